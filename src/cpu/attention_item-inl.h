// Per-target code of the fast CPU kernel (attention_hwy.cpp) for one work item: one partition of
// one row set (see RowSet), attended span by span and tile by tile with online softmax, what
// comes next prefetched while a tile is computed. Highway's "-inl.h" pattern: re-included once
// per target by foreach_target.h through attention_hwy.cpp, so the guard below toggles with
// HWY_TARGET_TOGGLE instead of #pragma once.

#if defined(PAGEDKV_CPU_ATTENTION_ITEM_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDKV_CPU_ATTENTION_ITEM_INL_H_
#undef PAGEDKV_CPU_ATTENTION_ITEM_INL_H_
#else
#define PAGEDKV_CPU_ATTENTION_ITEM_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/attention_prefetch-inl.h"
#include "cpu/attention_tile-inl.h"
#include "cpu/attention_work.hpp"

HWY_BEFORE_NAMESPACE();
namespace pagedkv::detail::fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Per-thread scratch that grows to the largest item seen and is then reused (no allocation
/// per item after warm-up).
inline float* ThreadScratch(size_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

/// What the tiles of one item share: its geometry, scratch rows, gathered spans and prefetch
/// state. InitItem and PlanPrefetch set every field once per item; nothing is zeroed up front
/// (the span arrays are written by GatherSpan before they are read), as for the locals they were.
template <typename T>
struct ItemState {
  ItemState(const KernelArgs& args, const RowSet& rows) : a(args), rs(rows) {}

  const KernelArgs& a;
  const RowSet& rs;
  int64_t D;            // head_dim
  int32_t G;            // query heads per kv head
  int32_t RT;           // rows per token
  int32_t R;            // rows
  int32_t head_rows;    // rows of one kv head, (token, query head) order: num_q * G
  int64_t ts;           // score row stride, whole vectors
  int64_t head_stride;  // elements between the kv heads of a set
  int64_t row_bytes;    // bytes of one K or V row
  float* qs;            // [R, D] scaled q
  float* acc;           // [R, D]
  float* sc;            // [R, ts] scores, then probabilities
  float* m;             // [R] running max
  float* l;             // [R] running sum
  const int32_t* table;
  int64_t key_begin;  // flat keys [key_begin, key_end) of this partition
  int64_t key_end;
  int64_t span;  // keys gathered at once
  bool masked;   // rows of several tokens: per-row causal / window mask
  bool split_prefetch;
  bool use_stream;
  bool tile_rows = true;          // the current head's tiles prefetch rows
  int32_t first_stream_head = 0;  // heads before it do not step the stream
  // Row pointers of the first kv head of the set (head hh adds hh * head_stride) and flat keys
  // of the current span and the next one.
  const T* kp[2][kMaxSpan];
  const T* vp[2][kMaxSpan];
  int64_t keys[2][kMaxSpan];
  PrefetchStream stream;
};

/// Geometry, scratch rows (scaled queries, zero accumulators and sums, -inf maxima), key range
/// and span length of item `part`.
template <typename T, class DF>
HWY_INLINE void InitItem(DF df, ItemState<T>& st, int32_t part) {
  using V = hn::Vec<DF>;
  const KernelArgs& a = st.a;
  const RowSet& rs = st.rs;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t D = st.D = a.head_dim;
  const int32_t G = st.G = a.group;
  const int32_t RT = st.RT = rs.rows_per_token(G);
  const int32_t R = st.R = rs.num_rows(G);
  const int64_t ts = st.ts = (kTile + L - 1) / L * L;
  st.head_stride = a.cache.head_stride;

  float* qs = st.qs = ThreadScratch(static_cast<size_t>(R * (2 * D + ts + 2)));
  st.acc = qs + R * D;
  st.sc = st.acc + R * D;
  st.m = st.sc + R * ts;
  st.l = st.m + R;
  // The softmax scale and each kv head's K scale (8-bit formats; 1 otherwise) fold into q.
  for (int32_t t = 0; t < rs.num_q; ++t) {
    const float* src =
        a.q + ((rs.q_row + t) * a.num_heads + static_cast<int64_t>(rs.kv_head) * G) * D;
    float* dst = qs + static_cast<int64_t>(t) * RT * D;
    for (int32_t h = 0; h < rs.num_kv; ++h) {
      const V vscale = hn::Set(df, a.scale * a.cache.key_scale(rs.kv_head + h) * kLoadFactor<T>);
      for (int64_t i = h * G * D; i < (h + 1) * G * D; i += L) {
        hn::StoreU(hn::Mul(hn::LoadU(df, src + i), vscale), df, dst + i);
      }
    }
  }
  std::fill(st.acc, st.acc + R * D, 0.0f);
  std::fill(st.m, st.m + R, -std::numeric_limits<float>::infinity());
  std::fill(st.l, st.l + R, 0.0f);

  st.table = a.block_tables + static_cast<int64_t>(rs.seq) * a.max_blocks_per_seq;
  st.key_begin = static_cast<int64_t>(part) * rs.part_keys;
  st.key_end = std::min(rs.num_keys(), st.key_begin + rs.part_keys);
  // Rows of one query token share their visible set, which is exactly the row set's key set;
  // several tokens (prefill) need a per-row causal / window mask.
  st.masked = rs.num_q > 1;
  // Keys are gathered a span at a time and attended a tile (kTile keys) at a time. A span is one
  // tile, except for a set of several kv heads over blocks longer than a tile: then it covers
  // whole blocks (up to kMaxSpan keys) and each head goes through all tiles of the span before
  // the next head, so K (and V) is read in address order across each block (head 0's run, head
  // 1's run, ...): one sequential stream per block instead of a jump per tile.
  st.span = rs.num_kv > 1 ? std::clamp<int64_t>((a.cache.block_size + kTile - 1) / kTile * kTile,
                                                kTile, kMaxSpan)
                          : kTile;
  // Rows of this head in (token, query head) order, two at a time so that each K and V vector
  // read serves both.
  st.head_rows = rs.num_q * G;
}

/// Chooses how what comes next is prefetched (split_prefetch, use_stream).
template <typename T>
HWY_INLINE void PlanPrefetch(ItemState<T>& st) {
  // The prefetch of what comes next is spread over the head's work: with two pairs or more, the
  // first pair's scores prefetch its K rows and the second pair's its V rows; with one pair,
  // that pair's scores prefetch both. Measured (bench_attention_cpu, bf16 d128, group 4, 1
  // thread): one burst of K and V during the first pair took 1.25-1.3x the time of the split,
  // for paged and contiguous alike, and left block_size 32 paged 8-15% behind contiguous.
  st.split_prefetch = st.head_rows > 2;
  const int64_t row_bytes = st.row_bytes = st.D * static_cast<int64_t>(sizeof(T));
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
  const KVLayerView& cv = st.a.cache;
  const int64_t kind_block = cv.block_size * static_cast<int64_t>(cv.num_kv_heads) * st.D;
  // Addresses compared as integers: K and V may be separate allocations.
  const bool kv_adjacent = reinterpret_cast<uintptr_t>(cv.v) - reinterpret_cast<uintptr_t>(cv.k) ==
                               static_cast<uintptr_t>(kind_block) * sizeof(T) &&
                           cv.block_stride == 2 * kind_block;
  const int64_t run_bytes = cv.block_size * st.rs.num_kv * row_bytes * (kv_adjacent ? 2 : 1);
  st.use_stream =
      cv.block_size <= kTile && row_bytes <= kStreamMaxRowBytes && run_bytes >= kStreamMinRunBytes;
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
  st.stream.to_l2 = st.a.team;
}

/// Gathers the row pointers of the span starting at flat key `from` into buffer `buf`; returns
/// its key count (0 past the partition). The next span is gathered, and its first rows
/// prefetched, while the current one is computed.
template <typename T>
HWY_INLINE int32_t GatherSpan(ItemState<T>& st, int64_t from, int buf) {
  if (from >= st.key_end) return 0;
  const auto count = static_cast<int32_t>(std::min<int64_t>(st.span, st.key_end - from));
  GatherTile(st.a, st.rs, st.table, from, count, st.kp[buf], st.vp[buf], st.keys[buf]);
  return count;
}

/// Builds the stream of the K and V rows of keys [0, count) (row pointers of head 0 of the set
/// kb/vb, flat keys kk) for every kv head of the set, spread over `steps` score-loop steps.
template <typename T>
HWY_INLINE void BuildStream(ItemState<T>& st, const T* const* kb, const T* const* vb,
                            const int64_t* kk, int32_t count, int64_t steps) {
  const KVLayerView& cv = st.a.cache;
  const int32_t num_kv = st.rs.num_kv;
  const int64_t head_stride = st.head_stride;
  const int64_t D = st.D;
  PrefetchStream& stream = st.stream;
  stream.reset();
  const bool head_runs = cv.token_stride == D;  // HND: a head's rows in a block are one run
  int32_t i0 = 0;                               // first key of the current block
  for (int32_t i = 1; i <= count; ++i) {
    if (i < count && kk[i] == kk[i - 1] + 1 && kk[i] / cv.block_size == kk[i - 1] / cv.block_size) {
      continue;
    }
    for (const T* const* base : {kb, vb}) {
      if (head_runs) {
        for (int32_t hh = 0; hh < num_kv; ++hh) {
          stream.add(base[i0] + hh * head_stride, base[i - 1] + hh * head_stride + D);
        }
      } else {  // NHD: the rows of keys i0..i-1 of all heads of the set are one run
        stream.add(base[i0], base[i - 1] + (num_kv - 1) * head_stride + D);
      }
    }
    i0 = i;
  }
  // Spread over the score loops of the last `heads` heads of the current span, so that no
  // more than kStreamAheadBytes are requested ahead of the head being read.
  const int64_t ahead_lines = kStreamAheadBytes / 64;
  const int32_t heads = static_cast<int32_t>(std::clamp<int64_t>(
      (num_kv * ahead_lines + stream.total_lines - 1) / std::max<int64_t>(stream.total_lines, 1), 1,
      num_kv));
  st.first_stream_head = num_kv - heads;
  steps = steps / num_kv * heads;
  stream.lines_per_step = (stream.total_lines + steps - 1) / std::max<int64_t>(steps, 1);
}

/// Scores s [ts] of one row (token `tok` of the set) over the tile's n keys kk: padding lanes
/// and, for prefill rows, the keys the row does not see become -inf (exp gives 0).
template <typename T>
HWY_INLINE void MaskScores(const ItemState<T>& st, float* HWY_RESTRICT s, int64_t ts,
                           const int64_t* kk, int32_t n, int32_t tok) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int32_t i = n; i < ts; ++i) s[i] = kNegInf;
  if (!st.masked) return;
  const int64_t pos = st.rs.first_pos + tok;
  const int64_t lo = window_lo(pos, st.a);
  const int64_t se = sink_end(lo, st.a);
  if (kk[n - 1] > pos || kk[0] < lo) {  // keys ascend: else the whole tile is visible
    for (int32_t i = 0; i < n; ++i) {
      if (kk[i] > pos || (kk[i] < lo && kk[i] >= se)) s[i] = kNegInf;
    }
  }
}

