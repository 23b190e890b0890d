#pragma once
/// @file tokenizer.hpp
/// SentencePiece-style BPE tokenizer in the llama2.c format, encode/decode compatible with the
/// llama2.c runtime (source: karpathy/llama2.c run.c, encode / decode / safe_printf).
///
/// File format: int32 max_token_length, then per token (vocab_size of them, the count comes
/// from the model): float32 score, int32 byte length, the bytes (no terminator).
/// Conventions: id 0 <unk>, id 1 BOS, id 2 EOS; byte-fallback pieces are spelled "<0xXX>".

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pagedkv/types.hpp"

namespace pagedkv::model {

/// Beginning-of-sequence token id; the runtime also stops generating when it samples it.
inline constexpr TokenId kBos = 1;
/// End-of-sequence token id.
inline constexpr TokenId kEos = 2;

class Tokenizer {
 public:
  /// Reads a tokenizer file with exactly `vocab_size` tokens.
  /// Errors: throws pagedkv::Error "tokenizer file <path>: <problem>" (one line) when the file
  /// is missing, truncated (a score/length/piece runs past the end), has a negative or
  /// oversized piece length or max_token_length < 1, or holds bytes after the last token (the
  /// tokenizer then does not match the model's vocab_size). vocab_size < 1 throws too.
  [[nodiscard]] static Tokenizer load(const std::string& path, int32_t vocab_size);

  /// The random model's byte-level tokenizer with `vocab_size` (>= 259) tokens:
  /// 0 <unk>, 1 BOS, 2 EOS, 3..258 the bytes <0x00>..<0xFF>, then the 95 printable ASCII
  /// characters, then " a".." z", then lowercase letter pairs "aa", "ab", ... until vocab_size
  /// (later pieces score lower). Any text encodes (byte fallback); ASCII text mostly into
  /// letter pairs. Errors: throws pagedkv::Error if vocab_size < 259 or > 259 + 95 + 26 + 676.
  [[nodiscard]] static Tokenizer builtin(int32_t vocab_size);

  /// Encodes UTF-8 text: optional BOS, a leading " " piece when text is non-empty (the
  /// add_dummy_prefix convention), each UTF-8 character as its piece or else byte-fallback
  /// pieces, then repeated merging of the adjacent pair whose merged piece has the best score
  /// (leftmost on ties), optional EOS. Complexity O(n^2) in the text length.
  [[nodiscard]] std::vector<TokenId> encode(std::string_view text, bool bos, bool eos) const;

  /// The bytes token `token` stands for when it follows `prev`: the piece, without its leading
  /// space right after BOS, and "<0xXX>" pieces as the single byte.
  /// Errors: throws pagedkv::Error if token is out of range.
  [[nodiscard]] std::string decode(TokenId prev, TokenId token) const;

  /// What the reference runtime prints for decode(prev, token): single-byte pieces that are
  /// neither printable nor whitespace (control codes) print as nothing.
  [[nodiscard]] std::string printable(TokenId prev, TokenId token) const;

  /// Text of a token sequence as the runtime prints it: printable(ids[i-1], ids[i]) for
  /// i >= 1 (ids[0] is the BOS that starts it, which prints nothing).
  [[nodiscard]] std::string render(const std::vector<TokenId>& ids) const;

  [[nodiscard]] int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  /// Characters of the longest piece (>= 1; a "<0xXX>" piece counts its 6): no token of
  /// encode() covers more bytes of the text, so encode(text, bos=true) gives at least
  /// 1 + ceil(text.size() / max_piece_bytes()) tokens, a bound a caller can check before the
  /// O(n^2) encode.
  [[nodiscard]] int32_t max_piece_bytes() const { return max_piece_bytes_; }
  [[nodiscard]] const std::string& piece(TokenId id) const;
  [[nodiscard]] float score(TokenId id) const;

 private:
  Tokenizer(std::vector<std::string> pieces, std::vector<float> scores);
  /// Id of an exact piece, or -1. With duplicate pieces the lowest id wins.
  [[nodiscard]] TokenId lookup(std::string_view piece) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, TokenId> ids_;
  std::vector<TokenId> byte_ids_;    ///< [256]: the id of "<0xXX>", or -1 when absent
  std::vector<int16_t> byte_value_;  ///< per id: the byte a "<0xXX>" piece stands for, else -1
  int32_t max_piece_bytes_ = 1;      ///< see max_piece_bytes()
};

}  // namespace pagedkv::model
