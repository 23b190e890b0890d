// The 8-bit pools (issue 19): scales per tensor and per kv head, quantize on write (stored =
// Q(x / scale), read = stored x scale), first-write calibration, the checks on scales, bytes
// with the scales counted, and reshape_and_cache on a view over memory the caller owns.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"
#include "pagedkv/storage/kv_write.hpp"

namespace pagedkv {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// 2 layers, 4 blocks of 2 tokens, 2 kv heads, head_dim 3, separate pools, HND.
KVCacheConfig config(DType dtype, KVScaleGranularity g = KVScaleGranularity::kPerTensor) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_blocks = 4;
  c.block_size = 2;
  c.num_kv_heads = 2;
  c.head_dim = 3;
  c.dtype = dtype;
  c.placement = KVPlacement::kSeparate;
  c.scale_granularity = g;
  return c;
}

TEST(QuantizedKVCache, BytesCountOneBytePerElementPlusTheScales) {
  const HostKVCache cache(config(DType::kFP8E4M3));
  // pools: 2 (K, V) x 2 layers x 4 blocks x 2 tokens x 2 heads x 3 dims x 1 byte = 192;
  // scales: 2 x 2 layers x 2 heads x 4 bytes = 32.
  EXPECT_EQ(cache.bytes(), 192 + 32);
  EXPECT_EQ(kv_scale_bytes(config(DType::kBF16)), 0);
  EXPECT_EQ(kv_cache_bytes(config(DType::kBF16)), 384);
  EXPECT_EQ(cache.block_bytes(0).size(), 2u * 2 * 2 * 2 * 3);
}

TEST(QuantizedKVCache, PerTensorScaleQuantizesAndReadsBackScaled) {
  HostKVCache cache(config(DType::kFP8E4M3));
  const float ks[] = {0.5f};
  const float vs[] = {2.0f};
  cache.set_scales(1, ks, vs);
  EXPECT_THAT(cache.scales(1, false), ElementsAre(0.5f, 0.5f));
  EXPECT_THAT(cache.scales(0, false), ElementsAre(1.0f, 1.0f));  // layer 0 not set
  // Token at slot 5 (block 2, offset 1). K / 0.5 = {2, 2.1, -300}: 2 exact, 2.1 -> 2.0 (e4m3
  // steps are 0.25 in [2, 4)), -300 -> -288 (steps of 32 in [256, 448]); read x 0.5.
  // V / 2 = {1, 500, NaN}: 1, 500 saturates to 448, NaN stays NaN; read x 2.
  const std::vector<float> k = {1.0f, 1.05f, -150.0f, 0, 0, 0};
  const std::vector<float> v = {2.0f, 1000.0f, kNaN, 0, 0, 0};
  cache.write(1, std::vector<Slot>{5}, k, v);
  EXPECT_THAT(cache.read(1, 5, 0, false), ElementsAre(1.0f, 1.0f, -144.0f));
  const std::vector<float> rv = cache.read(1, 5, 0, true);
  EXPECT_EQ(rv[0], 2.0f);
  EXPECT_EQ(rv[1], 896.0f);
  EXPECT_TRUE(std::isnan(rv[2]));
  // The bytes are the e4m3 codes of the scaled values.
  const KVLayerView view = cache.layer(1);
  const auto* kb = static_cast<const uint8_t*>(view.k);
  EXPECT_EQ(kb[view.slot_offset(5, 0)], f32_to_e4m3(2.0f));
  EXPECT_EQ(kb[view.slot_offset(5, 0) + 2], f32_to_e4m3(-288.0f));
  EXPECT_EQ(view.k_scale[1], 0.5f);
  EXPECT_EQ(view.v_scale[0], 2.0f);
}