/// One tile of head hh of the set: scores, mask, online softmax, values, for the head's rows
/// two at a time. The first rows prefetch the tile that comes next (pk/pv + poff, pn keys),
/// spread over their key loops rather than in one burst that would stall on the miss buffers.
/// Out of line, as the closure it replaces was (GCC 12, AVX2): a call costs nothing next to a
/// tile's work, where inlining the three call sites of AttendImpl's span loop would triple it.
template <typename T, class DF>
HWY_NOINLINE void AttendTile(DF df, ItemState<T>& st, int32_t hh, const T* const* kt,
                             const T* const* vt, const int64_t* kk, int32_t n, const T* const* pk,
                             const T* const* pv, int64_t poff, int32_t pn) {
  const int64_t ts = st.ts;
  const int64_t D = st.D;
  const int32_t G = st.G;
  float* sc = st.sc;
  float* acc = st.acc;
  const int64_t off = static_cast<int64_t>(hh) * st.head_stride;
  for (int32_t idx = 0; idx < st.head_rows; idx += 2) {
    const bool pair = idx + 1 < st.head_rows;
    int32_t rows[2];
    int32_t toks[2];
    for (int32_t u = 0; u < 2; ++u) {
      toks[u] = (idx + u) / G;
      rows[u] = toks[u] * st.RT + hh * G + (idx + u) % G;
    }
    float* s0 = sc + rows[0] * ts;
    float* s1 = sc + rows[1] * ts;
    const bool prefetch_k = idx == 0;
    const bool prefetch_v = st.split_prefetch ? idx == 2 : idx == 0;
    PrefetchPlan<T> pf{prefetch_k ? pk : nullptr, prefetch_v ? pv : nullptr, poff,
                       (prefetch_k || prefetch_v) && st.tile_rows ? pn : 0, st.row_bytes};
    if (st.use_stream) {
      pf.stream = &st.stream;
      pf.stream_n = (prefetch_k || prefetch_v) && hh >= st.first_stream_head ? n : 0;
    }
    if (pair) {
      TileScores2(df, st.qs + rows[0] * D, st.qs + rows[1] * D, kt, off, n, D, s0, s1, pf);
    } else {
      TileScores(df, st.qs + rows[0] * D, kt, off, n, D, s0, pf);
    }
    bool active[2] = {false, false};
    for (int32_t u = 0; u < (pair ? 2 : 1); ++u) {
      const int32_t r = rows[u];
      float* s = sc + r * ts;
      MaskScores(st, s, ts, kk, n, toks[u]);
      active[u] = OnlineSoftmax(df, s, ts, D, st.m + r, st.l + r, acc + r * D);
    }
    if (active[0] && active[1]) {
      TileAccumulate2(df, s0, s1, vt, off, n, D, acc + rows[0] * D, acc + rows[1] * D);
    } else {
      for (int32_t u = 0; u < 2; ++u) {
        if (active[u]) TileAccumulate(df, sc + rows[u] * ts, vt, off, n, D, acc + rows[u] * D);
      }
    }
  }
}

