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
    ::testing::Values(Expected{"gpt2", 2 * 12 * 12 * 64 * 4, 1024, 0},             // 72 KiB
                      Expected{"llama-2-7b", 2 * 32 * 32 * 128 * 2, 4096, 0},      // 512 KiB
                      Expected{"llama-3-8b", 2 * 32 * 8 * 128 * 2, 8192, 0},       // 128 KiB
                      Expected{"llama-3.1-8b", 2 * 32 * 8 * 128 * 2, 131072, 0},   // 128 KiB
                      Expected{"llama-3.1-70b", 2 * 80 * 8 * 128 * 2, 131072, 0},  // 320 KiB
                      Expected{"mistral-7b", 2 * 32 * 8 * 128 * 2, 8192, 4096},    // 128 KiB
                      Expected{"qwen2.5-7b", 2 * 28 * 4 * 128 * 2, 32768, 0},      // 56 KiB
                      Expected{"builtin", 2 * 4 * 4 * 64 * 4, 512, 0},             // 8 KiB
                      Expected{"stories260k", 2 * 5 * 4 * 8 * 4, 512, 0}),         // 1.25 KiB
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
