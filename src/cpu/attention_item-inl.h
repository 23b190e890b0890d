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
  int64_t row_bytes;    // bytes of one K or V row (what a row prefetch requests)
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
  // Row pointers of the first kv head of the set (head hh adds hh * head_stride) and flat keys
  // of the current span and the next one.
  const T* kp[2][kMaxSpan];
  const T* vp[2][kMaxSpan];
  int64_t keys[2][kMaxSpan];
};

/// Geometry, scratch rows (scaled queries, zero accumulators and sums, -inf maxima), key range
/// and span length of item `part`. The scaled queries are in the kernel's element order
/// (PairOrder: even/odd halves per 2L elements with kPaired).
template <bool kPaired, typename T, class DF>
HWY_INLINE void InitItem(DF df, ItemState<T>& st, int32_t part) {
  using V = hn::Vec<DF>;
  const KernelArgs& a = st.a;
  const RowSet& rs = st.rs;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t D = st.D = a.head_dim;
  const int32_t G = st.G = a.group;
  const int32_t RT = st.RT = rs.rows_per_token(G);
  const int32_t R = st.R = rs.num_rows(G);
  // Score rows of whole full-width vectors (OnlineSoftmax works at the target's full width).
  const auto LT = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const int64_t ts = st.ts = (kTile + LT - 1) / LT * LT;
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
      const float fs = a.scale * a.cache.key_scale(rs.kv_head + h) * kLoadFactor<T>;
      if constexpr (kPaired) {
        for (int64_t row = h * G * D; row < (h + 1) * G * D; row += D) {
          for (int64_t d = 0; d < D; ++d) dst[row + PairOrder<true>(d, L)] = src[row + d] * fs;
        }
      } else {
        const V vscale = hn::Set(df, fs);
        for (int64_t i = h * G * D; i < (h + 1) * G * D; i += L) {
          hn::StoreU(hn::Mul(hn::LoadU(df, src + i), vscale), df, dst + i);
        }
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
  // Rows of this head in (token, query head) order, kRowBlock at a time so that each K and V
  // vector read serves all of them.
  st.head_rows = rs.num_q * G;
  st.row_bytes = D * static_cast<int64_t>(sizeof(T));
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

/// One tile of head hh of the set: scores, mask, online softmax, values, for the head's rows a
/// block of up to kRowBlock at a time (each K and V vector loaded and widened once per block).
/// The first block prefetches the tile that comes next (pk/pv + poff, pn keys): K during its
/// scores, V during its accumulation, spread over their key loops rather than in one burst that
/// would stall on the miss buffers. Out of line: a call costs nothing next to a tile's work,
/// where inlining the three call sites of AttendImpl's span loop would triple it.
template <bool kPaired, typename T, class DF>
HWY_NOINLINE void AttendTile(DF df, ItemState<T>& st, int32_t hh, const T* const* kt,
                             const T* const* vt, const int64_t* kk, int32_t n, const T* const* pk,
                             const T* const* pv, int64_t poff, int32_t pn) {
  const int64_t ts = st.ts;
  const int64_t D = st.D;
  const int32_t G = st.G;
  const int64_t off = static_cast<int64_t>(hh) * st.head_stride;
  for (int32_t idx = 0; idx < st.head_rows; idx += kRowBlock) {
    const int32_t nr = std::min(kRowBlock, st.head_rows - idx);
    const float* q[kRowBlock];
    float* s[kRowBlock];
    float* acc[kRowBlock];
    int32_t rows[kRowBlock];
    for (int32_t u = 0; u < nr; ++u) {
      const int32_t tok = (idx + u) / G;
      rows[u] = tok * st.RT + hh * G + (idx + u) % G;
      q[u] = st.qs + rows[u] * D;
      s[u] = st.sc + rows[u] * ts;
      acc[u] = st.acc + rows[u] * D;
    }
    const bool first = idx == 0;
    const PrefetchPlan<T> pf_k{first ? pk : nullptr, nullptr, poff, first ? pn : 0, st.row_bytes};
    const PrefetchPlan<T> pf_v{nullptr, first ? pv : nullptr, poff, first ? pn : 0, st.row_bytes};
    // The first block of rows carries the prefetch.
    ForRowBlocks(df, nr, [&](auto rows, int32_t r0) {
      ScoresBlock<decltype(rows)::value, kPaired>(df, q + r0, kt, off, n, D, s + r0,
                                                  r0 == 0 ? pf_k : PrefetchPlan<T>{});
    });
    uint32_t active = 0;
    for (int32_t u = 0; u < nr; ++u) {
      MaskScores(st, s[u], ts, kk, n, (idx + u) / G);
      if (OnlineSoftmax(df, s[u], ts, D, st.m + rows[u], st.l + rows[u], acc[u])) {
        active |= 1u << u;
      }
    }
    if (active == (1u << nr) - 1) {
      ForRowBlocks(df, nr, [&](auto rows, int32_t r0) {
        AccumulateBlock<decltype(rows)::value, kPaired>(df, s + r0, vt, off, n, D, acc + r0,
                                                        r0 == 0 ? pf_v : PrefetchPlan<T>{});
      });
      continue;
    }
    // Rows without a visible key in this tile (prefill masks) hold -inf scores, not
    // probabilities: the others go one by one, the first of them carrying the prefetch.
    bool prefetched = false;
    for (int32_t u = 0; u < nr; ++u) {
      if ((active >> u & 1u) == 0) continue;
      AccumulateBlock<1, kPaired>(df, s + u, vt, off, n, D, acc + u,
                                  prefetched ? PrefetchPlan<T>{} : pf_v);
      prefetched = true;
    }
    if (!prefetched) pf_v.rows(0, std::max(pf_v.n, n));
  }
}

/// Writes the item's rows, back in natural element order: normalized to `out`, or (m, l, acc) to
/// its partial slot.
template <bool kPaired, typename T, class DF>
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
      const float inv = st.l[r] == 0.0f ? 0.0f : v_factor(r) / st.l[r];
      if constexpr (kPaired) {
        for (int64_t d = 0; d < D; ++d) o[d] = ar[PairOrder<true>(d, L)] * inv;
      } else {
        const V vinv = hn::Set(df, inv);
        for (int64_t d = 0; d < D; d += L) {
          hn::StoreU(hn::Mul(hn::LoadU(df, ar + d), vinv), df, o + d);
        }
      }
    }
  } else {
    for (int32_t r = 0; r < R; ++r) {
      float* dst = a.partial + rs.partial_offset + (static_cast<int64_t>(part) * R + r) * (D + 2);
      dst[0] = st.m[r];
      dst[1] = st.l[r];
      const float f = v_factor(r);
      for (int64_t d = 0; d < D; ++d) dst[2 + d] = st.acc[r * D + PairOrder<kPaired>(d, L)] * f;
    }
  }
}

