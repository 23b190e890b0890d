#pragma once
/// @file reference_kv_cache.hpp
/// Ground truth, storage half: a contiguous per-sequence KV cache in fp32, written for clarity,
/// not speed (the test oracle every paged cache is compared with). Depends on nothing but the
/// vocabulary headers.

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "pagedkv/types.hpp"

namespace pagedkv {

/// Reference KV cache (the test oracle), contiguous per sequence and layer, K and V as fp32 arrays
/// [num_tokens, num_kv_heads, head_dim] that grow as tokens are appended (no paging, no reuse).
/// Memory: bytes_in_use() counts exactly the stored tokens (DESIGN.md formula with fp32).
class ReferenceKVCache {
 public:
  /// An empty cache (no sequence) of the given geometry.
  /// Errors: throws pagedkv::Error if any size is < 1 (naming it).
  ReferenceKVCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim);

  /// Adds sequence `seq` with 0 tokens in every layer.
  /// Errors: throws pagedkv::Error if `seq` exists.
  void add_sequence(SeqId seq);
  /// Removes `seq` and its K/V. Errors: throws pagedkv::Error if `seq` is unknown.
  void free_sequence(SeqId seq);
  /// True if add_sequence(seq) was called and free_sequence(seq) was not since.
  [[nodiscard]] bool has_sequence(SeqId seq) const { return seqs_.contains(seq); }

  /// Appends n tokens' K and V (fp32, stored as given) to one layer of a sequence; layers grow
  /// independently. n == 0 is allowed.
  /// Shapes: k, v [n, num_kv_heads, head_dim]. Errors: throws pagedkv::Error on an unknown
  /// seq, a layer out of range, or sizes not a multiple of num_kv_heads * head_dim or
  /// different from each other (nothing is appended).
  void append(SeqId seq, int32_t layer, std::span<const float> k, std::span<const float> v);

  /// Tokens stored in `layer` of `seq`. Errors: throws pagedkv::Error on an unknown seq or a
  /// layer out of range.
  [[nodiscard]] int64_t num_tokens(SeqId seq, int32_t layer = 0) const;
  /// K of one layer of `seq`, in append order, the input of reference_attention.
  /// Shapes: [num_tokens(seq, layer), num_kv_heads, head_dim] fp32. The span is valid until
  /// the next append to that layer or free_sequence(seq). Errors: as num_tokens.
  [[nodiscard]] std::span<const float> keys(SeqId seq, int32_t layer) const;
  /// V of one layer of `seq`; shapes, lifetime and errors as keys().
  [[nodiscard]] std::span<const float> values(SeqId seq, int32_t layer) const;

  /// Bytes holding stored tokens: sum over sequences and layers of 2 x T x H_kv x D x 4.
  [[nodiscard]] int64_t bytes_in_use() const;

  /// Layers, as constructed.
  [[nodiscard]] int32_t num_layers() const { return num_layers_; }
  /// K/V heads per token, as constructed.
  [[nodiscard]] int32_t num_kv_heads() const { return num_kv_heads_; }
  /// Elements per head vector, as constructed.
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

}  // namespace pagedkv
