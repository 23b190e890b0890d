#pragma once
/// @file reference_attention.hpp
/// Ground truth, attention half: textbook attention in double with the full score matrix,
/// written for clarity, not speed. Every kernel is tested against it. Depends on nothing but the
/// vocabulary headers.

#include <cstdint>
#include <span>

#include "pagedkv/attention_params.hpp"

namespace pagedkv {

/// Textbook attention of one sequence: O = softmax(Q K^T * scale + mask) V, computed in double
/// with the full score matrix, then rounded to fp32.
/// Query token i sits at position num_kv_tokens - n_q + i; the mask is causal and honours
/// params.window_left / params.sink_tokens / params.chunk_size exactly as the kernels document.
/// Shapes: q, out [n_q, num_heads, head_dim]; k, v [num_kv_tokens, num_kv_heads, head_dim].
/// n_q = q.size() / (num_heads * head_dim). n_q == 0 is allowed (nothing to do).
/// Errors: throws pagedkv::Error on inconsistent sizes, a size < 1, n_q > num_kv_tokens,
/// num_kv_tokens < 0, num_heads not a multiple of num_kv_heads, window_left < -1,
/// sink_tokens < 0 or chunk_size < 0.
void reference_attention(const AttentionParams& params, std::span<const float> q,
                         std::span<const float> k, std::span<const float> v, int64_t num_kv_tokens,
                         std::span<float> out);

/// Textbook attention of ONE query over an explicit set of visible key positions (for token
/// eviction policies such as heavy hitters, whose kept set is not a window).
/// Shapes: q, out [num_heads, head_dim]; k, v [num_kv_tokens, num_kv_heads, head_dim];
/// positions: indices into k/v, any order, each < num_kv_tokens. Empty positions -> zeros.
/// Errors: throws pagedkv::Error on inconsistent sizes or params (as reference_attention), or a
/// position out of [0, num_kv_tokens).
void reference_attention_subset(const AttentionParams& params, std::span<const float> q,
                                std::span<const float> k, std::span<const float> v,
                                int64_t num_kv_tokens, std::span<const int64_t> positions,
                                std::span<float> out);

}  // namespace pagedkv
