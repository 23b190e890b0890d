#pragma once
/// @file dtype.hpp
/// Storage element types of the KV cache and their host-side conversions.
/// Compute is always fp32; fp16/bf16 are storage formats only.

#include <cstdint>
#include <cstring>
#include <string_view>

#include "pagedkv/types.hpp"

namespace pagedkv {

/// Element type of the K/V pools.
enum class DType : uint8_t {
  kF32,   ///< IEEE binary32, 4 bytes
  kF16,   ///< IEEE binary16, 2 bytes
  kBF16,  ///< bfloat16 (upper half of binary32), 2 bytes
};

/// Size of one element in bytes: 4, 2 or 2.
PAGEDKV_HOST_DEVICE constexpr int64_t dtype_size(DType dtype) {
  return dtype == DType::kF32 ? 4 : 2;
}

/// "fp32", "fp16" or "bf16".
std::string_view dtype_name(DType dtype);

/// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16"/"half", "bf16"/"bfloat16".
/// Errors: throws pagedkv::Error naming the string and the accepted names.
DType parse_dtype(std::string_view name);

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

/// Reads element `i` of a buffer of `dtype` as float.
inline float load_as_f32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
  return 0.0f;
}

/// Writes float `value` as element `i` of a buffer of `dtype` (rounded to nearest even).
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
  }
}

}  // namespace pagedkv
