// Tests for src/sim/model_preset.hpp and units.hpp: the published architecture numbers give
// the KV bytes per token the formula predicts, lookup and overrides, byte-size parsing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pagedkv/error.hpp"
#include "sim/model_preset.hpp"
#include "sim/units.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::HasSubstr;

struct Expected {
  const char* name;
  int64_t bytes_per_token;  // 2 x L x H_kv x D x sizeof(dtype), worked out by hand
  int64_t max_context;
  int64_t window;
};

class Presets : public ::testing::TestWithParam<Expected> {};

TEST_P(Presets, BytesPerTokenMatchTheFormula) {
  const Expected& e = GetParam();
  const ModelPreset& p = find_preset(e.name);
  EXPECT_EQ(kv_bytes_per_token(p), e.bytes_per_token);
  EXPECT_EQ(p.max_context, e.max_context);
  EXPECT_EQ(p.sliding_window, e.window);
  EXPECT_FALSE(p.source.empty());
  validate(p);
}

INSTANTIATE_TEST_SUITE_P(
    Published, Presets,
    ::testing::Values(Expected{"gpt2", 2 * 12 * 12 * 64 * 4, 1024, 0},               // 72 KiB
                      Expected{"llama-2-7b", 2 * 32 * 32 * 128 * 2, 4096, 0},        // 512 KiB
                      Expected{"llama-3-8b", 2 * 32 * 8 * 128 * 2, 8192, 0},         // 128 KiB
                      Expected{"llama-3.1-8b", 2 * 32 * 8 * 128 * 2, 131072, 0},     // 128 KiB
                      Expected{"llama-3.1-70b", 2 * 80 * 8 * 128 * 2, 131072, 0},    // 320 KiB
                      Expected{"mistral-7b", 2 * 32 * 8 * 128 * 2, 8192, 4096},      // 128 KiB
                      Expected{"qwen2.5-7b", 2 * 28 * 4 * 128 * 2, 32768, 0},        // 56 KiB
                      Expected{"gemma-3-27b", 2 * 62 * 16 * 128 * 2, 131072, 1024},  // 496 KiB
                      Expected{"gpt-oss-20b", 2 * 24 * 8 * 64 * 2, 131072, 128},     // 48 KiB
                      Expected{"gpt-oss-120b", 2 * 36 * 8 * 64 * 2, 131072, 128},    // 72 KiB
                      Expected{"llama-4-scout", 2 * 48 * 8 * 128 * 2, 10485760, 0},  // 192 KiB
                      Expected{"builtin", 2 * 4 * 4 * 64 * 4, 512, 0},               // 8 KiB
                      Expected{"stories260k", 2 * 5 * 4 * 8 * 4, 512, 0}),           // 1.25 KiB
    [](const ::testing::TestParamInfo<Expected>& info) {
      std::string n = info.param.name;
      for (char& c : n) {
        if (c == '-' || c == '.') c = '_';
      }
      return n;
    });

TEST(Presets, LookupIsCaseAndSeparatorInsensitive) {
  EXPECT_EQ(find_preset("Llama_3_8B").name, "llama-3-8b");
  EXPECT_EQ(find_preset("STORIES260K").num_layers, 5);
  EXPECT_THAT([] { (void)find_preset("llama-4"); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("unknown model preset 'llama-4' (known: gpt2, llama-2-7b")));
}

TEST(Presets, SlidingWindowCapsCachedPositions) {
  const ModelPreset& m = find_preset("mistral-7b");
  EXPECT_EQ(cached_positions(m, 1000), 1000);
  EXPECT_EQ(cached_positions(m, 8000), 4096);
  EXPECT_EQ(cached_positions(find_preset("llama-3-8b"), 8000), 8000);
}

