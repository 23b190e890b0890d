#include "pagedkv/storage/kv_layer_view.hpp"

#include <cmath>

#include "core/check.hpp"

namespace pagedkv {

void check_attention_params(const AttentionParams& params, const KVLayerView& cache) {
  PAGEDKV_CHECK(params.num_heads >= 1, "attention: num_heads must be >= 1, got {}",
                params.num_heads);
  PAGEDKV_CHECK(params.num_kv_heads >= 1, "attention: num_kv_heads must be >= 1, got {}",
                params.num_kv_heads);
  PAGEDKV_CHECK(params.head_dim >= 1, "attention: head_dim must be >= 1, got {}", params.head_dim);
  PAGEDKV_CHECK(params.num_heads % params.num_kv_heads == 0,
                "attention: num_heads {} is not a multiple of num_kv_heads {}", params.num_heads,
                params.num_kv_heads);
  PAGEDKV_CHECK(params.num_kv_heads == cache.num_kv_heads,
                "attention: params.num_kv_heads {} != cache num_kv_heads {}", params.num_kv_heads,
                cache.num_kv_heads);
  PAGEDKV_CHECK(params.head_dim == cache.head_dim,
                "attention: params.head_dim {} != cache head_dim {}", params.head_dim,
                cache.head_dim);
  PAGEDKV_CHECK(params.window_left >= -1,
                "attention: window_left must be -1 (unbounded) or >= 0, got {}",
                params.window_left);
  PAGEDKV_CHECK(params.sink_tokens >= 0, "attention: sink_tokens must be >= 0, got {}",
                params.sink_tokens);
  PAGEDKV_CHECK(std::isfinite(params.scale), "attention: scale must be finite, got {}",
                params.scale);
  PAGEDKV_CHECK(cache.block_size >= 1, "attention: cache block_size must be >= 1, got {}",
                cache.block_size);
  PAGEDKV_CHECK(cache.num_blocks >= 1, "attention: cache num_blocks must be >= 1, got {}",
                cache.num_blocks);
  PAGEDKV_CHECK(cache.k != nullptr && cache.v != nullptr,
                "attention: cache view has a null K or V pool (k={}, v={})", cache.k, cache.v);
}

}  // namespace pagedkv
