// Per-target arithmetic of the fast CPU kernel (attention_hwy.cpp) over one tile of keys: the
// scores q . k of a block of rows sharing one kv head, the online softmax step, and the P . V
// accumulation of a block of rows. Every K and V vector is loaded and widened to fp32 once per
// block of rows (up to kRowBlock rows: the GQA group's query heads of one kv head), so the
// widening and the loads are shared by the group and the fp32 FMAs are what is left.
// Highway's "-inl.h" pattern: re-included once per target by foreach_target.h through
// attention_hwy.cpp, so the guard below toggles with HWY_TARGET_TOGGLE instead of #pragma once.

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
#include "pagedkv/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace pagedkv::detail::fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// Vector registers of the target: 32 with AVX-512 (and on Arm), 16 on the other x86 targets.
/// The register blocks below are sized so that accumulators and operands never spill.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
inline constexpr int kVectorRegisters = 16;
#else
inline constexpr int kVectorRegisters = 32;
#endif

/// Rows that share each K and V load (scores and accumulation): 4 query heads of one kv head
/// (a GQA group of 4, or half of a group of 8) x 4 keys = 16 accumulators with AVX-512.
inline constexpr int32_t kRowBlock = 4;

/// fp16 bit patterns (uint16 lanes) to fp32, exact: vcvtph2ps on x86. Highway 1.0.3's SCALAR
/// and EMU128 promotions map exponent 31 (inf, NaN) to finite values, so those targets decode
/// each lane with dtype.hpp's f16_to_f32 instead.
template <class DF, class VU>
HWY_INLINE hn::Vec<DF> PromoteF16(DF df, VU bits) {
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
  const hn::Rebind<uint16_t, DF> du;
  HWY_ALIGN uint16_t in[hn::MaxLanes(du)];
  HWY_ALIGN float out[hn::MaxLanes(du)];
  hn::Store(bits, du, in);
  for (size_t i = 0; i < hn::Lanes(du); ++i) out[i] = f16_to_f32(in[i]);
  return hn::Load(df, out);
#else
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::BitCast(dh, bits));
#endif
}

/// Loads Lanes(df) K/V elements as fp32: fp16/bf16 are widened in registers (vcvtph2ps, or a
/// 16-bit shift for bf16), so the cache is read at its storage size. The 8-bit formats widen
/// too, before their scale (applied per head outside the loop): int8 through int32; fp8 e5m2
/// is the top byte of the fp16 of equal value; fp8 e4m3 is sign-extended to 16 bits and
/// shifted left by 7, which puts its sign at fp16's bit 15, a copy of the sign at bit 14
/// (cleared) and its exponent and mantissa at fp16's low exponent and top mantissa bits: the
/// fp16 of its value times 2^-8 (kLoadFactor), subnormals included. Its NaN code S.1111.111
/// would land on a finite fp16 and is replaced by an fp16 NaN (compare and blend).
/// Instructions per vector (AVX-512, 16 elements): e4m3 7, e5m2 3, int8 2, bf16 1 (LoadPair).
template <typename T, class DF>
HWY_INLINE hn::Vec<DF> LoadF32(DF df, const T* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<T, int8_t>) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, p)));
  } else if constexpr (std::is_same_v<T, Fp8E5M2>) {
    const hn::Rebind<uint8_t, DF> d8;
    const hn::Rebind<uint16_t, DF> d16;
    const auto b = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const uint8_t*>(p)));
    return PromoteF16(df, hn::ShiftLeft<8>(b));
  } else if constexpr (std::is_same_v<T, Fp8E4M3>) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int16_t, DF> d16;
    const hn::Rebind<uint16_t, DF> du;
    const auto s = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
    const auto bits = hn::And(hn::ShiftLeft<7>(hn::BitCast(du, s)), hn::Set(du, 0xBFFF));
    const auto nan = hn::Eq(hn::And(s, hn::Set(d16, 0x7F)), hn::Set(d16, 0x7F));
    return PromoteF16(df, hn::IfThenElse(hn::RebindMask(du, nan), hn::Set(du, 0x7E00), bits));
  } else if constexpr (std::is_same_v<T, hwy::float16_t>) {
    const hn::Rebind<uint16_t, DF> du;
    return PromoteF16(df, hn::LoadU(du, reinterpret_cast<const uint16_t*>(p)));
  } else {
    const hn::Rebind<T, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, p));
  }
}

