#pragma once
// Integer-only scalar codecs of the 8-bit KV formats, usable on the host and the device: the
// device kernels' fallback where the hardware has no fp8 conversion (sm_80: no cvt with e4m3 /
// e5m2 before sm_89), and the widening formulas of the decode kernel written one element at a
// time, so the host tests can hold them against dtype.hpp on every input. Private to cuda/
// (and its tests); no CUDA header.
//
// Encoders (fp32 -> 8 bits): the rules of dtype.hpp (round to nearest even, saturation to the
// finite range, infinities included, NaN -> the format's NaN code with its sign in fp8 and 0 in
// int8), so their bytes equal f32_to_e4m3 / f32_to_e5m2 / f32_to_int8's.
// Wideners (8 bits -> fp16 bits): the byte moved into fp16's fields, the form the decode kernel
// converts two at a time (__byte_perm, then half2 -> float2).

#include <cstdint>

#include "pagedkv/types.hpp"

namespace pagedkv::cuda::detail {

/// fp32 bits of `f` (memcpy-free, so it compiles for the device as well).
PAGEDKV_HOST_DEVICE inline uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(uint32_t, f);
#endif
}

/// fp32 -> OCP fp8 with kMan mantissa bits and exponent bias kBias; kMaxCode is the largest
/// finite code (0x7E for e4m3, 0x7B for e5m2), kNanCode the NaN (0x7F, 0x7E). Integer-only:
/// the fp32 mantissa is shifted to the fp8 quantum of the value's binade (the subnormal quantum
/// 2^(1 - bias - kMan) below the smallest normal) and rounded half to even on the bits shifted
/// out; a carry past the mantissa moves into the exponent, which is the next code; a code past
/// kMaxCode saturates (fp32 infinities too, their exponent being the largest).
/// Worked example (e4m3): 0.3 = 1.2 x 2^-2: biased exponent 5, mantissa 0.2 x 8 = 1.6 -> 2,
/// code 0x2A = 1.25 x 2^-2 = 0.3125.
template <int kMan, int kBias, uint32_t kMaxCode, uint32_t kNanCode>
PAGEDKV_HOST_DEVICE inline uint8_t f32_to_fp8_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint8_t>(sign | kNanCode);
  const int exp = static_cast<int>(abs >> 23);         // fp32 biased exponent
  if (exp == 0) return static_cast<uint8_t>(sign);     // fp32 zero or subnormal: below every fp8
  const uint32_t sig = (abs & 0x7FFFFFu) | 0x800000u;  // 24 bits, value sig x 2^(exp - 150)
  const int e8 = exp - 127 + kBias;                    // fp8 biased exponent if normal
  // Bits of sig below the fp8 quantum: 23 - kMan in a normal binade, more below it.
  const int shift = e8 >= 1 ? 23 - kMan : 24 - kMan - e8;
  if (shift > 24) return static_cast<uint8_t>(sign);  // < half the smallest subnormal
  uint32_t units = sig >> shift;
  const uint32_t rem = sig & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (units & 1u) != 0)) ++units;
  // Normal: units in [2^kMan, 2^(kMan + 1)], the implicit bit adds one to (e8 - 1) << kMan.
  // Subnormal: units in [0, 2^kMan], the code itself (2^kMan is the smallest normal).
  const uint32_t code =
      e8 >= 1 ? (static_cast<uint32_t>(e8 - 1) << kMan) + units : units;  // e8 - 1 >= 0
  return static_cast<uint8_t>(sign | (code > kMaxCode ? kMaxCode : code));
}

/// fp32 -> fp8 e4m3 bits (dtype.hpp's f32_to_e4m3).
PAGEDKV_HOST_DEVICE inline uint8_t f32_to_e4m3_bits(float f) {
  return f32_to_fp8_bits<3, 7, 0x7Eu, 0x7Fu>(f);
}
/// fp32 -> fp8 e5m2 bits (dtype.hpp's f32_to_e5m2).
PAGEDKV_HOST_DEVICE inline uint8_t f32_to_e5m2_bits(float f) {
  return f32_to_fp8_bits<2, 15, 0x7Bu, 0x7Eu>(f);
}

/// fp32 -> int8: NaN -> 0, else clamp to [-128, 127] and round half to even (dtype.hpp's
/// f32_to_int8). The device rounds with cvt.rni (__float2int_rn); the host adds and subtracts
/// 1.5 x 2^23, which rounds |c| <= 128 to an integer in the FPU's nearest-even mode (the sum
/// lies in [2^23, 2^24), where the spacing of floats is 1).
PAGEDKV_HOST_DEVICE inline int8_t f32_to_int8_bits(float f) {
  if (f != f) return 0;
  const float c = f < -128.0f ? -128.0f : (f > 127.0f ? 127.0f : f);
#if defined(__CUDA_ARCH__)
  return static_cast<int8_t>(__float2int_rn(c));
#else
  constexpr float kMagic = 12582912.0f;  // 1.5 x 2^23
  return static_cast<int8_t>(static_cast<int32_t>((c + kMagic) - kMagic));
#endif
}

/// fp8 e5m2 -> fp16 bits: the byte is the top byte of the fp16 of equal value (both formats
/// have 5 exponent bits, bias 15), infinities and NaN included.
PAGEDKV_HOST_DEVICE constexpr uint16_t e5m2_to_f16_bits(uint8_t b) {
  return static_cast<uint16_t>(b << 8);
}

/// fp8 e4m3 -> fp16 bits of the value times 2^-8: the sign to bit 15, exponent and mantissa
/// (bits 6..0) to bits 13..7, i.e. an fp16 exponent field e4 (bias 15 instead of 7: the 2^-8)
/// and mantissa m << 7; subnormals scale the same way (fp16 subnormal m x 2^-17 = e4m3's
/// m x 2^-9 times 2^-8). The NaN codes S.1111.111 give 0x3F80 (480 x 2^-8), which the caller
/// maps to NaN (is_e4m3_nan_f16_bits).
PAGEDKV_HOST_DEVICE constexpr uint16_t e4m3_to_f16_bits_scaled(uint8_t b) {
  return static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7));
}
/// True for the fp16 bits e4m3_to_f16_bits_scaled gives the NaN codes 0x7F and 0xFF.
PAGEDKV_HOST_DEVICE constexpr bool is_e4m3_nan_f16_bits(uint16_t h) {
  return (h & 0x7FFFu) == 0x3F80u;
}
/// The factor e4m3_to_f16_bits_scaled leaves out (2^8); the decode kernel folds it into the
/// K and V scales rather than into every element.
inline constexpr float kE4M3WidenFactor = 256.0f;

/// int8 -> fp16 bits of 1024 + (b + 128): the byte with its sign bit flipped (b + 128, an
/// unsigned 0..255) in the low mantissa bits of 1024 (0x6400); subtracting 1152 in fp16 (exact,
/// integers below 2048) gives b.
PAGEDKV_HOST_DEVICE constexpr uint16_t int8_to_f16_bits_biased(uint8_t b) {
  return static_cast<uint16_t>(0x6400u | (b ^ 0x80u));
}
/// What int8_to_f16_bits_biased adds: 1024 + 128.
inline constexpr float kInt8WidenBias = 1152.0f;

}  // namespace pagedkv::cuda::detail
