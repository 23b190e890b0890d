// CUDA decode attention on the host, run everywhere (no GPU needed): the split-K heuristic,
// workspace sizing, the kernels' index math (__host__ __device__ helpers), and the rejection of
// unsupported configurations and bad arguments before any CUDA call. The kernels themselves:
// test_cuda_decode_attention.cpp.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "common/error_message.hpp"
#include "cuda/launch.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/contiguous_paged_view.hpp"

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
      {DType::kF16, 320, 16,
       "head_dim 320 is not supported (supported: 1..256; fast kernel: 64, 128, 256)"},
      {DType::kF32, 257, 16, "head_dim 257 is not supported (supported: 1..256"},
      {DType::kBF16, 512, 8, "head_dim 512 is not supported (supported: 1..256"},
      {DType::kF16, 128, 256,
       "block_size 256 is not supported (supported: 1, 2, 4, 8, 16, 32, 64, 128)"},
      {DType::kF32, 64, 12, "block_size 12 is not supported (supported: 1, 2, 4, 8, 16, 32"},
      {DType::kBF16, 96, 7, "block_size 7 is not supported (supported: 1, 2, 4, 8, 16, 32"},
      {static_cast<DType>(9), 128, 16,
       "dtype 9 is not supported (supported: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8)"},
  };
  for (const Unsupported& c : cases) {
    FakeProblem f(c.dtype, c.head_dim, c.block_size);
    EXPECT_THAT(message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out); }),
                HasSubstr("CUDA decode attention: " + c.message));
  }
  // The contiguous kernel has no block size; head_dim and dtype are checked the same way.
  const KVLayerView cv = contiguous_paged_view({1, 2, 16, 288, DType::kF16, KVLayout::kHND},
                                               fake_ptr(0x30000), fake_ptr(0x40000));
  FakeProblem f(DType::kF16, 288, 16);
  EXPECT_THAT(
      message_of([&] { contiguous_decode_attention(f.params, cv, f.ctx, f.q, f.out); }),
      HasSubstr("head_dim 288 is not supported (supported: 1..256; fast kernel: 64, 128, 256)"));
}

TEST(DecodeRejection, TensorCoresNeedSixteenBitKvAndAFastHeadDim) {
  DecodeLaunch launch;
  launch.use_tensor_cores = true;
  for (auto [dtype, head_dim, message] :
       {std::tuple{DType::kF32, 128, "use_tensor_cores needs fp16 or bf16 K/V, got fp32"},
        std::tuple{DType::kInt8, 128, "use_tensor_cores needs fp16 or bf16 K/V, got int8"},
        std::tuple{DType::kBF16, 96, "use_tensor_cores needs head_dim 64, 128 or 256, got 96"}}) {
    FakeProblem f(dtype, head_dim, 16);
    EXPECT_THAT(
        message_of([&] { paged_decode_attention(f.params, f.view, f.tables, f.q, f.out, launch); }),
        HasSubstr(message));
  }
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

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
