// CUDA decode attention: the split-K heuristic, workspace sizing and index math (host-only, run
// everywhere); rejection of unsupported configurations before any CUDA call (no GPU needed); on
// a GPU, the kernels against the CPU paged_decode_attention on the same cache, every config.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "common/attention_bound.hpp"
#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
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

using ::testing::HasSubstr;

using testing::message_of;

// ---- the split-K heuristic (host only) ---------------------------------------------------------

DecodePlanInput h200(int32_t num_seqs, int32_t num_heads, int32_t num_kv_heads, int64_t ctx,
                     int32_t ctas_per_sm = 3) {
  DecodePlanInput in;
  in.num_seqs = num_seqs;
  in.num_heads = num_heads;
  in.num_kv_heads = num_kv_heads;
  in.max_context_len = ctx;
  in.sm_count = 132;
  in.ctas_per_sm = ctas_per_sm;
  return in;
}

TEST(PlanDecode, DocumentedExamples) {
  // decode_attention.hpp: 132 SMs x 3 CTAs per SM, 8 kv heads, GQA 4.
  EXPECT_EQ(plan_decode(h200(1, 32, 8, 32768)), (DecodePlan{47, 704}));
  EXPECT_EQ(plan_decode(h200(32, 32, 8, 4096)), (DecodePlan{3, 1408}));
  EXPECT_EQ(plan_decode(h200(64, 32, 8, 4096)), (DecodePlan{1, 0}));
}

TEST(PlanDecode, OnePassWhenTheGridAlreadyFillsTheDevice) {
  // 264 slots at 2 CTAs/SM: 256 CTAs of one pass beat any split.
  EXPECT_FALSE(plan_decode(h200(32, 32, 8, 4096, 2)).split_k());
  EXPECT_FALSE(plan_decode(h200(256, 32, 8, 32768, 2)).split_k());
}

TEST(PlanDecode, OnePassForShortContexts) {
  EXPECT_FALSE(plan_decode(h200(1, 32, 8, 0)).split_k());
  EXPECT_FALSE(plan_decode(h200(1, 32, 8, 1)).split_k());
  EXPECT_FALSE(plan_decode(h200(1, 32, 8, kMinSplitTokens)).split_k());
  EXPECT_FALSE(plan_decode(h200(1, 32, 8, 300, 2)).split_k());
}

TEST(PlanDecode, Batch1LongContextFillsOneWave) {
  const DecodePlan p = plan_decode(h200(1, 32, 8, 32768, 2));
  EXPECT_EQ(p, (DecodePlan{32, 1024}));
  const DecodePlan mqa = plan_decode(h200(1, 8, 2, 32768, 2));
  EXPECT_EQ(mqa, (DecodePlan{128, 256}));
}

TEST(PlanDecode, LargeGroupsCountHeadChunks) {
  // group 16 -> ceil(16 / kHeadsPerCta) CTAs per kv head: at least the CTAs of group 8, so no
  // more splits needed.
  const DecodePlan g8 = plan_decode(h200(1, 64, 8, 32768, 2));
  const DecodePlan g16 = plan_decode(h200(1, 128, 8, 32768, 2));
  EXPECT_GE(g8.num_splits, g16.num_splits);
}

TEST(PlanDecode, InvariantsOverAGrid) {
  for (int32_t seqs : {1, 2, 7, 32, 100, 256}) {
    for (int64_t ctx : {0, 1, 255, 256, 257, 1000, 4097, 32768, 131072}) {
      for (int32_t per_sm : {1, 2, 4}) {
        const DecodePlan p = plan_decode(h200(seqs, 32, 8, ctx, per_sm));
        SCOPED_TRACE("seqs " + std::to_string(seqs) + " ctx " + std::to_string(ctx));
        ASSERT_GE(p.num_splits, 1);
        ASSERT_LE(p.num_splits, kMaxSplits);
        if (!p.split_k()) continue;
        EXPECT_EQ(p.chunk_tokens % kSplitGranularity, 0);
        EXPECT_GE(p.chunk_tokens, kMinSplitTokens / 2);
        // Exactly covers the context: no empty split, nothing left for the last one.
        EXPECT_GE(int64_t{p.num_splits} * p.chunk_tokens, ctx);
        EXPECT_LT(int64_t{p.num_splits - 1} * p.chunk_tokens, ctx);
      }
    }
  }
}

