#pragma once
// The paged backend on the CPU: PagedBackend over HostKVCache with the CPU kernels of
// pagedkv/cpu/attention.hpp. Private to src/model.

#include <memory>
#include <span>

#include "model/paged_backend.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv::model {

/// The CPU kernels of pagedkv/cpu/attention.hpp, as PagedBackend's attention.
struct CpuPagedAttention {
  void decode(const AttentionParams& params, const KVLayerView& cache, const BlockTableView& tables,
              std::span<const float> q, std::span<float> out) {
    paged_decode_attention(params, cache, tables, q, out);
  }
  void prefill(const AttentionParams& params, const KVLayerView& cache,
               const BlockTableView& tables, std::span<const int32_t> query_start,
               std::span<const float> q, std::span<float> out) {
    paged_prefill_attention(params, cache, tables, query_start, q, out);
  }
};

using CpuPagedBackend = detail::PagedBackend<HostKVCache, CpuPagedAttention>;

/// The CPU paged backend with prefix caching and, when config.tiering asks, the tiers below
/// the pool (kv_tiering.hpp); kv_backend_prefix.cpp.
std::unique_ptr<KVBackend> make_prefix_paged_backend(const KVBackendConfig& config);

}  // namespace pagedkv::model
