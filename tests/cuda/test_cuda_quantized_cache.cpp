// 8-bit K/V on the device (fp8_e4m3, fp8_e5m2, int8): cuda::reshape_and_cache and
// DeviceKVCache::write store the bytes the host write stores for the same inputs and scales
// (per tensor and per head, GQA-sized heads, every layout and placement, inputs holding the
// ties, saturation and NaN edges), calibration agrees with the host's, scales travel with
// upload / download, and bad scales are refused naming them. The host-side refusals run
// without a GPU; the rest skips with the reason "no CUDA device".

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

#if PAGEDKV_WITH_CUDA
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

using testing::all_bytes;
using ::testing::HasSubstr;
using testing::message_of;

constexpr DType kQuantized[] = {DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8};

KVLayerView fake_view(DType dtype) {
  KVLayerView v;
  v.k = reinterpret_cast<void*>(uintptr_t{0x10000});
  v.v = reinterpret_cast<void*>(uintptr_t{0x20000});
  v.dtype = dtype;
  v.num_blocks = 4;
  v.block_size = 16;
  v.num_kv_heads = 2;
  v.head_dim = 64;
  layout_strides(KVLayout::kHND, 16, 2, 64, &v.block_stride, &v.head_stride, &v.token_stride);
  return v;
}

TEST(QuantizedCacheOpsRejection, ScalesAndInputDtypeCheckedOnTheHost) {
  NewKV in;
  in.k = reinterpret_cast<const void*>(uintptr_t{0x30000});
  in.v = reinterpret_cast<const void*>(uintptr_t{0x40000});
  in.slot_mapping = reinterpret_cast<const int64_t*>(uintptr_t{0x50000});
  in.num_tokens = 2;
  for (DType dtype : kQuantized) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    EXPECT_THAT(message_of([&] { reshape_and_cache(fake_view(dtype), in); }),
                HasSubstr("a " + std::string(dtype_name(dtype)) +
                          " cache needs a device k_scale of 2 floats, got"));
    KVLayerView half = fake_view(dtype);
    half.k_scale = reinterpret_cast<const float*>(uintptr_t{0x60000});
    EXPECT_THAT(message_of([&] { reshape_and_cache(half, in); }),
                HasSubstr("needs a device v_scale of 2 floats"));
    KVLayerView odd = half;
    odd.v_scale = reinterpret_cast<const float*>(uintptr_t{0x60002});  // not 4-byte aligned
    EXPECT_THAT(message_of([&] { reshape_and_cache(odd, in); }), HasSubstr("v_scale"));
    NewKV eight = in;
    eight.dtype = dtype;
    EXPECT_THAT(message_of([&] { reshape_and_cache(half, eight); }),
                HasSubstr("input dtype " + std::string(dtype_name(dtype)) +
                          ": new K/V are fp32, fp16 or bf16"));
  }
}

TEST(QuantizedDecodeRejection, EightBitViewsNeedDeviceScales) {
  // The launchers cannot read device scales, so they check the pointers, naming them; the
  // values were checked by DeviceKVCache::set_scales.
  AttentionParams params;
  params.num_heads = 8;
  params.num_kv_heads = 2;
  params.head_dim = 64;
  int32_t table[1] = {0};
  int32_t ctx[1] = {1};
  const BlockTableView tables{table, ctx, 1, 1, 16, 4};
  const auto* q = reinterpret_cast<const float*>(uintptr_t{0x70000});
  auto* out = reinterpret_cast<float*>(uintptr_t{0x80000});
  for (DType dtype : kQuantized) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KVLayerView view = fake_view(dtype);
    const std::string needs = "a " + std::string(dtype_name(dtype)) + " cache needs a device ";
    EXPECT_THAT(message_of([&] { paged_decode_attention(params, view, tables, q, out); }),
                HasSubstr("cuda::paged_decode_attention: " + needs + "k_scale of 2 floats"));
    view.k_scale = reinterpret_cast<const float*>(uintptr_t{0x50000});
    EXPECT_THAT(message_of([&] { contiguous_decode_attention(params, view, ctx, q, out); }),
                HasSubstr("cuda::contiguous_decode_attention: " + needs + "v_scale of 2 floats"));
    view.v_scale = reinterpret_cast<const float*>(uintptr_t{0x50001});
    EXPECT_THAT(message_of([&] { paged_decode_attention(params, view, tables, q, out); }),
                HasSubstr(needs + "v_scale of 2 floats, got 0x50001"));
  }
}

// ---- GPU ---------------------------------------------------------------------------------------

KVCacheConfig quantized_config(DType dtype, KVScaleGranularity g, KVLayout layout,
                               KVPlacement placement) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_blocks = 12;
  c.block_size = 16;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.dtype = dtype;
  c.scale_granularity = g;
  c.layout = layout;
  c.placement = placement;
  return c;
}

