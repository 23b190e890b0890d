#pragma once
/// @file kv_cache_groups.hpp
/// The page-size rule of a hybrid model: how its layers, each with its own attention (full,
/// sliding window, chunked local), form the KV cache groups of a HybridKVCacheManager so that
/// ONE block pool with ONE page size serves them all (docs/memory.md, "Hybrid models").
///
/// A block id names one page: block_size positions of the G layers of one group, so every group
/// holds G layer slots. The rule follows vLLM v1 (vllm/v1/core/kv_cache_utils.py,
/// _get_kv_cache_groups_uniform_page_size): layers with the same attention form a kind; G is
/// the smallest kind's layer count, or the largest kind's when that is below 1.5 x the smallest
/// (fewer groups, a little padding); each kind's L_k layers, in model order, fill
/// ceil(L_k / G) groups of G slots, and the slots left in a kind's last group are padding
/// (allocated with the group's pages, holding nothing). A model with one kind has one group of
/// all its layers: exactly a single-group KVCacheManager's page.
///
/// Bytes per page: block_size x G x 2 x H_kv x D x sizeof(dtype); a sequence of T tokens holds,
/// in group g, ceil(T / block_size) pages minus those its release rule returned.
///
/// Worked example, Gemma 3 (pattern 5 window : 1 full over 62 layers: 52 window, 10 full):
/// kinds window (52 layers, first at layer 0) and full (10); G = 10 (52 >= 1.5 x 10); the
/// window kind fills 6 groups (60 slots, 8 padded), the full kind 1 group; 7 groups in all.

#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {

/// Where one model layer's K/V live: its group and its slot among the group's G layer slots
/// (the layer index inside each page of the group).
struct LayerGroupSlot {
  int32_t group = 0;  ///< index into KVCacheGroupLayout::groups
  int32_t slot = 0;   ///< [0, layers_per_group)
};

/// The KV cache groups of a model under the page-size rule (see the file comment).
/// Invariants: layers_per_group x groups.size() == layers.size() + padded_layers; the layers of
/// one group share its spec (kind, window, sinks, chunk); groups[g].num_layers counts its real
/// layers (<= layers_per_group).
struct KVCacheGroupLayout {
  int32_t layers_per_group = 0;          ///< G: layer slots of every group (and page)
  std::vector<KVCacheGroupSpec> groups;  ///< [num_groups] in order of the kinds' first layer
  std::vector<LayerGroupSlot> layers;    ///< [num_layers] each model layer's group and slot
  int32_t padded_layers = 0;             ///< layer slots that hold no layer
};

/// Groups `layer_attention` ([num_layers] >= 1, each layer's attention; its num_layers is
/// ignored) by the page-size rule. Layers are of one kind when kind, window, sink_tokens and
/// chunk are all equal.
/// Errors: throws pagedkv::Error if layer_attention is empty or a layer's spec is invalid for
/// its kind (window or chunk < 1 where used, sinks < 0), naming the layer and the value.
[[nodiscard]] KVCacheGroupLayout group_layers(std::span<const KVCacheGroupSpec> layer_attention);

}  // namespace pagedkv
