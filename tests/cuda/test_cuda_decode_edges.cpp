// CUDA decode against the public bug classes of paged-attention kernels (issue 22, item 7), each
// against the CPU kernel on the same stored K/V (the fp32 bound, tests/common/attention_bound.hpp)
// and for both CUDA kernels where the dtype allows the tensor-core one (its own bound:
// test_cuda_decode_mma.cpp; here it is held to the dtype's rounding of q and P):
//   - a pool past 2^31 elements with the sequence's blocks at its end (int32 offset overflow);
//   - split counts 1, 2, 8 and kMaxSplits with the workspace and the output filled with NaN;
//   - GQA groups 1, 2, 4, 5, 7, 8, 16, 32;
//   - contexts 1..300, one sequence each, at page sizes 1, 16, 128 with permuted block tables;
//   - a sequence alone (batch 1) and inside a batch of 64: the same bits.
// Skipped without a GPU (scripts/gpu_check.sh runs them).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/attention_bound.hpp"
#include "common/attention_cases.hpp"
#include "common/cuda_test_util.hpp"
#include "common/paged_scenario.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

#if PAGEDKV_WITH_CUDA
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

using testing::PagedScenario;

/// One direct launch (no runner): host tables, q in, out back; the output and the split-K
/// workspace are filled with NaN first, so a partial or an element the kernels forget shows.
std::vector<float> launch_on_device(const AttentionParams& params, const KVLayerView& layer,
                                    const BlockTableView& host_tables, const std::vector<float>& q,
                                    const DecodePlan& plan, bool tensor_cores) {
  const int32_t n = host_tables.num_seqs;
  DeviceBuffer tables(std::max<int64_t>(int64_t{n} * host_tables.max_blocks_per_seq * 4, 4));
  tables.upload(host_tables.block_tables, int64_t{n} * host_tables.max_blocks_per_seq * 4);
  DeviceBuffer lens(std::max<int64_t>(int64_t{n} * 4, 4));
  lens.upload(host_tables.context_lens, int64_t{n} * 4);
  DeviceBuffer dq(static_cast<int64_t>(q.size() * 4));
  dq.upload(std::span<const float>(q));
  DeviceBuffer out(static_cast<int64_t>(q.size() * 4));
  out.upload(std::span<const float>(testing::nan_filled(q.size())));
  const int64_t ws = decode_workspace_bytes(n, params.num_heads, params.head_dim, plan);
  DeviceBuffer workspace(std::max<int64_t>(ws, 256));
  workspace.upload(
      std::span<const float>(testing::nan_filled(static_cast<size_t>(workspace.bytes() / 4))));
  BlockTableView dev = host_tables;
  dev.block_tables = tables.as<int32_t>();
  dev.context_lens = lens.as<int32_t>();
  DecodeLaunch launch{plan, workspace.data(), workspace.bytes(), nullptr};
  launch.use_tensor_cores = tensor_cores;
  paged_decode_attention(params, layer, dev, dq.as<const float>(), out.as<float>(), launch);
  synchronize(nullptr);
  std::vector<float> got(q.size());
  out.download(std::span<float>(got));
  return got;
}

/// q rounded to `dtype` where the tensor-core kernel runs (its rounding of q is then exact).
std::vector<float> q_for(const std::vector<float>& q, DType dtype, bool tensor_cores) {
  if (!tensor_cores) return q;
  std::vector<float> r(q);
  for (float& x : r) {
    x = dtype == DType::kF16 ? f16_to_f32(f32_to_f16(x)) : bf16_to_f32(f32_to_bf16(x));
  }
  return r;
}

/// The bound of a kernel against the CPU kernel: fp32's, plus one rounding of each p to the K/V
/// dtype for the tensor-core kernel (|V| <= 1 in these scenarios, so sum p |v| / l <= 1).
double bound_for(DType dtype, bool tensor_cores) {
  if (!tensor_cores) return testing::kAttentionMaxAbs;
  return testing::kAttentionMaxAbs +
         (dtype == DType::kF16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8));
}