/// K or V of `tokens` tokens: per head, values in units of the head's scale that hit the
/// format's decisions (every code, the ties between codes, past the max, NaN, infinities,
/// zeros of both signs), then uniform randoms. Head 0's scale is a power of two, so its ties
/// stay exact ties after x * (1 / scale).
std::vector<float> edge_kv(DType dtype, int64_t tokens, int32_t heads, int32_t dim,
                           const std::vector<float>& scales, uint32_t seed) {
  std::vector<float> units;
  const float max = dtype_max_finite(dtype);
  for (int b = 0; b < 256; ++b) {
    const auto byte = static_cast<uint8_t>(b);
    const float c = load_as_f32(&byte, dtype, 0);
    if (std::isfinite(c)) units.push_back(c);
  }
  for (float x : {max * 1.03f, max * 1.5f, max * 1e6f, 0.5f, 1.5f, 2.5f, -2.5f, -0.0f})
    units.push_back(x);
  units.push_back(std::numeric_limits<float>::quiet_NaN());
  units.push_back(-std::numeric_limits<float>::quiet_NaN());
  units.push_back(std::numeric_limits<float>::infinity());
  units.push_back(-std::numeric_limits<float>::infinity());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.2f * max, 1.2f * max);
  std::vector<float> out(static_cast<size_t>(tokens * heads * dim));
  size_t next = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t d = 0; d < dim; ++d, ++next) {
        const float u = next < units.size() * 3 ? units[next % units.size()] : uni(rng);
        out[next] = u * scales[static_cast<size_t>(h) % scales.size()];
      }
    }
  }
  return out;
}

struct QuantCase {
  DType dtype;
  KVScaleGranularity granularity;
  KVLayout layout;
  KVPlacement placement;
};

class CudaQuantizedWrite : public ::testing::TestWithParam<QuantCase> {};

TEST_P(CudaQuantizedWrite, BytesEqualTheHostWrite) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const QuantCase& qc = GetParam();
  const KVCacheConfig config = quantized_config(qc.dtype, qc.granularity, qc.layout, qc.placement);
  const bool per_head = qc.granularity == KVScaleGranularity::kPerHead;
  const std::vector<float> ks =
      per_head ? std::vector<float>{0.25f, 0.37f, 3.1f} : std::vector<float>{0.25f};
  const std::vector<float> vs =
      per_head ? std::vector<float>{0.5f, 1.7f, 0.011f} : std::vector<float>{0.5f};
  const int64_t tokens = 40;
  std::vector<Slot> slots(static_cast<size_t>(tokens));
  std::iota(slots.begin(), slots.end(), 3);
  slots[5] = -1;                                                      // padding
  slots.back() = int64_t{config.num_blocks} * config.block_size - 1;  // the last slot
  const std::vector<float> k = edge_kv(qc.dtype, tokens, 3, 64, ks, 11);
  const std::vector<float> v = edge_kv(qc.dtype, tokens, 3, 64, vs, 12);

  HostKVCache host(config);
  host.set_scales(1, ks, vs);
  host.write(1, slots, k, v);

  // From device inputs (cuda::reshape_and_cache) ...
  DeviceKVCache device(config);
  device.set_scales(1, ks, vs);
  DeviceBuffer d_k(static_cast<int64_t>(k.size() * 4));
  DeviceBuffer d_v(static_cast<int64_t>(v.size() * 4));
  DeviceBuffer d_slots(static_cast<int64_t>(slots.size() * sizeof(Slot)));
  d_k.upload(std::span<const float>(k));
  d_v.upload(std::span<const float>(v));
  d_slots.upload(std::span<const Slot>(slots));
  NewKV in{d_k.data(), d_v.data(), DType::kF32, d_slots.as<const int64_t>(), tokens};
  device.write(1, in);
  HostKVCache back(config);
  device.download(back);
  EXPECT_EQ(all_bytes(back), all_bytes(host));
  EXPECT_EQ(std::vector<float>(back.scales(1, false).begin(), back.scales(1, false).end()),
            std::vector<float>(host.scales(1, false).begin(), host.scales(1, false).end()));

  // ... and from host spans (DeviceKVCache::write), on a second cache.
  DeviceKVCache device2(config);
  device2.set_scales(1, ks, vs);
  device2.write(1, slots, k, v);
  HostKVCache back2(config);
  device2.download(back2);
  EXPECT_EQ(all_bytes(back2), all_bytes(host));
}

std::string quant_name(const ::testing::TestParamInfo<QuantCase>& info) {
  const QuantCase& c = info.param;
  return std::string(dtype_name(c.dtype)) +
         (c.granularity == KVScaleGranularity::kPerHead ? "_per_head" : "_per_tensor") +
         (c.layout == KVLayout::kHND ? "_hnd_" : "_nhd_") +
         std::string(testing::placement_name(c.placement));
}

