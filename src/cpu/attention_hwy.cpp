// Fast CPU paged attention: Google Highway SIMD compiled for several instruction sets and
// dispatched at run time (foreach_target.h re-includes this file once per target), OpenMP over
// work items, log-sum-exp merge of key partitions. Contract: attention_fast.hpp.
//
// Decode is memory-bound: every K/V byte is read once from memory and used by all query heads
// of its kv head; everything else (scores, softmax, accumulators) stays in L1.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cpu/attention_fast.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

// Target-independent definitions, shared by every per-target pass over this file.
#ifndef PAGEDKV_CPU_ATTENTION_HWY_SHARED_
#define PAGEDKV_CPU_ATTENTION_HWY_SHARED_
namespace pagedkv::detail::fast {

/// Keys per tile: the scores of a tile are four AVX-512 vectors; one kv head's K (or V) rows of
/// a tile (64 x 128 x 2 B = 16 KiB for bf16 head_dim 128) stay in L1 while its rows use them,
/// and the next tile is prefetched one tile ahead. Measured on bf16 d128 decode (one thread):
/// 64 was 5-10% faster than 32 (prefetch too close) and than 128 (tiles spill L1).
constexpr int32_t kTile = 64;
/// Most keys gathered at once (a span: whole blocks of up to 256 positions for a set of several
/// kv heads; see AttendImpl).
constexpr int32_t kMaxSpan = 4 * kTile;
/// Rows (query heads x query tokens) per work item: bounds the L1 footprint of the fp32
/// accumulators (32 x 128 x 4 B = 16 KiB) while letting prefill reuse each K/V tile 32 times.
constexpr int32_t kMaxRows = 32;
/// Most bytes the block stream (PrefetchStream) requests ahead of the kernel: a span of more
/// (more than 8 kv heads of 256-byte rows per item) is streamed over its last heads only, so
/// that what was prefetched stays in the 1-2 MiB L2 of current x86 cores until it is read.
constexpr int64_t kStreamAheadBytes = int64_t{256} << 10;
/// Shortest run of K and V bytes per block (all kv heads of an item, K and V together when
/// they are adjacent) for which the block stream is used; shorter runs keep the row prefetch.
constexpr int64_t kStreamMinRunBytes = int64_t{64} << 10;
/// Longest K/V row (bytes) for which the block stream is used: with longer rows one head's tile
/// of K and V (2 x kTile rows) no longer fits in L1 beside the stream's lines.
constexpr int64_t kStreamMaxRowBytes = 256;
/// Smallest key partition: below it, partial results and their merge cost more than the
/// parallelism gains.
constexpr int64_t kMinPartitionKeys = 256;
/// Work items per thread the automatic partitioning aims at, for load balance across
/// sequences of different lengths.
constexpr int64_t kItemsPerThread = 4;
/// Below this many key-row visits a call runs on the calling thread: waking a thread team costs
/// microseconds, as much as attending a few thousand keys.
constexpr int64_t kMinParallelWork = 16384;

/// Everything a work item reads, shared by all items of a call.
struct KernelArgs {
  KVLayerView cache;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  const float* q = nullptr;  // [rows, num_heads, head_dim]
  float* out = nullptr;      // [rows, num_heads, head_dim]
  float* partial = nullptr;  // split items: [parts][rows of the set][2 + head_dim] (m, l, acc)
  int32_t num_heads = 0;
  int32_t group = 0;  // query heads per kv head
  int32_t head_dim = 0;
  float scale = 0.0f;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  bool team = false;  // the call runs on a thread team (see AttendImpl's prefetch rules)
};

/// The rows of one work item: query tokens [first_pos, first_pos + num_q) of a sequence, the
/// `group` query heads of each of the kv heads [kv_head, kv_head + num_kv). Row r is token
/// r / (num_kv * group), kv head kv_head + (r % (num_kv * group)) / group; the query heads of
/// consecutive kv heads are adjacent in q, so a token's rows are one contiguous run of q.
/// Their visible keys are a subset of the key set [0, sink_len) ++ [main_begin, main_end),
/// addressed by a flat index j in [0, num_keys()).
struct RowSet {
  int32_t seq = 0;
  int32_t kv_head = 0;
  int32_t num_kv = 1;
  int32_t num_q = 0;
  int64_t q_row = 0;      // query row of the first token
  int64_t first_pos = 0;  // position of the first token (-1 for a decode padding row)
  int64_t sink_len = 0;
  int64_t main_begin = 0;
  int64_t main_end = 0;
  int32_t num_parts = 1;
  int64_t part_keys = 0;        // flat keys per partition
  int64_t partial_offset = -1;  // floats into KernelArgs::partial; -1 = write `out` directly

