// Tests for generate with a layer pattern (GenerateOptions::layer_attention, issue 17 item 5):
// the paged mode runs the hybrid paged cache (KV cache groups over one pool, released blocks
// never read) and must agree with the contiguous reference and the none mode under the same
// per-layer masks; the KV each group holds at the end is worked out by hand from the tokens
// cached.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/generate.hpp"
#include "model/layer_pattern.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_groups.hpp"
#include "tiny_llama.hpp"

namespace pagedkv::model {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::tiny_llama_config;

std::vector<std::vector<TokenId>> prompts() {
  return {{kBos, 20, 21, 22, 23, 24}, {kBos, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39}};
}

GenerateOptions options(std::vector<KVCacheGroupSpec> layers) {
  GenerateOptions o;
  o.steps = 40;
  o.block_size = 4;
  o.record_logits = true;
  o.layer_attention = std::move(layers);
  return o;
}

LlamaConfig config_with_layers(int32_t n) {
  LlamaConfig c = tiny_llama_config();
  c.n_layers = n;
  return c;
}

void expect_agree(const GenerateResult& a, const GenerateResult& b) {
  const Agreement g = compare_runs(a, b);
  EXPECT_TRUE(g.same_tokens) << "diverge at sequence " << g.diverge_seq << " token "
                             << g.diverge_index;
  EXPECT_TRUE(g.same_lengths);
  EXPECT_GT(g.positions_compared, 0);
  EXPECT_LE(g.max_abs_logit_diff, 1e-4);
}

TEST(GenerateHybrid, WindowChunkAndFullAgreeWithTheReferenceAndHoldWhatTheyNeed) {
  // Layers S (window 8), C (chunk 8), F: three kinds of one layer, so G = 1 and 3 groups; a
  // page is 4 positions x 1 layer x 2 (K, V) x 2 kv heads x 8 dims x 4 bytes = 512 bytes.
  LlamaModel model(random_weights(config_with_layers(3), 5));
  const auto layers = layer_attention_from_pattern("SCF", 3, 8, 0, 8);
  const GenerateOptions o = options(layers);
  const GenerateResult paged = generate(model, prompts(), CacheMode::kPaged, o);
  const GenerateResult contiguous = generate(model, prompts(), CacheMode::kContiguous, o);
  const GenerateResult none = generate(model, prompts(), CacheMode::kNone, o);
  expect_agree(paged, contiguous);
  expect_agree(none, contiguous);

  // The masks matter: an all-full reference of the same model computes other logits.
  const GenerateResult full = generate(model, prompts(), CacheMode::kContiguous, options({}));
  EXPECT_GT(compare_runs(full, contiguous).max_abs_logit_diff, 1e-3);

  // At the end, a sequence of T cached tokens (T = positions run) holds, by the release rule
  // (before the last append at p = T - 1 a group drops the blocks wholly below what p sees):
  //   window 8: entries [floor((T - 8) / 4), ceil(T / 4))     (T >= 8)
  //   chunk 8:  entries [2 floor((T - 1) / 8), ceil(T / 4))
  //   full:     entries [0, ceil(T / 4))
  const std::vector<GroupKVUsage>& groups = paged.stats.kv_groups;
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].spec.kind, GroupAttention::kSlidingWindow);
  EXPECT_EQ(groups[1].spec.kind, GroupAttention::kChunkedLocal);
  EXPECT_EQ(groups[2].spec.kind, GroupAttention::kFull);
  int64_t window = 0, chunk = 0, all = 0;
  for (const SequenceOutput& s : paged.seqs) {
    const int64_t t = s.positions_run;
    ASSERT_GE(t, 8);
    const int64_t blocks = (t + 3) / 4;
    window += blocks - (t - 8) / 4;
    chunk += blocks - 2 * ((t - 1) / 8);
    all += blocks;
  }
  EXPECT_EQ(groups[0].blocks, window);
  EXPECT_EQ(groups[1].blocks, chunk);
  EXPECT_EQ(groups[2].blocks, all);
  for (const GroupKVUsage& g : groups) EXPECT_EQ(g.bytes, g.blocks * 512);
  EXPECT_EQ(paged.stats.kv_bytes_in_use, (window + chunk + all) * 512);
  // All-full: every block of every layer (3 x 512 bytes per block).
  EXPECT_EQ(paged.stats.kv_bytes_all_full, all * 3 * 512);
  EXPECT_LT(paged.stats.kv_bytes_in_use, paged.stats.kv_bytes_all_full);
}