std::vector<QuantCase> quant_cases() {
  std::vector<QuantCase> cases;
  for (DType dtype : kQuantized) {
    for (auto g : {KVScaleGranularity::kPerTensor, KVScaleGranularity::kPerHead}) {
      for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
        for (KVPlacement p : {KVPlacement::kSeparate, KVPlacement::kInterleaved}) {
          cases.push_back({dtype, g, layout, p});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, CudaQuantizedWrite, ::testing::ValuesIn(quant_cases()), quant_name);

TEST(CudaQuantizedCache, CalibratesOnTheFirstHostWriteAsTheHostDoes) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (DType dtype : kQuantized) {
    for (auto g : {KVScaleGranularity::kPerTensor, KVScaleGranularity::kPerHead}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) +
                   (g == KVScaleGranularity::kPerHead ? " head" : " tensor"));
      const KVCacheConfig config =
          quantized_config(dtype, g, KVLayout::kHND, KVPlacement::kSeparate);
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
      std::vector<Slot> slots(20);
      std::iota(slots.begin(), slots.end(), 0);
      std::vector<float> k(20 * 3 * 64), v(k.size());
      for (size_t i = 0; i < k.size(); ++i) {
        // Heads of different ranges, so per-head calibration differs from per-tensor.
        const float range = 1.0f + static_cast<float>((i / 64) % 3);
        k[i] = range * uni(rng);
        v[i] = 0.5f * range * uni(rng);
      }
      HostKVCache host(config);
      host.write(0, slots, k, v);
      DeviceKVCache device(config);
      device.write(0, slots, k, v);
      for (bool value : {false, true}) {
        const auto a = device.scales(0, value);
        const auto b = host.scales(0, value);
        EXPECT_EQ(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()));
      }
      HostKVCache back(config);
      device.download(back);
      EXPECT_EQ(all_bytes(back), all_bytes(host));
    }
  }
}

TEST(CudaQuantizedCache, BadScalesAreRefusedNamingThem) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const KVCacheConfig config = quantized_config(DType::kFP8E4M3, KVScaleGranularity::kPerHead,
                                                KVLayout::kHND, KVPlacement::kSeparate);
  DeviceKVCache device(config);
  device.set_scales(0, std::vector<float>{2.0f}, std::vector<float>{3.0f});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {0.0f, -1.0f, nan, inf}) {
    EXPECT_THAT(
        message_of([&] {
          device.set_scales(0, std::vector<float>{1.0f, bad, 1.0f}, std::vector<float>{1.0f});
        }),
        HasSubstr("DeviceKVCache::set_scales: k_scale[1] is"));
  }
  EXPECT_THAT(message_of([&] {
                device.set_scales(0, std::vector<float>{1.0f, 1.0f}, std::vector<float>{1.0f});
              }),
              HasSubstr("k_scale has 2 values, expected 1 or 3 (one per kv head)"));
  EXPECT_THAT(
      message_of([&] { device.set_scales(2, std::vector<float>{1.0f}, std::vector<float>{1.0f}); }),
      HasSubstr("layer 2 out of range [0, 2)"));
  // A refused call changed nothing: the scales of the first call stay.
  EXPECT_EQ(device.scales(0, false)[1], 2.0f);
  EXPECT_EQ(device.scales(0, true)[2], 3.0f);
  // Device inputs are not calibrated: a layer without scales refuses them.
  DeviceBuffer d(16 * 3 * 64 * 4);
  DeviceBuffer d_slots(8);
  NewKV in{d.data(), d.data(), DType::kF32, d_slots.as<const int64_t>(), 1};
  EXPECT_THAT(message_of([&] { device.write(1, in); }),
              HasSubstr("layer 1 (fp8_e4m3) has no scales yet"));
  KVCacheConfig f16 = config;
  f16.dtype = DType::kF16;
  DeviceKVCache plain(f16);
  EXPECT_THAT(
      message_of([&] { plain.set_scales(0, std::vector<float>{1.0f}, std::vector<float>{1.0f}); }),
      HasSubstr("dtype fp16 has no scales"));
}

TEST(CudaQuantizedCache, UploadCarriesTheScales) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const KVCacheConfig config = quantized_config(DType::kInt8, KVScaleGranularity::kPerHead,
                                                KVLayout::kNHD, KVPlacement::kInterleaved);
  HostKVCache host(config);
  host.set_scales(1, std::vector<float>{0.1f, 0.2f, 0.3f}, std::vector<float>{4.0f, 5.0f, 6.0f});
  testing::fill_random(host, 3);
  DeviceKVCache device(config);
  device.upload(host);
  EXPECT_EQ(device.scales(1, true)[2], 6.0f);
  HostKVCache back(config);
  device.download(back);
  EXPECT_EQ(all_bytes(back), all_bytes(host));
  for (int32_t l = 0; l < 2; ++l) {
    for (bool value : {false, true}) {
      const auto a = back.scales(l, value);
      const auto b = host.scales(l, value);
      EXPECT_EQ(std::vector<float>(a.begin(), a.end()), std::vector<float>(b.begin(), b.end()));
    }
  }
}

#else  // !PAGEDKV_WITH_CUDA

TEST(CudaQuantizedCache, SkippedWithoutCuda) {
  GTEST_SKIP() << "no CUDA device (built without CUDA)";
}

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