/// Writes the item's rows: normalized to `out`, or (m, l, acc) to its partial slot.
template <typename T, class DF>
HWY_INLINE void StoreItem(DF df, const ItemState<T>& st, int32_t part) {
  using V = hn::Vec<DF>;
  const KernelArgs& a = st.a;
  const RowSet& rs = st.rs;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t D = st.D;
  const int32_t R = st.R;
  // Each kv head's V scale (8-bit formats; 1 otherwise) folds into the output, or into the
  // partial accumulator, which the merge combines linearly.
  const auto v_factor = [&](int32_t r) {
    return a.cache.value_scale(rs.kv_head + (r % st.RT) / st.G) * kLoadFactor<T>;
  };
  if (rs.partial_offset < 0) {
    for (int32_t r = 0; r < R; ++r) {
      const int64_t head = static_cast<int64_t>(rs.kv_head) * st.G + r % st.RT;
      float* o = a.out + ((rs.q_row + r / st.RT) * a.num_heads + head) * D;
      const float* ar = st.acc + r * D;
      // A row that saw no key (padding row, empty window) outputs zeros, as the plain kernel.
      const V vinv = hn::Set(df, st.l[r] == 0.0f ? 0.0f : v_factor(r) / st.l[r]);
      for (int64_t d = 0; d < D; d += L) {
        hn::StoreU(hn::Mul(hn::LoadU(df, ar + d), vinv), df, o + d);
      }
    }
  } else {
    for (int32_t r = 0; r < R; ++r) {
      float* dst = a.partial + rs.partial_offset + (static_cast<int64_t>(part) * R + r) * (D + 2);
      dst[0] = st.m[r];
      dst[1] = st.l[r];
      const float f = v_factor(r);
      for (int64_t d = 0; d < D; ++d) dst[2 + d] = st.acc[r * D + d] * f;
    }
  }
}

