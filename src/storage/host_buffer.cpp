#include "pagedkv/storage/host_buffer.hpp"

#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/check.hpp"

namespace pagedkv {

void detail::AlignedFree::operator()(std::byte* p) const {
  ::operator delete (p, std::align_val_t{alignment});
}

HostBuffer::HostBuffer(int64_t bytes, const HostMemoryOptions& options) {
  PAGEDKV_CHECK(bytes >= 0, "HostBuffer: bytes {} is negative", bytes);
  if (bytes == 0) return;
  const bool huge = options.huge_pages && bytes >= kHugePageBytes;
  const std::size_t alignment = static_cast<std::size_t>(huge ? kHugePageBytes : kAlignment);
  auto* raw = static_cast<std::byte*>(
      ::operator new (static_cast<std::size_t>(bytes), std::align_val_t{alignment}));
  data_ = std::unique_ptr<std::byte, detail::AlignedFree>(raw, detail::AlignedFree{alignment});
  size_ = bytes;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Before the first touch, so that the zero-fill below faults huge pages in. The advice covers
  // the whole huge pages inside the buffer; a failure (THP compiled out) just leaves 4 KiB pages.
  const int64_t whole = bytes / kHugePageBytes * kHugePageBytes;
  if (huge && whole > 0) {
    huge_pages_advised_ = madvise(raw, static_cast<std::size_t>(whole), MADV_HUGEPAGE) == 0;
  }
#endif
  std::memset(raw, 0, static_cast<std::size_t>(bytes));
}

}  // namespace pagedkv
