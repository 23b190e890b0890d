// CUDA decode attention on a GPU: the kernels (fast and generic) against the CPU
// paged_decode_attention on the same cache, every config; the contiguous kernel against the
// paged one. The host-side planning, index math and rejections: test_cuda_decode_host.cpp.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "common/attention_bound.hpp"
#include "common/cuda_test_util.hpp"
#include "common/paged_scenario.hpp"
#include "cuda/launch.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/contiguous_paged_view.hpp"

#if PAGEDKV_WITH_CUDA
#include "pagedkv/cuda/device_decode_runner.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

// ---- GPU: kernels vs the CPU implementation ----------------------------------------------------

using testing::max_abs_diff;
using testing::PagedScenario;
using testing::scenario_from_case;
using testing::SeqSpec;

struct GpuCase {
  std::string name;
  DType dtype = DType::kF16;
  int32_t head_dim = 128;
  int32_t block_size = 16;
  int32_t num_kv_heads = 2;
  int32_t group = 4;
  KVLayout layout = KVLayout::kHND;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  int32_t chunk_size = 0;
  std::vector<int32_t> contexts;
};

std::string gpu_case_name(const GpuCase& c) {
  std::string name = std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_bs" +
                     std::to_string(c.block_size) + "_gqa" + std::to_string(c.group) + "_kv" +
                     std::to_string(c.num_kv_heads);
  if (c.layout == KVLayout::kNHD) name += "_nhd";
  if (c.window_left >= 0) name += "_win" + std::to_string(c.window_left);
  if (c.sink_tokens > 0) name += "_sink" + std::to_string(c.sink_tokens);
  if (c.chunk_size > 0) name += "_chunk" + std::to_string(c.chunk_size);
  if (c.contexts.size() == 1) name += "_ctx" + std::to_string(c.contexts[0]);
  return name;
}

PagedScenario scenario_for(const GpuCase& c, uint32_t seed) {
  std::vector<SeqSpec> seqs;
  for (int32_t ctx : c.contexts) seqs.push_back({ctx, 1});
  return scenario_from_case(c, std::move(seqs), seed);
}

/// `ref` is the CPU kernel on the cache the device copy was uploaded from: the same stored K/V,
/// fp32 q and out on both sides, so only the order of fp32 operations differs and every dtype
/// gets the fp32 bound, element by element (common/attention_bound.hpp says why and what it
/// catches: one key dropped at context 32768, a window off by one).
void expect_close(const PagedScenario& s, const std::vector<float>& out,
                  const std::vector<float>& ref, const std::string& what) {
  EXPECT_TRUE(testing::attention_within(out, ref, int64_t{s.params.num_heads} * s.params.head_dim))
      << what;
}

class CudaDecodeVsCpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(CudaDecodeVsCpu, MatchesCpuPagedDecode) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const GpuCase& c = GetParam();
  const PagedScenario s = scenario_for(c, 1234u + static_cast<uint32_t>(c.head_dim));
  std::vector<float> cpu(s.q.size());
  paged_decode_attention(s.params, s.layer(), s.view(), s.q, cpu);  // CPU: pagedkv::

  DeviceKVCache device(s.config);
  device.upload(*s.cache);  // layer 0 and unused blocks stay NaN-poisoned on the device too
  DeviceDecodeRunner runner;
  const int64_t max_ctx = *std::max_element(c.contexts.begin(), c.contexts.end());

  std::vector<float> automatic = testing::nan_filled(s.q.size());
  runner.decode(s.params, device.layer(PagedScenario::kLayer), s.view(), s.q, automatic);
  expect_close(s, automatic, cpu, "auto plan " + std::to_string(runner.last_plan().num_splits));
  if (max_ctx >= 4097 && c.contexts.size() <= 8) {
    EXPECT_TRUE(runner.last_plan().split_k()) << "a long context at a small batch must split";
  }

  std::vector<float> one_pass = testing::nan_filled(s.q.size());
  runner.decode(s.params, device.layer(PagedScenario::kLayer), s.view(), s.q, one_pass,
                DecodePlan{});
  expect_close(s, one_pass, cpu, "one pass");

  // A forced split count whose chunks are not tile multiples and leave short rows with empty
  // splits (lse = -inf in the merge).
  std::vector<float> split = testing::nan_filled(s.q.size());
  runner.decode(s.params, device.layer(PagedScenario::kLayer), s.view(), s.q, split,
                make_split_plan(max_ctx, 13));
  expect_close(s, split, cpu, "13 splits");
}