/// One partition of one row set (see RowSet for the row order). kPaired: bf16 K/V widened by
/// even/odd halves (LoadPair), head_dim a multiple of 2 x Lanes(df).
template <bool kPaired, typename T, class DF>
void AttendImpl(DF df, const KernelArgs& a, const RowSet& rs, int32_t part) {
  ItemState<T> st(a, rs);
  InitItem<kPaired>(df, st, part);
  const int32_t num_kv = rs.num_kv;
  const int64_t head_stride = st.head_stride;
  int cur = 0;
  int32_t n = GatherSpan(st, st.key_begin, 0);  // keys in the current span
  for (int64_t j = st.key_begin; j < st.key_end;) {
    const int32_t nn = GatherSpan(st, j + n, cur ^ 1);
    const T* const* ks = st.kp[cur];
    const T* const* vs = st.vp[cur];
    const int64_t* kk = st.keys[cur];
    for (int32_t hh = 0; hh < num_kv; ++hh) {
      const int64_t off = static_cast<int64_t>(hh) * head_stride;
      for (int32_t t0 = 0; t0 < n; t0 += kTile) {
        const int32_t tn = std::min(kTile, n - t0);
        // What comes next: this head's next tile of the span, else the next head's first tile,
        // else head 0's first tile of the next span.
        if (t0 + kTile < n) {
          AttendTile<kPaired>(df, st, hh, ks + t0, vs + t0, kk + t0, tn, ks + t0 + kTile,
                              vs + t0 + kTile, off, std::min(kTile, n - t0 - kTile));
        } else if (hh + 1 < num_kv) {
          AttendTile<kPaired>(df, st, hh, ks + t0, vs + t0, kk + t0, tn, ks, vs, off + head_stride,
                              std::min(kTile, n));
        } else {
          AttendTile<kPaired>(df, st, hh, ks + t0, vs + t0, kk + t0, tn, st.kp[cur ^ 1],
                              st.vp[cur ^ 1], 0, std::min(kTile, nn));
        }
      }
    }
    if (nn == 0) break;
    j += n;
    n = nn;
    cur ^= 1;
  }
  StoreItem<kPaired>(df, st, part);
}

}  // namespace HWY_NAMESPACE
}  // namespace pagedkv::detail::fast
HWY_AFTER_NAMESPACE();
#endif  // PAGEDKV_CPU_ATTENTION_ITEM_INL_H_
