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
  /// addition to the window or chunk. 0 = none. Only meaningful with a local mask
  /// (window_left >= 0 or chunk_size > 0).
  int32_t sink_tokens = 0;
  /// Chunked local attention (tokens; Llama 4's attention_chunk_size): a query at position p
  /// sees only the keys of its own chunk, floor(p / chunk_size) x chunk_size <= k <= p.
  /// 0 = none. With window_left as well, the later of the two left edges applies.
  int32_t chunk_size = 0;

  /// 1/sqrt(head_dim) unless scale was set.
  [[nodiscard]] float softmax_scale() const;
  /// First key position the query at `pos` sees outside the sinks (mask_first_visible).
  [[nodiscard]] int64_t first_visible(int64_t pos) const {
    return mask_first_visible(pos, window_left, chunk_size);
  }
  /// Whether the query at `pos` sees the key at `key` (causal, window, chunk, sinks).
  [[nodiscard]] bool visible(int64_t key, int64_t pos) const {
    const int64_t lo = first_visible(pos);
    return key <= pos &&
           (key >= lo || key < mask_sink_end(lo, window_left, chunk_size, sink_tokens));
  }

  /// The mask's rule, shared by the CPU kernels, the CUDA host code and the reference: the
  /// first position a query at `pos` sees outside the sinks, max(window edge, chunk edge):
  /// window edge max(0, pos - window_left + 1) (0 when window_left < 0), chunk edge
  /// floor(pos / chunk_size) x chunk_size (0 when chunk_size <= 0). Precondition: pos >= 0.
  [[nodiscard]] static constexpr int64_t mask_first_visible(int64_t pos, int32_t window_left,
                                                            int32_t chunk_size) {
    int64_t lo = 0;
    if (window_left >= 0) lo = pos - window_left + 1 > 0 ? pos - window_left + 1 : 0;
    if (chunk_size > 0) {
      const int64_t chunk_lo = pos / chunk_size * chunk_size;
      if (chunk_lo > lo) lo = chunk_lo;
    }
    return lo;
  }
  /// End of the always-visible sink range [0, end) of a query whose first visible position is
  /// `lo`: min(sink_tokens, lo) under a local mask, 0 under full attention.
  [[nodiscard]] static constexpr int64_t mask_sink_end(int64_t lo, int32_t window_left,
                                                       int32_t chunk_size, int32_t sink_tokens) {
    if (window_left < 0 && chunk_size <= 0) return 0;
    return sink_tokens < lo ? sink_tokens : lo;
  }
};

}  // namespace pagedkv
