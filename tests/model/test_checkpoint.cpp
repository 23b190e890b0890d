// Tests for src/model/checkpoint.hpp: the llama2.c checkpoint reader on the real file, a
// save/load round trip, and every kind of bad file giving a one-line error naming the file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>

#include "model/checkpoint.hpp"
#include "pagedkv/error.hpp"
#include "shared_files.hpp"

namespace pagedkv::model {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace t = ::pagedkv::model::testing;

TEST(Checkpoint, LoadsStories260K) {
  PAGEDKV_REQUIRE_SHARED();
  const LlamaWeights w = load_checkpoint((t::shared_dir() / "models/stories260K.bin").string());
  const LlamaConfig& c = w.config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.kv_dim(), 32);
  // SOURCES.md: 264,128 floats after the header, of which 2 x 2,048 legacy RoPE floats.
  EXPECT_EQ(weights_floats(c), 264128);
  EXPECT_EQ(c.num_parameters(), 264128 - 4096);
  EXPECT_EQ(w.wcls, w.token_embedding);
}

LlamaConfig small_config(bool shared) {
  LlamaConfig c;
  c.dim = 16;
  c.hidden_dim = 24;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.vocab_size = 300;
  c.seq_len = 32;
  c.shared_classifier = shared;
  return c;
}

TEST(Checkpoint, SaveLoadRoundTripSharedAndSeparateClassifier) {
  t::TempDir dir("ckpt_roundtrip");
  for (const bool shared : {true, false}) {
    const LlamaWeights w = random_weights(small_config(shared), 7);
    const std::string path = dir.file(shared ? "shared.bin" : "separate.bin");
    save_checkpoint(w, path);
    EXPECT_EQ(std::filesystem::file_size(path), 28 + 4 * weights_floats(w.config()));
    const LlamaWeights r = load_checkpoint(path);
    EXPECT_EQ(r.config().shared_classifier, shared);
    EXPECT_EQ(r.config().vocab_size, 300);
    const int64_t n = weights_floats(w.config());
    EXPECT_TRUE(std::equal(w.token_embedding, w.token_embedding + n, r.token_embedding));
    EXPECT_EQ(r.wcls == r.token_embedding, shared);
    if (!shared) EXPECT_EQ(r.wcls[0], w.wcls[0]);
  }
}

TEST(Checkpoint, RandomWeightsAreDeterministicPerSeed) {
  const LlamaWeights a = random_weights(small_config(true), 1);
  const LlamaWeights b = random_weights(small_config(true), 1);
  const LlamaWeights c = random_weights(small_config(true), 2);
  const int64_t n = weights_floats(a.config());
  EXPECT_TRUE(std::equal(a.token_embedding, a.token_embedding + n, b.token_embedding));
  EXPECT_FALSE(std::equal(a.token_embedding, a.token_embedding + n, c.token_embedding));
  EXPECT_EQ(a.rms_att[0], 1.0f);
}

TEST(Checkpoint, BuiltinConfigIsValidAndDocumented) {
  const LlamaConfig c = builtin_config();
  EXPECT_NO_THROW(validate_config(c, "built-in"));
  EXPECT_EQ(c.dim, 512);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_GE(c.n_layers, 4);
  EXPECT_LE(c.n_layers, 6);
}

// ---- bad files -------------------------------------------------------------------------------

std::string header(std::array<int32_t, 7> h) {
  return std::string(reinterpret_cast<const char*>(h.data()), sizeof h);
}

/// A file with header `h` followed by `floats` zero floats.
std::string with_floats(std::array<int32_t, 7> h, int64_t floats) {
  return header(h) + std::string(static_cast<size_t>(floats) * 4, '\0');
}

struct BadFileCase {
  const char* name;
  std::string bytes;    // file content; "<missing>" = do not create it
  const char* problem;  // substring the message must contain
};

std::vector<BadFileCase> bad_file_cases() {
  // small_config(true) as a header, and its exact float count.
  const std::array<int32_t, 7> good{16, 24, 2, 4, 2, 300, 32};
  const int64_t n = weights_floats(small_config(true));
  return {
      {"missing", "<missing>", "cannot open"},
      {"empty", "", "truncated: 0 bytes, shorter than the 28-byte header"},
      {"truncated_header", header(good).substr(0, 20), "truncated: 20 bytes"},
      {"truncated_weights", with_floats(good, n - 1), "truncated"},
      {"trailing_bytes", with_floats(good, n + 3), "length mismatch"},
      {"zero_dim", with_floats({0, 24, 2, 4, 2, 300, 32}, n), "dim is 0"},
      {"zero_layers", with_floats({16, 24, 0, 4, 2, 300, 32}, n), "n_layers is 0"},
      {"negative_hidden", with_floats({16, -24, 2, 4, 2, 300, 32}, n), "hidden_dim is -24"},
      {"zero_vocab", with_floats({16, 24, 2, 4, 2, 0, 32}, n), "vocab_size is 0"},
      {"zero_seq_len", with_floats({16, 24, 2, 4, 2, 300, 0}, n), "seq_len is 0"},
      {"heads_not_multiple_of_kv_heads", with_floats({16, 24, 2, 4, 3, 300, 32}, n),
       "n_heads 4 is not a multiple of n_kv_heads 3"},
      {"dim_not_multiple_of_heads", with_floats({18, 24, 2, 4, 2, 300, 32}, n),
       "dim 18 is not a multiple of n_heads 4"},
      // Dimensions whose weights would be ~10^19 bytes: rejected from the header alone, with no
      // allocation (a reader that trusted the header would die here).
      {"huge_dims", with_floats({1 << 30, 1 << 30, 1 << 30, 1 << 10, 1 << 10, 1 << 30, 1 << 30}, 4),
       "too large"},
      // Plausible but large: 4 GiB of weights claimed by a 100-byte file.
      {"large_dims_small_file", with_floats({4096, 11008, 32, 32, 32, 32000, 2048}, 18),
       "truncated"},
      {"text_file", "this is not a llama2.c checkpoint", "model file"},
  };
}

class BadCheckpoint : public ::testing::TestWithParam<BadFileCase> {};

TEST_P(BadCheckpoint, OneLineErrorNamingTheFileAndProblem) {
  const BadFileCase& c = GetParam();
  t::TempDir dir("bad_ckpt");
  const std::string path = dir.file(std::string(c.name) + ".bin");
  if (c.bytes != "<missing>") (void)t::write_file(path, c.bytes);
  try {
    (void)load_checkpoint(path);
    FAIL() << "no error for " << c.name;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_THAT(msg, HasSubstr("model file " + path + ": "));
    EXPECT_THAT(msg, HasSubstr(c.problem));
    EXPECT_THAT(msg, Not(HasSubstr("\n")));
  }
}

INSTANTIATE_TEST_SUITE_P(Files, BadCheckpoint, ::testing::ValuesIn(bad_file_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Checkpoint, DirectoryIsAnError) {
  t::TempDir dir("ckpt_dir");
  const std::string path = dir.file("");
  EXPECT_THAT([&] { (void)load_checkpoint(path); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is a directory")));
}

TEST(Checkpoint, ValidateConfigRejectsOddHeadSize) {
  LlamaConfig c = small_config(true);
  c.dim = 12;  // head_size 3
  EXPECT_THAT([&] { validate_config(c, "cfg"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("head_size dim / n_heads = 3 is odd")));
}

}  // namespace
}  // namespace pagedkv::model