  [[nodiscard]] int64_t num_keys() const { return sink_len + (main_end - main_begin); }
  [[nodiscard]] int32_t rows_per_token(int32_t group) const { return num_kv * group; }
  [[nodiscard]] int32_t num_rows(int32_t group) const { return num_q * num_kv * group; }
};

/// First visible key of a query at `pos` (the sliding window's left edge; 0 without a window).
inline int64_t window_lo(int64_t pos, int32_t window_left) {
  return window_left < 0 ? 0 : std::max<int64_t>(0, pos - window_left + 1);
}
/// End of the always-visible sink range of a query whose window starts at `lo`.
inline int64_t sink_end(int64_t lo, int32_t window_left, int32_t sink_tokens) {
  return window_left < 0 ? 0 : std::min<int64_t>(sink_tokens, lo);
}

}  // namespace pagedkv::detail::fast
#endif  // PAGEDKV_CPU_ATTENTION_HWY_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target.h must come first: it re-includes this file per target.
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pagedkv::detail::fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Loads Lanes(df) K/V elements as fp32: fp16/bf16 are widened in registers (vcvtph2ps, or a
/// 16-bit shift for bf16), so the cache is read at its storage size.
template <typename T, class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else {
    const hn::Rebind<T, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}

/// Per-thread scratch that grows to the largest item seen and is then reused (no allocation
/// per item after warm-up).
inline float* ThreadScratch(size_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

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

/// out[k] = sum of the lanes of a_k, k = 0..3. With >= 4 lanes, two interleave rounds leave the
/// four partial sums side by side in every 128-bit block, then the blocks are added: about a
/// quarter of the shuffles of four separate reductions.
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE void SumOfLanes4(DF df, V a0, V a1, V a2, V a3, float* HWY_RESTRICT out) {
#if HWY_TARGET != HWY_SCALAR  // the scalar target has one lane and no interleave
  if constexpr (hn::MaxLanes(DF()) >= 4) {
    const size_t lanes = hn::Lanes(df);
    if (lanes >= 4) {
      const hn::Repartition<uint64_t, DF> du;
      const V t0 = hn::Add(hn::InterleaveLower(df, a0, a1), hn::InterleaveUpper(df, a0, a1));
      const V t1 = hn::Add(hn::InterleaveLower(df, a2, a3), hn::InterleaveUpper(df, a2, a3));
      const auto u0 = hn::BitCast(du, t0);
      const auto u1 = hn::BitCast(du, t1);
      const V u = hn::Add(hn::BitCast(df, hn::InterleaveLower(du, u0, u1)),
                          hn::BitCast(df, hn::InterleaveUpper(du, u0, u1)));
      HWY_ALIGN float blocks[hn::MaxLanes(DF())];
      hn::Store(u, df, blocks);
      const hn::CappedTag<float, 4> d4;
      auto sum = hn::Load(d4, blocks);
      for (size_t b = 4; b < lanes; b += 4) sum = hn::Add(sum, hn::Load(d4, blocks + b));
      hn::StoreU(sum, d4, out);
      return;
    }
  }
#endif
  out[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, a3));
}

/// s[i] = q . k_i for the n keys of a tile, k_i = k[i] + off. Four keys at a time, each with
/// two accumulator chains (even / odd vectors of head_dim): eight independent FMA chains hide
/// the FMA latency. Also prefetches what comes next (`pf`), four keys per four computed.
template <typename T, class DF>
HWY_INLINE void TileScores(DF df, const float* HWY_RESTRICT q, const T* const* k, int64_t off,
                           int32_t n, int64_t D, float* HWY_RESTRICT s, const PrefetchPlan<T>& pf) {
  using V = hn::Vec<DF>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    pf.rows(i, i + 4);
    const T* k0 = k[i] + off;
    const T* k1 = k[i + 1] + off;
    const T* k2 = k[i + 2] + off;
    const T* k3 = k[i + 3] + off;
    V a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    V b0 = hn::Zero(df), b1 = hn::Zero(df), b2 = hn::Zero(df), b3 = hn::Zero(df);
    int64_t d = 0;
    for (; d + 2 * L <= D; d += 2 * L) {
      const V qa = hn::LoadU(df, q + d);
      const V qb = hn::LoadU(df, q + d + L);
      a0 = hn::MulAdd(qa, LoadF32(df, k0 + d), a0);
      a1 = hn::MulAdd(qa, LoadF32(df, k1 + d), a1);
      a2 = hn::MulAdd(qa, LoadF32(df, k2 + d), a2);
      a3 = hn::MulAdd(qa, LoadF32(df, k3 + d), a3);
      b0 = hn::MulAdd(qb, LoadF32(df, k0 + d + L), b0);
      b1 = hn::MulAdd(qb, LoadF32(df, k1 + d + L), b1);
      b2 = hn::MulAdd(qb, LoadF32(df, k2 + d + L), b2);
      b3 = hn::MulAdd(qb, LoadF32(df, k3 + d + L), b3);
    }
    if (d < D) {  // odd number of vectors
      const V qa = hn::LoadU(df, q + d);
      a0 = hn::MulAdd(qa, LoadF32(df, k0 + d), a0);
      a1 = hn::MulAdd(qa, LoadF32(df, k1 + d), a1);
      a2 = hn::MulAdd(qa, LoadF32(df, k2 + d), a2);
      a3 = hn::MulAdd(qa, LoadF32(df, k3 + d), a3);
    }
    SumOfLanes4(df, hn::Add(a0, b0), hn::Add(a1, b1), hn::Add(a2, b2), hn::Add(a3, b3), s + i);
  }
  pf.rows(i, std::max(pf.n, n));
  for (; i < n; ++i) {
    V a0 = hn::Zero(df);
    for (int64_t d = 0; d < D; d += L) {
      a0 = hn::MulAdd(hn::LoadU(df, q + d), LoadF32(df, k[i] + off + d), a0);
    }
    s[i] = hn::GetLane(hn::SumOfLanes(df, a0));
  }
}

/// TileScores for two rows sharing one kv head: every K vector is loaded (and widened) once
/// for both, which halves the load and conversion work of GQA groups. Four keys x two rows =
/// eight FMA chains (fits the 16 registers of AVX2 with the operands).
template <typename T, class DF>
HWY_INLINE void TileScores2(DF df, const float* HWY_RESTRICT q0, const float* HWY_RESTRICT q1,
                            const T* const* k, int64_t off, int32_t n, int64_t D,
                            float* HWY_RESTRICT s0, float* HWY_RESTRICT s1,
                            const PrefetchPlan<T>& pf) {
  using V = hn::Vec<DF>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    pf.rows(i, i + 4);
    const T* k0 = k[i] + off;
    const T* k1 = k[i + 1] + off;
    const T* k2 = k[i + 2] + off;
    const T* k3 = k[i + 3] + off;
    V a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    V b0 = hn::Zero(df), b1 = hn::Zero(df), b2 = hn::Zero(df), b3 = hn::Zero(df);
    for (int64_t d = 0; d < D; d += L) {
      const V qa = hn::LoadU(df, q0 + d);
      const V qb = hn::LoadU(df, q1 + d);
      const V x0 = LoadF32(df, k0 + d);
      const V x1 = LoadF32(df, k1 + d);
      a0 = hn::MulAdd(qa, x0, a0);
      b0 = hn::MulAdd(qb, x0, b0);
      a1 = hn::MulAdd(qa, x1, a1);
      b1 = hn::MulAdd(qb, x1, b1);
      const V x2 = LoadF32(df, k2 + d);
      const V x3 = LoadF32(df, k3 + d);
      a2 = hn::MulAdd(qa, x2, a2);
      b2 = hn::MulAdd(qb, x2, b2);
      a3 = hn::MulAdd(qa, x3, a3);
      b3 = hn::MulAdd(qb, x3, b3);
    }
    SumOfLanes4(df, a0, a1, a2, a3, s0 + i);
    SumOfLanes4(df, b0, b1, b2, b3, s1 + i);
  }
  pf.rows(i, std::max(pf.n, n));
  for (; i < n; ++i) {
    V a0 = hn::Zero(df), b0 = hn::Zero(df);
    for (int64_t d = 0; d < D; d += L) {
      const V x = LoadF32(df, k[i] + off + d);
      a0 = hn::MulAdd(hn::LoadU(df, q0 + d), x, a0);
      b0 = hn::MulAdd(hn::LoadU(df, q1 + d), x, b0);
    }
    s0[i] = hn::GetLane(hn::SumOfLanes(df, a0));
    s1[i] = hn::GetLane(hn::SumOfLanes(df, b0));
  }
}

