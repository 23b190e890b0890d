// Tests for src/sim/memory_growth.hpp (the growth table from the formula) and, when the model
// layer is built, src/sim/model_memory.hpp: a real model run through the contiguous and the
// paged cache, whose measured bytes must equal the formula (contiguous) and the formula
// rounded up to whole blocks (paged) at every step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "pagedkv/error.hpp"
#include "sim/memory_growth.hpp"
#include "sim/model_preset.hpp"
#include "sim_test_util.hpp"

#if PAGEDKV_HAVE_MODEL
#include "model/checkpoint.hpp"
#include "model/llama.hpp"
#include "sim/model_memory.hpp"
#endif

namespace pagedkv::sim {
namespace {

using ::testing::ElementsAre;

TEST(GrowthLengths, PowersOfTwoTenAndOffBoundaryLengths) {
  EXPECT_THAT(growth_lengths(512), ElementsAre(1, 16, 17, 32, 64, 100, 128, 256, 512));
  EXPECT_THAT(growth_lengths(1), ElementsAre(1));
  EXPECT_THAT(growth_lengths(20), ElementsAre(1, 16, 17, 20));
}

TEST(GrowthTable, Llama2FormulaPagedAndFit) {
  const ModelPreset& m = find_preset("llama-2-7b");  // 512 KiB per token
  const std::vector<int64_t> lengths = {0, 1, 1000, 4096};
  const auto rows = growth_table(m, 2, 16, lengths, int64_t{40} << 30);
  ASSERT_EQ(rows.size(), 4u);
  constexpr int64_t kTok = 524288;
  EXPECT_EQ(rows[0].formula_bytes, 0);
  EXPECT_EQ(rows[0].paged_bytes, 0);
  EXPECT_EQ(rows[1].formula_bytes, 2 * kTok);
  EXPECT_EQ(rows[1].paged_bytes, 2 * 16 * kTok);  // one whole block per sequence
  EXPECT_EQ(rows[2].formula_bytes, 2 * 1000 * kTok);
  EXPECT_EQ(rows[2].paged_bytes, 2 * 1008 * kTok);  // 63 blocks of 16
  EXPECT_EQ(rows[3].paged_bytes, rows[3].formula_bytes);
  EXPECT_EQ(rows[3].contiguous_max_bytes, 2 * 4096 * kTok);
  // 40 GiB = 81920 positions: 81 sequences of 1008, 20 of 4096.
  EXPECT_EQ(rows[2].paged_fit, 81);
  EXPECT_EQ(rows[2].contiguous_fit, 20);
  EXPECT_EQ(rows[3].paged_fit, 20);
  EXPECT_EQ(rows[2].window_bytes, rows[2].formula_bytes);  // full attention
}

TEST(GrowthTable, SlidingWindowCapsGrowth) {
  const ModelPreset& m = find_preset("mistral-7b");
  const std::vector<int64_t> lengths = {4096, 8192};
  const auto rows = growth_table(m, 1, 16, lengths, 0);
  EXPECT_EQ(rows[1].window_bytes, rows[0].formula_bytes);
  EXPECT_EQ(rows[1].formula_bytes, 2 * rows[0].formula_bytes);
  EXPECT_EQ(rows[1].paged_fit, 0);                             // no budget given
  EXPECT_EQ(rows[1].window_paged_bytes, rows[0].paged_bytes);  // 256 blocks of 16 kept
}

TEST(GrowthTable, HybridPagedIsPerGroupWholeBlocks) {
  const ModelPreset& m = find_preset("gpt-oss-20b");  // 12 full + 12 window-128 layers
  constexpr int64_t kPerLayer = 2 * 8 * 64 * 2;
  const std::vector<int64_t> lengths = {100, 1000};
  const auto rows = growth_table(m, 3, 16, lengths, 0);
  // T = 100: both groups hold ceil(100 / 16) = 7 blocks (the window covers all of it).
  EXPECT_EQ(rows[0].window_paged_bytes, 3 * 24 * 7 * 16 * kPerLayer);
  EXPECT_EQ(rows[0].window_bytes, 3 * 24 * 100 * kPerLayer);
  // T = 1000: full 63 blocks; window keeps 872..999, blocks 54..62 -> 9.
  EXPECT_EQ(rows[1].window_paged_bytes, 3 * (12 * 63 + 12 * 9) * 16 * kPerLayer);
  EXPECT_EQ(rows[1].window_bytes, 3 * (12 * 1000 + 12 * 128) * kPerLayer);
  EXPECT_EQ(rows[1].paged_bytes, 3 * 24 * 63 * 16 * kPerLayer);
}

TEST(GrowthTable, BadArgumentsThrow) {
  const ModelPreset& m = find_preset("gpt2");
  const std::vector<int64_t> lengths = {1};
  EXPECT_THROW((void)growth_table(m, 0, 16, lengths, 0), Error);
  EXPECT_THROW((void)growth_table(m, 1, 0, lengths, 0), Error);
  const std::vector<int64_t> negative = {-1};
  EXPECT_THROW((void)growth_table(m, 1, 16, negative, 0), Error);
}

// Byte counts past int64 were computed anyway: signed overflow wrapped them to negative or 0
// bytes, and the contiguous fit then divided by 0 (`pagedkv memory --kv-heads 65536 --head-dim
// 65536 --max-context 4294967296 --kv-memory 1GiB` died of SIGFPE). Now an error naming the sizes.
TEST(GrowthTable, ByteCountsPastInt64Throw) {
  ModelOverrides big;
  big.num_kv_heads = 65536;
  big.head_dim = 65536;
  big.max_context = int64_t{1} << 32;
  const ModelPreset m = apply_overrides(find_preset("llama-2-7b"), big);  // 2^39 B per token
  EXPECT_THAT(
      [&] { (void)growth_table(m, 1, 16, growth_lengths(m.max_context), int64_t{1} << 30); },
      ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
          "1 sequence(s) of 4294967296 tokens x 2 x 32 layers x 65536 kv heads x head_dim "
          "65536 x 2 bytes overflows a 64-bit byte count")));
  // The same model at 2^23 tokens (2^62 bytes, plus one token of rounding) still fits.
  big.max_context = int64_t{1} << 23;
  const ModelPreset fits = apply_overrides(find_preset("llama-2-7b"), big);
  const std::vector<int64_t> lengths = {int64_t{1} << 23};
  const std::vector<GrowthRow> rows = growth_table(fits, 1, 1, lengths, 0);
  EXPECT_EQ(rows[0].formula_bytes, int64_t{1} << 62);
  // batch multiplies in: two sequences of that model overflow.
  EXPECT_THROW((void)growth_table(fits, 2, 1, lengths, 0), Error);
}