/// One partition of one row set (see RowSet for the row order).
template <typename T, class DF>
void AttendImpl(DF df, const KernelArgs& a, const RowSet& rs, int32_t part) {
  ItemState<T> st(a, rs);
  InitItem(df, st, part);
  PlanPrefetch(st);
  const int32_t num_kv = rs.num_kv;
  const int64_t head_stride = st.head_stride;
  const int32_t prefetching_pairs = st.split_prefetch ? 2 : 1;
  int cur = 0;
  int32_t n = GatherSpan(st, st.key_begin, 0);  // keys in the current span
  for (int64_t j = st.key_begin; j < st.key_end;) {
    const int32_t nn = GatherSpan(st, j + n, cur ^ 1);
    if (st.use_stream) {  // one step per 4 keys of each prefetching pair of every head
      BuildStream(st, st.kp[cur ^ 1], st.vp[cur ^ 1], st.keys[cur ^ 1], nn,
                  static_cast<int64_t>(num_kv) * ((n + 3) / 4) * prefetching_pairs);
    }
    const T* const* ks = st.kp[cur];
    const T* const* vs = st.vp[cur];
    const int64_t* kk = st.keys[cur];
    for (int32_t hh = 0; hh < num_kv; ++hh) {
      const int64_t off = static_cast<int64_t>(hh) * head_stride;
      st.tile_rows = !st.use_stream || a.team || (j == st.key_begin && hh + 1 < num_kv);
      for (int32_t t0 = 0; t0 < n; t0 += kTile) {
        const int32_t tn = std::min(kTile, n - t0);
        // What comes next: this head's next tile of the span, else the next head's first tile,
        // else head 0's first tile of the next span.
        if (t0 + kTile < n) {
          AttendTile(df, st, hh, ks + t0, vs + t0, kk + t0, tn, ks + t0 + kTile, vs + t0 + kTile,
                     off, std::min(kTile, n - t0 - kTile));
        } else if (hh + 1 < num_kv) {
          AttendTile(df, st, hh, ks + t0, vs + t0, kk + t0, tn, ks, vs, off + head_stride,
                     std::min(kTile, n));
        } else {
          AttendTile(df, st, hh, ks + t0, vs + t0, kk + t0, tn, st.kp[cur ^ 1], st.vp[cur ^ 1], 0,
                     std::min(kTile, nn));
        }
      }
    }
    if (nn == 0) break;
    j += n;
    n = nn;
    cur ^= 1;
  }
  StoreItem(df, st, part);
}

}  // namespace HWY_NAMESPACE
}  // namespace pagedkv::detail::fast
HWY_AFTER_NAMESPACE();
#endif  // PAGEDKV_CPU_ATTENTION_ITEM_INL_H_
