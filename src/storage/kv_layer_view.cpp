#include "pagedkv/storage/kv_layer_view.hpp"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "core/check.hpp"
#include "storage/host_kv_cache_ops.hpp"

namespace pagedkv {

void check_attention_shape(const AttentionParams& params, const KVLayerView& cache) {
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
  PAGEDKV_CHECK(params.chunk_size >= 0, "attention: chunk_size must be >= 0 (0 = none), got {}",
                params.chunk_size);
  PAGEDKV_CHECK(std::isfinite(params.scale), "attention: scale must be finite, got {}",
                params.scale);
  PAGEDKV_CHECK(cache.block_size >= 1, "attention: cache block_size must be >= 1, got {}",
                cache.block_size);
  PAGEDKV_CHECK(cache.num_blocks >= 1, "attention: cache num_blocks must be >= 1, got {}",
                cache.num_blocks);
  PAGEDKV_CHECK(cache.k != nullptr && cache.v != nullptr,
                "attention: cache view has a null K or V pool (k={}, v={})", cache.k, cache.v);
}

void check_attention_params(const AttentionParams& params, const KVLayerView& cache) {
  check_attention_shape(params, cache);
  if (dtype_is_quantized(cache.dtype)) detail::check_view_scales("attention", cache);
}

void detail::check_view_scales(const char* fn, const KVLayerView& c) {
  PAGEDKV_CHECK(c.k_scale != nullptr && c.v_scale != nullptr,
                "{}: a {} cache needs k_scale and v_scale (k_scale={}, v_scale={})", fn,
                dtype_name(c.dtype), static_cast<const void*>(c.k_scale),
                static_cast<const void*>(c.v_scale));
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    for (const float* s : {c.k_scale, c.v_scale}) {
      PAGEDKV_CHECK(std::isfinite(s[h]) && s[h] > 0.0f,
                    "{}: {} of kv head {} is {}: a scale must be finite and > 0", fn,
                    s == c.k_scale ? "k_scale" : "v_scale", h, s[h]);
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

void detail::check_view_pools(const char* fn, const KVLayerView& view) {
  PAGEDKV_CHECK(view.k != nullptr && view.v != nullptr,
                "{}: the view has a null K or V pool (k={}, v={})", fn, view.k, view.v);
  PAGEDKV_CHECK(
      view.num_blocks >= 1 && view.block_size >= 1 && view.num_kv_heads >= 1 && view.head_dim >= 1,
      "{}: the view has num_blocks {}, block_size {}, num_kv_heads {}, head_dim {} "
      "(each must be >= 1)",
      fn, view.num_blocks, view.block_size, view.num_kv_heads, view.head_dim);
}

void copy_blocks(const KVLayerView& src, const KVLayerView& dst, std::span<const BlockCopy> pairs) {
  detail::check_view_pools("copy_blocks(src)", src);
  detail::check_view_pools("copy_blocks(dst)", dst);
  PAGEDKV_CHECK(src.dtype == dst.dtype && src.block_size == dst.block_size &&
                    src.num_kv_heads == dst.num_kv_heads && src.head_dim == dst.head_dim,
                "copy_blocks: src is {} [block_size {}, {} kv heads, head_dim {}] but dst is {} "
                "[block_size {}, {} kv heads, head_dim {}]",
                dtype_name(src.dtype), src.block_size, src.num_kv_heads, src.head_dim,
                dtype_name(dst.dtype), dst.block_size, dst.num_kv_heads, dst.head_dim);
  for (size_t i = 0; i < pairs.size(); ++i) {
    PAGEDKV_CHECK(pairs[i].src >= 0 && pairs[i].src < src.num_blocks && pairs[i].dst >= 0 &&
                      pairs[i].dst < dst.num_blocks,
                  "copy_blocks: pair {} ({}, {}) out of range: src blocks [0, {}), dst blocks "
                  "[0, {})",
                  i, pairs[i].src, pairs[i].dst, src.num_blocks, dst.num_blocks);
  }
  // One memcpy a (head, token) row of head_dim elements: the views may differ in layout and
  // strides. A row copied onto itself (a pair src == dst within one pool) is skipped: memcpy
  // onto itself is undefined, and nothing would change.
  const int64_t esize = dtype_size(src.dtype);
  const auto row_bytes = static_cast<size_t>(src.head_dim * esize);
  for (const BlockCopy& p : pairs) {
    for (int pool = 0; pool < 2; ++pool) {
      const auto* from = static_cast<const std::byte*>(pool ? src.v : src.k);
      auto* to = static_cast<std::byte*>(pool ? dst.v : dst.k);
      for (int32_t h = 0; h < src.num_kv_heads; ++h) {
        for (int32_t t = 0; t < src.block_size; ++t) {
          const std::byte* f = from + src.offset(p.src, h, t) * esize;
          std::byte* d = to + dst.offset(p.dst, h, t) * esize;
          if (f != d) std::memcpy(d, f, row_bytes);
        }
      }
    }
  }
}

}  // namespace pagedkv
