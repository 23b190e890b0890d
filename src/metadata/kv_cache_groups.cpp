#include "pagedkv/metadata/kv_cache_groups.hpp"

#include <algorithm>
#include <string>

#include "core/check.hpp"

namespace pagedkv {

namespace {

bool same_kind(const KVCacheGroupSpec& a, const KVCacheGroupSpec& b) {
  return a.kind == b.kind && a.window == b.window && a.sink_tokens == b.sink_tokens &&
         a.chunk == b.chunk;
}

/// The manager's own checks of a group spec (one source of truth), reported for `layer`.
void validate_kind(const KVCacheGroupSpec& spec, size_t layer) {
  KVCacheGroupSpec one = spec;
  one.num_layers = 1;
  try {
    const HybridKVCacheManager probe(HybridKVCacheManagerConfig{2, 1, {one}});
  } catch (const Error& e) {
    detail::fail("KV cache groups: layer {} ({}): {}", layer, group_attention_name(spec.kind),
                 e.what());
  }
}

}  // namespace

KVCacheGroupLayout group_layers(std::span<const KVCacheGroupSpec> layer_attention) {
  PAGEDKV_CHECK(!layer_attention.empty(), "KV cache groups: the model has no layer");
  // Kinds in order of their first layer, with the layers of each.
  std::vector<KVCacheGroupSpec> kinds;
  std::vector<std::vector<int32_t>> members;
  for (size_t l = 0; l < layer_attention.size(); ++l) {
    const KVCacheGroupSpec& spec = layer_attention[l];
    const auto it = std::find_if(kinds.begin(), kinds.end(),
                                 [&](const KVCacheGroupSpec& k) { return same_kind(k, spec); });
    if (it == kinds.end()) {
      validate_kind(spec, l);
      kinds.push_back(spec);
      members.emplace_back();
      members.back().push_back(static_cast<int32_t>(l));
    } else {
      members[static_cast<size_t>(it - kinds.begin())].push_back(static_cast<int32_t>(l));
    }
  }
  size_t smallest = members[0].size();
  size_t largest = smallest;
  for (const auto& m : members) {
    smallest = std::min(smallest, m.size());
    largest = std::max(largest, m.size());
  }
  // vLLM's choice: the smallest kind's count, unless the largest is within 1.5x of it
  // (2 x largest < 3 x smallest, in integers).
  const size_t per_group = 2 * largest < 3 * smallest ? largest : smallest;

  KVCacheGroupLayout out;
  out.layers_per_group = static_cast<int32_t>(per_group);
  out.layers.resize(layer_attention.size());
  for (size_t k = 0; k < kinds.size(); ++k) {
    const std::vector<int32_t>& m = members[k];
    for (size_t j = 0; j < m.size(); j += per_group) {
      KVCacheGroupSpec g = kinds[k];
      g.num_layers = static_cast<int32_t>(std::min(per_group, m.size() - j));
      const auto group = static_cast<int32_t>(out.groups.size());
      for (size_t s = 0; s < static_cast<size_t>(g.num_layers); ++s) {
        out.layers[static_cast<size_t>(m[j + s])] = {group, static_cast<int32_t>(s)};
      }
      out.padded_layers += static_cast<int32_t>(per_group) - g.num_layers;
      out.groups.push_back(g);
    }
  }
  return out;
}

}  // namespace pagedkv
