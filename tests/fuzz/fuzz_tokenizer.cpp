// libFuzzer target: the llama2.c tokenizer reader (src/model/tokenizer.hpp). Input: 2 bytes of
// vocab_size, 1 byte of text length, that many bytes of text to encode, then the tokenizer
// file. The reader may only throw pagedkv::Error, with one line naming the file; a tokenizer it
// accepts must encode any text (byte fallback) into in-range ids and decode every id.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagedkv;
  static fuzz::ScratchFile file("tokenizer");
  fuzz::ByteReader in(data, size);
  // vocab_size in [-1, 1022]: 0 and -1 must be rejected cleanly.
  const int32_t vocab = static_cast<int32_t>(in.below(1024)) - 1;
  std::string text;
  for (uint32_t n = in.below(64); n > 0 && !in.empty(); --n)
    text.push_back(static_cast<char>(in.byte()));
  const std::string& path = file.write(in.rest());
  std::optional<model::Tokenizer> tok;
  try {
    tok.emplace(model::Tokenizer::load(path, vocab));
  } catch (const Error& e) {
    const std::string msg = e.what();
    PAGEDKV_FUZZ_CHECK(msg.find('\n') == std::string::npos, "multi-line message: %s", msg.c_str());
    PAGEDKV_FUZZ_CHECK(msg.find(path) != std::string::npos || vocab < 1,
                       "message does not name the file: %s", msg.c_str());
    return 0;
  }
  PAGEDKV_FUZZ_CHECK(tok->vocab_size() == vocab, "vocab %d, asked %d", tok->vocab_size(), vocab);
  for (const std::string& t : {text, std::string("Once upon a time"), std::string()}) {
    for (const bool bos : {false, true}) {
      const std::vector<TokenId> ids = tok->encode(t, bos, !bos);
      // BOS (1) and EOS (2) included: load() rejects vocabularies too small to hold them.
      for (TokenId id : ids) {
        PAGEDKV_FUZZ_CHECK(id >= 0 && id < vocab, "encode gave id %d of %d", id, vocab);
      }
      if (bos && !ids.empty()) (void)tok->render(ids);
    }
  }
  for (TokenId id = 0; id < vocab; ++id) {
    (void)tok->decode(1, id);
    (void)tok->printable(id, id);
  }
  return 0;
}