/// Appends a case of a shape (no mask) to `cases`.
void add(std::vector<GpuCase>& cases, DType dtype, int32_t d, int32_t bs, int32_t kv, int32_t group,
         KVLayout layout, std::vector<int32_t> contexts) {
  cases.push_back({.dtype = dtype,
                   .head_dim = d,
                   .block_size = bs,
                   .num_kv_heads = kv,
                   .group = group,
                   .layout = layout,
                   .contexts = std::move(contexts)});
}

/// Appends one case per (window, sinks, chunk) of `masks`: block size 8, contexts 1, 17, 1031,
/// 4097.
void add_masks(std::vector<GpuCase>& cases, DType dtype, int32_t head_dim,
               std::span<const std::array<int32_t, 3>> masks) {
  for (auto [window, sinks, chunk] : masks) {
    cases.push_back({.dtype = dtype,
                     .head_dim = head_dim,
                     .block_size = 8,
                     .window_left = window,
                     .sink_tokens = sinks,
                     .chunk_size = chunk,
                     .contexts = {1, 17, 1031, 4097}});
  }
}

std::vector<GpuCase> supported_grid() {
  // Every (dtype, fast head_dim) at page sizes 1, 16 and 128; every other listed page size on
  // fp16 d128 (block_size is a run-time shift: one code path for all of them).
  std::vector<GpuCase> cases;
  for (DType dtype : kDecodeDTypes) {
    for (int32_t d : kDecodeHeadDims) {
      for (int32_t bs : kDecodeBlockSizes) {
        if (bs != 1 && bs != 16 && bs != 128 && (dtype != DType::kF16 || d != 128)) continue;
        cases.push_back({.dtype = dtype,
                         .head_dim = d,
                         .block_size = bs,
                         .contexts = {1, bs, bs + 1, 4097, 32768}});
      }
    }
  }
  return cases;
}

std::vector<GpuCase> generic_cases() {
  // The run-time head_dim kernel (decode_generic.cu): stories260K's 8, the common 80 and 96,
  // odd sizes and the largest; every dtype; GQA groups, both layouts, page sizes 1..128, masks.
  std::vector<GpuCase> cases;
  for (DType dtype : kDecodeDTypes)
    add(cases, dtype, 8, 16, 2, 4, KVLayout::kHND, {1, 17, 300, 4097});
  add(cases, DType::kF16, 96, 1, 2, 4, KVLayout::kHND, {1, 2, 299, 2049});
  add(cases, DType::kBF16, 80, 128, 1, 8, KVLayout::kNHD, {5, 129, 4097});
  add(cases, DType::kF32, 1, 8, 3, 1, KVLayout::kHND, {1, 33, 100});
  add(cases, DType::kFP8E4M3, 33, 4, 2, 5, KVLayout::kNHD, {7, 1031});
  add(cases, DType::kInt8, 200, 32, 1, 7, KVLayout::kHND, {64, 0, 65});
  add(cases, DType::kF16, 255, 64, 2, 2, KVLayout::kHND, {63, 64, 65, 2049});
  add(cases, DType::kF32, 72, 2, 4, 16, KVLayout::kNHD, {1, 300});
  const std::array<int32_t, 3> masks[] = {
      {0, 3, 0}, {100, 0, 0}, {64, 4, 0}, {-1, 0, 8}, {-1, 4, 512}};
  add_masks(cases, DType::kBF16, 8, masks);
  return cases;
}