TEST(GenerateHybrid, PaddedGroupsKeepEachLayerInItsOwnSlot) {
  // "FFFSS": 3 full + 2 window layers; 2 x 3 < 3 x 2 fails, so G = 2: the full layers fill 2
  // groups (one slot padded), the window layers 1; pages hold 2 layer slots, so a layer
  // written to the wrong slot, or read through another group's table, breaks the agreement.
  LlamaModel model(random_weights(config_with_layers(5), 9));
  const auto layers = layer_attention_from_pattern("FFFSS", 5, 5, 1, 0);
  const KVCacheGroupLayout layout = group_layers(layers);
  ASSERT_EQ(layout.layers_per_group, 2);
  ASSERT_EQ(layout.groups.size(), 3u);
  EXPECT_EQ(layout.padded_layers, 1);
  const GenerateOptions o = options(layers);
  const GenerateResult paged = generate(model, prompts(), CacheMode::kPaged, o);
  expect_agree(paged, generate(model, prompts(), CacheMode::kContiguous, o));
  expect_agree(generate(model, prompts(), CacheMode::kNone, o),
               generate(model, prompts(), CacheMode::kContiguous, o));
  // A page: 4 positions x 2 slots x 2 x 2 x 8 x 4 bytes = 1024.
  for (const GroupKVUsage& g : paged.stats.kv_groups) EXPECT_EQ(g.bytes, g.blocks * 1024);
}

TEST(GenerateHybrid, ErrorsNameTheValue) {
  LlamaModel model(random_weights(config_with_layers(3), 5));
  GenerateOptions o = options(layer_attention_from_pattern("SF", 2, 8, 0, 0));
  EXPECT_THAT([&] { (void)generate(model, prompts(), CacheMode::kPaged, o); },
              ThrowsMessage<Error>(HasSubstr("2 layer attention entries for a model of 3 layers")));
  o = options(layer_attention_from_pattern("SF", 3, 8, 0, 0));
  o.prefix_caching = true;
  EXPECT_THAT([&] { (void)generate(model, prompts(), CacheMode::kPaged, o); },
              ThrowsMessage<Error>(HasSubstr("no prefix caching")));
}

TEST(LayerPattern, RepeatsOverTheLayers) {
  const auto l = layer_attention_from_pattern("SSF", 7, 16, 2, 0);
  ASSERT_EQ(l.size(), 7u);
  const GroupAttention s = GroupAttention::kSlidingWindow;
  const GroupAttention f = GroupAttention::kFull;
  const std::vector<GroupAttention> want = {s, s, f, s, s, f, s};
  for (size_t i = 0; i < l.size(); ++i) {
    EXPECT_EQ(l[i].kind, want[i]) << i;
    EXPECT_EQ(l[i].window, want[i] == s ? 16 : 0) << i;
    EXPECT_EQ(l[i].sink_tokens, want[i] == s ? 2 : 0) << i;
    EXPECT_EQ(l[i].num_layers, 1);
  }
  const auto c = layer_attention_from_pattern("CCCF", 4, 0, 0, 8192);
  EXPECT_EQ(c[0].kind, GroupAttention::kChunkedLocal);
  EXPECT_EQ(c[0].chunk, 8192);
  EXPECT_EQ(c[3].kind, GroupAttention::kFull);
}

TEST(LayerPattern, ErrorsNameTheValue) {
  const auto err = [](std::string_view p, int32_t layers, int32_t w, int32_t sinks, int32_t ch) {
    try {
      (void)layer_attention_from_pattern(p, layers, w, sinks, ch);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(err("", 2, 0, 0, 0), HasSubstr("empty"));
  EXPECT_THAT(err("SXF", 2, 4, 0, 0), HasSubstr("letter 'X' at index 1"));
  // A UTF-8 letter (e acute, bytes C3 A9): its first byte by value, not a raw byte.
  EXPECT_THAT(err("S\xC3\xA9"
                  "F",
                  2, 4, 0, 0),
              HasSubstr("letter byte 0xC3 at index 1"));
  EXPECT_THAT(err("S F", 2, 4, 0, 0), HasSubstr("letter ' ' at index 1"));
  EXPECT_THAT(err("SF", 2, 0, 0, 0), HasSubstr("S layers need a window >= 1, got 0"));
  EXPECT_THAT(err("CF", 2, 0, 0, -1), HasSubstr("C layers need a chunk >= 1, got -1"));
  EXPECT_THAT(err("SF", 2, 4, -2, 0), HasSubstr("sink tokens must be >= 0, got -2"));
  EXPECT_THAT(err("FF", 2, 4, 0, 0), HasSubstr("window 4 / sinks 0 given but no S layer"));
  EXPECT_THAT(err("FF", 2, 0, 0, 4), HasSubstr("chunk 4 given but no C layer"));
  EXPECT_THAT(err("F", 0, 0, 0, 0), HasSubstr("the model has 0 layers"));
  EXPECT_THAT(err(std::string(kMaxLayerPatternLength + 1, 'F'), 2, 0, 0, 0),
              HasSubstr("4097 letters, more than 4096"));
}

}  // namespace
}  // namespace pagedkv::model