/// acc[d .. d + kNV * L) += sum_i p[i] v_i[d ..], the accumulators in registers across the tile.
template <int kNV, typename T, class DF>
HWY_INLINE void AccumulateChunk(DF df, const float* HWY_RESTRICT p, const T* const* v, int64_t off,
                                int32_t n, int64_t d, float* HWY_RESTRICT acc) {
  using V = hn::Vec<DF>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  V a0 = hn::LoadU(df, acc + d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  if constexpr (kNV > 1) a1 = hn::LoadU(df, acc + d + L);
  if constexpr (kNV > 2) a2 = hn::LoadU(df, acc + d + 2 * L);
  if constexpr (kNV > 3) a3 = hn::LoadU(df, acc + d + 3 * L);
  if constexpr (kNV > 4) a4 = hn::LoadU(df, acc + d + 4 * L);
  if constexpr (kNV > 5) a5 = hn::LoadU(df, acc + d + 5 * L);
  if constexpr (kNV > 6) a6 = hn::LoadU(df, acc + d + 6 * L);
  if constexpr (kNV > 7) a7 = hn::LoadU(df, acc + d + 7 * L);
  for (int32_t i = 0; i < n; ++i) {
    const V pv = hn::Set(df, p[i]);
    const T* x = v[i] + off + d;
    a0 = hn::MulAdd(pv, LoadF32(df, x), a0);
    if constexpr (kNV > 1) a1 = hn::MulAdd(pv, LoadF32(df, x + L), a1);
    if constexpr (kNV > 2) a2 = hn::MulAdd(pv, LoadF32(df, x + 2 * L), a2);
    if constexpr (kNV > 3) a3 = hn::MulAdd(pv, LoadF32(df, x + 3 * L), a3);
    if constexpr (kNV > 4) a4 = hn::MulAdd(pv, LoadF32(df, x + 4 * L), a4);
    if constexpr (kNV > 5) a5 = hn::MulAdd(pv, LoadF32(df, x + 5 * L), a5);
    if constexpr (kNV > 6) a6 = hn::MulAdd(pv, LoadF32(df, x + 6 * L), a6);
    if constexpr (kNV > 7) a7 = hn::MulAdd(pv, LoadF32(df, x + 7 * L), a7);
  }
  hn::StoreU(a0, df, acc + d);
  if constexpr (kNV > 1) hn::StoreU(a1, df, acc + d + L);
  if constexpr (kNV > 2) hn::StoreU(a2, df, acc + d + 2 * L);
  if constexpr (kNV > 3) hn::StoreU(a3, df, acc + d + 3 * L);
  if constexpr (kNV > 4) hn::StoreU(a4, df, acc + d + 4 * L);
  if constexpr (kNV > 5) hn::StoreU(a5, df, acc + d + 5 * L);
  if constexpr (kNV > 6) hn::StoreU(a6, df, acc + d + 6 * L);
  if constexpr (kNV > 7) hn::StoreU(a7, df, acc + d + 7 * L);
}

/// acc += sum_i p[i] v_i (v_i = v[i] + off) over the whole head_dim, in chunks of up to 8
/// vectors: 8 independent FMA chains per key.
template <typename T, class DF>
HWY_INLINE void TileAccumulate(DF df, const float* HWY_RESTRICT p, const T* const* v, int64_t off,
                               int32_t n, int64_t D, float* HWY_RESTRICT acc) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t d = 0;
  for (; d + 8 * L <= D; d += 8 * L) AccumulateChunk<8>(df, p, v, off, n, d, acc);
  if ((D - d) / L >= 4) {
    AccumulateChunk<4>(df, p, v, off, n, d, acc);
    d += 4 * L;
  }
  if ((D - d) / L >= 2) {
    AccumulateChunk<2>(df, p, v, off, n, d, acc);
    d += 2 * L;
  }
  if (d < D) AccumulateChunk<1>(df, p, v, off, n, d, acc);
}

