#pragma once
/// @file attention_params.hpp
/// Attention geometry and masking: the vocabulary that the metadata layer (eviction policies
/// set the mask), the kernels (CPU and CUDA) and the reference attention share.

#include <cstdint>

namespace pagedkv {

/// Attention geometry and masking.
struct AttentionParams {
  int32_t num_heads = 1;     ///< query heads; a multiple of num_kv_heads (GQA group = ratio)
  int32_t num_kv_heads = 1;  ///< must equal the cache view's num_kv_heads
  int32_t head_dim = 64;     ///< must equal the cache view's head_dim
  float scale = 0.0f;        ///< softmax scale; 0 means 1/sqrt(head_dim)
  /// Sliding window (tokens): a query at position p sees keys at positions k with
  /// p - window_left < k <= p: the last window_left positions, itself included.
  /// -1 = unbounded (full causal attention).
  int32_t window_left = -1;
  /// Attention sinks (StreamingLLM): keys at positions < sink_tokens are always visible, in
  /// addition to the window. 0 = none. Only meaningful with window_left >= 0.
  int32_t sink_tokens = 0;

  /// 1/sqrt(head_dim) unless scale was set.
  [[nodiscard]] float softmax_scale() const;
};

}  // namespace pagedkv