std::vector<GpuCase> shape_cases() {
  std::vector<GpuCase> cases;
  add(cases, DType::kF16, 128, 16, 4, 1, KVLayout::kHND, {0, 5, 300, 2000});  // MHA + padding row
  add(cases, DType::kBF16, 128, 16, 2, 8, KVLayout::kHND, {17, 1031, 4097});  // GQA 8
  add(cases, DType::kF16, 64, 16, 2, 16, KVLayout::kHND, {1, 333, 4097});     // several head chunks
  add(cases, DType::kF32, 128, 8, 1, 6, KVLayout::kHND, {3, 1031, 2049});     // MQA, group 6
  add(cases, DType::kF32, 64, 32, 3, 3, KVLayout::kHND, {100, 0, 65});        // 3 kv heads
  add(cases, DType::kF16, 128, 16, 2, 4, KVLayout::kNHD, {1, 16, 17, 4097});  // NHD layout
  add(cases, DType::kBF16, 256, 8, 2, 2, KVLayout::kNHD, {9, 1031});
  add(cases, DType::kF32, 64, 16, 4, 5, KVLayout::kNHD, {33, 500});
  // 8-bit pools (per-head scales that differ by head, from make_scenario): GQA groups 5 and 8,
  // MQA, both layouts; the grid above has every (8-bit dtype, head_dim, block_size).
  add(cases, DType::kFP8E4M3, 128, 16, 2, 5, KVLayout::kNHD, {1, 333, 4097});
  add(cases, DType::kFP8E5M2, 64, 8, 4, 8, KVLayout::kHND, {17, 1031, 4097});
  add(cases, DType::kInt8, 256, 32, 1, 6, KVLayout::kNHD, {3, 1031, 2049});
  add(cases, DType::kInt8, 128, 16, 3, 3, KVLayout::kHND, {0, 100, 65});
  std::vector<int32_t> many(64);  // a wide batch of mixed lengths: one-pass territory
  for (int32_t i = 0; i < 64; ++i) many[static_cast<size_t>(i)] = 1 + (i * 97) % 700;
  add(cases, DType::kF16, 128, 16, 2, 4, KVLayout::kHND, many);
  return cases;
}

std::vector<GpuCase> mask_cases() {
  // (window, sinks, chunk): windows and sinks; chunks around the block size, odd, with sinks,
  // with a window. Hidden blocks point at NaN (scenario_from_case), as released entries do.
  const std::array<int32_t, 3> masks[] = {
      {0, 0, 0},  {0, 3, 0},  {1, 0, 0},     {100, 0, 0},   {64, 4, 0},   {2000, 0, 0},
      {-1, 0, 3}, {-1, 0, 8}, {-1, 0, 1000}, {-1, 0, 8192}, {-1, 4, 512}, {100, 0, 1024}};
  std::vector<GpuCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kFP8E4M3})
    add_masks(cases, dtype, 128, masks);
  return cases;
}

template <typename F>
std::vector<GpuCase> named(F make) {
  std::vector<GpuCase> cases = make();
  for (GpuCase& c : cases) c.name = gpu_case_name(c);
  // Cases with the same geometry differ by their contexts: keep names unique.
  for (size_t i = 0; i < cases.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (cases[j].name == cases[i].name) cases[i].name += "_" + std::to_string(i);
    }
  }
  return cases;
}