/// Loads 2 x Lanes(df) K/V elements [p, p + 2L) as two fp32 vectors (lo, hi), the pair every
/// loop below steps by. kPaired (bf16 only): one full-width load of 2L bf16 split by bit
/// operations into the even elements (lo = bits << 16) and the odd ones (hi = bits & 0xFFFF0000),
/// two cheap lane-wise operations instead of two cross-lane widenings; q and the accumulators
/// are kept in the same even/odd order per 2L elements (PairOrder), so every dot product and
/// every P.V sum is over the same element pairs as in natural order.
template <bool kPaired, typename T, class DF, class V = hn::Vec<DF>>
HWY_INLINE void LoadPair(DF df, const T* HWY_RESTRICT p, V& lo, V& hi) {
  if constexpr (kPaired) {
    static_assert(std::is_same_v<T, hwy::bfloat16_t>, "the even/odd split is bf16's");
    const hn::RebindToUnsigned<DF> du;
    const auto bits = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
    lo = hn::BitCast(df, hn::ShiftLeft<16>(bits));
    hi = hn::BitCast(df, hn::And(bits, hn::Set(du, 0xFFFF0000u)));
  } else {
    const auto L = static_cast<int64_t>(hn::Lanes(df));
    lo = LoadF32(df, p);
    hi = LoadF32(df, p + L);
  }
}

/// Index in the kernel's order of element d of a row of head_dim elements: natural order, or
/// with kPaired the even elements of each 2L block first, then its odd ones (see LoadPair).
template <bool kPaired>
HWY_INLINE int64_t PairOrder(int64_t d, int64_t lanes) {
  if constexpr (!kPaired) return d;
  const int64_t base = d - d % (2 * lanes);
  return base + (d % 2) * lanes + (d - base) / 2;
}

#if HWY_TARGET != HWY_SCALAR  // one lane: no halves
/// The sum of the 128-bit blocks of v, by halving (register extracts, no store and reload).
template <class D, class V = hn::Vec<D>>
HWY_INLINE auto FoldTo128(D d, V v) {
  if constexpr (hn::MaxLanes(D()) * sizeof(float) > 16) {
    const hn::Half<D> dh;
    return FoldTo128(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  } else {
    (void)d;
    return v;
  }
}
#endif

/// out[k] = sum of the lanes of a_k, k = 0..3. With >= 4 lanes, two interleave rounds leave the
/// four partial sums side by side in every 128-bit block, then the blocks are added
/// (FoldTo128): about a quarter of the shuffles of four separate reductions.
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
      hn::StoreU(FoldTo128(df, u), hn::CappedTag<float, 4>(), out);
      return;
    }
  }
#endif
  out[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, a3));
}

/// Keys per step of the scores of kR rows: kR x kK accumulators, at most half the registers
/// (the rest hold the K pairs and q), and at least four.
template <int kR>
inline constexpr int kScoreKeys = kR >= 4 ? (kVectorRegisters >= 32 ? 4 : 2) : 4;

