#pragma once
/// @file reference.hpp
/// Ground truth: a contiguous per-sequence KV cache and textbook attention, written for clarity,
/// not speed. Every kernel is tested against these. Depends on nothing but the vocabulary types.

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "pagedkv/attention_params.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Contiguous KV cache: per sequence and layer, K and V as fp32 arrays
/// [num_tokens, num_kv_heads, head_dim] that grow as tokens are appended (no paging, no reuse).
/// Memory: bytes_in_use() counts exactly the stored tokens (DESIGN.md formula with fp32).
class ContiguousKVCache {
 public:
  /// Errors: throws pagedkv::Error if any size is < 1.
  ContiguousKVCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim);

  /// Errors: throws if `seq` exists.
  void add_sequence(SeqId seq);
  /// Errors: throws if `seq` is unknown.
  void free_sequence(SeqId seq);
  [[nodiscard]] bool has_sequence(SeqId seq) const { return seqs_.contains(seq); }

  /// Appends n tokens' K and V to one layer of a sequence.
  /// Shapes: k, v [n, num_kv_heads, head_dim]. Errors: throws on unknown seq, layer out of
  /// range, or sizes not a multiple of num_kv_heads * head_dim or different from each other.
  void append(SeqId seq, int32_t layer, std::span<const float> k, std::span<const float> v);

  /// Tokens stored in `layer` of `seq`. Errors: throws on unknown seq or layer.
  [[nodiscard]] int64_t num_tokens(SeqId seq, int32_t layer = 0) const;
  /// K (or V) of one layer: [num_tokens, num_kv_heads, head_dim]. Errors: as num_tokens.
  [[nodiscard]] std::span<const float> keys(SeqId seq, int32_t layer) const;
  [[nodiscard]] std::span<const float> values(SeqId seq, int32_t layer) const;

  /// Bytes holding stored tokens: sum over sequences and layers of 2 x T x H_kv x D x 4.
  [[nodiscard]] int64_t bytes_in_use() const;

  [[nodiscard]] int32_t num_layers() const { return num_layers_; }
  [[nodiscard]] int32_t num_kv_heads() const { return num_kv_heads_; }
  [[nodiscard]] int32_t head_dim() const { return head_dim_; }

 private:
  struct Layer {
    std::vector<float> k;
    std::vector<float> v;
  };
  const std::vector<Layer>& get(SeqId seq, int32_t layer) const;

  int32_t num_layers_;
  int32_t num_kv_heads_;
  int32_t head_dim_;
  std::map<SeqId, std::vector<Layer>> seqs_;
};

/// Textbook attention of one sequence: O = softmax(Q K^T * scale + mask) V, computed in double
/// with the full score matrix, then rounded to fp32.
/// Query token i sits at position num_kv_tokens - n_q + i; the mask is causal and honours
/// params.window_left / params.sink_tokens exactly as the kernels document.
/// Shapes: q, out [n_q, num_heads, head_dim]; k, v [num_kv_tokens, num_kv_heads, head_dim].
/// n_q = q.size() / (num_heads * head_dim). n_q == 0 is allowed (nothing to do).
/// Errors: throws pagedkv::Error on inconsistent sizes, n_q > num_kv_tokens, or
/// num_heads % num_kv_heads != 0.
void reference_attention(const AttentionParams& params, std::span<const float> q,
                         std::span<const float> k, std::span<const float> v, int64_t num_kv_tokens,
                         std::span<float> out);

/// Textbook attention of ONE query over an explicit set of visible key positions (for token
/// eviction policies such as heavy hitters, whose kept set is not a window).
/// Shapes: q, out [num_heads, head_dim]; k, v [num_kv_tokens, num_kv_heads, head_dim];
/// positions: indices into k/v, any order, each < num_kv_tokens. Empty positions -> zeros.
/// Errors: throws on inconsistent sizes or a position out of range.
void reference_attention_subset(const AttentionParams& params, std::span<const float> q,
                                std::span<const float> k, std::span<const float> v,
                                int64_t num_kv_tokens, std::span<const int64_t> positions,
                                std::span<float> out);

}  // namespace pagedkv
