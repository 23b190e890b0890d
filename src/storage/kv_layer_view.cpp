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
  if (dtype_is_quantized(cache.dtype)) {
    PAGEDKV_CHECK(cache.k_scale != nullptr && cache.v_scale != nullptr,
                  "attention: a {} cache needs k_scale and v_scale (k_scale={}, v_scale={})",
                  dtype_name(cache.dtype), static_cast<const void*>(cache.k_scale),
                  static_cast<const void*>(cache.v_scale));
    for (int32_t h = 0; h < cache.num_kv_heads; ++h) {
      for (const float* s : {cache.k_scale, cache.v_scale}) {
        PAGEDKV_CHECK(std::isfinite(s[h]) && s[h] > 0.0f,
                      "attention: {} of kv head {} is {}: a scale must be finite and > 0",
                      s == cache.k_scale ? "k_scale" : "v_scale", h, s[h]);
      }
    }
  }
}

void check_table_geometry(const char* fn, const KVLayerView& cache, int32_t block_size,
                          int32_t num_blocks) {
  // A mismatch reads the wrong tokens without any id being out of range (slot = block *
  // block_size + offset means something else under another block size), so no later range
  // check can catch it.
  PAGEDKV_CHECK(block_size == cache.block_size,
                "{}: block tables built for block_size {} but the cache has block_size {} (the "
                "tables and the cache must come from one configuration{})",
                fn, block_size, cache.block_size,
                block_size == 0 ? "; the view's block_size is unset" : "");
  PAGEDKV_CHECK(num_blocks >= 0 && num_blocks <= cache.num_blocks,
                "{}: block tables index a pool of {} blocks but the cache has num_blocks {}", fn,
                num_blocks, cache.num_blocks);
}

}  // namespace pagedkv