/// s_r[i + j] = q_r . k_{i+j} for kR rows (q_r, s_r) and kK keys, k_x = k[x] + off: each K pair
/// is loaded and widened once for all kR rows. With four accumulators or fewer the low and high
/// vectors of a pair get separate chains (eight chains hide the FMA latency).
template <int kR, int kK, bool kPaired, typename T, class DF>
HWY_INLINE void ScoresStep(DF df, const float* const* HWY_RESTRICT q, const T* const* k,
                           int64_t off, int64_t D, float* const* HWY_RESTRICT s, int32_t i) {
  using V = hn::Vec<DF>;
  constexpr bool kSplit = kR * kK <= 4;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  V acc[kR][kK];
  V acc_hi[kSplit ? kR : 1][kK];
  for (int r = 0; r < kR; ++r) {
    for (int j = 0; j < kK; ++j) acc[r][j] = hn::Zero(df);
  }
  if constexpr (kSplit) {
    for (int r = 0; r < kR; ++r) {
      for (int j = 0; j < kK; ++j) acc_hi[r][j] = hn::Zero(df);
    }
  }
  const T* kr[kK];
  for (int j = 0; j < kK; ++j) kr[j] = k[i + j] + off;
  int64_t d = 0;
  for (; d + 2 * L <= D; d += 2 * L) {
    V klo[kK], khi[kK];
    for (int j = 0; j < kK; ++j) LoadPair<kPaired>(df, kr[j] + d, klo[j], khi[j]);
    for (int r = 0; r < kR; ++r) {
      const V qlo = hn::LoadU(df, q[r] + d);
      const V qhi = hn::LoadU(df, q[r] + d + L);
      for (int j = 0; j < kK; ++j) {
        acc[r][j] = hn::MulAdd(qlo, klo[j], acc[r][j]);
        if constexpr (kSplit) {
          acc_hi[r][j] = hn::MulAdd(qhi, khi[j], acc_hi[r][j]);
        } else {
          acc[r][j] = hn::MulAdd(qhi, khi[j], acc[r][j]);
        }
      }
    }
  }
  if (d < D) {  // an odd number of vectors (never with kPaired: head_dim % 2L == 0)
    for (int j = 0; j < kK; ++j) {
      const V x = LoadF32(df, kr[j] + d);
      for (int r = 0; r < kR; ++r) acc[r][j] = hn::MulAdd(hn::LoadU(df, q[r] + d), x, acc[r][j]);
    }
  }
  if constexpr (kSplit) {
    for (int r = 0; r < kR; ++r) {
      for (int j = 0; j < kK; ++j) acc[r][j] = hn::Add(acc[r][j], acc_hi[r][j]);
    }
  }
  if constexpr (kK == 4) {
    for (int r = 0; r < kR; ++r) {
      SumOfLanes4(df, acc[r][0], acc[r][1], acc[r][2], acc[r][3], s[r] + i);
    }
  } else if constexpr (kK == 2 && kR % 2 == 0) {
    for (int r = 0; r < kR; r += 2) {
      float sum[4];
      SumOfLanes4(df, acc[r][0], acc[r][1], acc[r + 1][0], acc[r + 1][1], sum);
      s[r][i] = sum[0];
      s[r][i + 1] = sum[1];
      s[r + 1][i] = sum[2];
      s[r + 1][i + 1] = sum[3];
    }
  } else {
    for (int r = 0; r < kR; ++r) {
      for (int j = 0; j < kK; ++j) s[r][i + j] = hn::GetLane(hn::SumOfLanes(df, acc[r][j]));
    }
  }
}

/// s_r[i] = q_r . k_i for kR rows and the n keys of a tile (ScoresStep, kScoreKeys<kR> keys at
/// a time). Also prefetches what comes next (`pf`), four keys per four computed.
template <int kR, bool kPaired, typename T, class DF>
HWY_INLINE void ScoresBlock(DF df, const float* const* HWY_RESTRICT q, const T* const* k,
                            int64_t off, int32_t n, int64_t D, float* const* HWY_RESTRICT s,
                            const PrefetchPlan<T>& pf) {
  constexpr int kK = kScoreKeys<kR>;
  int32_t i = 0;
  for (; i + kK <= n; i += kK) {
    if (i % 4 == 0) pf.rows(i, i + 4);
    ScoresStep<kR, kK, kPaired>(df, q, k, off, D, s, i);
  }
  pf.rows(i - i % 4 + (i % 4 == 0 ? 0 : 4), std::max(pf.n, n));
  for (; i < n; ++i) ScoresStep<kR, 1, kPaired>(df, q, k, off, D, s, i);
}

/// Vectors of head_dim per accumulation chunk of kR rows: kR x kNV accumulators in half the
/// registers, an even number (whole pairs), at most 8.
template <int kR>
inline constexpr int kAccVectors = std::clamp(kVectorRegisters / 2 / kR, 2, 8);

/// acc_r[d .. d + kNV L) += sum_i p_r[i] v_i[d ..] for kR rows over the n keys of a tile, the
/// accumulators in registers across the tile; each V vector is loaded and widened once for all
/// kR rows. Prefetches `pf` (null: nothing), four keys per four computed.
template <int kR, int kNV, bool kPaired, typename T, class DF>
HWY_INLINE void AccumulateChunk(DF df, const float* const* HWY_RESTRICT p, const T* const* v,
                                int64_t off, int32_t n, int64_t d, float* const* HWY_RESTRICT acc,
                                const PrefetchPlan<T>* pf) {
  using V = hn::Vec<DF>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  V a[kR][kNV];
  for (int r = 0; r < kR; ++r) {
    for (int j = 0; j < kNV; ++j) a[r][j] = hn::LoadU(df, acc[r] + d + j * L);
  }
  for (int32_t i = 0; i < n; ++i) {
    if (pf != nullptr && i % 4 == 0) pf->rows(i, i + 4);
    const T* x = v[i] + off + d;
    V xv[kNV];
    if constexpr (kNV == 1) {
      xv[0] = LoadF32(df, x);
    } else {
      static_assert(kNV % 2 == 0, "whole pairs");
      for (int j = 0; j < kNV; j += 2) LoadPair<kPaired>(df, x + j * L, xv[j], xv[j + 1]);
    }
    for (int r = 0; r < kR; ++r) {
      const V pr = hn::Set(df, p[r][i]);
      for (int j = 0; j < kNV; ++j) a[r][j] = hn::MulAdd(pr, xv[j], a[r][j]);
    }
  }
  if (pf != nullptr) pf->rows((n + 3) / 4 * 4, std::max(pf->n, n));
  for (int r = 0; r < kR; ++r) {
    for (int j = 0; j < kNV; ++j) hn::StoreU(a[r][j], df, acc[r] + d + j * L);
  }
}