TEST(PlanDecode, RejectsBadInput) {
  EXPECT_THAT(message_of([] { (void)plan_decode(h200(0, 32, 8, 10)); }),
              HasSubstr("num_seqs must be >= 1, got 0"));
  EXPECT_THAT(message_of([] { (void)plan_decode(h200(1, 30, 8, 10)); }),
              HasSubstr("num_heads 30 is not a positive multiple of num_kv_heads 8"));
  EXPECT_THAT(message_of([] { (void)plan_decode(h200(1, 32, 8, -1)); }),
              HasSubstr("max_context_len must be >= 0, got -1"));
  DecodePlanInput in = h200(1, 32, 8, 10);
  in.sm_count = 0;
  EXPECT_THAT(message_of([&] { (void)plan_decode(in); }), HasSubstr("sm_count must be >= 1"));
}

TEST(MakeSplitPlan, CoversTheContext) {
  EXPECT_EQ(make_split_plan(1000, 1), (DecodePlan{1, 0}));
  EXPECT_EQ(make_split_plan(1000, 3), (DecodePlan{3, 334}));
  EXPECT_EQ(make_split_plan(0, 4), (DecodePlan{4, 1}));
  EXPECT_THROW((void)make_split_plan(100, 0), Error);
  EXPECT_THROW((void)make_split_plan(100, kMaxSplits + 1), Error);
}

TEST(DecodeWorkspace, BytesArePartialsPlusAlignedLse) {
  EXPECT_EQ(decode_workspace_bytes(4, 32, 128, DecodePlan{}), 0);
  // 2 seqs x 8 heads x 3 splits = 48 rows: 48 x 64 x 4 = 12288 (aligned) + 192 -> 256.
  EXPECT_EQ(decode_workspace_bytes(2, 8, 64, DecodePlan{3, 512}), 12288 + 256);
}

/// A fake, aligned, non-null device address (never dereferenced on the host).
void* fake_ptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

TEST(ContiguousView, KernelAddressingIsTheSharedDescription) {
  // 3 sequences, 4 kv heads, max_len 100, head_dim 128 (HND): sequence = block.
  const KVLayerView view = contiguous_paged_view({3, 4, 100, 128, DType::kF16, KVLayout::kHND},
                                                 fake_ptr(0x10000), fake_ptr(0x20000));
  const detail::ContiguousKV kv = detail::contiguous_kv(view);
  EXPECT_EQ(kv.k, view.k);
  EXPECT_EQ(kv.v, view.v);
  EXPECT_EQ(kv.token_stride, 128);
  EXPECT_EQ(kv.head_stride, 12800);
  EXPECT_EQ(kv.seq_stride, 51200);
  // Same element as the paged addressing with the identity block table.
  const PaddedBlockTables identity = identity_block_tables(std::vector<int32_t>{5, 100, 1}, 100);
  for (int32_t seq = 0; seq < 3; ++seq) {
    const int64_t block = identity.block_tables[static_cast<size_t>(seq)];
    EXPECT_EQ(kv.row(seq, 3, 99), view.offset(block, 3, 99));
  }
}

// ---- kernel index math (host-testable __host__ __device__ helpers) ----------------------------

