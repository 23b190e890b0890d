#pragma once
/// @file device.hpp
/// The CUDA device, streams and owning device / pinned host buffers, as seen from host C++.
/// No CUDA header is included: a stream is an opaque `void*` (a `cudaStream_t`).
///
/// Availability: device_available(), require_device() and device_info() are defined in every
/// build of pagedkv, with or without its CUDA backend (pagedkv/config.hpp: PAGEDKV_WITH_CUDA).
/// Everything else in pagedkv::cuda exists only when PAGEDKV_WITH_CUDA is 1; code that must
/// also build without CUDA guards its use with `#if PAGEDKV_WITH_CUDA` after require_device().

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace pagedkv::cuda {

/// A CUDA stream (`cudaStream_t`) passed through host code without CUDA headers.
/// nullptr is the legacy default stream. pagedkv never creates or destroys caller streams.
using Stream = void*;

/// True when pagedkv was built with CUDA and at least one CUDA device is usable (driver loaded,
/// cudaGetDeviceCount() > 0). Never throws; safe to call on machines without a GPU or driver.
[[nodiscard]] bool device_available() noexcept;

/// Throws pagedkv::Error with a one-line reason unless device_available():
/// "no CUDA device: <driver message>" or "no CUDA device: pagedkv was built without CUDA
/// (PAGEDKV_WITH_CUDA=0)". What `pagedkv generate --device cuda` calls first.
void require_device();

/// Properties of the current device.
struct DeviceInfo {
  std::string name;                 ///< e.g. "NVIDIA H200"
  int32_t compute_capability = 0;   ///< major * 10 + minor, e.g. 90
  int32_t sm_count = 0;             ///< streaming multiprocessors
  int64_t global_memory_bytes = 0;  ///< total device memory, bytes
  int64_t l2_cache_bytes = 0;       ///< bytes
};

/// Properties of the current device. Errors: throws pagedkv::Error as require_device().
[[nodiscard]] DeviceInfo device_info();

/// Blocks the host until all work queued on `stream` is done.
/// Errors: throws pagedkv::Error naming the CUDA error (also reports earlier asynchronous
/// kernel faults on that stream).
void synchronize(Stream stream);

/// Owning device allocation (cudaMalloc: 256-byte aligned). Move-only; freed on destruction.
/// Contents are uninitialized unless zero() is called.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates `bytes` bytes of device memory, uninitialized (0 bytes: an empty buffer, no
  /// allocation). Synchronous.
  /// Errors: throws pagedkv::Error if bytes < 0 or cudaMalloc fails (the message names the
  /// size and the CUDA error).
  explicit DeviceBuffer(int64_t bytes);
  ~DeviceBuffer();
  /// Takes other's allocation without copying; `other` is left empty (data() == nullptr,
  /// bytes() == 0), like a default-constructed buffer, and may be reused by assignment. Device
  /// pointers taken from `other` before the move stay valid: the memory now belongs to this one.
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  /// Frees this buffer's allocation (cudaFree, errors ignored) and takes other's, leaving
  /// `other` empty as the move constructor does. Self-move keeps the buffer.
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// Device address of byte 0; nullptr when empty (default-constructed, 0 bytes, moved from).
  /// Not dereferenceable on the host.
  [[nodiscard]] void* data() const { return data_; }
  /// data() as a typed device pointer (no check: T's alignment must divide 256, the
  /// cudaMalloc alignment, and the caller keeps to bytes() / sizeof(T) elements).
  template <typename T>
  [[nodiscard]] T* as() const {
    return static_cast<T*>(data_);
  }
  /// Size of the allocation, bytes (0 when empty).
  [[nodiscard]] int64_t bytes() const { return bytes_; }

  /// Copies host bytes to offset `offset` (synchronous when stream is nullptr and `host` is
  /// pageable). Errors: throws if the range exceeds bytes() or the copy fails.
  void upload(const void* host, int64_t bytes, int64_t offset = 0, Stream stream = nullptr);
  /// Copies bytes at `offset` to host memory. Synchronizes `stream` before returning.
  /// Errors: throws if the range exceeds bytes() or the copy fails.
  void download(void* host, int64_t bytes, int64_t offset = 0, Stream stream = nullptr) const;
  /// Sets every byte to 0 (cudaMemsetAsync on `stream`).
  void zero(Stream stream = nullptr);

  /// Typed convenience: upload(host.data(), host.size_bytes(), 0, stream), the whole span to
  /// offset 0, with the same stream semantics and errors.
  template <typename T>
  void upload(std::span<const T> host, Stream stream = nullptr) {
    upload(host.data(), static_cast<int64_t>(host.size_bytes()), 0, stream);
  }
  /// Typed convenience: download(host.data(), host.size_bytes(), 0, stream), the first
  /// host.size_bytes() bytes into the span; synchronizes `stream` before returning.
  /// Errors: throws pagedkv::Error if the span is larger than bytes() or the copy fails.
  template <typename T>
  void download(std::span<T> host, Stream stream = nullptr) const {
    download(host.data(), static_cast<int64_t>(host.size_bytes()), 0, stream);
  }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

/// Owning page-locked host allocation (cudaMallocHost): the source or destination of truly
/// asynchronous copies (swap pools, metadata staging). Move-only; zero-initialized.
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  /// Allocates `bytes` bytes of page-locked host memory, zeroed (0 bytes: an empty buffer, no
  /// allocation).
  /// Errors: throws pagedkv::Error if bytes < 0 or cudaMallocHost fails (the message names the
  /// size and the CUDA error).
  explicit PinnedHostBuffer(int64_t bytes);
  ~PinnedHostBuffer();
  /// Takes other's allocation without copying; `other` is left empty (data() == nullptr,
  /// bytes() == 0) and may be reused by assignment. Pointers into the memory stay valid.
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept;
  /// Frees this buffer's allocation (cudaFreeHost, errors ignored) and takes other's, leaving
  /// `other` empty as the move constructor does. Self-move keeps the buffer.
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept;
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  /// Host address of byte 0, readable and writable on the host; nullptr when empty
  /// (default-constructed, 0 bytes, moved from). Wait for the copies that use it (synchronize
  /// their stream) before touching the bytes.
  [[nodiscard]] std::byte* data() const { return data_; }
  /// Size of the allocation, bytes (0 when empty).
  [[nodiscard]] int64_t bytes() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace pagedkv::cuda