/// AccumulateChunk for two rows sharing one kv head: every V vector is loaded (and widened) once
/// for both. kNV <= 4 vectors x two rows = eight accumulators.
template <int kNV, typename T, class DF>
HWY_INLINE void AccumulateChunk2(DF df, const float* HWY_RESTRICT p0, const float* HWY_RESTRICT p1,
                                 const T* const* v, int64_t off, int32_t n, int64_t d,
                                 float* HWY_RESTRICT acc0, float* HWY_RESTRICT acc1) {
  using V = hn::Vec<DF>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  V a0 = hn::LoadU(df, acc0 + d), a1 = a0, a2 = a0, a3 = a0;
  V b0 = hn::LoadU(df, acc1 + d), b1 = b0, b2 = b0, b3 = b0;
  if constexpr (kNV > 1) {
    a1 = hn::LoadU(df, acc0 + d + L);
    b1 = hn::LoadU(df, acc1 + d + L);
  }
  if constexpr (kNV > 2) {
    a2 = hn::LoadU(df, acc0 + d + 2 * L);
    b2 = hn::LoadU(df, acc1 + d + 2 * L);
  }
  if constexpr (kNV > 3) {
    a3 = hn::LoadU(df, acc0 + d + 3 * L);
    b3 = hn::LoadU(df, acc1 + d + 3 * L);
  }
  for (int32_t i = 0; i < n; ++i) {
    const V pa = hn::Set(df, p0[i]);
    const V pb = hn::Set(df, p1[i]);
    const T* x = v[i] + off + d;
    const V x0 = LoadF32(df, x);
    a0 = hn::MulAdd(pa, x0, a0);
    b0 = hn::MulAdd(pb, x0, b0);
    if constexpr (kNV > 1) {
      const V x1 = LoadF32(df, x + L);
      a1 = hn::MulAdd(pa, x1, a1);
      b1 = hn::MulAdd(pb, x1, b1);
    }
    if constexpr (kNV > 2) {
      const V x2 = LoadF32(df, x + 2 * L);
      a2 = hn::MulAdd(pa, x2, a2);
      b2 = hn::MulAdd(pb, x2, b2);
    }
    if constexpr (kNV > 3) {
      const V x3 = LoadF32(df, x + 3 * L);
      a3 = hn::MulAdd(pa, x3, a3);
      b3 = hn::MulAdd(pb, x3, b3);
    }
  }
  hn::StoreU(a0, df, acc0 + d);
  hn::StoreU(b0, df, acc1 + d);
  if constexpr (kNV > 1) {
    hn::StoreU(a1, df, acc0 + d + L);
    hn::StoreU(b1, df, acc1 + d + L);
  }
  if constexpr (kNV > 2) {
    hn::StoreU(a2, df, acc0 + d + 2 * L);
    hn::StoreU(b2, df, acc1 + d + 2 * L);
  }
  if constexpr (kNV > 3) {
    hn::StoreU(a3, df, acc0 + d + 3 * L);
    hn::StoreU(b3, df, acc1 + d + 3 * L);
  }
}

/// TileAccumulate for two rows sharing one kv head, in chunks of up to 4 vectors.
template <typename T, class DF>
HWY_INLINE void TileAccumulate2(DF df, const float* HWY_RESTRICT p0, const float* HWY_RESTRICT p1,
                                const T* const* v, int64_t off, int32_t n, int64_t D,
                                float* HWY_RESTRICT acc0, float* HWY_RESTRICT acc1) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  int64_t d = 0;
  for (; d + 4 * L <= D; d += 4 * L) AccumulateChunk2<4>(df, p0, p1, v, off, n, d, acc0, acc1);
  if ((D - d) / L >= 2) {
    AccumulateChunk2<2>(df, p0, p1, v, off, n, d, acc0, acc1);
    d += 2 * L;
  }
  if (d < D) AccumulateChunk2<1>(df, p0, p1, v, off, n, d, acc0, acc1);
}

/// Online softmax step of one row over a tile: s [ts] scores (padding -inf) become the
/// probabilities exp(s - m); the running max m, sum l and accumulator acc [D] are rescaled only
/// when the max grows. Returns false when the tile has no visible key for the row (nothing to
/// accumulate). Source: Milakov & Gimelshein, "Online normalizer calculation for softmax"
/// (2018).
template <class DF>
HWY_INLINE bool OnlineSoftmax(DF df, float* HWY_RESTRICT s, int64_t ts, int64_t D,
                              float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                              float* HWY_RESTRICT acc) {
  using V = hn::Vec<DF>;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  V vmax = hn::Set(df, kNegInf);
  for (int64_t i = 0; i < ts; i += L) vmax = hn::Max(vmax, hn::LoadU(df, s + i));
  const float mt = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (mt == kNegInf) return false;
  if (mt > *m) {
    if (*m != kNegInf) {
      const float corr = std::exp(*m - mt);
      *l *= corr;
      const V vc = hn::Set(df, corr);
      for (int64_t d = 0; d < D; d += L) {
        hn::StoreU(hn::Mul(hn::LoadU(df, acc + d), vc), df, acc + d);
      }
    }
    *m = mt;
  }
  const V vm = hn::Set(df, *m);
  V vsum = hn::Zero(df);
  for (int64_t i = 0; i < ts; i += L) {
    const V p = hn::Exp(df, hn::Sub(hn::LoadU(df, s + i), vm));
    hn::StoreU(p, df, s + i);
    vsum = hn::Add(vsum, p);
  }
  *l += hn::GetLane(hn::SumOfLanes(df, vsum));
  return true;
}

