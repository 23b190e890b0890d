// Host side of the CUDA backend: device queries, owning buffers, CUDA error reporting.
// Compiled only when pagedkv is built with CUDA (the stand-ins of device_available() and
// require_device() for builds without CUDA live in support.cpp).

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "core/check.hpp"
#include "cuda/host/cuda_check.hpp"
#include "pagedkv/cuda/device.hpp"

namespace pagedkv::cuda {

namespace detail {

void throw_cuda_error(int code, const char* what, const char* file, int line) {
  const auto err = static_cast<cudaError_t>(code);
  // Clear the sticky "last error" so that a caller who catches can carry on where possible.
  (void)cudaGetLastError();
  ::pagedkv::detail::fail("CUDA error {} ({}): {} in {} at {}:{}", cudaGetErrorName(err), code,
                          cudaGetErrorString(err), what, file, line);
}

}  // namespace detail

bool device_available() noexcept {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

void require_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    // Without a GPU, or without its driver, the runtime reports cudaErrorNoDevice or
    // cudaErrorInsufficientDriver (no libcuda to match): name both the cause and the hint.
    ::pagedkv::detail::fail(
        "no CUDA device: cudaGetDeviceCount failed: {} ({}); is an NVIDIA GPU with a driver for "
        "CUDA {}.{} present?",
        cudaGetErrorString(err), cudaGetErrorName(err), CUDART_VERSION / 1000,
        CUDART_VERSION % 1000 / 10);
  }
  PAGEDKV_CHECK(count > 0, "no CUDA device: cudaGetDeviceCount() found 0 devices");
}

DeviceInfo device_info() {
  require_device();
  int device = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  PAGEDKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.name = prop.name;
  info.compute_capability = prop.major * 10 + prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.global_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.l2_cache_bytes = prop.l2CacheSize;
  return info;
}

void synchronize(Stream stream) {
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

// ---- DeviceBuffer ------------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(int64_t bytes) {
  PAGEDKV_CHECK(bytes >= 0, "DeviceBuffer: size must be >= 0, got {} bytes", bytes);
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    ::pagedkv::detail::fail("DeviceBuffer: cudaMalloc of {} bytes failed: {} ({})", bytes,
                            cudaGetErrorString(err), cudaGetErrorName(err));
  }
  data_ = p;
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) (void)cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, int64_t bytes, int64_t offset, Stream stream) {
  PAGEDKV_CHECK(bytes >= 0 && offset >= 0 && offset + bytes <= bytes_,
                "DeviceBuffer::upload: range [{}, {}) outside the buffer's {} bytes", offset,
                offset + bytes, bytes_);
  if (bytes == 0) return;
  PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(data_) + offset, host,
                                     static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                     static_cast<cudaStream_t>(stream)));
}

void DeviceBuffer::download(void* host, int64_t bytes, int64_t offset, Stream stream) const {
  PAGEDKV_CHECK(bytes >= 0 && offset >= 0 && offset + bytes <= bytes_,
                "DeviceBuffer::download: range [{}, {}) outside the buffer's {} bytes", offset,
                offset + bytes, bytes_);
  if (bytes == 0) return;
  PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(host, static_cast<const std::byte*>(data_) + offset,
                                     static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                     static_cast<cudaStream_t>(stream)));
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

void DeviceBuffer::zero(Stream stream) {
  if (bytes_ == 0) return;
  PAGEDKV_CUDA_CHECK(
      cudaMemsetAsync(data_, 0, static_cast<size_t>(bytes_), static_cast<cudaStream_t>(stream)));
}

// ---- PinnedHostBuffer --------------------------------------------------------------------------

PinnedHostBuffer::PinnedHostBuffer(int64_t bytes) {
  PAGEDKV_CHECK(bytes >= 0, "PinnedHostBuffer: size must be >= 0, got {} bytes", bytes);
  if (bytes == 0) return;
  void* p = nullptr;
  const cudaError_t err = cudaMallocHost(&p, static_cast<size_t>(bytes));
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    ::pagedkv::detail::fail("PinnedHostBuffer: cudaMallocHost of {} bytes failed: {} ({})", bytes,
                            cudaGetErrorString(err), cudaGetErrorName(err));
  }
  data_ = static_cast<std::byte*>(p);
  bytes_ = bytes;
  std::memset(data_, 0, static_cast<size_t>(bytes));
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (data_ != nullptr) (void)cudaFreeHost(data_);
}

PinnedHostBuffer::PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedHostBuffer& PinnedHostBuffer::operator=(PinnedHostBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