TEST(QuantizedKVCache, PerHeadScalesApplyToTheirHeadOnly) {
  HostKVCache cache(config(DType::kInt8, KVScaleGranularity::kPerHead));
  const float ks[] = {0.1f, 1.0f};
  const float vs[] = {1.0f, 0.01f};
  cache.set_scales(0, ks, vs);
  // head 0 K / 0.1: {10, -25, 2000 -> 127}; head 1 K / 1: {1, -2.5 -> -2, 0.4 -> 0}.
  const std::vector<float> k = {1.0f, -2.5f, 200.0f, 1.0f, -2.5f, 0.4f};
  // head 0 V / 1: {3.5 -> 4, -200 -> -128, 0}; head 1 V / 0.01: {50, -1.26 -> -1, 0.995 -> 0}.
  // (0.995 / 0.01 = 99.5 in exact arithmetic; in fp32 0.995 x 100 rounds to 99.5 -> 100 even.)
  const std::vector<float> v = {3.5f, -200.0f, 0.0f, 0.5f, -0.0126f, 0.995f};
  cache.write(0, std::vector<Slot>{0}, k, v);
  const std::vector<float> k0 = cache.read(0, 0, 0, false);
  EXPECT_FLOAT_EQ(k0[0], 1.0f);
  EXPECT_FLOAT_EQ(k0[1], -2.5f);
  EXPECT_FLOAT_EQ(k0[2], 12.7f);
  EXPECT_THAT(cache.read(0, 0, 1, false), ElementsAre(1.0f, -2.0f, 0.0f));
  EXPECT_THAT(cache.read(0, 0, 0, true), ElementsAre(4.0f, -128.0f, 0.0f));
  const std::vector<float> v1 = cache.read(0, 0, 1, true);
  EXPECT_FLOAT_EQ(v1[0], 0.5f);
  EXPECT_FLOAT_EQ(v1[1], -0.01f);
  const auto* vb = static_cast<const int8_t*>(cache.layer(0).v);
  EXPECT_EQ(vb[cache.layer(0).slot_offset(0, 1) + 2], f32_to_int8(0.995f * (1.0f / 0.01f)));
}

TEST(QuantizedKVCache, FirstWriteCalibratesPerTensorOrPerHead) {
  // Head 0 of K peaks at |-8|, head 1 at 2; V at 0.5 and 4 (padding slot -1 still counts: it
  // is part of the batch the caller passed).
  const std::vector<float> k = {1, -8, 2, 2, 0, 1, 0.5f, 0, 0, 0, 0, 0};
  const std::vector<float> v = {0.5f, 0, 0, 4, 0, 0, 0, 0, 0, 0, -1, 0};
  {
    HostKVCache cache(config(DType::kFP8E4M3));
    cache.write(0, std::vector<Slot>{3, -1}, k, v);
    EXPECT_THAT(cache.scales(0, false), ElementsAre(8.0f / 448, 8.0f / 448));
    EXPECT_THAT(cache.scales(0, true), ElementsAre(4.0f / 448, 4.0f / 448));
    EXPECT_THAT(cache.scales(1, false), ElementsAre(1.0f, 1.0f));  // other layer untouched
    // The max maps to the format's max exactly, so it reads back exactly.
    EXPECT_EQ(cache.read(0, 3, 0, false)[1], -8.0f);
    // A second write keeps the scales (and saturates what is larger).
    cache.write(0, std::vector<Slot>{4, 5}, std::vector<float>(12, 100.0f),
                std::vector<float>(12, 0.0f));
    EXPECT_THAT(cache.scales(0, false), ElementsAre(8.0f / 448, 8.0f / 448));
    EXPECT_EQ(cache.read(0, 4, 1, false)[0], 8.0f);
  }
  {
    HostKVCache cache(config(DType::kFP8E5M2, KVScaleGranularity::kPerHead));
    cache.write(0, std::vector<Slot>{3, -1}, k, v);
    EXPECT_THAT(cache.scales(0, false), ElementsAre(8.0f / 57344, 2.0f / 57344));
    EXPECT_THAT(cache.scales(0, true), ElementsAre(0.5f / 57344, 4.0f / 57344));
  }
  // All zeros: scale 1 (nothing to scale); non-finite values are left out of the max.
  const KVScales z = calibrate_kv_scales(DType::kInt8, KVScaleGranularity::kPerHead, 1, 2,
                                         std::vector<float>{0, 0, 0, 0},
                                         std::vector<float>{kNaN, 3, -INFINITY, 1});
  EXPECT_THAT(z.k, ElementsAre(1.0f));
  EXPECT_THAT(z.v, ElementsAre(3.0f / 127));
  const std::vector<float> none;
  for (auto [heads, dim] : {std::pair{0, 2}, std::pair{1, 0}}) {
    EXPECT_THAT(
        [&] {
          (void)calibrate_kv_scales(DType::kInt8, KVScaleGranularity::kPerTensor, heads, dim, none,
                                    none);
        },
        ThrowsMessage<Error>(HasSubstr("must be >= 1")));
  }
  EXPECT_THAT(
      [&] {
        (void)calibrate_kv_scales(DType::kF16, KVScaleGranularity::kPerTensor, 1, 2, none, none);
      },
      ThrowsMessage<Error>(HasSubstr("dtype fp16 has no scales")));
  // K of 2 tokens, V of 1 (both whole tokens): refused naming both sizes.
  EXPECT_THAT(
      [&] {
        (void)calibrate_kv_scales(DType::kInt8, KVScaleGranularity::kPerTensor, 1, 2,
                                  std::vector<float>(4, 1.0f), std::vector<float>(2, 1.0f));
      },
      ThrowsMessage<Error>(HasSubstr("k has 4 and v 2 elements")));
}

