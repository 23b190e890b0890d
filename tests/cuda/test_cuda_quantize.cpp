// cuda/quantize.hpp, the integer codecs the CUDA kernels run where the hardware has no fp8
// conversion (sm_80) and the widening formulas of the decode kernel, checked on the host
// (no GPU needed) against dtype.hpp's encoders and decoders: every code, every tie between two
// codes, the saturation and NaN edges, and a million random floats.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda/quantize.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::cuda::detail {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

/// Inputs that decide an 8-bit encoder: for every finite code c, its value, the value one
/// fp32 ulp either side, and the midpoint to the next code with its two neighbours (the ties,
/// and just past them); both signs; zeros, infinities, NaN of both signs, fp32 subnormals,
/// values past the largest code.
std::vector<float> edge_inputs(float (*decode)(uint8_t)) {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           -std::numeric_limits<float>::quiet_NaN(),
                           from_bits(0x7F800001u),  // signalling NaN payload
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           1e30f,
                           3e38f};
  std::vector<float> codes;
  for (int b = 0; b < 128; ++b) {
    const float c = decode(static_cast<uint8_t>(b));
    if (std::isfinite(c)) codes.push_back(c);
  }
  for (size_t i = 0; i < codes.size(); ++i) {
    const float c = codes[i];
    const float inf = std::numeric_limits<float>::infinity();
    for (float x : {c, std::nextafter(c, inf), std::nextafter(c, -inf)}) xs.push_back(x);
    // The last code's "next" is the one past max (the would-be code): its tie must saturate.
    const float next = i + 1 < codes.size() ? codes[i + 1] : 2.0f * c - codes[i - 1];
    const float mid = 0.5f * (c + next);  // exact: codes are short binary fractions
    for (float x : {mid, std::nextafter(mid, inf), std::nextafter(mid, -inf)}) xs.push_back(x);
  }
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  return xs;
}

std::vector<float> random_inputs() {
  std::mt19937 rng(2024);
  std::vector<float> xs;
  for (int i = 0; i < 500000; ++i) xs.push_back(from_bits(static_cast<uint32_t>(rng())));
  std::uniform_real_distribution<float> wide(-600.0f, 600.0f);
  for (int i = 0; i < 500000; ++i) xs.push_back(wide(rng));
  return xs;
}

TEST(CudaQuantize, E4M3EncoderMatchesHost) {
  for (const auto& xs : {edge_inputs(&e4m3_to_f32), random_inputs()}) {
    for (float x : xs) {
      ASSERT_EQ(f32_to_e4m3_bits(x), f32_to_e4m3(x)) << "x = " << x;
    }
  }
  // Hand-worked (quantize.hpp's example and the edges of dtype.hpp).
  EXPECT_EQ(f32_to_e4m3_bits(0.3f), 0x2A);
  EXPECT_EQ(f32_to_e4m3_bits(464.0f), 0x7E);  // tie between 448 and the NaN code: saturates
  EXPECT_EQ(f32_to_e4m3_bits(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(f32_to_e4m3_bits(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: even
  EXPECT_EQ(f32_to_e4m3_bits(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal quanta: even (2)
}

TEST(CudaQuantize, E5M2EncoderMatchesHost) {
  for (const auto& xs : {edge_inputs(&e5m2_to_f32), random_inputs()}) {
    for (float x : xs) {
      ASSERT_EQ(f32_to_e5m2_bits(x), f32_to_e5m2(x)) << "x = " << x;
    }
  }
  EXPECT_EQ(f32_to_e5m2_bits(61440.0f), 0x7B);  // tie between 57344 and inf: saturates
  EXPECT_EQ(f32_to_e5m2_bits(std::numeric_limits<float>::infinity()), 0x7B);
  EXPECT_EQ(f32_to_e5m2_bits(std::numeric_limits<float>::quiet_NaN()), 0x7E);
}

TEST(CudaQuantize, Int8EncoderMatchesHost) {
  std::vector<float> xs = random_inputs();
  for (int i = -140; i <= 140; ++i) {
    for (float f : {0.0f, 0.5f, 0.25f, 0.75f}) xs.push_back(static_cast<float>(i) + f);
  }
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  for (float x : xs) {
    ASSERT_EQ(f32_to_int8_bits(x), f32_to_int8(x)) << "x = " << x;
  }
  EXPECT_EQ(f32_to_int8_bits(2.5f), 2);  // half to even
  EXPECT_EQ(f32_to_int8_bits(-3.5f), -4);
  EXPECT_EQ(f32_to_int8_bits(1000.0f), 127);
  EXPECT_EQ(f32_to_int8_bits(-1000.0f), -128);
}

TEST(CudaQuantize, WidenersGiveTheStoredValueOfEveryCode) {
  for (int i = 0; i < 256; ++i) {
    const auto b = static_cast<uint8_t>(i);
    const float e5 = e5m2_to_f32(b);
    const float w5 = f16_to_f32(e5m2_to_f16_bits(b));
    EXPECT_TRUE(std::isnan(e5) ? std::isnan(w5) : w5 == e5) << "e5m2 code " << i;

    const float e4 = e4m3_to_f32(b);
    const uint16_t h = e4m3_to_f16_bits_scaled(b);
    EXPECT_EQ(is_e4m3_nan_f16_bits(h), std::isnan(e4)) << "e4m3 code " << i;
    if (!std::isnan(e4)) {
      EXPECT_EQ(f16_to_f32(h) * kE4M3WidenFactor, e4) << "e4m3 code " << i;
    }

    const float w8 = f16_to_f32(int8_to_f16_bits_biased(b)) - kInt8WidenBias;
    EXPECT_EQ(w8, static_cast<float>(static_cast<int8_t>(b))) << "int8 code " << i;
  }
}

}  // namespace
}  // namespace pagedkv::cuda::detail
