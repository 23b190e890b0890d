// Per-target code of the fast CPU kernel (attention_hwy.cpp): gathering the K/V row pointers of
// a tile through the block table, and the software prefetch of the rows the kernel reads next.
// Highway's "-inl.h" pattern: re-included once per target by foreach_target.h through
// attention_hwy.cpp, so the guard below toggles with HWY_TARGET_TOGGLE instead of #pragma once.

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

/// Requests one K or V row into L2 ahead of use (T1 hint, every cache line: blocks are
/// scattered, so the hardware stream prefetcher loses the stream at every block boundary).
/// Callers spread these over the compute of the current tile, one tile (>= 1 us of work)
/// ahead of its use. Why L2 and not L1: one tile of K and V rows of a head (64 rows of 256-512
/// bytes each for head_dim 128) does not fit an L1 of 32-48 KiB beside the tile being read,
/// so rows prefetched into L1 were evicted before use. Measured (2026-12-05, AMD EPYC Zen 4,
/// 32 KiB L1d, 1 MiB L2; decode of batch 8 x 4096 keys over 8 kv heads from DRAM, one thread,
/// the variants alternating on a machine loaded by other builds, so compare within a row):
/// bf16 d128 block_size 16: the non-temporal L1 row prefetch with the block-size-gated block
/// stream (the previous rules) 9.1 GB/s, an address-ordered block stream into L2 11.1, these L2
/// row prefetches 11.9; fp32 d128 block_size 16: 5.0, 10.9, 12.1; block_size 128 and head_dim
/// 64 alike; requesting every other line only halved the rate (each line must be requested).
template <typename T>
HWY_INLINE void PrefetchRow(const T* row, int64_t row_bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}

/// What a key loop prefetches while it computes: the K rows k[t] + off and V rows v[t] + off
/// of keys t < n (a null k or v: none of that kind).
template <typename T>
struct PrefetchPlan {
  const T* const* k = nullptr;
  const T* const* v = nullptr;
  int64_t off = 0;
  int32_t n = 0;
  int64_t row_bytes = 0;

  /// Prefetches the rows of keys [from, min(to, n)).
  HWY_INLINE void rows(int32_t from, int32_t to) const {
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