std::string param_name(const ::testing::TestParamInfo<GpuCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Supported, CudaDecodeVsCpu, ::testing::ValuesIn(named(supported_grid)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeVsCpu, ::testing::ValuesIn(named(shape_cases)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Masks, CudaDecodeVsCpu, ::testing::ValuesIn(named(mask_cases)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(GenericHeadDim, CudaDecodeVsCpu, ::testing::ValuesIn(named(generic_cases)),
                         param_name);

/// The scenario's stored (rounded) K/V repacked as a dense [num_seqs, H, max_len, D] cache of
/// the same dtype, on the device.
struct DenseCopy {
  DeviceBuffer k;
  DeviceBuffer v;
  KVLayerView view;
};

/// The stored K/V as a contiguous device cache; 8-bit: stored / scale re-rounds to the same
/// code (an ulp off at most), and the view borrows `scales`' device k_scale / v_scale.
DenseCopy dense_copy(const PagedScenario& s, int32_t max_len, const KVLayerView& scales) {
  const KVCacheConfig& c = s.config;
  const ContiguousKVShape shape{static_cast<int32_t>(s.seqs.size()),
                                c.num_kv_heads,
                                max_len,
                                c.head_dim,
                                c.dtype,
                                KVLayout::kHND};
  const int64_t elems = contiguous_kv_elements(shape);
  std::vector<std::byte> hk(static_cast<size_t>(elems * dtype_size(c.dtype)));
  std::vector<std::byte> hv(hk.size());
  const KVLayerView layout = contiguous_paged_view(shape, hk.data(), hv.data());
  for (int32_t i = 0; i < shape.num_seqs; ++i) {
    const std::vector<float> ks = s.stored(static_cast<size_t>(i), false);
    const std::vector<float> vs = s.stored(static_cast<size_t>(i), true);
    for (int64_t p = 0; p < s.seqs[static_cast<size_t>(i)].context_len; ++p) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        const auto hs = static_cast<size_t>(h);
        const float k_div = s.cache->scales(PagedScenario::kLayer, false)[hs];
        const float v_div = s.cache->scales(PagedScenario::kLayer, true)[hs];
        for (int32_t d = 0; d < c.head_dim; ++d) {
          const int64_t src = (p * c.num_kv_heads + h) * c.head_dim + d;
          const int64_t dst = layout.offset(i, h, p) + d;  // sequence i is block i
          store_from_f32(hk.data(), c.dtype, dst, ks[static_cast<size_t>(src)] / k_div);
          store_from_f32(hv.data(), c.dtype, dst, vs[static_cast<size_t>(src)] / v_div);
        }
      }
    }
  }
  DenseCopy out{DeviceBuffer(static_cast<int64_t>(hk.size())),
                DeviceBuffer(static_cast<int64_t>(hv.size())),
                {}};
  out.k.upload(std::span<const std::byte>(hk));
  out.v.upload(std::span<const std::byte>(hv));
  out.view = contiguous_paged_view(shape, out.k.data(), out.v.data());
  out.view.k_scale = scales.k_scale;
  out.view.v_scale = scales.v_scale;
  return out;
}

class CudaContiguousDecode : public ::testing::TestWithParam<GpuCase> {};

TEST_P(CudaContiguousDecode, SameBodyAsPaged) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const GpuCase& c = GetParam();
  const PagedScenario s = scenario_for(c, 77u);
  std::vector<float> cpu(s.q.size());
  paged_decode_attention(s.params, s.layer(), s.view(), s.q, cpu);
  DeviceKVCache device(s.config);
  device.upload(*s.cache);
  const int32_t max_len = *std::max_element(c.contexts.begin(), c.contexts.end()) + 5;
  DenseCopy dense = dense_copy(s, max_len, device.layer(PagedScenario::kLayer));
  DeviceDecodeRunner runner;
  for (const DecodePlan& plan : {DecodePlan{}, make_split_plan(max_len, 9)}) {
    SCOPED_TRACE("splits " + std::to_string(plan.num_splits));
    std::vector<float> paged = testing::nan_filled(s.q.size());
    std::vector<float> contiguous = testing::nan_filled(s.q.size());
    runner.decode(s.params, device.layer(PagedScenario::kLayer), s.view(), s.q, paged, plan);
    runner.decode_contiguous(s.params, dense.view, s.context_lens, s.q, contiguous, plan);
    expect_close(s, contiguous, cpu, "contiguous vs CPU");
    // Same kernel body, same tiles, same order: the two layouts agree to rounding noise.
    EXPECT_LE(max_abs_diff(contiguous, paged), 1e-6);
  }
}

std::vector<GpuCase> contiguous_cases() {
  std::vector<GpuCase> cases;
  for (auto [dtype, d, bs] :
       {std::tuple{DType::kF16, 128, 16}, std::tuple{DType::kBF16, 64, 8},
        std::tuple{DType::kF32, 256, 32}, std::tuple{DType::kFP8E4M3, 128, 16},
        std::tuple{DType::kInt8, 64, 8}, std::tuple{DType::kFP8E5M2, 256, 32},
        // the generic kernel (run-time head_dim)
        std::tuple{DType::kBF16, 8, 16}, std::tuple{DType::kFP8E4M3, 96, 1}}) {
    GpuCase c;
    c.dtype = dtype;
    c.head_dim = d;
    c.block_size = bs;
    c.contexts = {1, bs + 1, 0, 4097};
    cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaContiguousDecode,
                         ::testing::ValuesIn(named(contiguous_cases)), param_name);

TEST(CudaDecode, ZeroSequencesWritesNothing) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  KVCacheConfig config;
  config.num_blocks = 4;
  config.head_dim = 64;
  config.dtype = DType::kF16;
  DeviceKVCache device(config);
  AttentionParams params;
  params.head_dim = 64;
  BlockTableView empty;
  empty.block_size = config.block_size;
  // Null q and out are fine for zero rows; with a real out buffer, no byte of it changes.
  paged_decode_attention(params, device.layer(0), empty, nullptr, nullptr);
  const std::vector<float> sentinel(64, 7.0f);
  DeviceBuffer out(64 * 4);
  out.upload(std::span<const float>(sentinel));
  paged_decode_attention(params, device.layer(0), empty, nullptr, out.as<float>());
  synchronize(nullptr);
  std::vector<float> back(64, 0.0f);
  out.download(std::span<float>(back));
  EXPECT_EQ(back, sentinel);
}

#else  // !PAGEDKV_WITH_CUDA

TEST(CudaDecode, SkippedWithoutCuda) { GTEST_SKIP() << "no CUDA device (built without CUDA)"; }

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
