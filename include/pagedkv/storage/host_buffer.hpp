#pragma once
/// @file host_buffer.hpp
/// Owned, zero-filled, aligned host memory for K/V pools (HostKVCache's arena, contiguous peer
/// caches). Large buffers are backed by transparent huge pages where the OS offers them, so a
/// kernel that reads pages scattered over a pool of gigabytes does not pay a TLB miss per 4 KiB.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace pagedkv {

namespace detail {
/// Deleter of HostBuffer memory: operator delete with the alignment it was allocated with.
struct AlignedFree {
  std::size_t alignment = 64;
  void operator()(std::byte* p) const;
};
}  // namespace detail

/// How host K/V memory is allocated.
struct HostMemoryOptions {
  /// Advise transparent huge pages (Linux madvise(MADV_HUGEPAGE)) for buffers of at least
  /// kHugePageBytes; such buffers are also aligned to kHugePageBytes. Only an advice: the OS may
  /// give 4 KiB pages (THP disabled, memory fragmented), and results never depend on it.
  /// Measured (bench_attention_cpu, bf16 d128, 256 MiB per kind, 1 thread): paged decode 6-9%
  /// faster with huge pages, contiguous 2-4%, and the paged/contiguous ratio stable across runs
  /// (0.95-1.03) where 4 KiB pages gave 0.82-1.2 from one process to the next.
  bool huge_pages = true;
};

/// A fixed-size byte buffer: zero-filled at construction, 64-byte aligned (2 MiB when huge
/// pages are advised), freed on destruction. Move-only.
class HostBuffer {
 public:
  /// Size from which huge pages are advised (the x86-64 and arm64 THP size), bytes.
  static constexpr int64_t kHugePageBytes = int64_t{2} << 20;
  /// Alignment of every buffer, bytes (a cache line: vector loads of the first row never
  /// straddle one).
  static constexpr int64_t kAlignment = 64;

  /// An empty buffer: data() == nullptr, size() == 0.
  HostBuffer() = default;
  /// Allocates and zero-fills `bytes` bytes (huge pages advised per `options`).
  /// Errors: throws pagedkv::Error if bytes < 0 (naming it); std::bad_alloc if the memory cannot
  /// be allocated. bytes == 0 gives an empty buffer (data() == nullptr).
  explicit HostBuffer(int64_t bytes, const HostMemoryOptions& options = {});

  /// Takes other's memory. Moves leave `other` empty (data() == nullptr, size() == 0, no
  /// advice): the memberwise default kept the old size next to a null pointer.
  HostBuffer(HostBuffer&& other) noexcept
      : data_(std::move(other.data_)),
        size_(std::exchange(other.size_, 0)),
        huge_pages_advised_(std::exchange(other.huge_pages_advised_, false)) {}
  /// Frees this buffer's memory and takes other's, leaving `other` empty as the move
  /// constructor does. Self-move keeps the buffer.
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      data_ = std::move(other.data_);
      size_ = std::exchange(other.size_, 0);
      huge_pages_advised_ = std::exchange(other.huge_pages_advised_, false);
    }
    return *this;
  }

  /// First byte; nullptr for an empty buffer. As with std::unique_ptr::get, a const buffer
  /// still gives a writable pointer.
  [[nodiscard]] std::byte* data() const { return data_.get(); }
  /// Size in bytes, as requested at construction (0 when empty or moved from).
  [[nodiscard]] int64_t size() const { return size_; }
  /// True if madvise(MADV_HUGEPAGE) was requested and accepted for this buffer (whether the OS
  /// then backs it with huge pages is its choice: see AnonHugePages in /proc/self/smaps).
  [[nodiscard]] bool huge_pages_advised() const { return huge_pages_advised_; }

  /// The buffer as an array of T (T must need no construction: float, uint16_t, ...).
  template <typename T>
  [[nodiscard]] T* as() const {
    return reinterpret_cast<T*>(data_.get());
  }

 private:
  std::unique_ptr<std::byte, detail::AlignedFree> data_;
  int64_t size_ = 0;
  bool huge_pages_advised_ = false;
};

}  // namespace pagedkv