TEST(Presets, HybridLayerPatternsFollowThePublishedConfigs) {
  // Gemma 3: layer i global when (i + 1) mod 6 == 0 -> 10 of 62 global.
  int32_t gemma_global = 0;
  for (int32_t i = 0; i < 62; ++i) gemma_global += (i + 1) % 6 == 0;
  EXPECT_EQ(find_preset("gemma-3-27b").num_local_layers, 62 - gemma_global);
  EXPECT_EQ(find_preset("gpt-oss-20b").num_local_layers, 24 / 2);  // alternating
  EXPECT_EQ(find_preset("gpt-oss-120b").num_local_layers, 36 / 2);
  const ModelPreset& scout = find_preset("llama-4-scout");
  EXPECT_EQ(scout.num_local_layers, 48 - 48 / 4);  // every 4th layer global
  EXPECT_EQ(scout.attention_chunk, 8192);
  EXPECT_EQ(find_preset("mistral-7b").num_local_layers, 32);  // every layer windowed
  EXPECT_EQ(find_preset("llama-3-8b").num_local_layers, 0);
}

// Hand-worked, window W = 8 and block size 4: at T tokens the query at T - 1 sees positions
// [T - 8, T); the blocks held are those covering them.
TEST(Presets, WindowBlocksReleasedAtExactBoundaries) {
  ModelPreset m = find_preset("builtin");
  m.sliding_window = 8;
  m.num_local_layers = 4;
  validate(m);
  // T:                     8  9 10 11 12 13 14 15 16 17 18 19 20
  const int64_t held[] = {2, 3, 3, 3, 2, 3, 3, 3, 2, 3, 3, 3, 2};
  for (int64_t t = 8; t <= 20; ++t) {
    EXPECT_EQ(local_blocks_held(m, t, 4), held[t - 8]) << "T = " << t;
    EXPECT_EQ(cached_positions(m, t), 8) << "T = " << t;
  }
  // T = 12: positions 4..11 in blocks 1 and 2; block 0 (positions 0..3) is released.
  EXPECT_EQ(local_blocks_held(m, 3, 4), 1);
  EXPECT_EQ(local_blocks_held(m, 0, 4), 0);
}

// Hand-worked, chunk C = 8 and block size 4: the query at T - 1 sees [8 floor((T - 1) / 8), T),
// so the blocks of a chunk go once the next chunk starts.
TEST(Presets, ChunkBlocksReleasedWhenTheNextChunkStarts) {
  ModelPreset m = find_preset("builtin");
  m.attention_chunk = 8;
  m.num_local_layers = 2;
  validate(m);
  // T:                       8  9 10 11 12 13 14 15 16 17 18 19 20
  const int64_t kept[] = {8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4};
  const int64_t held[] = {2, 1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1};
  for (int64_t t = 8; t <= 20; ++t) {
    EXPECT_EQ(cached_positions(m, t), kept[t - 8]) << "T = " << t;
    EXPECT_EQ(local_blocks_held(m, t, 4), held[t - 8]) << "T = " << t;
  }
  EXPECT_EQ(cached_positions(m, 0), 0);
}

TEST(Presets, Gemma3At32kKeepsAboutAFifthOfTheAllFullBytes) {
  const ModelPreset& g = find_preset("gemma-3-27b");
  constexpr int64_t kPerLayer = 2 * 16 * 128 * 2;  // K and V, 16 kv heads, D 128, bf16
  constexpr int64_t kT = 32768;
  const int64_t expected = 10 * kT * kPerLayer + 52 * 1024 * kPerLayer;
  EXPECT_EQ(hybrid_kv_bytes(g, kT), expected);
  EXPECT_EQ(hybrid_paged_bytes(g, kT, 16), expected);  // both block-aligned
  EXPECT_EQ(kv_bytes_per_token(g) * kT, 62 * kT * kPerLayer);
  // One token past a block: the full group takes a new block, the window group keeps
  // ceil(32769 / 16) - floor((32769 - 1024) / 16) = 2049 - 1984 = 65 blocks.
  EXPECT_EQ(hybrid_paged_bytes(g, kT + 1, 16),
            10 * 2049 * 16 * kPerLayer + 52 * 65 * 16 * kPerLayer);
}

