#pragma once
// The paged cache mode of a hybrid model (KVBackendConfig::layer_attention): the layers form
// KV cache groups by the page-size rule (group_layers), one HybridKVCacheManager on the host
// gives each sequence one block table per group over ONE pool and releases the blocks a local
// group no longer sees; a PagedKVStorage keeps the pool with layers_per_group layer slots per
// page (a layer writes and reads slot layers[l].slot of its group's pages); attention runs per
// layer over its group's tables with the layer's mask, so released entries (the null block)
// are never read. Built on pagedkv's public API only. Private to src/model.

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "model/kv_backend.hpp"
#include "model/paged_backend.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"
#include "pagedkv/metadata/kv_cache_groups.hpp"

namespace pagedkv::model::detail {

/// c.num_blocks blocks per group (each group may need a whole full table per sequence) plus
/// the null block. Errors: throws pagedkv::Error past 2^31 - 1 blocks.
inline HybridKVCacheManagerConfig hybrid_manager_config(const KVBackendConfig& c,
                                                        const KVCacheGroupLayout& layout) {
  const int64_t blocks = int64_t{c.num_blocks} * static_cast<int64_t>(layout.groups.size()) + 1;
  if (blocks > INT32_MAX) {
    throw Error(fmt::format("hybrid paged pool: {} blocks x {} groups is more than 2^31 - 1",
                            c.num_blocks, layout.groups.size()));
  }
  return {static_cast<int32_t>(blocks), c.block_size, layout.groups};
}

/// The pool: one page = block_size positions of layers_per_group layer slots.
inline KVCacheConfig hybrid_storage_config(const KVBackendConfig& c,
                                           const HybridKVCacheManagerConfig& m,
                                           const KVCacheGroupLayout& layout) {
  KVCacheConfig s = storage_config(c);
  s.num_layers = layout.layers_per_group;
  s.num_blocks = m.num_blocks;
  return s;
}

template <PagedKVStorage Storage, PagedAttention Attention>
class HybridPagedBackend : public KVBackend {
 public:
  explicit HybridPagedBackend(const KVBackendConfig& c)
      : layer_params_(layer_params(c)),
        layout_(group_layers(c.layer_attention)),
        manager_(hybrid_manager_config(c, layout_)),
        cache_(hybrid_storage_config(c, manager_.config(), layout_)),
        page_bytes_(kv_bytes_for_tokens(layout_.layers_per_group, c.num_kv_heads, c.head_dim,
                                        c.kv_dtype, c.block_size)),
        group_slots_(layout_.groups.size()) {}

  CacheMode mode() const override { return CacheMode::kPaged; }
  void add_sequence(SeqId seq) override { manager_.add_sequence(seq); }
  void free_sequence(SeqId seq) override { manager_.free_sequence(seq); }
  int64_t num_tokens(SeqId seq) const override { return manager_.num_tokens(seq); }

  void begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) override {
    check_step(seqs, n_new);
    for (std::vector<Slot>& s : group_slots_) s.clear();
    query_start_.assign(1, 0);
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto r = manager_.append_slots(seqs[i], n_new[i]);
      if (!r) {
        throw Error(fmt::format(
            "hybrid paged KV pool exhausted: sequence {} needs {} more blocks, {} free", seqs[i],
            manager_.blocks_needed(seqs[i], n_new[i]), manager_.num_free_blocks()));
      }
      // A copy moves a whole page, every layer slot of its group: before this step's writes.
      if (!r->copies.empty()) cache_.copy_blocks(r->copies);
      for (size_t g = 0; g < group_slots_.size(); ++g) {
        group_slots_[g].insert(group_slots_[g].end(), r->slots[g].begin(), r->slots[g].end());
      }
      query_start_.push_back(query_start_.back() + static_cast<int32_t>(n_new[i]));
    }
    group_meta_ = manager_.batch_metadata(seqs);
    decode_ = std::all_of(n_new.begin(), n_new.end(), [](int64_t n) { return n == 1; });
  }

  void attend(int32_t layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, std::span<float> out) override {
    const LayerGroupSlot at = layout_.layers[static_cast<size_t>(layer)];
    const auto g = static_cast<size_t>(at.group);
    cache_.write(at.slot, group_slots_[g], k, v);
    const KVLayerView view = cache_.layer(at.slot);
    const AttentionParams& params = layer_params_[static_cast<size_t>(layer)];
    const BlockTableView tables = group_meta_[g].padded.view();
    if (decode_) {
      attention_.decode(params, view, tables, q, out);
    } else {
      attention_.prefill(params, view, tables, query_start_, q, out);
    }
  }

  int64_t bytes_in_use() const override {
    const int64_t used = manager_.config().num_blocks - 1 - manager_.num_free_blocks();
    return used * page_bytes_;
  }

  std::vector<GroupKVUsage> group_usage() const override {
    std::vector<GroupKVUsage> out;
    for (int32_t g = 0; g < manager_.num_groups(); ++g) {
      const int64_t blocks = manager_.blocks_in_tables(g);
      out.push_back({layout_.groups[static_cast<size_t>(g)], blocks, blocks * page_bytes_});
    }
    return out;
  }

 private:
  std::vector<AttentionParams> layer_params_;  // [num_layers], each layer's mask
  KVCacheGroupLayout layout_;
  HybridKVCacheManager manager_;
  Storage cache_;
  Attention attention_;
  int64_t page_bytes_;
  std::vector<std::vector<Slot>> group_slots_;  // [num_groups] the step's slots, batch order
  std::vector<int32_t> query_start_;            // [num_seqs + 1] the step's rows
  std::vector<GroupBatchMetadata> group_meta_;  // [num_groups] the step's tables
  bool decode_ = false;
};

}  // namespace pagedkv::model::detail
