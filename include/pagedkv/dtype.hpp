#pragma once
/// @file dtype.hpp
/// Storage element types of the KV cache, their host-side conversions, and the views of an
/// engine's fp32 / fp16 / bf16 activations (ActivationView). Compute is always fp32; fp16/bf16
/// are storage and activation formats, the 8-bit formats storage formats only.
///
/// 8-bit (quantized) formats carry a scale per layer for K and for V (per tensor, or per kv
/// head): stored = Q(x / scale) and x = dequantized(stored) * scale, the convention of vLLM's
/// fp8 KV cache (k_scale / v_scale) and FlashInfer. Q rounds to nearest even and saturates to
/// the format's finite range (PTX cvt.rn.satfinite for fp8, cvt.rni.sat.s8 for int8):
///   fp8 e4m3 (OCP "E4M3FN": bias 7, no infinities, max 448, NaN = S.1111.111)
///   fp8 e5m2 (OCP: bias 15, max 57344, inf S.11111.00, NaN S.11111.xx != 00)
///   int8     (two's complement, [-128, 127])
/// NaN stays NaN in the fp8 formats (e4m3 0x7F, e5m2 0x7E, sign kept) and becomes 0 in int8,
/// which has no NaN (as the hardware conversion does); +-inf saturate to +-max.
/// Source: OCP 8-bit Floating Point Specification (OFP8) rev. 1.0, 2023.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "pagedkv/types.hpp"

namespace pagedkv {

/// Element type of the K/V pools.
enum class DType : uint8_t {
  kF32,      ///< IEEE binary32, 4 bytes
  kF16,      ///< IEEE binary16, 2 bytes
  kBF16,     ///< bfloat16 (upper half of binary32), 2 bytes
  kFP8E4M3,  ///< OCP fp8 E4M3FN, 1 byte, scaled (max 448)
  kFP8E5M2,  ///< OCP fp8 E5M2, 1 byte, scaled (max 57344)
  kInt8,     ///< int8, 1 byte, scaled ([-128, 127])
};

/// Size of one element in bytes: 4 (fp32), 2 (fp16, bf16) or 1 (the 8-bit formats).
PAGEDKV_HOST_DEVICE constexpr int64_t dtype_size(DType dtype) {
  return dtype == DType::kF32 ? 4 : (dtype == DType::kF16 || dtype == DType::kBF16) ? 2 : 1;
}

/// True for the 8-bit formats, whose values are stored divided by a per-layer scale.
PAGEDKV_HOST_DEVICE constexpr bool dtype_is_quantized(DType dtype) {
  return dtype == DType::kFP8E4M3 || dtype == DType::kFP8E5M2 || dtype == DType::kInt8;
}

/// Largest finite stored value of a quantized format (448, 57344, 127); 0 for the others.
/// Calibration divides max |x| by it (calibrate_kv_scales).
PAGEDKV_HOST_DEVICE constexpr float dtype_max_finite(DType dtype) {
  return dtype == DType::kFP8E4M3   ? 448.0f
         : dtype == DType::kFP8E5M2 ? 57344.0f
         : dtype == DType::kInt8    ? 127.0f
                                    : 0.0f;
}

/// "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2" or "int8".
std::string_view dtype_name(DType dtype);

/// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16"/"half", "bf16"/"bfloat16",
/// "fp8_e4m3"/"fp8"/"e4m3"/"float8_e4m3fn", "fp8_e5m2"/"e5m2"/"float8_e5m2", "int8"/"i8".
/// Errors: throws pagedkv::Error naming the string and the accepted names.
DType parse_dtype(std::string_view name);

/// Read-only activations of an engine in their own dtype: `size` elements of `dtype` at
/// `data`, row-major as the fp32 spans they stand for (q of the CPU attention overloads,
/// cpu/attention.hpp; the new K / V of reshape_and_cache, storage/kv_write.hpp). Entry points
/// widen fp16 / bf16 exactly to fp32 (f16_to_f32, bf16_to_f32) and compute from there.
/// dtype: DType::kF32, kF16 or kBF16 (the 8-bit formats are storage formats, not activations).
struct ActivationView {
  const void* data = nullptr;  ///< first element; may be null only when size is 0
  size_t size = 0;             ///< elements (not bytes)
  DType dtype = DType::kF32;   ///< element type: fp32, fp16 or bf16
};

/// Writable activations (out of the CPU attention overloads): as ActivationView.
struct MutableActivationView {
  void* data = nullptr;       ///< first element; may be null only when size is 0
  size_t size = 0;            ///< elements (not bytes)
  DType dtype = DType::kF32;  ///< element type: fp32, fp16 or bf16
};

/// fp16 bits -> float (exact; handles subnormals, inf, NaN).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3FFu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// float -> fp16 bits, round to nearest even; overflow gives inf, NaN stays NaN.
inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u)
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

/// bf16 bits -> float (exact).
inline float bf16_to_f32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// float -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

