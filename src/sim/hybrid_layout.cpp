#include "sim/hybrid_layout.hpp"

#include <algorithm>
#include <limits>

#include "core/check.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv::sim {

namespace {

int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

/// G from the layer counts of the kinds present (source: the file comment of hybrid_layout.hpp).
int32_t group_size(int32_t full, int32_t local) {
  if (full == 0 || local == 0) return std::max(full, local);
  const int32_t lo = std::min(full, local);
  const int32_t hi = std::max(full, local);
  // hi < 1.5 x lo, in integers.
  return 2 * hi < 3 * lo ? hi : lo;
}

int32_t to_int32(int64_t tokens, const char* what, const ModelPreset& model) {
  PAGEDKV_CHECK(tokens <= std::numeric_limits<int32_t>::max(),
                "hybrid layout of '{}': {} {} tokens is above 2^31 - 1", model.name, what, tokens);
  return static_cast<int32_t>(tokens);
}

}  // namespace

HybridLayout hybrid_layout(const ModelPreset& model, int32_t block_size) {
  validate(model);
  PAGEDKV_CHECK(block_size >= 1, "hybrid layout: block size must be >= 1, got {}", block_size);
  const int32_t local = model.num_local_layers;
  const int32_t full = model.num_layers - local;
  HybridLayout out;
  out.layers_per_group = group_size(full, local);
  const int32_t g = out.layers_per_group;
  out.full_groups = full > 0 ? ceil_div(full, g) : 0;
  out.local_groups = local > 0 ? ceil_div(local, g) : 0;
  out.padded_layers = g * (out.full_groups + out.local_groups) - model.num_layers;
  out.layer_position_bytes =
      kv_bytes_for_tokens(1, model.num_kv_heads, model.head_dim, model.dtype, 1);
  out.page_bytes = int64_t{block_size} * g * out.layer_position_bytes;
  KVCacheGroupSpec full_spec{.kind = GroupAttention::kFull, .num_layers = g};
  KVCacheGroupSpec local_spec{.num_layers = g};
  if (model.sliding_window > 0) {
    local_spec.kind = GroupAttention::kSlidingWindow;
    local_spec.window = to_int32(model.sliding_window, "sliding window", model);
  } else if (model.attention_chunk > 0) {
    local_spec.kind = GroupAttention::kChunkedLocal;
    local_spec.chunk = to_int32(model.attention_chunk, "attention chunk", model);
  }
  out.groups.assign(static_cast<size_t>(out.full_groups), full_spec);
  out.groups.insert(out.groups.end(), static_cast<size_t>(out.local_groups), local_spec);
  return out;
}

int64_t needed_layer_positions(const ModelPreset& model, int64_t num_tokens) {
  const int64_t full = model.num_layers - model.num_local_layers;
  return full * num_tokens + int64_t{model.num_local_layers} * cached_positions(model, num_tokens);
}

}  // namespace pagedkv::sim