TEST(PagedBytes, RoundsUpToWholeBlocks) {
  const ModelPreset& m = find_preset("stories260k");  // 1280 bytes per token
  EXPECT_EQ(paged_bytes_for_tokens(m, 0, 16), 0);
  EXPECT_EQ(paged_bytes_for_tokens(m, 1, 16), 16 * 1280);
  EXPECT_EQ(paged_bytes_for_tokens(m, 16, 16), 16 * 1280);
  EXPECT_EQ(paged_bytes_for_tokens(m, 17, 16), 32 * 1280);
  EXPECT_EQ(paged_bytes_for_tokens(m, 17, 1), 17 * 1280);
}

#if PAGEDKV_HAVE_MODEL

void expect_measured_equals_formula(const std::vector<MeasuredStep>& steps, int64_t prompt,
                                    int64_t positions, int32_t bs, int64_t bytes_per_token) {
  ASSERT_EQ(static_cast<int64_t>(steps.size()), positions - prompt + 1);
  for (const MeasuredStep& m : steps) {
    SCOPED_TRACE(m.step);
    EXPECT_EQ(m.tokens, prompt + m.step);
    EXPECT_EQ(m.formula_bytes, m.tokens * bytes_per_token);
    EXPECT_EQ(m.contiguous_bytes, m.formula_bytes);  // exact
    EXPECT_EQ(m.paged_bytes, blocks_for_tokens(m.tokens, bs) * bs * bytes_per_token);
    EXPECT_EQ(m.paged_bytes, m.paged_expected_bytes);
  }
}

std::vector<TokenId> prompt_of(int n) {
  std::vector<TokenId> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(3 + 'a' + i % 26);
  return p;
}

class MeasuredBuiltin : public ::testing::TestWithParam<int32_t> {};

// The built-in model (4 layers, 4 kv heads, head_dim 64, fp32): 8192 bytes per token.
TEST_P(MeasuredBuiltin, MeasuredEqualsFormula) {
  const int32_t bs = GetParam();
  model::LlamaModel llama(model::random_weights(model::builtin_config(), 7));
  const auto steps = measure_model_growth(llama, prompt_of(5), 40, bs);
  expect_measured_equals_formula(steps, 5, 40, bs, 8192);
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, MeasuredBuiltin, ::testing::Values(1, 7, 16, 32),
                         [](const auto& info) { return "bs" + std::to_string(info.param); });

// stories260K from ../shared/models: 5 layers, 4 kv heads, head_dim 8, fp32 = 1280 bytes per
// token, over its whole 512-position context.
TEST(MeasuredStories260K, WholeContextMeasuredEqualsFormula) {
  const auto path = std::filesystem::path(PAGEDKV_SHARED_DIR) / "models" / "stories260K.bin";
  if (!std::filesystem::exists(path)) {
    if (testing::running_in_ci()) FAIL() << "CI=true but " << path << " is missing";
    GTEST_SKIP() << path << " is missing: skipping the real-model measurement";
  }
  model::LlamaModel llama(model::load_checkpoint(path.string()));
  const auto steps = measure_model_growth(llama, prompt_of(17), 512, 16);
  expect_measured_equals_formula(steps, 17, 512, 16, 1280);
  EXPECT_EQ(steps.back().contiguous_bytes, 655360);
}

TEST(MeasuredBuiltinErrors, BadArgumentsThrow) {
  model::LlamaModel llama(model::random_weights(model::builtin_config(), 7));
  EXPECT_THROW((void)measure_model_growth(llama, {}, 10, 16), Error);
  EXPECT_THROW((void)measure_model_growth(llama, prompt_of(5), 4, 16), Error);
  EXPECT_THROW((void)measure_model_growth(llama, prompt_of(5), 513, 16), Error);
  EXPECT_THROW((void)measure_model_growth(llama, prompt_of(5), 10, 0), Error);
}

#endif  // PAGEDKV_HAVE_MODEL

}  // namespace
}  // namespace pagedkv::sim
