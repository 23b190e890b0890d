#pragma once
// The one paged backend of kv_backend.hpp, for every device: KVCacheManager on the host decides
// the slots and the copy-on-write copies; a PagedKVStorage keeps the pools (HostKVCache, or
// cuda::DeviceKVCache); an attention object runs decode or prefill over the storage's layer
// views (the CPU kernels, or cuda::DeviceDecodeRunner). Built on pagedkv's public API only.
// Private to src/model.

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/kv_backend.hpp"
#include "pagedkv/attention_params.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/storage/paged_kv_storage.hpp"

namespace pagedkv::model::detail {

/// Decode and prefill attention with host spans over a layer view of the storage's memory, with
/// the signatures of pagedkv::paged_decode_attention and paged_prefill_attention.
template <typename A>
concept PagedAttention = requires(A& a, const AttentionParams& params, const KVLayerView& view,
                                  const BlockTableView& tables,
                                  std::span<const int32_t> query_start, std::span<const float> q,
                                  std::span<float> out) {
  a.decode(params, view, tables, q, out);
  a.prefill(params, view, tables, query_start, q, out);
};

/// The model's attention geometry; scale 0: 1/sqrt(head_dim), as Llama.
inline AttentionParams attention_params(const KVBackendConfig& c) {
  AttentionParams p;
  p.num_heads = c.num_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  return p;
}

/// Each layer's attention: the model's geometry with the layer's mask (c.layer_attention[l]'s;
/// full attention for every layer when layer_attention is empty). [num_layers].
inline std::vector<AttentionParams> layer_params(const KVBackendConfig& c) {
  std::vector<AttentionParams> out(static_cast<size_t>(c.num_layers), attention_params(c));
  for (size_t l = 0; l < c.layer_attention.size() && l < out.size(); ++l) {
    c.layer_attention[l].mask().apply(out[l]);
  }
  return out;
}

/// HND pools of c.kv_dtype in the default placement for the backend's geometry.
inline KVCacheConfig storage_config(const KVBackendConfig& c) {
  KVCacheConfig s{c.num_layers, c.num_blocks, c.block_size,  c.num_kv_heads,
                  c.head_dim,   c.kv_dtype,   KVLayout::kHND};
  s.calibration_headroom = c.kv_scale_headroom;
  return s;
}

/// The block manager of a paged backend: prefix caching (with its event log, which the tiers
/// follow) when the config asks for it or for tiers.
inline KVCacheManagerConfig manager_config(const KVBackendConfig& c) {
  KVCacheManagerConfig m;
  m.num_blocks = c.num_blocks;
  m.block_size = c.block_size;
  m.enable_prefix_caching = c.prefix_caching || c.tiering.enabled();
  m.enable_events = m.enable_prefix_caching;
  return m;
}

/// Errors: throws pagedkv::Error naming both sizes unless seqs and n_new have one entry each.
void check_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new);

/// The paged backends' begin_step bookkeeping: manager.append_slots for every sequence, handing
/// each non-empty copy-on-write list to `copy_blocks` before the next sequence appends.
/// Errors: throws pagedkv::Error on a size mismatch or an exhausted pool (naming the counts).
void append_step(KVCacheManager& manager, std::span<const SeqId> seqs,
                 std::span<const int64_t> n_new,
                 const std::function<void(std::span<const BlockCopy>)>& copy_blocks);

/// The paged cache mode over `Storage` with `Attention`; the protocol of KVBackend.
template <PagedKVStorage Storage, PagedAttention Attention>
class PagedBackend : public KVBackend {
 public:
  explicit PagedBackend(const KVBackendConfig& c)
      : layer_params_(layer_params(c)),
        manager_(manager_config(c)),
        cache_(storage_config(c)),
        block_bytes_(kv_bytes_for_tokens(c.num_layers, c.num_kv_heads, c.head_dim, c.kv_dtype,
                                         c.block_size)) {}

  CacheMode mode() const override { return CacheMode::kPaged; }
  void add_sequence(SeqId seq) override { manager_.add_sequence(seq); }
  void free_sequence(SeqId seq) override { manager_.free_sequence(seq); }
  int64_t num_tokens(SeqId seq) const override { return manager_.num_tokens(seq); }

  void begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) override {
    step_seqs_.assign(seqs.begin(), seqs.end());
    append_step(manager_, seqs, n_new,
                [this](std::span<const BlockCopy> copies) { cache_.copy_blocks(copies); });
    manager_.batch_metadata(seqs, n_new, meta_);  // reuses meta_'s storage every step
    decode_ = std::all_of(n_new.begin(), n_new.end(), [](int64_t n) { return n == 1; });
  }

  void attend(int32_t layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, std::span<float> out) override {
    // On a device, the copy-on-write copies and this write share the default stream: in order.
    cache_.write(layer, meta_.slot_mapping, k, v);
    const KVLayerView view = cache_.layer(layer);
    if (decode_) {
      attention_.decode(layer_params_[layer], view, meta_.padded.view(), q, out);
    } else {
      attention_.prefill(layer_params_[layer], view, meta_.padded.view(), meta_.query_start, q,
                         out);
    }
  }

  /// Every layer has written the step's K/V: the manager may publish them (commit), the
  /// lifecycle step an engine takes after each forward pass.
  void end_step() override {
    for (const SeqId s : step_seqs_) manager_.commit(s, manager_.num_tokens(s));
    step_seqs_.clear();
  }

  int64_t bytes_in_use() const override {
    const int64_t used = manager_.num_total_blocks() - manager_.num_free_blocks();
    return used * block_bytes_;
  }

 protected:
  std::vector<AttentionParams> layer_params_;  // [num_layers]
  KVCacheManager manager_;
  Storage cache_;
  Attention attention_;
  int64_t block_bytes_;
  BatchMetadata meta_;
  bool decode_ = false;
  std::vector<SeqId> step_seqs_;  // the sequences of the step begun, until end_step
};

}  // namespace pagedkv::model::detail
