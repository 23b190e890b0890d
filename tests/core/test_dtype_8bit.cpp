// The 8-bit KV formats (dtype.hpp): fp8 e4m3 / e5m2 and int8 names, exact decodes, and the
// encode (round to nearest even, saturation, NaN) against a brute-force oracle that picks the
// nearest of all 256 decoded values.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "pagedkv/dtype.hpp"

namespace pagedkv {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(DType8Bit, SizesNamesAndAliases) {
  for (DType d : {DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8}) {
    EXPECT_EQ(dtype_size(d), 1);
    EXPECT_TRUE(dtype_is_quantized(d));
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) EXPECT_FALSE(dtype_is_quantized(d));
  EXPECT_EQ(dtype_name(DType::kFP8E4M3), "fp8_e4m3");
  EXPECT_EQ(dtype_name(DType::kFP8E5M2), "fp8_e5m2");
  EXPECT_EQ(dtype_name(DType::kInt8), "int8");
  for (const char* s : {"fp8", "e4m3", "float8_e4m3fn"}) EXPECT_EQ(parse_dtype(s), DType::kFP8E4M3);
  for (const char* s : {"e5m2", "float8_e5m2"}) EXPECT_EQ(parse_dtype(s), DType::kFP8E5M2);
  EXPECT_EQ(parse_dtype("i8"), DType::kInt8);
  EXPECT_EQ(dtype_max_finite(DType::kFP8E4M3), 448.0f);
  EXPECT_EQ(dtype_max_finite(DType::kFP8E5M2), 57344.0f);
  EXPECT_EQ(dtype_max_finite(DType::kInt8), 127.0f);
  EXPECT_EQ(dtype_max_finite(DType::kBF16), 0.0f);
}

// Hand-worked from the OCP spec's field layout S.EEEE.MMM, bias 7.
TEST(DType8Bit, E4M3DecodesHandWorkedCodes) {
  EXPECT_EQ(e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_f32(0x80)));
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));      // smallest subnormal: 1/8 x 2^-6
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));  // largest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));      // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);                      // E = 7
  EXPECT_EQ(e4m3_to_f32(0x39), 1.125f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);  // 2^8 x 1.75
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);  // E = 15 is a normal binade (no inf in E4M3FN)
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
}

// e5m2 is fp16 without its low 8 mantissa bits: the fp16 decoder (tested exhaustively in
// test_dtype.cpp) is an independent oracle for all 256 codes.
TEST(DType8Bit, E5M2IsTheTopByteOfFp16) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float want = f16_to_f32(static_cast<uint16_t>(b << 8));
    const float got = e5m2_to_f32(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      EXPECT_EQ(got, want) << b;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << b;
    }
  }
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(0x7C), kInf);
}

/// The oracle: the code of the finite value nearest to x (ties to the even code), saturating
/// beyond the largest finite value; NaN -> the format's NaN code with x's sign.
template <typename Decode>
uint8_t nearest_code(float x, Decode decode, uint8_t nan_code) {
  if (std::isnan(x)) return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | nan_code);
  int best = -1;
  double best_d = 0;
  // Saturation: beyond the largest finite value (where distances to the top codes no longer
  // differ in double), the largest finite value of x's sign.
  float max_finite = 0;
  for (int c = 0; c < 128; ++c) {
    const float v = decode(static_cast<uint8_t>(c));
    if (std::isfinite(v)) max_finite = std::max(max_finite, v);
  }
  if (std::abs(x) >= max_finite) {
    x = std::signbit(x) ? -max_finite : max_finite;
  }
  for (int c = 0; c < 256; ++c) {
    const float v = decode(static_cast<uint8_t>(c));
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(x)) continue;
    const double d = std::abs(static_cast<double>(v) - static_cast<double>(x));
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

/// Probes: every finite value, the midpoints of neighbours (ties) and the floats just beside
/// them, log-uniform randoms over the whole range and beyond, zero, infinities, NaN.
template <typename Decode>
std::vector<float> probes(Decode decode) {
  std::vector<float> finite;
  for (int c = 0; c < 128; ++c) {
    const float v = decode(static_cast<uint8_t>(c));
    if (std::isfinite(v)) finite.push_back(v);
  }
  std::vector<float> p = finite;
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    const float mid = (finite[i] + finite[i + 1]) / 2;  // exact: one more mantissa bit
    p.push_back(mid);
    p.push_back(std::nextafter(mid, 0.0f));
    p.push_back(std::nextafter(mid, kInf));
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> e(-20.0f, 20.0f);
  for (int i = 0; i < 4000; ++i) p.push_back(std::exp2(e(rng)));
  p.insert(p.end(), {finite.back() * 1.03f, finite.back() * 1.1f, 1e30f, kInf, kNaN, 1e-40f});
  const size_t n = p.size();
  for (size_t i = 0; i < n; ++i) p.push_back(-p[i]);
  return p;
}

