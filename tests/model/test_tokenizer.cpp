// Tests for src/model/tokenizer.hpp: encode/decode against the llama2.c reference runtime's
// recorded ids and text, the built-in byte-level vocabulary, and bad tokenizer files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"
#include "shared_files.hpp"

namespace pagedkv::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
namespace t = ::pagedkv::model::testing;

const char* const kCases[] = {"p01_once_upon_a_time_n200", "p12_big_bear_n512"};

Tokenizer tok512() {
  return Tokenizer::load((t::shared_dir() / "models/tok512.bin").string(), 512);
}

TEST(Tokenizer, Tok512Layout) {
  PAGEDKV_REQUIRE_SHARED();
  const Tokenizer tok = tok512();
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(tok.piece(0), "<unk>");
  EXPECT_EQ(tok.piece(kBos), "\n<s>\n");
  EXPECT_EQ(tok.piece(kEos), "\n</s>\n");
  EXPECT_EQ(tok.piece(3), "<0x00>");
  EXPECT_EQ(tok.piece(258), "<0xFF>");
}

TEST(Tokenizer, EncodesReferencePromptsToTheRuntimesIds) {
  PAGEDKV_REQUIRE_SHARED();
  const Tokenizer tok = tok512();
  for (const char* name : kCases) {
    const auto ref =
        t::read_json(t::shared_dir() / "reference/llama2c" / (std::string(name) + ".json"));
    const auto expected = ref.at("prompt_token_ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tok.encode(ref.at("prompt").get<std::string>(), true, false), expected) << name;
  }
}

TEST(Tokenizer, RendersReferenceIdsToTheRuntimesStdout) {
  PAGEDKV_REQUIRE_SHARED();
  const Tokenizer tok = tok512();
  for (const char* name : kCases) {
    const auto dir = t::shared_dir() / "reference/llama2c";
    const auto ref = t::read_json(dir / (std::string(name) + ".json"));
    const auto ids = ref.at("sequence_ids").get<std::vector<TokenId>>();
    // The runtime prints a final newline after the generation.
    EXPECT_EQ(tok.render(ids) + "\n", t::read_file(dir / (std::string(name) + ".stdout"))) << name;
  }
}

// The reference runtime's encodings of 42 more texts (tests/data/tokenizer/README.md says which
// and how they were made), on the committed tokenizer: runs without ../shared.
TEST(Tokenizer, EncodesTheRuntimesEncodings) {
  const std::filesystem::path dir =
      std::filesystem::path(PAGEDKV_SOURCE_DIR) / "tests/data/tokenizer";
  const auto ref = t::read_json(dir / "llama2c_encodings.json");
  const Tokenizer tok = Tokenizer::load(
      (std::filesystem::path(PAGEDKV_SOURCE_DIR) / "models/tok512.bin").string(), 512);
  const auto& cases = ref.at("cases");
  ASSERT_EQ(cases.size(), 42u);
  for (const auto& c : cases) {
    const auto hex = c.at("text_hex").get<std::string>();
    std::string text;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    EXPECT_EQ(tok.encode(text, true, false), c.at("bos_ids").get<std::vector<TokenId>>())
        << "text bytes " << hex << " (" << c.at("text").get<std::string>() << ")";
  }
}

TEST(Tokenizer, ByteFallbackAndEosAndEmptyText) {
  PAGEDKV_REQUIRE_SHARED();
  const Tokenizer tok = tok512();
  // Empty text: BOS only, no dummy-prefix space.
  EXPECT_THAT(tok.encode("", true, false), ElementsAre(kBos));
  EXPECT_THAT(tok.encode("", true, true), ElementsAre(kBos, kEos));
  // "ü" (C3 BC) is not a piece of tok512: two byte tokens 0xC3 + 3, 0xBC + 3 after the space.
  const auto ids = tok.encode("\xC3\xBC", false, false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(tok.piece(ids[0]), " ");
  EXPECT_EQ(ids[1], 0xC3 + 3);
  EXPECT_EQ(ids[2], 0xBC + 3);
  EXPECT_EQ(tok.decode(ids[1], ids[2]), "\xBC");  // byte pieces decode to the byte itself
  EXPECT_EQ(tok.printable(ids[1], ids[2]), "");   // a lone high byte is not printed
  // "é" is a piece of its own (id 485): no fallback.
  EXPECT_EQ(tok.encode("\xC3\xA9", false, false).size(), 2u);
}

TEST(Tokenizer, DecodeStripsLeadingSpaceOnlyAfterBos) {
  PAGEDKV_REQUIRE_SHARED();
  const Tokenizer tok = tok512();
  const TokenId the = tok.encode("the", false, false).at(0);
  ASSERT_EQ(tok.piece(the), " the");
  EXPECT_EQ(tok.decode(kBos, the), "the");
  EXPECT_EQ(tok.decode(the, the), " the");
  EXPECT_EQ(tok.printable(the, 3 + '\n'), "\n");  // whitespace bytes print
  EXPECT_EQ(tok.printable(the, 3 + 0x07), "");    // control bytes do not
}

TEST(Tokenizer, BuiltinIsByteLevelAndRoundTripsAscii) {
  const Tokenizer tok = Tokenizer::builtin(1024);
  EXPECT_EQ(tok.vocab_size(), 1024);
  EXPECT_EQ(tok.piece(3 + 'A'), "<0x41>");
  const std::string text = "Once upon a time, 42 cats {sat} on a mat!";
  const auto ids = tok.encode(text, true, false);
  EXPECT_EQ(ids.front(), kBos);
  EXPECT_LT(ids.size(), text.size());  // pairs merged
  EXPECT_EQ(tok.render(ids), text);
  // Anything encodes: non-ASCII falls back to bytes.
  const auto utf8 = tok.encode("\xE2\x82\xAC", false, false);
  EXPECT_THAT(utf8, ElementsAre(tok.encode(" ", false, false).at(0), 3 + 0xE2, 3 + 0x82, 3 + 0xAC));
  EXPECT_THROW((void)Tokenizer::builtin(100), Error);
  EXPECT_THROW((void)tok.piece(1024), Error);
}

TEST(Tokenizer, MaxPieceBytesBoundsTheTokenCountFromBelow) {
  // The bound generate checks before encoding: 1 + ceil(bytes / max_piece_bytes) <= tokens.
  std::vector<Tokenizer> toks{Tokenizer::builtin(1024)};
  if (std::filesystem::exists(t::shared_dir() / "models/tok512.bin")) toks.push_back(tok512());
  std::mt19937 rng(5);
  for (const Tokenizer& tok : toks) {
    size_t longest = 0;
    for (TokenId id = 0; id < tok.vocab_size(); ++id)
      longest = std::max(longest, tok.piece(id).size());
    EXPECT_EQ(tok.max_piece_bytes(), static_cast<int32_t>(longest));
    const auto L = static_cast<size_t>(tok.max_piece_bytes());
    std::vector<std::string> texts{"", "a", "Once upon a time", std::string(300, 'e'),
                                   "\xE2\x82\xAC\xE2\x82\xAC the the the"};
    std::uniform_int_distribution<int> ch(32, 126);
    for (int i = 0; i < 20; ++i) {
      std::string x(static_cast<size_t>(1 + i * 13), ' ');
      for (char& c : x) c = static_cast<char>(ch(rng));
      texts.push_back(x);
    }
    for (const std::string& text : texts) {
      EXPECT_GE(tok.encode(text, true, false).size(), 1 + (text.size() + L - 1) / L) << text;
    }
  }
}

// ---- bad files -------------------------------------------------------------------------------

std::string i32(int32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string f32(float v) { return std::string(reinterpret_cast<const char*>(&v), 4); }
std::string token(float score, const std::string& piece) {
  return f32(score) + i32(static_cast<int32_t>(piece.size())) + piece;
}
/// A valid 3-token file: max_token_length 3, pieces "a", "bc", "def".
std::string three_tokens() { return i32(3) + token(0, "a") + token(-1, "bc") + token(-2, "def"); }

struct BadTokCase {
  const char* name;
  std::string bytes;
  const char* problem;
};

class BadTokenizer : public ::testing::TestWithParam<BadTokCase> {};

TEST_P(BadTokenizer, OneLineErrorNamingTheFileAndProblem) {
  const BadTokCase& c = GetParam();
  t::TempDir dir("bad_tok");
  const std::string path = dir.file(std::string(c.name) + ".bin");
  if (c.bytes != "<missing>") (void)t::write_file(path, c.bytes);
  try {
    (void)Tokenizer::load(path, 3);
    FAIL() << "no error for " << c.name;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_THAT(msg, HasSubstr("tokenizer file " + path + ": "));
    EXPECT_THAT(msg, HasSubstr(c.problem));
    EXPECT_THAT(msg, Not(HasSubstr("\n")));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Files, BadTokenizer,
    ::testing::Values(
        BadTokCase{"missing", "<missing>", "cannot open"},
        BadTokCase{"empty", "", "truncated: 0 bytes"},
        BadTokCase{"zero_max_len", i32(0) + token(0, "a"), "max_token_length 0"},
        BadTokCase{"truncated_piece", three_tokens().substr(0, three_tokens().size() - 1),
                   "ends inside the bytes of token 2"},
        BadTokCase{"too_few_tokens", i32(3) + token(0, "a"), "ends inside the score of token 1"},
        BadTokCase{"negative_length", i32(3) + f32(0) + i32(-5), "token 0 has length -5"},
        // A huge length must be refused before it is allocated.
        BadTokCase{"huge_length", i32(3) + f32(0) + i32(2000000000), "token 0 has length"},
        // A corrupt max_token_length lets a huge length pass that check: the bytes left decide.
        BadTokCase{"huge_max_and_length", i32(0x7FFFFFFF) + f32(0) + i32(0x7FFFFFFF),
                   "truncated: 12 bytes, ends inside the bytes of token 0"},
        BadTokCase{"too_many_tokens", three_tokens() + token(0, "x"),
                   "more tokens than the model's vocab_size 3"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Tokenizer, LoadsAValidSmallFile) {
  t::TempDir dir("tok_ok");
  const std::string path = dir.file("ok.bin");
  (void)t::write_file(path, three_tokens());
  const Tokenizer tok = Tokenizer::load(path, 3);
  EXPECT_EQ(tok.piece(2), "def");
  EXPECT_EQ(tok.score(1), -1.0f);
}

}  // namespace
}  // namespace pagedkv::model
