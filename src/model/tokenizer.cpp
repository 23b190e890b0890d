#include "model/tokenizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "pagedkv/error.hpp"

namespace pagedkv::model {

namespace {

[[noreturn]] void fail_file(const std::string& path, const std::string& problem) {
  throw Error(fmt::format("tokenizer file {}: {}", path, problem));
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/// The byte a "<0xXX>" piece stands for, or -1.
int parse_byte_piece(const std::string& p) {
  if (p.size() != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
  const int hi = hex_digit(p[3]);
  const int lo = hex_digit(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Tokenizer::Tokenizer(std::vector<std::string> pieces, std::vector<float> scores)
    : pieces_(std::move(pieces)),
      scores_(std::move(scores)),
      byte_ids_(256, -1),
      byte_value_(pieces_.size(), -1) {
  ids_.reserve(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    ids_.try_emplace(pieces_[i], id);  // keeps the lowest id of duplicates
    max_piece_bytes_ = std::max(max_piece_bytes_, static_cast<int32_t>(pieces_[i].size()));
    const int b = parse_byte_piece(pieces_[i]);
    if (b >= 0) {
      byte_value_[i] = static_cast<int16_t>(b);
      if (byte_ids_[static_cast<size_t>(b)] < 0) byte_ids_[static_cast<size_t>(b)] = id;
    }
  }
}

Tokenizer Tokenizer::load(const std::string& path, int32_t vocab_size) {
  // Ids 0 (<unk>), 1 (BOS) and 2 (EOS) are fixed by the llama2.c format: encode always emits BOS.
  if (vocab_size < 3) {
    fail_file(path,
              fmt::format("vocab_size {} must be >= 3 (ids 0 <unk>, 1 BOS, 2 EOS)", vocab_size));
  }
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail_file(path, "is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_file(path, fmt::format("cannot open ({})", std::strerror(errno)));
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (ec) fail_file(path, fmt::format("cannot read its size ({})", ec.message()));

  int64_t at = 0;
  auto read = [&](void* dst, int64_t n, const char* what, int32_t index) {
    if (file_bytes - at < n) {
      fail_file(path, fmt::format("truncated: {} bytes, ends inside the {} of token {} of {}",
                                  file_bytes, what, index, vocab_size));
    }
    in.read(static_cast<char*>(dst), n);
    if (!in) fail_file(path, "read error");
    at += n;
  };
  int32_t max_len = 0;
  read(&max_len, 4, "max_token_length header", -1);
  if (max_len < 1) fail_file(path, fmt::format("max_token_length {} must be >= 1", max_len));

  std::vector<std::string> pieces(static_cast<size_t>(vocab_size));
  std::vector<float> scores(static_cast<size_t>(vocab_size));
  for (int32_t i = 0; i < vocab_size; ++i) {
    read(&scores[static_cast<size_t>(i)], 4, "score", i);
    int32_t len = 0;
    read(&len, 4, "length", i);
    // Checked before allocating: a corrupt length must not become a huge allocation.
    if (len < 0 || len > max_len) {
      fail_file(path, fmt::format("token {} has length {}, outside [0, max_token_length {}]", i,
                                  len, max_len));
    }
    // And against the bytes left: max_token_length itself may be corrupt (2^31 - 1).
    if (file_bytes - at < len) {
      fail_file(path, fmt::format("truncated: {} bytes, ends inside the bytes of token {} of {} "
                                  "(length {})",
                                  file_bytes, i, vocab_size, len));
    }
    auto& p = pieces[static_cast<size_t>(i)];
    p.resize(static_cast<size_t>(len));
    read(p.data(), len, "bytes", i);
  }
  if (at != file_bytes) {
    fail_file(path, fmt::format("{} bytes after token {}: the file holds more tokens than the "
                                "model's vocab_size {}",
                                file_bytes - at, vocab_size - 1, vocab_size));
  }
  return Tokenizer(std::move(pieces), std::move(scores));
}

Tokenizer Tokenizer::builtin(int32_t vocab_size) {
  constexpr int32_t kBase = 3 + 256;
  constexpr int32_t kMax = kBase + 95 + 26 + 26 * 26;
  if (vocab_size < kBase || vocab_size > kMax) {
    throw Error(
        fmt::format("built-in tokenizer: vocab_size {} outside [{}, {}]", vocab_size, kBase, kMax));
  }
  std::vector<std::string> pieces{"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
  for (char c = 0x20; c < 0x7F; ++c) pieces.emplace_back(1, c);
  for (char c = 'a'; c <= 'z'; ++c) pieces.push_back(std::string(" ") + c);
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b = 'a'; b <= 'z'; ++b) pieces.push_back(std::string{a, b});
  }
  pieces.resize(static_cast<size_t>(vocab_size));
  std::vector<float> scores(pieces.size(), 0.0f);
  for (size_t i = kBase; i < pieces.size(); ++i) scores[i] = -static_cast<float>(i - kBase);
  return Tokenizer(std::move(pieces), std::move(scores));
}

TokenId Tokenizer::lookup(std::string_view piece) const {
  const auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

const std::string& Tokenizer::piece(TokenId id) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error(fmt::format("tokenizer: token id {} outside [0, {})", id, vocab_size()));
  }
  return pieces_[static_cast<size_t>(id)];
}

float Tokenizer::score(TokenId id) const {
  (void)piece(id);
  return scores_[static_cast<size_t>(id)];
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool bos, bool eos) const {
  std::vector<TokenId> tokens;
  tokens.reserve(text.size() + 3);
  if (bos) tokens.push_back(kBos);

  auto push_bytes = [&](std::string_view bytes) {
    for (const char c : bytes) {
      const TokenId id = byte_ids_[static_cast<unsigned char>(c)];
      tokens.push_back(id >= 0 ? id : 0);  // no byte piece at all: <unk>
    }
  };
  auto push_piece = [&](std::string_view p) {
    const TokenId id = lookup(p);
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      push_bytes(p);
    }
  };

  if (!text.empty()) push_piece(" ");

  // One UTF-8 character at a time (a lead byte plus up to 3 continuation bytes), exactly as the
  // runtime groups them, so stray continuation bytes fall back to bytes the same way.
  size_t i = 0;
  while (i < text.size()) {
    size_t len = 1;
    while (i + len < text.size() && (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80 &&
           len < 4) {
      ++len;
    }
    push_piece(text.substr(i, len));
    i += len;
  }

  // Greedy BPE: merge the adjacent pair whose concatenation is the best-scoring piece.
  std::string merged;
  while (tokens.size() >= 2) {
    float best_score = -1e10f;
    TokenId best_id = -1;
    size_t best_idx = 0;
    for (size_t j = 0; j + 1 < tokens.size(); ++j) {
      merged = pieces_[static_cast<size_t>(tokens[j])];
      merged += pieces_[static_cast<size_t>(tokens[j + 1])];
      const TokenId id = lookup(merged);
      if (id >= 0 && scores_[static_cast<size_t>(id)] > best_score) {
        best_score = scores_[static_cast<size_t>(id)];
        best_id = id;
        best_idx = j;
      }
    }
    if (best_id < 0) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }

  if (eos) tokens.push_back(kEos);
  return tokens;
}

std::string Tokenizer::decode(TokenId prev, TokenId token) const {
  const std::string& p = piece(token);
  const int16_t b = byte_value_[static_cast<size_t>(token)];
  if (b >= 0) return std::string(1, static_cast<char>(b));
  // SentencePiece strips the leading space of the first piece after BOS (llama2.c PR #89).
  if (prev == kBos && !p.empty() && p[0] == ' ') return p.substr(1);
  return p;
}

std::string Tokenizer::printable(TokenId prev, TokenId token) const {
  std::string s = decode(prev, token);
  if (s.size() == 1) {
    const auto c = static_cast<unsigned char>(s[0]);
    // The runtime runs in the "C" locale: bytes >= 0x80 are neither printable nor space.
    const bool ok = c < 0x80 && (std::isprint(c) || std::isspace(c));
    if (!ok) return {};
  }
  return s;
}

std::string Tokenizer::render(const std::vector<TokenId>& ids) const {
  std::string out;
  for (size_t i = 1; i < ids.size(); ++i) out += printable(ids[i - 1], ids[i]);
  return out;
}

}  // namespace pagedkv::model