TEST(QuantizedKVCache, CalibrationHeadroomScalesTheMaxAndLeavesRoomAboveIt) {
  // K peaks at |-8|, V at 4 (the batch of FirstWriteCalibratesPerTensorOrPerHead, one head).
  const std::vector<float> k = {1, -8, 2, 2, 0, 1}, v = {0.5f, 0, 0, 4, 0, 0};
  KVCacheConfig c = config(DType::kInt8);
  c.calibration_headroom = 2.0f;
  HostKVCache cache(c);
  cache.write(0, std::vector<Slot>{3}, k, v);
  // With 2 kv heads of 3 dims per token in config(): k holds one token of both heads.
  EXPECT_THAT(cache.scales(0, false), ElementsAre(2.0f * 8 / 127, 2.0f * 8 / 127));
  EXPECT_THAT(cache.scales(0, true), ElementsAre(2.0f * 4 / 127, 2.0f * 4 / 127));
  // A later K of 15 (under 2 x 8) is stored unsaturated: round(15 / (16 / 127)) = 119.
  cache.write(0, std::vector<Slot>{4}, std::vector<float>{15, 0, 0, 0, 0, 0},
              std::vector<float>(6, 0.0f));
  const auto* kb = static_cast<const int8_t*>(cache.layer(0).k);
  EXPECT_EQ(kb[cache.layer(0).slot_offset(0, 4)], 119);
  // Headroom 1 saturates the same value at 127.
  HostKVCache tight(config(DType::kInt8));
  tight.write(0, std::vector<Slot>{3}, k, v);
  tight.write(0, std::vector<Slot>{4}, std::vector<float>{15, 0, 0, 0, 0, 0},
              std::vector<float>(6, 0.0f));
  EXPECT_EQ(static_cast<const int8_t*>(tight.layer(0).k)[tight.layer(0).slot_offset(0, 4)], 127);
  // Layer 1 calibrates into its own scales, layer 0's stay as they were.
  cache.write(1, std::vector<Slot>{3}, v, k);
  EXPECT_THAT(cache.scales(1, false), ElementsAre(2.0f * 4 / 127, 2.0f * 4 / 127));
  EXPECT_THAT(cache.scales(1, true), ElementsAre(2.0f * 8 / 127, 2.0f * 8 / 127));
  EXPECT_THAT(cache.scales(0, true), ElementsAre(2.0f * 4 / 127, 2.0f * 4 / 127));
  // The free function: exactly headroom x max / format max; a huge max stays a finite scale.
  const KVScales s = calibrate_kv_scales(DType::kFP8E4M3, KVScaleGranularity::kPerTensor, 1, 2,
                                         std::vector<float>{-8, 1}, std::vector<float>{4, 0}, 3.0f);
  EXPECT_THAT(s.k, ElementsAre(8.0f / 448 * 3));
  EXPECT_THAT(s.v, ElementsAre(4.0f / 448 * 3));
  const float big = std::numeric_limits<float>::max();
  const KVScales h = calibrate_kv_scales(DType::kInt8, KVScaleGranularity::kPerTensor, 1, 1,
                                         std::vector<float>{big}, std::vector<float>{1}, 65536.0f);
  EXPECT_EQ(h.k[0], big);
  // Each bad value is named, after the function or struct it came to.
  for (auto [bad, text] : {std::pair{0.5f, "0.5"}, {0.0f, "0"}, {kNaN, "nan"}, {INFINITY, "inf"}}) {
    EXPECT_THAT(
        [&] {
          (void)calibrate_kv_scales(DType::kInt8, KVScaleGranularity::kPerTensor, 1, 1,
                                    std::vector<float>{1}, std::vector<float>{1}, bad);
        },
        ThrowsMessage<Error>(HasSubstr(
            std::string("calibrate_kv_scales: headroom must be finite and >= 1, got ") + text)));
    KVCacheConfig b = config(DType::kInt8);
    b.calibration_headroom = bad;
    EXPECT_THAT([&] { validate(b); },
                ThrowsMessage<Error>(HasSubstr(
                    std::string("KVCacheConfig: calibration_headroom must be finite and >= 1, "
                                "got ") +
                    text)));
  }
}

