// Per-target code of the fast CPU kernel (attention_hwy.cpp): gathering the K/V row pointers of
// a tile through the block table, and the software prefetch of what the kernel reads next (row
// prefetch and block stream). Highway's "-inl.h" pattern: re-included once per target by
// foreach_target.h through attention_hwy.cpp, so the guard below toggles with HWY_TARGET_TOGGLE
// instead of #pragma once.

#if defined(PAGEDKV_CPU_ATTENTION_PREFETCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDKV_CPU_ATTENTION_PREFETCH_INL_H_
#undef PAGEDKV_CPU_ATTENTION_PREFETCH_INL_H_
#else
#define PAGEDKV_CPU_ATTENTION_PREFETCH_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "cpu/attention_work.hpp"

HWY_BEFORE_NAMESPACE();
namespace pagedkv::detail::fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Fills the K/V row pointers of the tile of flat keys [j, j + n) of a row set, through the
/// block table; consecutive keys step through a block without a division.
template <typename T>
HWY_INLINE void GatherTile(const KernelArgs& a, const RowSet& rs, const int32_t* table, int64_t j,
                           int32_t n, const T** kp, const T** vp, int64_t* keys) {
  const KVLayerView& c = a.cache;
  const T* kbase = static_cast<const T*>(c.k);
  const T* vbase = static_cast<const T*>(c.v);
  const int64_t bs = c.block_size;
  const int64_t head_off = static_cast<int64_t>(rs.kv_head) * c.head_stride;
  int64_t key = j < rs.sink_len ? j : rs.main_begin + (j - rs.sink_len);
  int64_t lb = key / bs;
  int64_t o = key % bs;
  int64_t block_off = static_cast<int64_t>(table[lb]) * c.block_stride + head_off;
  for (int32_t i = 0; i < n; ++i, ++j) {
    if (j == rs.sink_len && i > 0) {  // jump from the sinks to the window
      key = rs.main_begin;
      lb = key / bs;
      o = key % bs;
      block_off = static_cast<int64_t>(table[lb]) * c.block_stride + head_off;
    } else if (o == bs) {  // next block; its table entry is read only when a key needs it
      o = 0;
      ++lb;
      block_off = static_cast<int64_t>(table[lb]) * c.block_stride + head_off;
    }
    const int64_t off = block_off + o * c.token_stride;
    kp[i] = kbase + off;
    vp[i] = vbase + off;
    keys[i] = key;
    ++key;
    ++o;
  }
}

/// Requests one K or V row into cache ahead of use: blocks are scattered, so the hardware stream
/// prefetcher loses the stream at every block boundary. Callers spread these over the compute of
/// the previous tile (one burst per tile measured slower: it stalls on the miss buffers).
/// Non-temporal hint (x86 prefetchnta, arm PLDL1STRM): K/V is streamed once per call, so it
/// should not push the accumulators and scores out of the caches. Measured (bf16 d128, 1
/// thread): 3-6% faster than a T0 prefetch for paged and contiguous alike.
template <typename T>
HWY_INLINE void PrefetchRow(const T* row, int64_t row_bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b, 0, 0);
}

/// The K and V bytes the next span reads, as address-ordered segments (per block, the rows of
/// its keys for every kv head of the set: a whole block is one segment, K and V together when
/// they are adjacent), requested `lines_per_step` cache lines per step() over the current span's
/// score loops, so each block is swept once in address order, one span ahead (where reading head
/// by head jumps between the span's blocks every block_size rows). When to use it: AttendImpl.
/// T0 hint (all cache levels) on one thread: the span ahead (<= kStreamAheadBytes) stays in L2
/// until its heads are reached. Measured (bench_attention_cpu, paged, side by side in one
/// process, one thread): with a non-temporal or T1/T2 hint the stream was 2-10% slower than
/// with T0. On a thread team: T1 (to_l2), with the row prefetch kept on (see AttendImpl).
struct PrefetchStream {
  static constexpr int32_t kMaxSegments = 2 * kMaxSpan;  // whole blocks merge; partial ones are few
  const char* begin[kMaxSegments];
  const char* end[kMaxSegments];
  int32_t count = 0;
  int32_t seg = 0;            // segment of the next line
  const char* cur = nullptr;  // next line
  int64_t total_lines = 0;    // lines in all segments
  int64_t lines_per_step = 0;

  void reset() {
    count = 0;
    seg = 0;
    cur = nullptr;
    total_lines = 0;
  }
  /// Appends the lines of [b, e); a segment that starts inside or at the end of the previous
  /// one extends it (a whole block's K then V when interleaved, consecutive heads in HND).
  void add(const void* b, const void* e) {
    const auto* lb = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(b) & ~uintptr_t{63});
    const auto* ce = static_cast<const char*>(e);
    if (count > 0 && lb >= begin[count - 1] && lb <= end[count - 1]) {
      total_lines -= (end[count - 1] - begin[count - 1] + 63) / 64;
      end[count - 1] = std::max(end[count - 1], ce);
    } else {
      if (count == kMaxSegments) return;  // a hint only: the rest goes unprefetched
      begin[count] = lb;
      end[count] = ce;
      if (count++ == 0) cur = lb;
    }
    total_lines += (end[count - 1] - begin[count - 1] + 63) / 64;
  }
  bool to_l2 = false;  // T1 hint (L2 and below) instead of T0
  // The hint is tested per line on purpose: hoisting it (a branch per call into two template
  // loops) made paged decode 3-10% slower on one thread (A/B, 2026-11-29), the larger inlined
  // step costing more in the score loops than a perfectly predicted branch.
  HWY_INLINE void step() {
    for (int64_t left = lines_per_step; left > 0 && seg < count; --left) {
      if (to_l2) {
        __builtin_prefetch(cur, 0, 2);
      } else {
        __builtin_prefetch(cur, 0, 3);
      }
      cur += 64;
      if (cur >= end[seg] && ++seg < count) cur = begin[seg];
    }
  }
};

/// What a score loop prefetches while it computes: the K rows k[t] + off and V rows v[t] + off
/// of keys t < n (a null k or v: none of that kind), and, with a stream, one step of it per call
/// that covers a key t < stream_n.
template <typename T>
struct PrefetchPlan {
  const T* const* k = nullptr;
  const T* const* v = nullptr;
  int64_t off = 0;
  int32_t n = 0;
  int64_t row_bytes = 0;
  PrefetchStream* stream = nullptr;
  int32_t stream_n = 0;

  /// Prefetches the rows of keys [from, min(to, n)) (and a stream step).
  HWY_INLINE void rows(int32_t from, int32_t to) const {
    if (stream != nullptr && from < to && from < stream_n) stream->step();
    for (int32_t t = from; t < to && t < n; ++t) {
      if (k != nullptr) PrefetchRow(k[t] + off, row_bytes);
      if (v != nullptr) PrefetchRow(v[t] + off, row_bytes);
    }
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace pagedkv::detail::fast
HWY_AFTER_NAMESPACE();
#endif  // PAGEDKV_CPU_ATTENTION_PREFETCH_INL_H_