TEST(DecodeIndexMath, PagedRowFollowsTheBlockTable) {
  // HND, block_size 16, 4 kv heads, head_dim 128: block 8192, head 2048, token 128 elements.
  const int32_t table[] = {7, 3, 11, /*seq 1:*/ 5, 2, 0};
  detail::PagedKV kv;
  kv.block_tables = table;
  kv.max_blocks_per_seq = 3;
  kv.log2_block_size = 4;
  layout_strides(KVLayout::kHND, 16, 4, 128, &kv.block_stride, &kv.head_stride, &kv.token_stride);
  EXPECT_EQ(kv.row(0, 0, 0), 7 * 8192);
  EXPECT_EQ(kv.row(0, 2, 17), 3 * 8192 + 2 * 2048 + 1 * 128);
  EXPECT_EQ(kv.row(1, 3, 47), 0 * 8192 + 3 * 2048 + 15 * 128);
  // int64: a block id near 2^20 with 8192-element blocks passes 2^31.
  const int32_t big[] = {(1 << 20) - 1};
  kv.block_tables = big;
  EXPECT_EQ(kv.row(0, 0, 0), int64_t{(1 << 20) - 1} * 8192);
}

TEST(DecodeIndexMath, ContiguousRowIsDense) {
  const detail::ContiguousKV kv = detail::contiguous_kv(contiguous_paged_view(
      {2, 2, 50, 64, DType::kF32, KVLayout::kHND}, fake_ptr(0x10000), fake_ptr(0x20000)));
  EXPECT_EQ(kv.row(1, 1, 49), 1 * 6400 + 1 * 3200 + 49 * 64);
  const detail::ContiguousKV nhd = detail::contiguous_kv(contiguous_paged_view(
      {2, 2, 50, 64, DType::kF32, KVLayout::kNHD}, fake_ptr(0x10000), fake_ptr(0x20000)));
  EXPECT_EQ(nhd.row(1, 1, 49), 1 * 6400 + 49 * 128 + 1 * 64);
}

// ---- rejection before any CUDA call (no GPU needed) --------------------------------------------

#if PAGEDKV_WITH_CUDA

/// A view and tables with fake, aligned, non-null pointers: a launcher that rejects the call
/// must do so on the host before touching them.
struct FakeProblem {
  KVLayerView view;
  AttentionParams params;
  int32_t table[1] = {0};
  int32_t ctx[1] = {1};
  BlockTableView tables{table, ctx, 1, 1};
  float* q = reinterpret_cast<float*>(uintptr_t{0x10000});
  float* out = reinterpret_cast<float*>(uintptr_t{0x20000});

  FakeProblem(DType dtype, int32_t head_dim, int32_t block_size) {
    view.k = reinterpret_cast<void*>(uintptr_t{0x30000});
    view.v = reinterpret_cast<void*>(uintptr_t{0x40000});
    view.dtype = dtype;
    view.num_blocks = 4;
    view.block_size = block_size;
    tables.block_size = block_size;
    tables.num_blocks = 4;
    view.num_kv_heads = 2;
    view.head_dim = head_dim;
    layout_strides(KVLayout::kHND, block_size, 2, head_dim, &view.block_stride, &view.head_stride,
                   &view.token_stride);
    params.num_heads = 8;
    params.num_kv_heads = 2;
    params.head_dim = head_dim;
  }
};

struct Unsupported {
  DType dtype;
  int32_t head_dim;
  int32_t block_size;
  std::string message;
};