TEST(QuantizedKVCache, LayersOutOfRangeAreRejectedNamingThem) {
  HostKVCache cache(config(DType::kInt8));  // 2 layers
  const float one[] = {1.0f};
  for (int32_t layer : {-1, 2, 3}) {
    EXPECT_THAT([&] { cache.set_scales(layer, one, one); },
                ThrowsMessage<Error>(HasSubstr("HostKVCache::set_scales: layer " +
                                               std::to_string(layer) + " out of range")));
    EXPECT_THAT(
        [&] {
          cache.write(layer, std::vector<Slot>{0}, std::vector<float>(6, 1.0f),
                      std::vector<float>(6, 1.0f));
        },
        ThrowsMessage<Error>(
            HasSubstr("HostKVCache::write: layer " + std::to_string(layer) + " out of range")));
  }
}

TEST(QuantizedKVCache, BadScalesAreRejectedNamingThemAndChangeNothing) {
  HostKVCache cache(config(DType::kInt8, KVScaleGranularity::kPerHead));
  const float good[] = {0.5f};
  cache.set_scales(0, good, good);
  const float zero[] = {0.0f};
  const float neg[] = {1.0f, -2.0f};
  const float nan[] = {kNaN};
  const float inf[] = {INFINITY};
  const float three[] = {1, 1, 1};
  EXPECT_THAT([&] { cache.set_scales(0, zero, good); },
              ThrowsMessage<Error>(HasSubstr("k_scale[0] is 0: a scale must be finite and > 0")));
  EXPECT_THAT([&] { cache.set_scales(0, good, neg); },
              ThrowsMessage<Error>(HasSubstr("v_scale[1] is -2")));
  EXPECT_THAT([&] { cache.set_scales(0, nan, good); }, ThrowsMessage<Error>(HasSubstr("is nan")));
  EXPECT_THAT([&] { cache.set_scales(0, good, inf); }, ThrowsMessage<Error>(HasSubstr("is inf")));
  EXPECT_THAT([&] { cache.set_scales(0, three, good); },
              ThrowsMessage<Error>(HasSubstr("k_scale has 3 values, expected 1 or 2")));
  EXPECT_THAT([&] { cache.set_scales(2, good, good); },
              ThrowsMessage<Error>(HasSubstr("layer 2 out of range")));
  EXPECT_THAT(cache.scales(0, false), ElementsAre(0.5f, 0.5f));
  HostKVCache per_tensor(config(DType::kInt8));
  const float two[] = {1, 2};
  EXPECT_THAT([&] { per_tensor.set_scales(0, two, good); },
              ThrowsMessage<Error>(HasSubstr("expected 1 (per-tensor scales)")));
  HostKVCache plain(config(DType::kBF16));
  EXPECT_THAT([&] { plain.set_scales(0, good, good); },
              ThrowsMessage<Error>(HasSubstr("dtype bf16 has no scales")));
}

TEST(QuantizedKVCache, FailedFirstWriteLeavesScalesUncalibrated) {
  HostKVCache cache(config(DType::kFP8E4M3));
  const std::vector<float> k(6, 3.0f);
  EXPECT_THAT([&] { cache.write(0, std::vector<Slot>{99}, k, k); },
              ThrowsMessage<Error>(HasSubstr("slot 99 of token 0 out of range [0, 8)")));
  EXPECT_THAT(cache.scales(0, false), ElementsAre(1.0f, 1.0f));
  cache.write(0, std::vector<Slot>{1}, std::vector<float>(6, 0.5f), k);
  EXPECT_THAT(cache.scales(0, false), ElementsAre(0.5f / 448, 0.5f / 448));  // calibrated now
}

