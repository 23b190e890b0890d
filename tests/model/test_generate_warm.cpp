// Tests for GenerateOptions::warm_pass (src/model/generate.hpp): a first, unmeasured pass of the
// same prompts leaves its blocks in the pool (kPool) or, once the pool's prefix cache is dropped,
// in the tiers below it (kTiers), and the measured pass hits them. Hand-worked counts on a small
// random model with block size 4: prompts A = P + [a] (13 tokens) and B = P + 4 tokens (16),
// sharing the 12-token prefix P (BOS included). A prompt's last token always runs, so each can
// hit (len - 1) / 4 = 3 full blocks = 12 tokens, all of P.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "model/generate.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"
#include "tiny_llama.hpp"

namespace pagedkv::model {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::tiny_llama_config;

std::vector<std::vector<TokenId>> shared_prefix_prompts() {
  const std::vector<TokenId> p = {kBos, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30};
  std::vector<TokenId> a = p;
  a.push_back(40);
  std::vector<TokenId> b = p;
  b.insert(b.end(), {50, 51, 52, 53});
  return {a, b};
}

GenerateOptions base_options() {
  GenerateOptions o;
  o.steps = 28;
  o.block_size = 4;
  o.prefix_caching = true;
  return o;
}

std::vector<std::vector<TokenId>> ids_of(const GenerateResult& r) {
  std::vector<std::vector<TokenId>> out;
  for (const SequenceOutput& s : r.seqs) out.push_back(s.ids);
  return out;
}

class GenerateWarm : public ::testing::Test {
 protected:
  LlamaModel model_{random_weights(tiny_llama_config(), 11)};
  std::vector<std::vector<TokenId>> prompts_ = shared_prefix_prompts();
  // The contiguous cache's tokens: what every paged run must reproduce.
  std::vector<std::vector<TokenId>> expected_ =
      ids_of(generate(model_, prompts_, CacheMode::kContiguous, base_options()));
};

TEST_F(GenerateWarm, ColdRunHitsNothingWithinItsOwnBatch) {
  // Both prompts are added before the prefill publishes anything.
  const GenerateResult r = generate(model_, prompts_, CacheMode::kPaged, base_options());
  EXPECT_EQ(r.stats.prompt_tokens, 29);
  EXPECT_EQ(r.stats.prompt_tokens_cached, 0);
  EXPECT_EQ(ids_of(r), expected_);
}

TEST_F(GenerateWarm, PoolWarmPassHitsEveryEligibleBlockOfBothPrompts) {
  GenerateOptions o = base_options();
  o.warm_pass = model::WarmPass::kPool;
  const GenerateResult r = generate(model_, prompts_, CacheMode::kPaged, o);
  EXPECT_EQ(r.stats.prompt_tokens, 29);
  EXPECT_EQ(r.stats.prompt_tokens_cached, 24);  // 12 + 12, all from the pool
  EXPECT_EQ(r.stats.tiering.onboarded_tokens, 0);
  EXPECT_EQ(ids_of(r), expected_);
}

TEST_F(GenerateWarm, TiersWarmPassOnboardsThePrefixOnceThenThePoolSharesIt) {
  const auto dir = std::filesystem::temp_directory_path() / "pagedkv_test_generate_warm";
  std::filesystem::create_directories(dir);
  for (const WritePolicy policy : {WritePolicy::kWriteThrough, WritePolicy::kOnEviction}) {
    for (const bool disk : {false, true}) {
      SCOPED_TRACE(std::string(policy == WritePolicy::kWriteThrough ? "write-through" : "evict") +
                   (disk ? " disk" : " host"));
      GenerateOptions o = base_options();
      o.warm_pass = model::WarmPass::kTiers;
      o.tiering.policy = policy;
      if (disk) {
        const auto file = dir / "kv.tier";
        std::filesystem::remove(file);
        o.tiering.disk_path = file.string();
        o.tiering.disk_bytes = int64_t{1} << 20;
      } else {
        o.tiering.host_bytes = int64_t{1} << 20;
      }
      o.tiering.model_id = "tiny:11";
      const GenerateResult r = generate(model_, prompts_, CacheMode::kPaged, o);
      // A finds nothing in the emptied pool and onboards P's 3 blocks from the tier; they are
      // committed before B is added, so B hits them in the pool.
      EXPECT_EQ(r.stats.prompt_tokens_cached, 24);
      EXPECT_EQ(r.stats.tiering.onboarded_tokens, 12);
      ASSERT_EQ(r.stats.tiering.loaded_blocks.size(), 1u);
      EXPECT_EQ(r.stats.tiering.loaded_blocks[0], 3);
      EXPECT_EQ(r.stats.tiering.refused_records, 0);
      EXPECT_EQ(ids_of(r), expected_);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_F(GenerateWarm, NeedsAPrefixCacheAndForTiersATier) {
  GenerateOptions o = base_options();
  o.warm_pass = model::WarmPass::kPool;
  EXPECT_THAT(
      [&] { (void)generate(model_, prompts_, CacheMode::kContiguous, o); },
      ThrowsMessage<Error>(HasSubstr("warm pass 'pool' needs the paged cache with prefix caching "
                                     "(--prefix-caching or a tier), not the contiguous "
                                     "cache")));
  o.prefix_caching = false;
  EXPECT_THAT([&] { (void)generate(model_, prompts_, CacheMode::kPaged, o); },
              ThrowsMessage<Error>(HasSubstr("not the paged cache without it")));
  o.prefix_caching = true;
  o.warm_pass = model::WarmPass::kTiers;
  EXPECT_THAT([&] { (void)generate(model_, prompts_, CacheMode::kPaged, o); },
              ThrowsMessage<Error>(HasSubstr("warm pass 'tiers' needs a tier")));
  o.warm_pass = model::WarmPass::kPool;
  o.shadow_kv_dtypes = {DType::kF16};
  EXPECT_THAT([&] { (void)generate(model_, prompts_, CacheMode::kPaged, o); },
              ThrowsMessage<Error>(HasSubstr("cannot run with shadow KV dtypes")));
}

TEST(WarmPassName, Names) {
  EXPECT_STREQ(warm_pass_name(model::WarmPass::kNone), "none");
  EXPECT_STREQ(warm_pass_name(model::WarmPass::kPool), "pool");
  EXPECT_STREQ(warm_pass_name(model::WarmPass::kTiers), "tiers");
}

}  // namespace
}  // namespace pagedkv::model