namespace detail {
/// An OCP fp8 format: kMan mantissa bits, exponent bias kBias; kIeee: the top exponent is
/// inf/NaN (e5m2) rather than only S.1111.111 being NaN (e4m3, which has no inf).
template <int kMan, int kBias, bool kIeee>
struct Fp8Format {
  static constexpr int kManBits = kMan;
  static constexpr int kExpBias = kBias;
  static constexpr bool kIeeeSpecials = kIeee;
  static constexpr uint32_t kExpMax = (1u << (7 - kMan)) - 1;
  static constexpr uint8_t kMaxCode = kIeee ? 0x7B : 0x7E;  // 57344 / 448
  static constexpr uint8_t kNanCode = kIeee ? 0x7E : 0x7F;
};
using E4M3 = Fp8Format<3, 7, false>;
using E5M2 = Fp8Format<2, 15, true>;

/// fp8 bits -> float (exact).
template <class F>
inline float fp8_to_f32(uint8_t b) {
  const uint32_t e = (b >> F::kManBits) & F::kExpMax;
  const uint32_t m = b & ((1u << F::kManBits) - 1);
  float v;
  if (F::kIeeeSpecials && e == F::kExpMax) {
    v = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (!F::kIeeeSpecials && e == F::kExpMax && m == (1u << F::kManBits) - 1) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else {
    // subnormal (e == 0): m x 2^(1 - bias - man); normal: (2^man + m) x 2^(e - bias - man)
    const uint32_t sig = e == 0 ? m : ((1u << F::kManBits) | m);
    const int exp = (e == 0 ? 1 : static_cast<int>(e)) - F::kExpBias - F::kManBits;
    v = std::ldexp(static_cast<float>(sig), exp);
  }
  return (b & 0x80u) ? -v : v;
}

/// float -> fp8 bits: round to nearest even, saturate to +-max (inf included), NaN -> NaN code.
template <class F>
inline uint8_t f32_to_fp8(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return static_cast<uint8_t>(sign | F::kNanCode);
  const float a = std::fabs(f);
  const float max = fp8_to_f32<F>(F::kMaxCode);
  if (a >= max) return static_cast<uint8_t>(sign | F::kMaxCode);
  if (a == 0.0f) return sign;  // frexp(0) has no binade
  // The quantum of a's binade, never below the subnormal quantum 2^(1 - bias - man).
  int e2 = 0;
  (void)std::frexp(a, &e2);  // a = f x 2^e2, f in [0.5, 1)
  const int q_exp = std::max(e2 - 1, 1 - F::kExpBias) - F::kManBits;
  // a / quantum is exact (a power-of-two scaling); nearbyint rounds half to even.
  const auto units = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, -q_exp)));
  // units in [0, 2^(man+1)]: the code is (biased exponent of the binade - 1) << man plus units,
  // which carries into the next exponent exactly when units reaches 2^(man+1), and gives the
  // subnormal codes (and the smallest normal) in the lowest binade.
  const auto base_exp = static_cast<uint32_t>(q_exp + F::kManBits + F::kExpBias);  // >= 1
  uint32_t code = ((base_exp - 1) << F::kManBits) + units;
  if (code > F::kMaxCode) code = F::kMaxCode;  // rounded up past max: saturate
  return static_cast<uint8_t>(sign | code);
}
}  // namespace detail

/// fp8 e4m3 bits -> float (exact; 0x7F / 0xFF are NaN).
inline float e4m3_to_f32(uint8_t b) { return detail::fp8_to_f32<detail::E4M3>(b); }
/// float -> fp8 e4m3 bits (see the file comment: RNE, saturating, NaN kept).
inline uint8_t f32_to_e4m3(float f) { return detail::f32_to_fp8<detail::E4M3>(f); }
/// fp8 e5m2 bits -> float (exact; the top byte of the fp16 with the same value).
inline float e5m2_to_f32(uint8_t b) { return detail::fp8_to_f32<detail::E5M2>(b); }
/// float -> fp8 e5m2 bits (RNE, saturating to +-57344, inf included; NaN kept).
inline uint8_t f32_to_e5m2(float f) { return detail::f32_to_fp8<detail::E5M2>(f); }
/// float -> int8: round to nearest even, saturate to [-128, 127], NaN -> 0.
inline int8_t f32_to_int8(float f) {
  if (std::isnan(f)) return 0;
  return static_cast<int8_t>(std::nearbyint(std::clamp(f, -128.0f, 127.0f)));
}

/// Reads element `i` of a buffer of `dtype` as float. The 8-bit formats give the stored value
/// before its scale (the caller multiplies by the layer's k_scale / v_scale).
inline float load_as_f32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP8E4M3:
      return e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::kFP8E5M2:
      return e5m2_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::kInt8:
      return static_cast<float>(static_cast<const int8_t*>(base)[i]);
  }
  return 0.0f;
}

/// Writes float `value` as element `i` of a buffer of `dtype` (rounded to nearest even; the
/// 8-bit formats saturate, see the file comment). For a quantized dtype `value` is already
/// divided by its scale.
inline void store_from_f32(void* base, DType dtype, int64_t i, float value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = value;
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = f32_to_f16(value);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = f32_to_bf16(value);
      return;
    case DType::kFP8E4M3:
      static_cast<uint8_t*>(base)[i] = f32_to_e4m3(value);
      return;
    case DType::kFP8E5M2:
      static_cast<uint8_t*>(base)[i] = f32_to_e5m2(value);
      return;
    case DType::kInt8:
      static_cast<int8_t*>(base)[i] = f32_to_int8(value);
      return;
  }
}

}  // namespace pagedkv