// The free function on a view over memory the caller owns (an engine's own pool).
TEST(QuantizedKVCache, ReshapeAndCacheOnExternalMemory) {
  KVCacheConfig c = config(DType::kFP8E5M2);
  c.num_layers = 1;
  std::vector<uint8_t> kmem(static_cast<size_t>(pool_elements(c)), 0xAA);
  std::vector<uint8_t> vmem(kmem.size(), 0xAA);
  KVLayerView view = layer_view(c, kmem.data(), vmem.data());
  const float ks[] = {0.25f, 4.0f};
  const float vs[] = {1.0f, 1.0f};
  const std::vector<float> k = {1, 2, 3, 4, 8, 12};
  const std::vector<float> v = {-1, 0, 1, 2, 3, 57344 * 2};
  // No scales on an 8-bit view: refused before anything is written.
  EXPECT_THAT([&] { reshape_and_cache(view, std::vector<Slot>{6}, k, v); },
              ThrowsMessage<Error>(HasSubstr("a fp8_e5m2 cache needs k_scale and v_scale")));
  EXPECT_EQ(kmem[static_cast<size_t>(view.slot_offset(6, 0))], 0xAA);
  view.k_scale = ks;
  view.v_scale = vs;
  reshape_and_cache(view, std::vector<Slot>{6}, k, v);
  const int64_t h0 = view.slot_offset(6, 0);
  const int64_t h1 = view.slot_offset(6, 1);
  EXPECT_EQ(kmem[h0], f32_to_e5m2(4.0f));  // 1 / 0.25
  EXPECT_EQ(kmem[h1], f32_to_e5m2(1.0f));  // 4 / 4
  EXPECT_EQ(kmem[h1 + 2], f32_to_e5m2(3.0f));
  EXPECT_EQ(vmem[h1 + 2], 0x7B);  // 114688 saturates to 57344
  EXPECT_EQ(kmem[h0 + 3], 0xAA);  // the next token's slot is untouched
  const float bad[] = {1.0f, 0.0f};
  view.v_scale = bad;
  EXPECT_THAT([&] { reshape_and_cache(view, std::vector<Slot>{0}, k, v); },
              ThrowsMessage<Error>(HasSubstr("v_scale of kv head 1 is 0")));
  const float negative[] = {-0.5f, 1.0f};
  view.v_scale = vs;
  view.k_scale = negative;
  EXPECT_THAT([&] { reshape_and_cache(view, std::vector<Slot>{0}, k, v); },
              ThrowsMessage<Error>(HasSubstr("k_scale of kv head 0 is -0.5")));
  EXPECT_EQ(kmem[static_cast<size_t>(view.slot_offset(0, 0))], 0xAA);
}

TEST(QuantizedKVCache, FillBlocksStoresTheScaledValue) {
  HostKVCache cache(config(DType::kFP8E4M3, KVScaleGranularity::kPerHead));
  const float ks[] = {0.5f, 2.0f};
  cache.set_scales(0, ks, ks);
  const BlockId b[] = {1};
  cache.fill_blocks(b, 3.0f);  // head 0 stores 6, head 1 stores 1.5: both read 3
  EXPECT_THAT(cache.read(0, 2, 0, false), ElementsAre(3.0f, 3.0f, 3.0f));
  EXPECT_THAT(cache.read(0, 3, 1, true), ElementsAre(3.0f, 3.0f, 3.0f));
  cache.fill_blocks(b, kNaN);
  EXPECT_TRUE(std::isnan(cache.read(0, 2, 1, false)[0]));
}

// Attention refuses an 8-bit view whose scales are missing or invalid, naming the head.
TEST(QuantizedKVCache, AttentionChecksEveryHeadsScale) {
  HostKVCache cache(config(DType::kFP8E4M3, KVScaleGranularity::kPerHead));
  AttentionParams params;
  params.num_heads = 2;
  params.num_kv_heads = 2;
  params.head_dim = 3;
  KVLayerView view = cache.layer(0);
  check_attention_params(params, view);  // the cache's own scales (1 each) are fine
  const float ks[] = {1.0f, NAN};
  view.k_scale = ks;
  EXPECT_THAT([&] { check_attention_params(params, view); },
              ThrowsMessage<Error>(HasSubstr("attention: k_scale of kv head 1 is nan")));
  view.k_scale = nullptr;
  EXPECT_THAT([&] { check_attention_params(params, view); },
              ThrowsMessage<Error>(HasSubstr("a fp8_e4m3 cache needs k_scale and v_scale")));
}

}  // namespace
}  // namespace pagedkv
