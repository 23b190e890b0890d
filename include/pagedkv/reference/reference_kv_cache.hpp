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
  /// Errors: throws pagedkv::Error if any size is < 1.
  ReferenceKVCache(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim);

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

}  // namespace pagedkv