/// acc_r += sum_i p_r[i] v_i (v_i = v[i] + off) over the whole head_dim for kR rows, in chunks
/// of kAccVectors<kR> vectors, then pairs, then (unpaired, odd head_dim / L) one vector. The
/// first chunk carries the prefetch.
template <int kR, bool kPaired, typename T, class DF>
HWY_INLINE void AccumulateBlock(DF df, const float* const* HWY_RESTRICT p, const T* const* v,
                                int64_t off, int32_t n, int64_t D, float* const* HWY_RESTRICT acc,
                                const PrefetchPlan<T>& pf) {
  constexpr int kNV = kAccVectors<kR>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const PrefetchPlan<T>* plan = &pf;
  int64_t d = 0;
  for (; d + kNV * L <= D; d += kNV * L, plan = nullptr) {
    AccumulateChunk<kR, kNV, kPaired>(df, p, v, off, n, d, acc, plan);
  }
  for (; d + 2 * L <= D; d += 2 * L, plan = nullptr) {
    AccumulateChunk<kR, 2, kPaired>(df, p, v, off, n, d, acc, plan);
  }
  if (d < D) AccumulateChunk<kR, 1, kPaired>(df, p, v, off, n, d, acc, plan);
}

/// Calls block(rows, r0) for the nr in [1, kRowBlock] rows of a head in register blocks of 4,
/// 2 and 1 rows (rows: std::integral_constant of the block's row count, r0 its first row); with
/// 1-lane vectors (odd head_dim) the rows go one by one, which compiles less code.
template <class DF, class Fn>
HWY_INLINE void ForRowBlocks(DF, int32_t nr, Fn&& block) {
  static_assert(kRowBlock == 4, "blocks of 4, 2 and 1 rows");
  using One = std::integral_constant<int, 1>;
  if constexpr (hn::MaxLanes(DF()) == 1) {
    for (int32_t r = 0; r < nr; ++r) block(One(), r);
  } else if (nr == 4) {
    block(std::integral_constant<int, 4>(), 0);
  } else if (nr == 1) {
    block(One(), 0);
  } else {
    block(std::integral_constant<int, 2>(), 0);
    if (nr == 3) block(One(), 2);
  }
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
/// accumulate). The scores go at the target's full width whatever head_dim's vectors (df, for
/// acc) are: ts is a multiple of it (InitItem). Source: Milakov & Gimelshein, "Online
/// normalizer calculation for softmax" (2018).
template <class DF>
HWY_INLINE bool OnlineSoftmax(DF df, float* HWY_RESTRICT s, int64_t ts, int64_t D,
                              float* HWY_RESTRICT m, float* HWY_RESTRICT l,
                              float* HWY_RESTRICT acc) {
  using V = hn::Vec<DF>;
  const hn::ScalableTag<float> dt;
  using VT = hn::Vec<decltype(dt)>;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t LT = static_cast<int64_t>(hn::Lanes(dt));
  VT vmax = hn::Set(dt, kNegInf);
  for (int64_t i = 0; i < ts; i += LT) vmax = hn::Max(vmax, hn::LoadU(dt, s + i));
  const float mt = hn::GetLane(hn::MaxOfLanes(dt, vmax));
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
  const VT vm = hn::Set(dt, *m);
  VT vsum = hn::Zero(dt);
  for (int64_t i = 0; i < ts; i += LT) {
    const VT p = ExpOrNaN(dt, hn::Sub(hn::LoadU(dt, s + i), vm));
    hn::StoreU(p, dt, s + i);
    vsum = hn::Add(vsum, p);
  }
  *l += hn::GetLane(hn::SumOfLanes(dt, vsum));
  return true;
}

}  // namespace HWY_NAMESPACE
}  // namespace pagedkv::detail::fast
HWY_AFTER_NAMESPACE();
#endif  // PAGEDKV_CPU_ATTENTION_TILE_INL_H_
