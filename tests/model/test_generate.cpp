// Tests for src/model/generate.hpp and llama.hpp on small random models: the three cache modes
// agree (tokens exactly, logits within fp32 noise) for batches of different lengths and several
// block sizes, batching changes nothing, stop rules, memory figures, and input errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/checkpoint.hpp"
#include "model/generate.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "tiny_llama.hpp"

namespace pagedkv::model {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

LlamaConfig tiny(int32_t seq_len = 64) { return testing::tiny_llama_config(seq_len); }

std::vector<std::vector<TokenId>> prompts() {
  // Different lengths (1, 5, 19 tokens), so blocks fill unevenly and prefill rows differ.
  return {{kBos},
          {kBos, 50, 60, 70, 80},
          {kBos, 9, 8, 7, 6, 5, 4, 3, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}};
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
  }
  return d;
}

struct AgreeCase {
  const char* name;
  int32_t block_size;
  float temperature;
};

class ModesAgree : public ::testing::TestWithParam<AgreeCase> {};

TEST_P(ModesAgree, SameTokensAndLogitsForABatch) {
  LlamaModel model(random_weights(tiny(), 5));
  GenerateOptions opt;
  opt.steps = 40;
  opt.block_size = GetParam().block_size;
  opt.temperature = GetParam().temperature;
  opt.seed = 5;
  opt.record_logits = true;
  const auto paged = generate(model, prompts(), CacheMode::kPaged, opt);
  const auto contiguous = generate(model, prompts(), CacheMode::kContiguous, opt);
  const auto none = generate(model, prompts(), CacheMode::kNone, opt);
  int64_t positions = 0;
  for (const auto& s : paged.seqs) {
    // A random model may sample BOS and stop early; otherwise it runs all 40 positions.
    if (!s.stopped_on_bos) EXPECT_EQ(s.positions_run, 40);
    EXPECT_EQ(s.logits.size(), static_cast<size_t>(s.positions_run) * 300);
    EXPECT_EQ(s.ids.size(), s.prompt_ids.size() + static_cast<size_t>(s.num_generated));
    positions += s.positions_run;
  }
  EXPECT_GT(positions, 3 * 20);
  for (const auto* other : {&contiguous, &none}) {
    const Agreement g = compare_runs(*other, paged);
    EXPECT_TRUE(g.same_tokens) << "seq " << g.diverge_seq << " index " << g.diverge_index;
    EXPECT_LE(g.max_abs_logit_diff, 1e-4);
    EXPECT_EQ(g.positions_compared, positions);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ModesAgree,
                         ::testing::Values(AgreeCase{"greedy_bs1", 1, 0.0f},
                                           AgreeCase{"greedy_bs4", 4, 0.0f},
                                           AgreeCase{"greedy_bs16", 16, 0.0f},
                                           AgreeCase{"greedy_bs64", 64, 0.0f},
                                           AgreeCase{"sampled_t0p8_bs16", 16, 0.8f}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Generate, BatchingChangesNothing) {
  LlamaModel model(random_weights(tiny(), 11));
  GenerateOptions opt;
  opt.steps = 30;
  opt.record_logits = true;
  const auto all = prompts();
  const auto batch = generate(model, all, CacheMode::kPaged, opt);
  for (size_t i = 0; i < all.size(); ++i) {
    const auto alone = generate(model, {all[i]}, CacheMode::kPaged, opt);
    EXPECT_EQ(alone.seqs[0].ids, batch.seqs[i].ids) << i;
    EXPECT_LE(max_diff(alone.seqs[0].logits, batch.seqs[i].logits), 1e-4) << i;
  }
}

TEST(Generate, PrefillEqualsTokenByToken) {
  // A prompt prefilled in one pass gives the logits of feeding it one position at a time:
  // record the prompt rows, then replay the prompt as a "generation" of forced tokens.
  LlamaModel model(random_weights(tiny(), 13));
  const std::vector<TokenId> prompt{kBos, 20, 21, 22, 23, 24, 25, 26, 27, 28};
  GenerateOptions opt;
  opt.steps = static_cast<int32_t>(prompt.size());
  opt.record_logits = true;
  const auto once = generate(model, {prompt}, CacheMode::kPaged, opt);

  auto backend = make_kv_backend(CacheMode::kPaged, model.backend_config(4, 8));
  backend->add_sequence(0);
  const SeqId seq = 0;
  const int64_t one = 1;
  for (size_t p = 0; p < prompt.size(); ++p) {
    const auto logits =
        model.forward(*backend, StepInput{{&seq, 1}, {&one, 1}, {&prompt[p], 1}}, false);
    for (int v = 0; v < 300; ++v) {
      ASSERT_NEAR(logits[v], once.seqs[0].logits[p * 300 + v], 1e-4) << "position " << p;
    }
  }
  EXPECT_EQ(backend->num_tokens(0), static_cast<int64_t>(prompt.size()));
}

TEST(Generate, StopsOnBos) {
  // A model that always predicts BOS: every layer's output projections are zero (the residual
  // stream stays the token embedding), all embeddings are one vector e, and the separate
  // classifier has e in BOS's row and zeros elsewhere, so logit[BOS] = |e|^2 / rms > 0 = others.
  LlamaConfig c = tiny();
  c.shared_classifier = false;
  const LlamaWeights base = random_weights(c, 1);
  std::vector<float> data(static_cast<size_t>(weights_floats(c)), 0.0f);
  const int64_t emb = int64_t{c.vocab_size} * c.dim;
  for (int64_t i = 0; i < emb; ++i) data[i] = static_cast<float>(i % c.dim + 1) / c.dim;
  const auto offset = [&](const float* p) { return p - base.token_embedding; };
  std::fill(data.begin() + offset(base.rms_att), data.begin() + offset(base.wq), 1.0f);
  std::fill(data.begin() + offset(base.rms_ffn), data.begin() + offset(base.w1), 1.0f);
  std::fill(data.begin() + offset(base.rms_final), data.begin() + offset(base.rms_final) + c.dim,
            1.0f);
  for (int64_t d = 0; d < c.dim; ++d) {
    data[offset(base.wcls) + kBos * c.dim + d] = static_cast<float>(d + 1) / c.dim;
  }
  LlamaModel model(LlamaWeights(c, std::move(data)));
  GenerateOptions opt;
  opt.steps = 20;
  for (const CacheMode mode : {CacheMode::kPaged, CacheMode::kContiguous, CacheMode::kNone}) {
    const auto r = generate(model, {{kBos, 40, 41}, {kBos}}, mode, opt);
    for (const auto& s : r.seqs) {
      EXPECT_TRUE(s.stopped_on_bos);
      EXPECT_EQ(s.num_generated, 0);
      EXPECT_EQ(s.ids, s.prompt_ids);  // the BOS that stops is not kept
      EXPECT_EQ(s.positions_run, static_cast<int64_t>(s.prompt_ids.size()));
    }
    EXPECT_EQ(r.stats.tokens_generated, 0);
    EXPECT_TRUE(r.stats.tpot_ms.empty());  // stopped at the prefill: no decode step
  }
}

TEST(Generate, MemoryFigures) {
  const LlamaConfig c = tiny();
  LlamaModel model(random_weights(c, 5));
  GenerateOptions opt;
  opt.steps = 21;  // 2 blocks of 16 per sequence, the second holding 5 tokens
  opt.block_size = 16;
  const auto all = prompts();
  const int64_t token_bytes =
      kv_bytes_for_tokens(c.n_layers, c.n_kv_heads, c.head_size(), DType::kF32, 1);
  const auto paged = generate(model, all, CacheMode::kPaged, opt);
  // Precondition of the hand-computed figures (true for weight seed 5): nobody stops early.
  for (const auto& s : paged.seqs) ASSERT_FALSE(s.stopped_on_bos);
  EXPECT_EQ(paged.stats.kv_tokens_in_use, 3 * 21);
  EXPECT_EQ(paged.stats.kv_bytes_in_use, 3 * 2 * 16 * token_bytes);  // whole blocks
  EXPECT_EQ(paged.stats.contiguous_reservation_bytes, 3 * 64 * token_bytes);
  EXPECT_DOUBLE_EQ(paged.stats.wasted_share(), 1.0 - 96.0 / 192.0);
  EXPECT_EQ(paged.stats.tokens_generated, 3 * 22 - 1 - 5 - 19);
  EXPECT_EQ(paged.stats.tpot_ms.size(), 20u);  // the longest prompt's decode steps

  const auto contiguous = generate(model, all, CacheMode::kContiguous, opt);
  EXPECT_EQ(contiguous.stats.kv_bytes_in_use, 3 * 21 * token_bytes);  // exact tokens
  const auto none = generate(model, all, CacheMode::kNone, opt);
  EXPECT_EQ(none.stats.kv_bytes_in_use, 0);
  EXPECT_EQ(none.stats.kv_tokens_in_use, 0);
}

TEST(Generate, PositionsPastSeqLenAreComputedNotLookedUp) {
  // RoPE angles come from the position, so running past the header's seq_len is well defined
  // (the CLI caps --steps at seq_len; the model itself does not crash past it).
  LlamaModel model(random_weights(tiny(/*seq_len=*/8), 3));
  GenerateOptions opt;
  opt.steps = 50;
  opt.record_logits = true;
  const auto r = generate(model, {{kBos, 7}}, CacheMode::kPaged, opt);
  EXPECT_EQ(r.seqs[0].positions_run, 50);
  for (const float l : r.seqs[0].logits) ASSERT_TRUE(std::isfinite(l));
}

TEST(Generate, SamplingIsSeededAndGreedyIgnoresTheSeed) {
  LlamaModel model(random_weights(tiny(), 3));
  GenerateOptions opt;
  opt.steps = 30;
  opt.temperature = 1.0f;
  opt.seed = 1;
  const auto a = generate(model, prompts(), CacheMode::kPaged, opt);
  const auto b = generate(model, prompts(), CacheMode::kPaged, opt);
  opt.seed = 2;
  const auto c = generate(model, prompts(), CacheMode::kPaged, opt);
  EXPECT_EQ(a.seqs[2].ids, b.seqs[2].ids);
  EXPECT_NE(a.seqs[2].ids, c.seqs[2].ids);
  opt.temperature = 0.0f;
  const auto g1 = generate(model, prompts(), CacheMode::kPaged, opt);
  opt.seed = 1;
  const auto g2 = generate(model, prompts(), CacheMode::kPaged, opt);
  EXPECT_EQ(g1.seqs[2].ids, g2.seqs[2].ids);
}

TEST(Generate, InputErrors) {
  LlamaModel model(random_weights(tiny(), 3));
  GenerateOptions opt;
  opt.steps = 4;
  EXPECT_THAT([&] { (void)generate(model, {}, CacheMode::kPaged, opt); },
              ThrowsMessage<Error>(HasSubstr("no prompt")));
  EXPECT_THAT([&] { (void)generate(model, {{}}, CacheMode::kPaged, opt); },
              ThrowsMessage<Error>(HasSubstr("prompt 0 has no token")));
  EXPECT_THAT(
      [&] {
        (void)generate(model, {{1, 5, 6, 7, 8}}, CacheMode::kPaged, opt);
      },
      ThrowsMessage<Error>(HasSubstr("prompt 0 has 5 tokens, more than the 4 positions")));
  EXPECT_THAT(
      [&] {
        (void)generate(model, {{1, 300}}, CacheMode::kPaged, opt);
      },
      ThrowsMessage<Error>(HasSubstr("token id 300 outside [0, 300)")));
  opt.temperature = -1.0f;
  EXPECT_THAT([&] { (void)generate(model, {{1}}, CacheMode::kPaged, opt); },
              ThrowsMessage<Error>(HasSubstr("temperature")));
  opt.temperature = 0.0f;
  opt.block_size = 0;
  EXPECT_THAT([&] { (void)generate(model, {{1}}, CacheMode::kPaged, opt); },
              ThrowsMessage<Error>(HasSubstr("block size 0")));
  // 1024 sequences x one block of 2^20 tokens x 256 B per token: refused, not allocated.
  opt.block_size = 1 << 20;
  const std::vector<std::vector<TokenId>> many(1024, std::vector<TokenId>{1});
  EXPECT_THAT([&] { (void)generate(model, many, CacheMode::kPaged, opt); },
              ThrowsMessage<Error>(HasSubstr("page pool would take")));
}

TEST(Generate, Summary) {
  const Summary s = summarize({5, 1, 4, 2, 3});
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  EXPECT_DOUBLE_EQ(s.p50, 3.0);
  EXPECT_DOUBLE_EQ(s.p99, 5.0);
  const Summary e = summarize({});
  EXPECT_EQ(e.mean, 0.0);
}

TEST(CacheMode, Names) {
  for (const CacheMode m : {CacheMode::kPaged, CacheMode::kContiguous, CacheMode::kNone}) {
    EXPECT_EQ(parse_cache_mode(cache_mode_name(m)), m);
  }
  EXPECT_FALSE(parse_cache_mode("all").has_value());
}

}  // namespace
}  // namespace pagedkv::model
