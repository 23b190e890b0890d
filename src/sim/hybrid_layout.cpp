#include "sim/hybrid_layout.hpp"

#include <limits>
#include <vector>

#include "core/check.hpp"
#include "pagedkv/metadata/kv_cache_groups.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv::sim {

namespace {

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
  KVCacheGroupSpec local_spec;
  if (model.sliding_window > 0) {
    local_spec.kind = GroupAttention::kSlidingWindow;
    local_spec.window = to_int32(model.sliding_window, "sliding window", model);
  } else if (model.attention_chunk > 0) {
    local_spec.kind = GroupAttention::kChunkedLocal;
    local_spec.chunk = to_int32(model.attention_chunk, "attention chunk", model);
  }
  // The full layers first, so the full groups come first: the rule itself is group_layers'.
  std::vector<KVCacheGroupSpec> layers(static_cast<size_t>(full), KVCacheGroupSpec{});
  layers.insert(layers.end(), static_cast<size_t>(local), local_spec);
  const KVCacheGroupLayout grouped = group_layers(layers);
  HybridLayout out;
  out.layers_per_group = grouped.layers_per_group;
  out.groups = grouped.groups;
  out.padded_layers = grouped.padded_layers;
  for (const KVCacheGroupSpec& g : out.groups) {
    ++(g.kind == GroupAttention::kFull ? out.full_groups : out.local_groups);
  }
  out.layer_position_bytes =
      kv_bytes_for_tokens(1, model.num_kv_heads, model.head_dim, model.dtype, 1);
  out.page_bytes = int64_t{block_size} * out.layers_per_group * out.layer_position_bytes;
  return out;
}

int64_t needed_layer_positions(const ModelPreset& model, int64_t num_tokens) {
  const int64_t full = model.num_layers - model.num_local_layers;
  return full * num_tokens + int64_t{model.num_local_layers} * cached_positions(model, num_tokens);
}

}  // namespace pagedkv::sim
