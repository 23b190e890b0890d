#pragma once
/// @file hybrid_layout.hpp
/// How a hybrid model's layers share one block pool with one page size: the page-size rule of
/// the replay's hybrid-<bs> strategy (docs/memory.md, "Hybrid vs all-full in the replay").
///
/// A page (block id) holds block_size positions of the G layers of ONE KV cache group, so every
/// group must hold G layers for one page size to serve them all. The rule follows vLLM v1
/// (vllm/v1/core/kv_cache_utils.py, _get_kv_cache_groups_uniform_page_size): G is the smaller
/// kind's layer count, or the larger one's when it is below 1.5 x the smaller (fewer, slightly
/// padded groups); each kind's L_kind layers then form ceil(L_kind / G) groups of G, and the
/// layer slots left over in the last group of a kind are padding: their pages are allocated
/// with the group and hold nothing. A model with one kind only (all full, or all local like
/// Mistral-7B) has G = L and one group, which is exactly paged-<bs>'s page.
///
/// Worked example, Gemma-3-27B (10 full + 52 window-1024 layers, 2 x 16 x 128 x 2 = 8192 bytes
/// per position per layer), block size 16: G = 10; 1 full group and ceil(52 / 10) = 6 window
/// groups, 70 layer slots for 62 layers, 8 padded (12.9%); a page is 16 x 10 x 8192 = 1,310,720
/// bytes, and a 40 GiB budget holds 32,768 pages.

#include <cstdint>
#include <vector>

#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"
#include "sim/model_preset.hpp"

namespace pagedkv::sim {

/// The KV cache groups of a model under the page-size rule (see the file comment).
/// Invariants: layers_per_group x (full_groups + local_groups) == L + padded_layers;
/// groups.size() == full_groups + local_groups; page_bytes == block_size x layers_per_group x
/// layer_position_bytes.
struct HybridLayout {
  int32_t layers_per_group = 0;      ///< G: layers each group, and so each page, holds
  int32_t full_groups = 0;           ///< ceil(L_full / G) (0 without full layers)
  int32_t local_groups = 0;          ///< ceil(L_local / G) (0 without local layers)
  int32_t padded_layers = 0;         ///< layer slots holding no real layer
  int64_t layer_position_bytes = 0;  ///< one position of one layer: 2 x H_kv x D x sizeof(dtype)
  int64_t page_bytes = 0;            ///< one block: block_size x G x layer_position_bytes, bytes
  /// [full_groups + local_groups] the manager's groups (group_layers of the metadata layer, which
  /// implements the rule), full ones first, each with its real layers (a kind's last group may
  /// hold fewer than G); the local ones carry the preset's window or chunk (no sink tokens: no
  /// preset has any).
  std::vector<KVCacheGroupSpec> groups;
};

/// The layout of `model` at `block_size` tokens per page.
/// Errors: throws pagedkv::Error if the model is invalid (validate(ModelPreset)), block_size < 1,
/// or the window or chunk exceeds 2^31 - 1 tokens.
[[nodiscard]] HybridLayout hybrid_layout(const ModelPreset& model, int32_t block_size);

/// KV the real layers of a `num_tokens`-token sequence need, in layer-positions (one position
/// of one layer, layer_position_bytes each): each layer the positions the query at
/// num_tokens - 1 sees, (L - L_local) x T + L_local x cached_positions(T). Padded layers need
/// nothing. Equals L x T without local layers. Precondition: num_tokens >= 0.
[[nodiscard]] int64_t needed_layer_positions(const ModelPreset& model, int64_t num_tokens);

}  // namespace pagedkv::sim
