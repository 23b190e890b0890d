// Per-target arithmetic of the fast CPU kernel (attention_hwy.cpp) over one tile of keys: the
// scores q . k (one row, or two rows sharing each K load), the online softmax step, and the
// P . V accumulation. Highway's "-inl.h" pattern: re-included once per target by
// foreach_target.h through attention_hwy.cpp, so the guard below toggles with HWY_TARGET_TOGGLE
// instead of #pragma once.

#if defined(PAGEDKV_CPU_ATTENTION_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDKV_CPU_ATTENTION_TILE_INL_H_
#undef PAGEDKV_CPU_ATTENTION_TILE_INL_H_
#else
#define PAGEDKV_CPU_ATTENTION_TILE_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/attention_prefetch-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagedkv::detail::fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Loads Lanes(df) K/V elements as fp32: fp16/bf16 are widened in registers (vcvtph2ps, or a
/// 16-bit shift for bf16), so the cache is read at its storage size. The 8-bit formats widen
/// too, before their scale (applied per head outside the loop): int8 through int32; fp8 e5m2
/// is the top byte of the fp16 of equal value; fp8 e4m3's sign, exponent and mantissa shifted
/// into fp16's fields give its value times 2^-8 (kLoadFactor), subnormals included, with its
/// one NaN code S.1111.111 mapped to an fp16 NaN.
template <typename T, class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<T, int8_t>) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, p)));
  } else if constexpr (std::is_same_v<T, Fp8E4M3> || std::is_same_v<T, Fp8E5M2>) {
    const hn::Rebind<uint8_t, DF> d8;
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto b = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const uint8_t*>(p)));
    if constexpr (std::is_same_v<T, Fp8E5M2>) {
      return hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(b)));
    } else {
      const auto sign = hn::ShiftLeft<8>(hn::And(b, hn::Set(d16, 0x80)));
      const auto em = hn::And(b, hn::Set(d16, 0x7F));
      const auto nan = hn::Eq(em, hn::Set(d16, 0x7F));
      const auto bits = hn::IfThenElse(nan, hn::Set(d16, 0x7E00), hn::ShiftLeft<7>(em));
      return hn::PromoteTo(df, hn::BitCast(dh, hn::Or(sign, bits)));
    }
  } else {
    const hn::Rebind<T, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}

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

/// exp(x) per lane, NaN lanes kept NaN. Highway's EMU128 fallback computes Exp through a C++
/// float-to-int conversion, undefined behaviour for NaN (UBSan reports it; the hardware targets
/// convert without UB, so they call Exp directly). A NaN score comes from NaN or infinite
/// weights or K/V (inf - inf); it must reach the output as NaN, not as UB.
template <class DF, class V = hn::Vec<DF>>
HWY_INLINE V ExpOrNaN(DF df, V x) {
#if HWY_TARGET == HWY_EMU128
  const auto nan = hn::IsNaN(x);
  return hn::IfThenElse(nan, x, hn::Exp(df, hn::IfThenZeroElse(nan, x)));
#else
  return hn::Exp(df, x);
#endif
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
    const V p = ExpOrNaN(df, hn::Sub(hn::LoadU(df, s + i), vm));
    hn::StoreU(p, df, s + i);
    vsum = hn::Add(vsum, p);
  }
  *l += hn::GetLane(hn::SumOfLanes(df, vsum));
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace pagedkv::detail::fast
HWY_AFTER_NAMESPACE();
#endif  // PAGEDKV_CPU_ATTENTION_TILE_INL_H_