TEST(Presets, InvalidLayerPatternsAreNamed) {
  ModelPreset m = find_preset("builtin");
  m.sliding_window = 8;
  EXPECT_THAT([&] { validate(m); },
              ::testing::ThrowsMessage<Error>(HasSubstr("local layers must be in [1, 4]")));
  m.num_local_layers = 5;
  EXPECT_THAT([&] { validate(m); }, ::testing::ThrowsMessage<Error>(HasSubstr("got 5")));
  m.num_local_layers = 2;
  m.attention_chunk = 4;
  EXPECT_THAT([&] { validate(m); },
              ::testing::ThrowsMessage<Error>(HasSubstr("cannot both be set")));
  ModelPreset full = find_preset("builtin");
  full.num_local_layers = 1;
  EXPECT_THAT([&] { validate(full); },
              ::testing::ThrowsMessage<Error>(HasSubstr("no window or chunk is set")));
}

TEST(Presets, WindowOverrideMakesEveryLayerLocalUnlessTold) {
  ModelOverrides o;
  o.sliding_window = 1024;
  EXPECT_EQ(apply_overrides(find_preset("llama-3-8b"), o).num_local_layers, 32);
  o.num_local_layers = 24;
  const ModelPreset p = apply_overrides(find_preset("llama-3-8b"), o);
  EXPECT_EQ(p.num_local_layers, 24);
  EXPECT_EQ(p.name, "custom");
  ModelOverrides off;
  off.sliding_window = 0;
  EXPECT_EQ(apply_overrides(find_preset("gemma-3-27b"), off).num_local_layers, 0);
}

TEST(Presets, OverridesMakeACustomModel) {
  ModelOverrides o;
  o.num_layers = 2;
  o.num_kv_heads = 1;
  o.head_dim = 4;
  o.dtype = DType::kF32;
  const ModelPreset p = apply_overrides(find_preset("llama-3-8b"), o);
  EXPECT_EQ(p.name, "custom");
  EXPECT_EQ(kv_bytes_per_token(p), 2 * 2 * 1 * 4 * 4);
  EXPECT_THAT(p.source, HasSubstr("overridden: layers 2, kv heads 1, head_dim 4, dtype fp32"));
  // A context change alone keeps the model's name.
  ModelOverrides ctx;
  ctx.max_context = 131072;
  EXPECT_EQ(apply_overrides(find_preset("qwen2.5-7b"), ctx).name, "qwen2.5-7b");
  ModelOverrides bad;
  bad.head_dim = 0;
  EXPECT_THAT([&] { (void)apply_overrides(find_preset("gpt2"), bad); },
              ::testing::ThrowsMessage<Error>(HasSubstr("head_dim must be >= 1, got 0")));
}

TEST(Units, ParseBytes) {
  EXPECT_EQ(parse_bytes("40GiB"), int64_t{40} << 30);
  EXPECT_EQ(parse_bytes("40 gib"), int64_t{40} << 30);
  EXPECT_EQ(parse_bytes("1.5G"), int64_t{3} << 29);
  EXPECT_EQ(parse_bytes("80GB"), 80'000'000'000);
  EXPECT_EQ(parse_bytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_bytes("4096"), 4096);
  EXPECT_EQ(parse_bytes("10B"), 10);
  for (const char* bad : {"", "GiB", "-1GiB", "40XB", "1e3", "99999999TiB"}) {
    EXPECT_THROW((void)parse_bytes(bad), Error) << bad;
  }
  EXPECT_THAT([] { (void)parse_bytes("40XB"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown unit 'XB'")));
}

TEST(Units, FormatBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(static_cast<double>(int64_t{40} << 30)), "40.00 GiB");
}

}  // namespace
}  // namespace pagedkv::sim
