// reshape_and_cache and HostKVCache::write from an engine's fp16 / bf16 activations (the
// ActivationView overloads, kv_write.hpp, issues 19 and 21): every pool dtype must hold, byte
// for byte, what the fp32 write of the exactly widened inputs puts there. The widening here is
// independent of dtype.hpp's: fp16 is decoded from its fields with ldexp, bf16 by placing its
// bits in the top half of a binary32. Hand-worked values, the errors (8-bit input dtypes, null
// data, sizes) and that a failed write changes nothing.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/error_message.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_write.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using testing::message_of;

constexpr uint8_t kSentinel = 0xAA;

/// fp16 bits -> float from the fields (1-5-10, bias 15): inf and NaN keep sign and payload as
/// the IEEE widening does (mantissa in the top 10 of binary32's 23 bits).
float f16_by_fields(uint16_t h) {
  const uint32_t sign = h >> 15;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) {
    const uint32_t bits = (sign << 31) | 0x7F800000u | (m << 13);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
  const float a = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(1024 + m), int(e) - 25);
  return sign ? -a : a;
}

/// bf16 bits -> float: the upper half of a binary32.
float bf16_by_bits(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::vector<float> widen(DType dtype, const std::vector<uint16_t>& bits) {
  std::vector<float> out;
  for (uint16_t b : bits) out.push_back(dtype == DType::kF16 ? f16_by_fields(b) : bf16_by_bits(b));
  return out;
}

/// 1 layer, 2 blocks of 4 tokens, 2 kv heads of 3 dims, separate NHD pools of `dtype`.
KVCacheConfig config(DType dtype) {
  KVCacheConfig c;
  c.num_layers = 1;
  c.num_blocks = 2;
  c.block_size = 4;
  c.num_kv_heads = 2;
  c.head_dim = 3;
  c.dtype = dtype;
  c.layout = KVLayout::kNHD;
  c.placement = KVPlacement::kSeparate;
  return c;
}

/// Caller-owned K and V pools filled with kSentinel, and their view (8-bit: per-head scales).
struct Pools {
  std::vector<std::byte> k, v;
  KVLayerView view;
  explicit Pools(DType dtype)
      : k(static_cast<size_t>(pool_elements(config(dtype)) * dtype_size(dtype)),
          std::byte{kSentinel}),
        v(k.size(), std::byte{kSentinel}),
        view(layer_view(config(dtype), k.data(), v.data())) {
    if (dtype_is_quantized(dtype)) {
      view.k_scale = kKScale;
      view.v_scale = kVScale;
    }
  }
  static constexpr float kKScale[2] = {0.5f, 3.0f};
  static constexpr float kVScale[2] = {2.0f, 0.25f};
};

/// Every interesting 16-bit pattern once (zeros, subnormals, normals near 1, the largest
/// finite, inf, NaN, both signs), then random bits, to num_tokens * 2 heads * 3 dims values.
std::vector<uint16_t> input_bits(DType dtype, size_t n, uint32_t seed) {
  std::vector<uint16_t> bits =
      dtype == DType::kF16
          ? std::vector<uint16_t>{0x0000, 0x8000, 0x0001, 0x83FF, 0x3C00, 0x3C01, 0xBE00,
                                  0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x5BF8, 0x2E66}
          : std::vector<uint16_t>{0x0000, 0x8000, 0x0001, 0x807F, 0x3F80, 0x3F81, 0xBFC0,
                                  0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0x42FE, 0x3E4D};
  std::mt19937 rng(seed);
  while (bits.size() < n) bits.push_back(static_cast<uint16_t>(rng()));
  bits.resize(n);
  return bits;
}

struct WriteCase {
  DType input;
  DType pool;
};

class WriteFromActivations : public ::testing::TestWithParam<WriteCase> {};

TEST_P(WriteFromActivations, EqualsTheFp32WriteOfTheWidenedValues) {
  const auto [input, pool] = GetParam();
  const std::vector<Slot> slots = {5, 2, 7, 0, -1};  // the patterns land in tokens 0-2; 4 pads
  const size_t n = slots.size() * 2 * 3;
  const std::vector<uint16_t> k16 = input_bits(input, n, 1);
  const std::vector<uint16_t> v16 = input_bits(input, n, 2);
  Pools typed(pool);
  reshape_and_cache(typed.view, slots, ActivationView{k16.data(), k16.size(), input},
                    ActivationView{v16.data(), v16.size(), input});
  Pools fp32(pool);
  reshape_and_cache(fp32.view, slots, widen(input, k16), widen(input, v16));
  EXPECT_EQ(typed.k, fp32.k);
  EXPECT_EQ(typed.v, fp32.v);
  // The write happened: token 0's first value (+0) is stored as zero bytes at slot 5.
  EXPECT_EQ(typed.k[static_cast<size_t>(typed.view.slot_offset(5, 0) * dtype_size(pool))],
            std::byte{0});
  // The padding token went nowhere: the 4 slots of the 8 no token maps to keep their sentinels
  // (a written byte may equal the sentinel too, hence >=).
  const auto untouched = [&](const std::vector<std::byte>& bytes) {
    size_t count = 0;
    for (std::byte b : bytes) count += b == std::byte{kSentinel};
    return count;
  };
  EXPECT_GE(untouched(typed.k), 4u * 2 * 3 * static_cast<size_t>(dtype_size(pool)));
}

std::vector<WriteCase> cases() {
  std::vector<WriteCase> out;
  for (DType input : {DType::kF16, DType::kBF16}) {
    for (DType pool :
         {DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8}) {
      out.push_back({input, pool});
    }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<WriteCase>& info) {
  return std::string(dtype_name(info.param.input)) + "_into_" +
         std::string(dtype_name(info.param.pool));
}

INSTANTIATE_TEST_SUITE_P(Grid, WriteFromActivations, ::testing::ValuesIn(cases()), case_name);

TEST(WriteFromActivations, HandWorkedValues) {
  // bf16 0x3FC0 is 1.5 and 0x4000 is 2.0: an fp32 pool holds them exactly.
  Pools f32(DType::kF32);
  const std::vector<uint16_t> k = {0x3FC0, 0x4000, 0xC0A0, 0, 0, 0};  // 1.5, 2, -5
  reshape_and_cache(f32.view, std::vector<Slot>{5}, ActivationView{k.data(), 6, DType::kBF16},
                    ActivationView{k.data(), 6, DType::kBF16});
  float got[3];
  std::memcpy(got, f32.k.data() + f32.view.slot_offset(5, 0) * 4, sizeof got);
  EXPECT_EQ(got[0], 1.5f);
  EXPECT_EQ(got[1], 2.0f);
  EXPECT_EQ(got[2], -5.0f);
  // fp16 65504 (0x7BFF, its largest finite) into fp8 e4m3 with scale 1 saturates to 448 (0x7E);
  // -65504 to -448 (0xFE); fp16 0.5 (0x3800) stays 0.5 (0x30).
  Pools e4m3(DType::kFP8E4M3);
  const float one[2] = {1.0f, 1.0f};
  e4m3.view.k_scale = one;
  e4m3.view.v_scale = one;
  const std::vector<uint16_t> big = {0x7BFF, 0xFBFF, 0x3800, 0, 0, 0};
  reshape_and_cache(e4m3.view, std::vector<Slot>{0}, ActivationView{big.data(), 6, DType::kF16},
                    ActivationView{big.data(), 6, DType::kF16});
  EXPECT_EQ(e4m3.k[0], std::byte{0x7E});
  EXPECT_EQ(e4m3.k[1], std::byte{0xFE});
  EXPECT_EQ(e4m3.k[2], std::byte{0x30});
  // fp16 1 + 2^-10 (0x3C01) into bf16 (7 mantissa bits) rounds to 1.0 (0x3F80); int8 with
  // head 0's K scale 0.5: bf16 1.5 / 0.5 = 3.
  Pools b16(DType::kBF16);
  const std::vector<uint16_t> near_one = {0x3C01, 0, 0, 0, 0, 0};
  reshape_and_cache(b16.view, std::vector<Slot>{0}, ActivationView{near_one.data(), 6, DType::kF16},
                    ActivationView{near_one.data(), 6, DType::kF16});
  uint16_t stored = 0;
  std::memcpy(&stored, b16.k.data(), 2);
  EXPECT_EQ(stored, 0x3F80);
  Pools i8(DType::kInt8);
  reshape_and_cache(i8.view, std::vector<Slot>{0}, ActivationView{k.data(), 6, DType::kBF16},
                    ActivationView{k.data(), 6, DType::kBF16});
  EXPECT_EQ(static_cast<int8_t>(i8.k[0]), 3);
}

TEST(WriteFromActivations, KAndVMayDifferAndFp32IsReadInPlace) {
  const std::vector<uint16_t> k16 = input_bits(DType::kF16, 6, 3);
  const std::vector<float> v32 = {1, -2, 0.25f, 3, 1e-3f, 7};
  Pools typed(DType::kFP8E4M3);
  reshape_and_cache(typed.view, std::vector<Slot>{3}, ActivationView{k16.data(), 6, DType::kF16},
                    ActivationView{v32.data(), 6, DType::kF32});
  Pools fp32(DType::kFP8E4M3);
  reshape_and_cache(fp32.view, std::vector<Slot>{3}, widen(DType::kF16, k16), v32);
  EXPECT_EQ(typed.k, fp32.k);
  EXPECT_EQ(typed.v, fp32.v);
}

TEST(WriteFromActivations, ErrorsNameTheValueAndWriteNothing) {
  Pools pools(DType::kBF16);
  const std::vector<uint16_t> six(6, 0x3F80), twelve(12, 0x3F80);
  const std::vector<uint8_t> bytes(6, 0x38);
  const ActivationView good{six.data(), 6, DType::kBF16};
  struct BadCall {
    ActivationView k, v;
    std::vector<Slot> slots;
    const char* message;
  };
  const std::vector<BadCall> calls = {
      {{bytes.data(), 6, DType::kFP8E4M3},
       good,
       {0},
       "reshape_and_cache: k dtype fp8_e4m3 is not fp32, fp16 or bf16"},
      {good, {bytes.data(), 6, DType::kInt8}, {0}, "v dtype int8 is not fp32, fp16 or bf16"},
      {good, {bytes.data(), 6, DType::kFP8E5M2}, {0}, "v dtype fp8_e5m2 is not fp32, fp16 or bf16"},
      {{nullptr, 6, DType::kF16}, good, {0}, "reshape_and_cache: k is null with 6 elements"},
      {{twelve.data(), 12, DType::kBF16},
       good,
       {0},
       "k has 12 elements, expected 6 (1 tokens x 2 kv heads x 3 dims)"},
      {good, {twelve.data(), 12, DType::kF16}, {0}, "v has 12 elements, expected 6"},
      {good, good, {8}, "slot 8 of token 0 out of range [0, 8)"},
  };
  for (const BadCall& c : calls) {
    EXPECT_THAT(message_of([&] { reshape_and_cache(pools.view, c.slots, c.k, c.v); }),
                HasSubstr(c.message));
  }
  for (const auto* pool : {&pools.k, &pools.v}) {
    for (std::byte b : *pool) EXPECT_EQ(b, std::byte{kSentinel});
  }
  // No tokens and no data: nothing to do, as the fp32 overload.
  EXPECT_NO_THROW(reshape_and_cache(pools.view, {}, ActivationView{nullptr, 0, DType::kBF16},
                                    ActivationView{nullptr, 0, DType::kF16}));
}

// HostKVCache::write from bf16: a quantized layer calibrates its scales from the widened values
// and stores what the fp32 write stores.
TEST(WriteFromActivations, HostKVCacheCalibratesAndStoresAsFp32) {
  KVCacheConfig c = config(DType::kFP8E4M3);
  c.scale_granularity = KVScaleGranularity::kPerHead;
  HostKVCache typed(c);
  HostKVCache fp32(c);
  const std::vector<Slot> slots = {1, 6};
  const std::vector<uint16_t> k16 = input_bits(DType::kBF16, 12, 4);
  const std::vector<uint16_t> v16 = input_bits(DType::kBF16, 12, 5);
  typed.write(0, slots, ActivationView{k16.data(), 12, DType::kBF16},
              ActivationView{v16.data(), 12, DType::kBF16});
  fp32.write(0, slots, widen(DType::kBF16, k16), widen(DType::kBF16, v16));
  for (bool value : {false, true}) {
    const std::span<const float> a = typed.scales(0, value);
    const std::span<const float> b = fp32.scales(0, value);
    EXPECT_EQ(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()));
  }
  for (BlockId b = 0; b < c.num_blocks; ++b) EXPECT_EQ(typed.block_bytes(b), fp32.block_bytes(b));
  const std::vector<uint8_t> bytes(12, 0x38);
  HostKVCache fresh(c);
  const ActivationView k_bf16{k16.data(), 12, DType::kBF16};
  const ActivationView v_fp8{bytes.data(), 12, DType::kFP8E4M3};
  EXPECT_THAT(message_of([&] { fresh.write(0, slots, k_bf16, v_fp8); }),
              HasSubstr("HostKVCache::write: v dtype fp8_e4m3 is not fp32, fp16 or bf16"));
  EXPECT_EQ(fresh.scales(0, false)[0], 1.0f);  // not calibrated by the failed write
}

}  // namespace
}  // namespace pagedkv
