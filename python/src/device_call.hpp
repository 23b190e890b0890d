#pragma once
/// @file device_call.hpp
/// One op call on a CUDA device (cuda_ops.cpp, cuda_copies.cpp): the array's device made
/// current for the call and the previous one restored after, the caller's stream, and the
/// call's scratch memory (stream-ordered: cudaMallocAsync now, cudaFreeAsync at the end, so
/// the memory is reused only after the kernels that read it). Only with PAGEDKV_WITH_CUDA.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "pagedkv/cuda/device.hpp"
#include "pools.hpp"

namespace pagedkv::py {

/// Direction of a copy between host and device memory (cudaMemcpyKind's four).
enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

/// RAII for one call on device `device` and `stream` (a cudaStream_t as a Python int; none:
/// the legacy default stream). Not copyable. Errors: throws pagedkv::Error naming the CUDA
/// error of any failed CUDA call.
class DeviceCall {
 public:
  DeviceCall(int32_t device, std::optional<uintptr_t> stream);
  /// Frees the scratch on the stream (after the queued work) and restores the previous device.
  ~DeviceCall();
  DeviceCall(const DeviceCall&) = delete;
  DeviceCall& operator=(const DeviceCall&) = delete;

  [[nodiscard]] cuda::Stream stream() const { return stream_; }

  /// `bytes` of device scratch, valid for the work queued on the stream during this call
  /// (nullptr for 0 bytes).
  [[nodiscard]] void* alloc(int64_t bytes);

  /// A device copy of host values, queued on the stream; the host bytes are kept until the
  /// stream has read them (so `host` may be a temporary).
  template <class T>
  [[nodiscard]] const T* upload(const std::vector<T>& host) {
    return static_cast<const T*>(upload_bytes(host.data(), host.size() * sizeof(T)));
  }

  /// cudaMemcpy2DAsync on the stream: `rows` rows of `width` bytes, `pitch` bytes apart.
  void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                 int64_t rows, CopyKind kind);

  /// The values of a CUDA float32 [n] array (any stride), read on the stream and waited for.
  [[nodiscard]] std::vector<float> read_floats(const Any& a);

 private:
  const void* upload_bytes(const void* host, size_t bytes);

  int previous_ = 0;
  int device_ = 0;
  cuda::Stream stream_ = nullptr;
  std::vector<void*> scratch_;
  /// Host copies of uploaded bytes, freed by a host function queued after the uploads.
  std::vector<std::vector<std::byte>>* staged_ = nullptr;
};

}  // namespace pagedkv::py

#endif  // PAGEDKV_WITH_CUDA
