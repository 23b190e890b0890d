// dtype names, sizes and the fp16/bf16 <-> fp32 conversions (exact values and exhaustive
// round trips over every 16-bit pattern).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "pagedkv/dtype.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(DType, Sizes) {
  static_assert(dtype_size(DType::kF32) == 4);
  EXPECT_EQ(dtype_size(DType::kF16), 2);
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
}

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  EXPECT_EQ(dtype_name(DType::kF32), "fp32");
  EXPECT_EQ(dtype_name(DType::kF16), "fp16");
  EXPECT_EQ(dtype_name(DType::kBF16), "bf16");
}

TEST(DType, ParseAliases) {
  for (const char* s : {"fp32", "f32", "float32"}) EXPECT_EQ(parse_dtype(s), DType::kF32) << s;
  for (const char* s : {"fp16", "f16", "float16", "half"}) EXPECT_EQ(parse_dtype(s), DType::kF16);
  for (const char* s : {"bf16", "bfloat16"}) EXPECT_EQ(parse_dtype(s), DType::kBF16) << s;
}

TEST(DType, ParseErrorNamesTheStringAndTheAcceptedNames) {
  EXPECT_THAT([] { (void)parse_dtype("fp4"); },
              ThrowsMessage<Error>(AllOf(HasSubstr("'fp4'"), HasSubstr("bfloat16"),
                                         HasSubstr("fp8_e4m3"), HasSubstr("int8"))));
  EXPECT_THAT([] { (void)parse_dtype(""); }, ThrowsMessage<Error>(HasSubstr("''")));
}

TEST(DType, F16ExactValues) {
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(0.5f), 0x3800);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);               // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);               // halfway to 65536: rounds to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -26)), 0x0000);  // below half the smallest subnormal
  // Round to nearest even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> the even one (1);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even) -> 1 + 2^-9.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
}

TEST(DType, Bf16ExactValues) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  // Halfway cases, round to nearest even (8 significant bits: ulp at 1 is 2^-7).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
}

TEST(DType, EveryF16PatternRoundTrips) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << "pattern " << h;
  }
}

TEST(DType, EveryBf16PatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_bf16(f), b) << "pattern " << b;
  }
}

TEST(DType, StoreThenLoadRoundsToNearest) {
  // 0.1 is not representable in any of the three; each stores its nearest value.
  float f32[1];
  uint16_t half[1];
  store_from_f32(f32, DType::kF32, 0, 0.1f);
  EXPECT_EQ(load_as_f32(f32, DType::kF32, 0), 0.1f);
  store_from_f32(half, DType::kF16, 0, 0.1f);
  EXPECT_EQ(half[0], 0x2E66);  // 0.0999755859375
  EXPECT_EQ(load_as_f32(half, DType::kF16, 0), 0.0999755859375f);
  store_from_f32(half, DType::kBF16, 0, 0.1f);
  EXPECT_EQ(half[0], 0x3DCD);  // 0.10009765625
  EXPECT_EQ(load_as_f32(half, DType::kBF16, 0), 0.10009765625f);
}

}  // namespace
}  // namespace pagedkv