TEST(DecodeRejection, UnsupportedConfigurationsFailOnTheHost) {
  const Unsupported cases[] = {
      {DType::kF16, 96, 16, "head_dim 96 is not supported (supported: 64, 128, 256)"},
      {DType::kF32, 32, 16, "head_dim 32 is not supported (supported: 64, 128, 256)"},
      {DType::kBF16, 512, 8, "head_dim 512 is not supported (supported: 64, 128, 256)"},
      {DType::kF16, 128, 64, "block_size 64 is not supported (supported: 8, 16, 32)"},
      {DType::kF32, 64, 1, "block_size 1 is not supported (supported: 8, 16, 32)"},
      {DType::kBF16, 256, 7, "block_size 7 is not supported (supported: 8, 16, 32)"},
      {static_cast<DType>(9), 128, 16,
       "dtype 9 is not supported (supported: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8)"},
  };
  for (const Unsupported& c : cases) {
    FakeProblem f(c.dtype, c.head_dim, c.block_size);
    EXPECT_THAT(message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out); }),
                HasSubstr("CUDA decode attention: " + c.message));
  }
  // The contiguous kernel has no block size; head_dim and dtype are checked the same way.
  const KVLayerView cv = contiguous_paged_view({1, 2, 16, 80, DType::kF16, KVLayout::kHND},
                                               fake_ptr(0x30000), fake_ptr(0x40000));
  FakeProblem f(DType::kF16, 80, 16);
  EXPECT_THAT(message_of([&] { contiguous_decode_attention(f.params, cv, f.ctx, f.q, f.out); }),
              HasSubstr("head_dim 80 is not supported (supported: 64, 128, 256)"));
}

TEST(DecodeRejection, BadArgumentsFailOnTheHost) {
  {
    FakeProblem f(DType::kF16, 128, 16);
    f.params.num_heads = 8;
    f.params.num_kv_heads = 4;
    EXPECT_THAT(message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out); }),
                HasSubstr("num_kv_heads 4 != cache num_kv_heads 2"));
  }
  {
    FakeProblem f(DType::kF16, 128, 16);
    EXPECT_THAT(
        message_of([&] { paged_decode_attention(f.params, f.view, f.tables, nullptr, f.out); }),
        HasSubstr("q is null"));
    EXPECT_THAT(
        message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q + 1, f.out); }),
        HasSubstr("is not 16-byte aligned"));
  }
  {
    FakeProblem f(DType::kF16, 128, 16);
    DecodeLaunch launch;
    launch.plan = DecodePlan{4, 64};
    launch.workspace = reinterpret_cast<void*>(uintptr_t{0x50000});
    launch.workspace_bytes = 100;
    EXPECT_THAT(
        message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out, launch); }),
        HasSubstr("workspace of 100 bytes is smaller than the"));
    launch.plan = DecodePlan{kMaxSplits + 1, 64};
    EXPECT_THAT(
        message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out, launch); }),
        HasSubstr("plan.num_splits 257 outside [1, 256]"));
  }
  {
    FakeProblem f(DType::kF16, 128, 16);
    f.tables.num_seqs = 70000;
    EXPECT_THAT(message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out); }),
                HasSubstr("num_seqs 70000 exceeds the grid limit 65535"));
  }
}

// Issue 16: tables of a manager with block_size 4 read through a cache of 16-token blocks (or
// of fewer blocks than the manager's pool) are refused on the host, naming both values, even
// for an empty batch: geometry is configuration, not data.
TEST(DecodeRejection, TableGeometryMismatchFailsOnTheHost) {
  FakeProblem f(DType::kF16, 128, 16);
  f.tables.block_size = 4;
  EXPECT_THAT(message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out); }),
              HasSubstr("cuda::paged_decode_attention: block tables built for block_size 4 but "
                        "the cache has block_size 16"));
  f.tables.block_size = 0;
  EXPECT_THAT(message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out); }),
              HasSubstr("block_size 0 but the cache has block_size 16 (the tables and the cache "
                        "must come from one configuration; the view's block_size is unset)"));
  f.tables.block_size = 16;
  f.tables.num_blocks = 8;
  f.tables.num_seqs = 0;
  EXPECT_THAT(message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out); }),
              HasSubstr("block tables index a pool of 8 blocks but the cache has num_blocks 4"));
}

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