/// One partition of one row set (see RowSet for the row order).
template <typename T, class DF>
void AttendImpl(DF df, const KernelArgs& a, const RowSet& rs, int32_t part) {
  using V = hn::Vec<DF>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t D = a.head_dim;
  const int32_t G = a.group;
  const int32_t RT = rs.rows_per_token(G);
  const int32_t R = rs.num_rows(G);
  const int64_t ts = (kTile + L - 1) / L * L;  // score row stride, whole vectors
  const int64_t head_stride = a.cache.head_stride;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  float* qs = ThreadScratch(static_cast<size_t>(R * (2 * D + ts + 2)));  // [R, D] scaled q
  float* acc = qs + R * D;                                               // [R, D]
  float* sc = acc + R * D;  // [R, ts] scores, then probabilities
  float* m = sc + R * ts;   // [R] running max
  float* l = m + R;         // [R] running sum

  const V vscale = hn::Set(df, a.scale);
  for (int32_t t = 0; t < rs.num_q; ++t) {
    const float* src =
        a.q + ((rs.q_row + t) * a.num_heads + static_cast<int64_t>(rs.kv_head) * G) * D;
    float* dst = qs + static_cast<int64_t>(t) * RT * D;
    for (int64_t i = 0; i < RT * D; i += L) {
      hn::StoreU(hn::Mul(hn::LoadU(df, src + i), vscale), df, dst + i);
    }
  }
  std::fill(acc, acc + R * D, 0.0f);
  std::fill(m, m + R, kNegInf);
  std::fill(l, l + R, 0.0f);

  const int32_t* table = a.block_tables + static_cast<int64_t>(rs.seq) * a.max_blocks_per_seq;
  const int64_t key_begin = static_cast<int64_t>(part) * rs.part_keys;
  const int64_t key_end = std::min(rs.num_keys(), key_begin + rs.part_keys);
  // Rows of one query token share their visible set, which is exactly the row set's key set;
  // several tokens (prefill) need a per-row causal / window mask.
  const bool masked = rs.num_q > 1;

  // Keys are gathered a span at a time and attended a tile (kTile keys) at a time. A span is one
  // tile, except for a set of several kv heads over blocks longer than a tile: then it covers
  // whole blocks (up to kMaxSpan keys) and each head goes through all tiles of the span before
  // the next head, so K (and V) is read in address order across each block (head 0's run, head
  // 1's run, ...): one sequential stream per block instead of a jump per tile.
  // Row pointers are those of the first kv head of the set; head hh adds hh * head_stride.
  const T* kp[2][kMaxSpan];
  const T* vp[2][kMaxSpan];
  int64_t keys[2][kMaxSpan];
  const int64_t span =
      rs.num_kv > 1
          ? std::clamp<int64_t>((a.cache.block_size + kTile - 1) / kTile * kTile, kTile, kMaxSpan)
          : kTile;
  int cur = 0;
  // The next span's pointers are gathered, and its first rows prefetched, while the current one
  // is computed.
  auto gather = [&](int64_t from, int buf) -> int32_t {
    if (from >= key_end) return 0;
    const auto count = static_cast<int32_t>(std::min<int64_t>(span, key_end - from));
    GatherTile(a, rs, table, from, count, kp[buf], vp[buf], keys[buf]);
    return count;
  };
  // Rows of this head in (token, query head) order, two at a time so that each K and V vector
  // read serves both.
  const int32_t head_rows = rs.num_q * G;
  // The prefetch of what comes next is spread over the head's work: with two pairs or more, the
  // first pair's scores prefetch its K rows and the second pair's its V rows; with one pair,
  // that pair's scores prefetch both. Measured (bench_attention_cpu, bf16 d128, group 4, 1
  // thread): one burst of K and V during the first pair took 1.25-1.3x the time of the split,
  // for paged and contiguous alike, and left block_size 32 paged 8-15% behind contiguous.
  const bool split_prefetch = head_rows > 2;
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(T));
  // What comes next is prefetched one of two ways. Blocks longer than a tile (and the
  // contiguous view) are read in address order already, a head's run at a time, and each tile
  // prefetches the rows of the tile read next (non-temporal). Blocks no longer than a tile make a
  // span of several blocks read head by head, jumping between the blocks every block_size rows;
  // then, when each block is a long run (kStreamMinRunBytes: all heads of the item, K and V
  // together if adjacent) of short rows (kStreamMaxRowBytes), the next span is streamed block by
  // block in address order instead (PrefetchStream). Measured (bench_attention_cpu, 8 kv heads,
  // paged, the two ways side by side in one process): bf16 d128 block_size 32 5-7% faster (both
  // placements, 1 and 2 threads), fp32 d64 block_size 16 interleaved 2-5% faster, bf16 d128
  // block_size 16 interleaved level (+-1%); where the rules keep the rows, the stream was 2-10%
  // slower (32 KiB runs: block_size 8, or 16 with separate K and V pools; 512-byte rows).
  const KVLayerView& cv = a.cache;
  const int64_t kind_block = cv.block_size * static_cast<int64_t>(cv.num_kv_heads) * D;
  // Addresses compared as integers: K and V may be separate allocations.
  const bool kv_adjacent = reinterpret_cast<uintptr_t>(cv.v) - reinterpret_cast<uintptr_t>(cv.k) ==
                               static_cast<uintptr_t>(kind_block) * sizeof(T) &&
                           cv.block_stride == 2 * kind_block;
  const int64_t run_bytes = cv.block_size * rs.num_kv * row_bytes * (kv_adjacent ? 2 : 1);
  const bool use_stream =
      cv.block_size <= kTile && row_bytes <= kStreamMaxRowBytes && run_bytes >= kStreamMinRunBytes;
  int32_t first_stream_head = 0;  // heads before it do not step the stream
  // With the stream, rows are prefetched only in an item's first span (nothing streamed it):
  // each head prefetches the next head's rows, as without the stream. Measured (interleaved,
  // 2 threads, paged / contiguous): fp32 d64 block_size 16 at 2048 x 1 (8 key partitions of 4
  // spans, a quarter of them cold without it) 1.03-1.065 -> 1.004; bf16 d128 8k x 1 and
  // 32k x 1 0.98.
  // On a thread team the stream fills L2 only (T1) and every span keeps the row prefetch (the
  // next head's rows into L1). Measured (2-core Zen 5 VM, interleaved, paged / contiguous, the
  // variants alternating over 20 rounds; the guest's memory ran in two states, a memcpy
  // alongside reading ~20 or 30-35 GB/s): T0 stream alone, 256 KiB ahead: worst 1.059 (~20)
  // and 1.017 (30-35); 128 KiB ahead: 1.014 and 1.127; T1 stream + rows: 1.026 and 1.021. On
  // one thread T1 + rows was 4-5% slower on bf16 d128 (4% faster on fp32 d64), so one thread
  // keeps T0 alone.
  bool tile_rows = true;
  PrefetchStream stream;
  stream.to_l2 = a.team;
  // The stream of the K and V rows of keys [0, count) (row pointers of head 0 of the set kb/vb,
  // flat keys kk) for every kv head of the set, spread over `steps` score-loop steps.
  auto build_stream = [&](const T* const* kb, const T* const* vb, const int64_t* kk, int32_t count,
                          int64_t steps) {
    stream.reset();
    const bool head_runs = cv.token_stride == D;  // HND: a head's rows in a block are one run
    int32_t i0 = 0;                               // first key of the current block
    for (int32_t i = 1; i <= count; ++i) {
      if (i < count && kk[i] == kk[i - 1] + 1 &&
          kk[i] / cv.block_size == kk[i - 1] / cv.block_size) {
        continue;
      }
      for (const T* const* base : {kb, vb}) {
        if (head_runs) {
          for (int32_t hh = 0; hh < rs.num_kv; ++hh) {
            stream.add(base[i0] + hh * head_stride, base[i - 1] + hh * head_stride + D);
          }
        } else {  // NHD: the rows of keys i0..i-1 of all heads of the set are one run
          stream.add(base[i0], base[i - 1] + (rs.num_kv - 1) * head_stride + D);
        }
      }
      i0 = i;
    }
    // Spread over the score loops of the last `heads` heads of the current span, so that no
    // more than kStreamAheadBytes are requested ahead of the head being read.
    const int64_t ahead_lines = kStreamAheadBytes / 64;
    const int32_t heads = static_cast<int32_t>(
        std::clamp<int64_t>((rs.num_kv * ahead_lines + stream.total_lines - 1) /
                                std::max<int64_t>(stream.total_lines, 1),
                            1, rs.num_kv));
    first_stream_head = rs.num_kv - heads;
    steps = steps / rs.num_kv * heads;
    stream.lines_per_step = (stream.total_lines + steps - 1) / std::max<int64_t>(steps, 1);
  };
  const int32_t prefetching_pairs = split_prefetch ? 2 : 1;

  // One tile of head hh of the set: scores, mask, online softmax, values. The first rows
  // prefetch the tile that comes next (pk/pv + poff, pn keys), spread over their key loops
  // rather than in one burst that would stall on the miss buffers.
  auto attend_tile = [&](int32_t hh, const T* const* kt, const T* const* vt, const int64_t* kk,
                         int32_t n, const T* const* pk, const T* const* pv, int64_t poff,
                         int32_t pn) {
    const int64_t off = static_cast<int64_t>(hh) * head_stride;
    for (int32_t idx = 0; idx < head_rows; idx += 2) {
      const bool pair = idx + 1 < head_rows;
      int32_t rows[2];
      int32_t toks[2];
      for (int32_t u = 0; u < 2; ++u) {
        toks[u] = (idx + u) / G;
        rows[u] = toks[u] * RT + hh * G + (idx + u) % G;
      }
      float* s0 = sc + rows[0] * ts;
      float* s1 = sc + rows[1] * ts;
      const bool prefetch_k = idx == 0;
      const bool prefetch_v = split_prefetch ? idx == 2 : idx == 0;
      PrefetchPlan<T> pf{prefetch_k ? pk : nullptr, prefetch_v ? pv : nullptr, poff,
                         (prefetch_k || prefetch_v) && tile_rows ? pn : 0, row_bytes};
      if (use_stream) {
        pf.stream = &stream;
        pf.stream_n = (prefetch_k || prefetch_v) && hh >= first_stream_head ? n : 0;
      }
      if (pair) {
        TileScores2(df, qs + rows[0] * D, qs + rows[1] * D, kt, off, n, D, s0, s1, pf);
      } else {
        TileScores(df, qs + rows[0] * D, kt, off, n, D, s0, pf);
      }
      bool active[2] = {false, false};
      for (int32_t u = 0; u < (pair ? 2 : 1); ++u) {
        const int32_t r = rows[u];
        float* s = sc + r * ts;
        for (int32_t i = n; i < ts; ++i) s[i] = kNegInf;  // padding lanes: exp gives 0
        if (masked) {
          const int64_t pos = rs.first_pos + toks[u];
          const int64_t lo = window_lo(pos, a.window_left);
          const int64_t se = sink_end(lo, a.window_left, a.sink_tokens);
          if (kk[n - 1] > pos || kk[0] < lo) {  // keys ascend: else the whole tile is visible
            for (int32_t i = 0; i < n; ++i) {
              if (kk[i] > pos || (kk[i] < lo && kk[i] >= se)) s[i] = kNegInf;
            }
          }
        }
        active[u] = OnlineSoftmax(df, s, ts, D, m + r, l + r, acc + r * D);
      }
      if (active[0] && active[1]) {
        TileAccumulate2(df, s0, s1, vt, off, n, D, acc + rows[0] * D, acc + rows[1] * D);
      } else {
        for (int32_t u = 0; u < 2; ++u) {
          if (active[u]) TileAccumulate(df, sc + rows[u] * ts, vt, off, n, D, acc + rows[u] * D);
        }
      }
    }
  };

  int32_t n = gather(key_begin, 0);  // keys in the current span
  for (int64_t j = key_begin; j < key_end;) {
    const int32_t nn = gather(j + n, cur ^ 1);
    if (use_stream) {  // one step per 4 keys of each prefetching pair of every head
      build_stream(kp[cur ^ 1], vp[cur ^ 1], keys[cur ^ 1], nn,
                   static_cast<int64_t>(rs.num_kv) * ((n + 3) / 4) * prefetching_pairs);
    }
    const T* const* ks = kp[cur];
    const T* const* vs = vp[cur];
    for (int32_t hh = 0; hh < rs.num_kv; ++hh) {
      const int64_t off = static_cast<int64_t>(hh) * head_stride;
      tile_rows = !use_stream || a.team || (j == key_begin && hh + 1 < rs.num_kv);
      for (int32_t t0 = 0; t0 < n; t0 += kTile) {
        const int32_t tn = std::min(kTile, n - t0);
        // What comes next: this head's next tile of the span, else the next head's first tile,
        // else head 0's first tile of the next span.
        if (t0 + kTile < n) {
          attend_tile(hh, ks + t0, vs + t0, keys[cur] + t0, tn, ks + t0 + kTile, vs + t0 + kTile,
                      off, std::min(kTile, n - t0 - kTile));
        } else if (hh + 1 < rs.num_kv) {
          attend_tile(hh, ks + t0, vs + t0, keys[cur] + t0, tn, ks, vs, off + head_stride,
                      std::min(kTile, n));
        } else {
          attend_tile(hh, ks + t0, vs + t0, keys[cur] + t0, tn, kp[cur ^ 1], vp[cur ^ 1], 0,
                      std::min(kTile, nn));
        }
      }
    }
    if (nn == 0) break;
    j += n;
    n = nn;
    cur ^= 1;
  }

  if (rs.partial_offset < 0) {
    for (int32_t r = 0; r < R; ++r) {
      const int64_t head = static_cast<int64_t>(rs.kv_head) * G + r % RT;
      float* o = a.out + ((rs.q_row + r / RT) * a.num_heads + head) * D;
      const float* ar = acc + r * D;
      // A row that saw no key (padding row, empty window) outputs zeros, as the plain kernel.
      const V vinv = hn::Set(df, l[r] == 0.0f ? 0.0f : 1.0f / l[r]);
      for (int64_t d = 0; d < D; d += L) {
        hn::StoreU(hn::Mul(hn::LoadU(df, ar + d), vinv), df, o + d);
      }
    }
  } else {
    for (int32_t r = 0; r < R; ++r) {
      float* dst = a.partial + rs.partial_offset + (static_cast<int64_t>(part) * R + r) * (D + 2);
      dst[0] = m[r];
      dst[1] = l[r];
      std::copy(acc + r * D, acc + (r + 1) * D, dst + 2);
    }
  }
}

