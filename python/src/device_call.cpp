// One op call on a CUDA device: device guard, stream, stream-ordered scratch (device_call.hpp).
#include "device_call.hpp"

#if PAGEDKV_WITH_CUDA

#include <cuda_runtime_api.h>

#include <string>

#include "pagedkv/error.hpp"

namespace pagedkv::py {

namespace {

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // clear the sticky error so that a caller who catches can go on
  throw Error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
              ") in " + what);
}

cudaMemcpyKind kind_of(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      break;
  }
  return cudaMemcpyDeviceToDevice;
}

}  // namespace

DeviceCall::DeviceCall(int32_t device, std::optional<uintptr_t> stream)
    : device_(device), stream_(reinterpret_cast<cuda::Stream>(stream.value_or(0))) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device_) check(cudaSetDevice(device_), "cudaSetDevice (the arrays' device)");
}

DeviceCall::~DeviceCall() {
  const auto s = static_cast<cudaStream_t>(stream_);
  // Errors are ignored: a destructor cannot report them, and the call's own error (if any) is
  // the one the caller sees.
  for (void* p : scratch_) (void)cudaFreeAsync(p, s);
  if (staged_) {
    // The uploads queued before this point read staged_; free it once the stream reaches here.
    const cudaError_t err = cudaLaunchHostFunc(
        s, [](void* p) { delete static_cast<std::vector<std::vector<std::byte>>*>(p); }, staged_);
    if (err != cudaSuccess) {
      (void)cudaStreamSynchronize(s);
      delete staged_;
    }
  }
  (void)cudaGetLastError();
  if (previous_ != device_) (void)cudaSetDevice(previous_);
}

void* DeviceCall::alloc(int64_t bytes) {
  if (bytes <= 0) return nullptr;
  void* p = nullptr;
  check(cudaMallocAsync(&p, static_cast<size_t>(bytes), static_cast<cudaStream_t>(stream_)),
        "cudaMallocAsync (the call's scratch)");
  scratch_.push_back(p);
  return p;
}

const void* DeviceCall::upload_bytes(const void* host, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (!staged_) staged_ = new std::vector<std::vector<std::byte>>();
  const auto* first = static_cast<const std::byte*>(host);
  staged_->emplace_back(first, first + bytes);
  void* dst = alloc(static_cast<int64_t>(bytes));
  check(cudaMemcpyAsync(dst, staged_->back().data(), bytes, cudaMemcpyHostToDevice,
                        static_cast<cudaStream_t>(stream_)),
        "cudaMemcpyAsync (host metadata to the device)");
  return dst;
}

void DeviceCall::copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                           int64_t width, int64_t rows, CopyKind kind) {
  if (width <= 0 || rows <= 0) return;
  const auto s = static_cast<cudaStream_t>(stream_);
  if (rows == 1 || (dst_pitch == width && src_pitch == width)) {
    check(cudaMemcpyAsync(dst, src, static_cast<size_t>(width * rows), kind_of(kind), s),
          "cudaMemcpyAsync (a block copy)");
    return;
  }
  check(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                          static_cast<size_t>(width), static_cast<size_t>(rows), kind_of(kind), s),
        "cudaMemcpy2DAsync (a block copy)");
}

std::vector<float> DeviceCall::read_floats(const Any& a) {
  std::vector<float> out(a.shape(0));
  const int64_t pitch = a.stride(0) * static_cast<int64_t>(sizeof(float));
  copy_rows(out.data(), sizeof(float), a.data(), pitch, sizeof(float),
            static_cast<int64_t>(out.size()), CopyKind::kDeviceToHost);
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
        "cudaStreamSynchronize (reading a scale array)");
  return out;
}

}  // namespace pagedkv::py

#endif  // PAGEDKV_WITH_CUDA