/// The scenarios' geometry (testing::AttentionCase's fields; its `context` is unused here).
testing::AttentionCase geometry(DType dtype, int32_t block_size = 16, int32_t group = 4) {
  return {.dtype = dtype, .head_dim = 128, .block_size = block_size, .group = group};
}

/// Both kernels (the tensor-core one only for fp16 / bf16) of scenario s under `plan`, each
/// against the CPU kernel on the q it was given.
void expect_both_kernels(const PagedScenario& s, const DecodePlan& plan, const std::string& what) {
  DeviceKVCache device(s.config);
  device.upload(*s.cache);
  const DType dtype = s.config.dtype;
  for (bool tc : {false, true}) {
    if (tc && dtype != DType::kF16 && dtype != DType::kBF16) continue;
    const std::vector<float> q = q_for(s.q, dtype, tc);
    std::vector<float> ref(q.size());
    pagedkv::paged_decode_attention(s.params, s.layer(), s.view(), q, ref);
    const std::vector<float> got =
        launch_on_device(s.params, device.layer(PagedScenario::kLayer), s.view(), q, plan, tc);
    EXPECT_TRUE(testing::attention_within(got, ref, int64_t{s.params.num_heads} * s.params.head_dim,
                                          bound_for(dtype, tc)))
        << what << (tc ? ", tensor cores" : ", CUDA cores") << ", " << plan.num_splits << " splits";
  }
}

TEST(CudaDecodeEdges, PoolPastTwoToTheThirtyOneElementsWithBlocksAtTheEnd) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  // fp16, 2 kv heads x head_dim 128 x block 16: 4096 elements per block and pool, so 2^19 + 8
  // blocks put the last ones past element 2^31 of K (and of V); 8.6 GB of device memory.
  KVCacheConfig big;
  big.num_layers = 1;
  big.block_size = 16;
  big.num_kv_heads = 2;
  big.head_dim = 128;
  big.dtype = DType::kF16;
  big.num_blocks = (1 << 19) + 8;
  KVCacheConfig small = big;
  small.num_blocks = 8;
  const int32_t ctx = 100;  // 7 blocks
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const size_t row = 2 * 128;
  std::vector<float> k(ctx * row), v(ctx * row), q(8 * 128);
  for (float& x : k) x = uni(rng);
  for (float& x : v) x = uni(rng);
  for (float& x : q) x = uni(rng);
  // Logical block j of the sequence: block j in the small cache, block num_blocks - 1 - j in
  // the big one (the last seven, in reverse).
  std::vector<Slot> small_slots(ctx), big_slots(ctx);
  std::vector<int32_t> small_table(7), big_table(7);
  for (int32_t j = 0; j < 7; ++j) {
    small_table[j] = j;
    big_table[j] = big.num_blocks - 1 - j;
  }
  for (int32_t p = 0; p < ctx; ++p) {
    small_slots[p] = Slot{small_table[p / 16]} * 16 + p % 16;
    big_slots[p] = Slot{big_table[p / 16]} * 16 + p % 16;
  }
  HostKVCache host(small);
  host.write(0, small_slots, k, v);
  DeviceKVCache device(big);
  device.write(0, big_slots, k, v);
  AttentionParams params;
  params.num_heads = 8;
  params.num_kv_heads = 2;
  params.head_dim = 128;
  const int32_t lens[1] = {ctx};
  const BlockTableView small_view{small_table.data(), lens, 1, 7, 16, small.num_blocks};
  const BlockTableView big_view{big_table.data(), lens, 1, 7, 16, big.num_blocks};
  for (bool tc : {false, true}) {
    const std::vector<float> qq = q_for(q, DType::kF16, tc);
    std::vector<float> ref(qq.size());
    pagedkv::paged_decode_attention(params, host.layer(0), small_view, qq, ref);
    for (const DecodePlan& plan : {DecodePlan{}, make_split_plan(ctx, 3)}) {
      const std::vector<float> got =
          launch_on_device(params, device.layer(0), big_view, qq, plan, tc);
      EXPECT_TRUE(testing::attention_within(got, ref, 8 * 128, bound_for(DType::kF16, tc)))
          << (tc ? "tensor cores" : "CUDA cores") << ", " << plan.num_splits << " splits";
    }
  }
}