template <typename T>
void AttendTyped(const KernelArgs& a, const RowSet& rs, int32_t part) {
  // The widest vector that divides head_dim (listed once here; see attention_fast.hpp).
  const hn::ScalableTag<float> df;
  if (a.head_dim % static_cast<int32_t>(hn::Lanes(df)) == 0) return AttendImpl<T>(df, a, rs, part);
  const hn::CappedTag<float, 4> d4;
  if (a.head_dim % static_cast<int32_t>(hn::Lanes(d4)) == 0) return AttendImpl<T>(d4, a, rs, part);
  const hn::CappedTag<float, 1> d1;
  AttendImpl<T>(d1, a, rs, part);
}

void AttendPart(const KernelArgs& a, const RowSet& rs, int32_t part) {
  switch (a.cache.dtype) {
    case DType::kF32:
      return AttendTyped<float>(a, rs, part);
    case DType::kF16:
      return AttendTyped<hwy::float16_t>(a, rs, part);
    case DType::kBF16:
      return AttendTyped<hwy::bfloat16_t>(a, rs, part);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace pagedkv::detail::fast
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedkv::detail {
namespace fast {
HWY_EXPORT(AttendPart);

/// Merges the partitions of one row: o = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p.
void merge_row(const float* parts, int32_t num_parts, int64_t stride, int32_t head_dim,
               float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t p = 0; p < num_parts; ++p) mx = std::max(mx, parts[p * stride]);
  std::fill(out, out + head_dim, 0.0f);
  if (mx == -std::numeric_limits<float>::infinity()) return;  // no visible key at all
  float sum = 0.0f;
  for (int32_t p = 0; p < num_parts; ++p) {
    const float* src = parts + p * stride;
    if (src[1] == 0.0f) continue;
    const float w = std::exp(src[0] - mx);
    sum += w * src[1];
    for (int32_t d = 0; d < head_dim; ++d) out[d] += w * src[2 + d];
  }
  const float inv = 1.0f / sum;
  for (int32_t d = 0; d < head_dim; ++d) out[d] *= inv;
}

}  // namespace fast

namespace {

/// KV heads per decode work item: by default as many as kMaxRows query rows allow. A block holds
/// every kv head's rows; reading one head at a time turns each block into short scattered runs
/// (HND: block_size x head_dim elements) that the hardware prefetcher never locks onto, while
/// an item over all heads reads each block in one sweep. Measured (bench_attention_cpu, d128,
/// context 4k, batch 8, 1 thread, paged / contiguous time): one head per item took 1.16-1.25
/// (bf16, block_size 8 and 16) where all heads took 1.05-1.13; at block_size 128 one head took
/// 1.07 and all heads 1.01; the contiguous peer itself ran 3% faster with all heads.
int32_t heads_per_item(const AttentionParams& params, const FastAttentionConfig& config) {
  const int32_t H = params.num_kv_heads;
  const int32_t G = params.num_heads / H;
  int32_t hg = config.heads_per_item > 0 ? config.heads_per_item : std::max(1, fast::kMaxRows / G);
  hg = std::clamp(hg, 1, H);
  while (H % hg != 0) --hg;  // equal groups
  return hg;
}

}  // namespace

int32_t fast_attention_max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

const char* fast_attention_target() {
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(targets & -targets);  // lowest bit = best target
}

namespace {
/// Compiled-and-supported targets, captured before any test hook narrows them.
int64_t available_targets() {
  static const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return targets;
}
}  // namespace

std::vector<std::string> fast_attention_targets() {
  std::vector<std::string> names;
  for (int64_t t = available_targets(); t != 0; t &= t - 1) {
    names.emplace_back(hwy::TargetName(t & -t));
  }
  return names;
}

bool force_fast_attention_target(std::string_view name) {
  int64_t chosen = 0;
  if (!name.empty()) {
    for (int64_t t = available_targets(); t != 0; t &= t - 1) {
      if (name == hwy::TargetName(t & -t)) chosen = t & -t;
    }
    if (chosen == 0) return false;
  }
  available_targets();                      // capture the full set before narrowing it
  hwy::SetSupportedTargetsForTest(chosen);  // 0 = back to what the CPU supports
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return true;
}

void fast_paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                                  const BlockTableView& tables,
                                  std::span<const int32_t> query_start, std::span<const float> q,
                                  std::span<float> out, const FastAttentionConfig& config) {
  using fast::RowSet;
  fast::KernelArgs a;
  a.cache = cache;
  a.block_tables = tables.block_tables;
  a.max_blocks_per_seq = tables.max_blocks_per_seq;
  a.q = q.data();
  a.out = out.data();
  a.num_heads = params.num_heads;
  a.group = params.num_heads / params.num_kv_heads;
  a.head_dim = params.head_dim;
  a.scale = params.softmax_scale();
  a.window_left = params.window_left;
  a.sink_tokens = params.sink_tokens;
  const int32_t G = a.group;
  const int32_t H = params.num_kv_heads;
  const int32_t heads_per_set = heads_per_item(params, config);

  // Row sets: (sequence, query tile, kv heads), with the union of their rows' visible keys.
  std::vector<RowSet> sets;
  int64_t total_work = 0;
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    const int64_t n = query_start[i + 1] - query_start[i];
    const int64_t ctx = tables.context_lens[i];
    // Decode rows group kv heads (one pass over whole blocks); prefill rows group query tokens
    // instead (each K/V tile then serves up to 32 / group queries).
    const int32_t hg = n == 1 ? heads_per_set : 1;
    const int32_t q_per_set = std::max(1, fast::kMaxRows / (G * hg));
    for (int64_t t0 = 0; t0 < n; t0 += q_per_set) {
      RowSet rs;
      rs.seq = i;
      rs.num_kv = hg;
      rs.num_q = static_cast<int32_t>(std::min<int64_t>(q_per_set, n - t0));
      rs.q_row = query_start[i] + t0;
      rs.first_pos = ctx - n + t0;
      const int64_t last_pos = rs.first_pos + rs.num_q - 1;
      const int64_t lo = fast::window_lo(rs.first_pos, a.window_left);
      const int64_t se =
          fast::sink_end(fast::window_lo(last_pos, a.window_left), a.window_left, a.sink_tokens);
      if (se >= lo) {  // sinks and window touch: one range
        rs.sink_len = 0;
        rs.main_begin = 0;
      } else {
        rs.sink_len = se;
        rs.main_begin = lo;
      }
      rs.main_end = std::max(rs.main_begin, last_pos + 1);
      for (int32_t h = 0; h < H; h += hg) {
        rs.kv_head = h;
        sets.push_back(rs);
        total_work += rs.num_keys() * rs.num_rows(G);
      }
    }
  }

  const int32_t threads =
      config.num_threads > 0 ? config.num_threads : fast_attention_max_threads();
  // Target work per item: the batch's work spread over kItemsPerThread items per thread.
  const int64_t item_work =
      threads > 1 ? std::max<int64_t>(1, total_work / (threads * fast::kItemsPerThread))
                  : std::numeric_limits<int64_t>::max();
  int64_t partial_floats = 0;
  struct Item {
    int32_t set;
    int32_t part;
  };
  std::vector<Item> items;
  items.reserve(sets.size());
  for (size_t s = 0; s < sets.size(); ++s) {
    RowSet& rs = sets[s];
    const int64_t keys = rs.num_keys();
    const int32_t rows = rs.num_rows(G);
    int64_t part_keys = keys;
    if (config.partition_keys > 0) {
      part_keys = config.partition_keys;
    } else if (keys * rows > item_work) {
      part_keys = std::max(fast::kMinPartitionKeys, item_work / rows);
    }
    part_keys = std::max<int64_t>(1, std::min(part_keys, keys));
    // A row set with no visible key still gets one item: it writes the zero rows.
    rs.num_parts = static_cast<int32_t>(std::max<int64_t>(1, (keys + part_keys - 1) / part_keys));
    if (rs.num_parts > 1) {
      // Balance the parts and keep them whole tiles.
      part_keys = (keys + rs.num_parts - 1) / rs.num_parts;
      part_keys = (part_keys + fast::kTile - 1) / fast::kTile * fast::kTile;
      rs.num_parts = static_cast<int32_t>((keys + part_keys - 1) / part_keys);
    }
    rs.part_keys = std::max<int64_t>(1, part_keys);
    if (rs.num_parts > 1) {
      rs.partial_offset = partial_floats;
      partial_floats += static_cast<int64_t>(rs.num_parts) * rows * (a.head_dim + 2);
    }
    for (int32_t p = 0; p < rs.num_parts; ++p) items.push_back({static_cast<int32_t>(s), p});
  }

  thread_local std::vector<float> partial;
  if (partial_floats > 0) {
    if (partial.size() < static_cast<size_t>(partial_floats)) {
      partial.resize(static_cast<size_t>(partial_floats));
    }
    a.partial = partial.data();
  }

  const auto num_items = static_cast<int64_t>(items.size());
  [[maybe_unused]] const bool parallel =
      threads > 1 && num_items > 1 && total_work >= fast::kMinParallelWork;
#if defined(_OPENMP)
  a.team = parallel;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (parallel)
#endif
  for (int64_t w = 0; w < num_items; ++w) {
    HWY_DYNAMIC_DISPATCH(fast::AttendPart)(a, sets[items[w].set], items[w].part);
  }

  if (partial_floats == 0) return;
  const auto num_sets = static_cast<int64_t>(sets.size());
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads) if (parallel)
#endif
  for (int64_t s = 0; s < num_sets; ++s) {
    const RowSet& rs = sets[s];
    if (rs.partial_offset < 0) continue;
    const int32_t rows = rs.num_rows(G);
    const int32_t rt = rs.rows_per_token(G);
    const int64_t stride = static_cast<int64_t>(rows) * (a.head_dim + 2);
    for (int32_t r = 0; r < rows; ++r) {
      const int64_t head = static_cast<int64_t>(rs.kv_head) * G + r % rt;
      fast::merge_row(a.partial + rs.partial_offset + static_cast<int64_t>(r) * (a.head_dim + 2),
                      rs.num_parts, stride, a.head_dim,
                      a.out + ((rs.q_row + r / rt) * a.num_heads + head) * a.head_dim);
    }
  }
}

}  // namespace pagedkv::detail
#endif  // HWY_ONCE