TEST(DType8Bit, E4M3EncodeIsNearestEvenSaturatingOnEveryProbe) {
  for (float x : probes(e4m3_to_f32)) {
    ASSERT_EQ(f32_to_e4m3(x), nearest_code(x, e4m3_to_f32, 0x7F)) << "x = " << x;
  }
}

TEST(DType8Bit, E5M2EncodeIsNearestEvenSaturatingOnEveryProbe) {
  for (float x : probes(e5m2_to_f32)) {
    ASSERT_EQ(f32_to_e5m2(x), nearest_code(x, e5m2_to_f32, 0x7E)) << "x = " << x;
  }
}

TEST(DType8Bit, HandWorkedRoundingAndSaturation) {
  // 1 + 1/16 is halfway between 1 (0x38, even) and 1.125 (0x39): to 0x38; 1 + 3/16 is halfway
  // between 1.125 (odd) and 1.25 (0x3A, even): to 0x3A.
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);
  // Halfway between 448 and the next step (480, the NaN code): saturates to 448, as everything
  // larger, infinities included.
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-kInf), 0xFE);
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0xFF);
  // Subnormals: 2^-10 is half the smallest subnormal: ties to even (0); 3 x 2^-10 is halfway
  // between codes 1 and 2: to 2.
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(f32_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);
  // 15 x 2^-10 is halfway between the largest subnormal (7, odd) and the smallest normal (8).
  EXPECT_EQ(f32_to_e4m3(15 * std::ldexp(1.0f, -10)), 0x08);
  EXPECT_EQ(f32_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7B);  // halfway to 65536 (inf): saturates
  EXPECT_EQ(f32_to_e5m2(kInf), 0x7B);
  EXPECT_EQ(f32_to_e5m2(-kInf), 0xFB);
  EXPECT_EQ(f32_to_e5m2(kNaN), 0x7E);
  EXPECT_EQ(f32_to_e5m2(1.0f), 0x3C);
}

TEST(DType8Bit, Int8RoundsHalfToEvenSaturatesAndZeroesNaN) {
  EXPECT_EQ(f32_to_int8(2.5f), 2);
  EXPECT_EQ(f32_to_int8(3.5f), 4);
  EXPECT_EQ(f32_to_int8(-2.5f), -2);
  EXPECT_EQ(f32_to_int8(-0.4f), 0);
  EXPECT_EQ(f32_to_int8(126.6f), 127);
  EXPECT_EQ(f32_to_int8(127.5f), 127);
  EXPECT_EQ(f32_to_int8(1000.0f), 127);
  EXPECT_EQ(f32_to_int8(-128.0f), -128);
  EXPECT_EQ(f32_to_int8(-1000.0f), -128);
  EXPECT_EQ(f32_to_int8(kInf), 127);
  EXPECT_EQ(f32_to_int8(-kInf), -128);
  EXPECT_EQ(f32_to_int8(kNaN), 0);
}

TEST(DType8Bit, StoreThenLoadGivesTheStoredValueBeforeItsScale) {
  uint8_t buf[3];
  store_from_f32(buf, DType::kFP8E4M3, 0, 0.1f);  // nearest e4m3: 0.1015625 = 13 x 2^-7
  EXPECT_EQ(buf[0], 0x1D);
  EXPECT_EQ(load_as_f32(buf, DType::kFP8E4M3, 0), 0.1015625f);
  store_from_f32(buf, DType::kFP8E5M2, 1, 0.1f);  // nearest e5m2: 0.09375 = 3 x 2^-5
  EXPECT_EQ(load_as_f32(buf, DType::kFP8E5M2, 1), 0.09375f);
  store_from_f32(buf, DType::kInt8, 2, -7.6f);
  EXPECT_EQ(load_as_f32(buf, DType::kInt8, 2), -8.0f);
}

}  // namespace
}  // namespace pagedkv