std::vector<GpuCase> supported_grid() {
  std::vector<GpuCase> cases;
  for (DType dtype : kDecodeDTypes) {
    for (int32_t d : kDecodeHeadDims) {
      for (int32_t bs : kDecodeBlockSizes) {
        cases.push_back({.dtype = dtype,
                         .head_dim = d,
                         .block_size = bs,
                         .contexts = {1, bs, bs + 1, 4097, 32768}});
      }
    }
  }
  return cases;
}

std::vector<GpuCase> shape_cases() {
  std::vector<GpuCase> cases;
  auto add = [&](DType dtype, int32_t d, int32_t bs, int32_t kv, int32_t group, KVLayout layout,
                 std::vector<int32_t> contexts) {
    cases.push_back({.dtype = dtype,
                     .head_dim = d,
                     .block_size = bs,
                     .num_kv_heads = kv,
                     .group = group,
                     .layout = layout,
                     .contexts = std::move(contexts)});
  };
  add(DType::kF16, 128, 16, 4, 1, KVLayout::kHND, {0, 5, 300, 2000});  // MHA + padding row
  add(DType::kBF16, 128, 16, 2, 8, KVLayout::kHND, {17, 1031, 4097});  // GQA 8
  add(DType::kF16, 64, 16, 2, 16, KVLayout::kHND, {1, 333, 4097});     // several head chunks
  add(DType::kF32, 128, 8, 1, 6, KVLayout::kHND, {3, 1031, 2049});     // MQA, group 6
  add(DType::kF32, 64, 32, 3, 3, KVLayout::kHND, {100, 0, 65});        // 3 kv heads
  add(DType::kF16, 128, 16, 2, 4, KVLayout::kNHD, {1, 16, 17, 4097});  // NHD layout
  add(DType::kBF16, 256, 8, 2, 2, KVLayout::kNHD, {9, 1031});
  add(DType::kF32, 64, 16, 4, 5, KVLayout::kNHD, {33, 500});
  // 8-bit pools (per-head scales that differ by head, from make_scenario): GQA groups 5 and 8,
  // MQA, both layouts; the grid above has every (8-bit dtype, head_dim, block_size).
  add(DType::kFP8E4M3, 128, 16, 2, 5, KVLayout::kNHD, {1, 333, 4097});
  add(DType::kFP8E5M2, 64, 8, 4, 8, KVLayout::kHND, {17, 1031, 4097});
  add(DType::kInt8, 256, 32, 1, 6, KVLayout::kNHD, {3, 1031, 2049});
  add(DType::kInt8, 128, 16, 3, 3, KVLayout::kHND, {0, 100, 65});
  std::vector<int32_t> many(64);  // a wide batch of mixed lengths: one-pass territory
  for (int32_t i = 0; i < 64; ++i) many[static_cast<size_t>(i)] = 1 + (i * 97) % 700;
  add(DType::kF16, 128, 16, 2, 4, KVLayout::kHND, many);
  return cases;
}

std::vector<GpuCase> mask_cases() {
  // (window, sinks, chunk): windows and sinks; chunks around the block size, odd, with sinks,
  // with a window. Hidden blocks point at NaN (scenario_from_case), as released entries do.
  const std::array<int32_t, 3> masks[] = {
      {0, 0, 0},  {0, 3, 0},  {1, 0, 0},     {100, 0, 0},   {64, 4, 0},   {2000, 0, 0},
      {-1, 0, 3}, {-1, 0, 8}, {-1, 0, 1000}, {-1, 0, 8192}, {-1, 4, 512}, {100, 0, 1024}};
  std::vector<GpuCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kFP8E4M3}) {
    for (auto [window, sinks, chunk] : masks) {
      cases.push_back({.dtype = dtype,
                       .block_size = 8,
                       .window_left = window,
                       .sink_tokens = sinks,
                       .chunk_size = chunk,
                       .contexts = {1, 17, 1031, 4097}});
    }
  }
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
        std::tuple{DType::kInt8, 64, 8}, std::tuple{DType::kFP8E5M2, 256, 32}}) {
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