TEST(CudaDecodeEdges, SplitCountsWithANanWorkspace) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
    const PagedScenario s =
        testing::scenario_from_case(geometry(dtype), {{1, 1}, {300, 1}, {4097, 1}}, 21u);
    for (int32_t splits : {1, 2, 8, kMaxSplits}) {
      expect_both_kernels(s, make_split_plan(4097, splits), std::string(dtype_name(dtype)));
    }
  }
}

TEST(CudaDecodeEdges, EveryGqaGroup) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (int32_t group : {1, 2, 4, 5, 7, 8, 16, 32}) {
    const PagedScenario s = testing::scenario_from_case(geometry(DType::kBF16, 16, group),
                                                        {{1, 1}, {33, 1}, {1031, 1}}, 31u);
    expect_both_kernels(s, DecodePlan{}, "GQA " + std::to_string(group));
    expect_both_kernels(s, make_split_plan(1031, 5), "GQA " + std::to_string(group));
  }
}

TEST(CudaDecodeEdges, ContextsOneToThreeHundredAtPageSizesOneSixteenAndOneTwentyEight) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  std::vector<testing::SeqSpec> seqs;
  for (int32_t ctx = 1; ctx <= 300; ++ctx) seqs.push_back({ctx, 1});
  for (int32_t bs : {1, 16, 128}) {
    // make_scenario draws the blocks from a seeded shuffle: permuted tables.
    const PagedScenario s = testing::scenario_from_case(geometry(DType::kF16, bs), seqs,
                                                        41u + static_cast<uint32_t>(bs));
    expect_both_kernels(s, DecodePlan{}, "block_size " + std::to_string(bs));
  }
}

TEST(CudaDecodeEdges, ASequenceAloneAndInABatchOfSixtyFourGiveTheSameBits) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  std::vector<testing::SeqSpec> seqs;
  for (int32_t i = 0; i < 64; ++i) seqs.push_back({1 + (i * 131) % 2000, 1});
  const PagedScenario s = testing::scenario_from_case(geometry(DType::kBF16), seqs, 51u);
  DeviceKVCache device(s.config);
  device.upload(*s.cache);
  const int64_t row = int64_t{s.params.num_heads} * s.params.head_dim;
  for (bool tc : {false, true}) {
    for (const DecodePlan& plan : {DecodePlan{}, make_split_plan(2000, 4)}) {
      const std::vector<float> q = q_for(s.q, DType::kBF16, tc);
      const std::vector<float> batch =
          launch_on_device(s.params, device.layer(PagedScenario::kLayer), s.view(), q, plan, tc);
      for (int32_t i : {0, 17, 63}) {
        const BlockTableView all = s.view();
        const BlockTableView one{all.block_tables + int64_t{i} * all.max_blocks_per_seq,
                                 all.context_lens + i,
                                 1,
                                 all.max_blocks_per_seq,
                                 all.block_size,
                                 all.num_blocks};
        const std::vector<float> qi(q.begin() + i * row, q.begin() + (i + 1) * row);
        const std::vector<float> alone =
            launch_on_device(s.params, device.layer(PagedScenario::kLayer), one, qi, plan, tc);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + i * row))
            << "sequence " << i << (tc ? ", tensor cores" : ", CUDA cores") << ", "
            << plan.num_splits << " splits";
      }
    }
  }
}

#else  // !PAGEDKV_WITH_CUDA

TEST(CudaDecodeEdges, SkippedWithoutCuda) { GTEST_SKIP() << "no CUDA device (built without CUDA)"; }

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
