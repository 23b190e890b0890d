#pragma once
/// @file paged_kv_storage.hpp
/// The shape every paged K/V storage has, in host memory (HostKVCache) or device memory
/// (cuda::DeviceKVCache): what a model loop needs to drive the pages with what KVCacheManager
/// returns, so that one loop serves every device.
///
/// Worked example (one decode step of one layer, any storage `S`):
///   auto r = manager.append_slots(seq, 1);          // slots and copy-on-write copies
///   cache.copy_blocks(r->copies);
///   cache.write(layer, r->slots, k, v);             // host spans, fp32
///   attention(params, cache.layer(layer), tables, q, out);  // the kernels of S's memory

#include <concepts>
#include <cstdint>
#include <span>

#include "pagedkv/storage/host_kv_cache.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// A paged K/V storage S:
///  - `S(config)` allocates zeroed pools for a KVCacheConfig; `s.config()` returns it and
///    `s.bytes()` is kv_cache_bytes(config) (units: bytes, in S's memory);
///  - `s.write(layer, slot_mapping, k, v)` is reshape_and_cache from host memory, converting
///    fp32 to the pool dtype (round to nearest even). Shapes: slot_mapping [num_tokens] int64
///    (negative = padding, skipped); k, v [num_tokens, num_kv_heads, head_dim] fp32. Synchronous:
///    the spans may be reused when it returns;
///  - `s.copy_blocks(copies)` copies every layer's K and V of block src to block dst: the
///    copy-on-write lists of KVCacheManager::append_slots (no block both a source and a
///    destination, no destination twice; a device storage, which copies pairs in parallel,
///    rejects other lists);
///  - `s.layer(l)` views layer l's pools (in S's memory) for the attention kernels of that memory.
/// Errors: each member throws pagedkv::Error on an out-of-range layer, slot, block id or size,
/// before changing anything.
template <typename S>
concept PagedKVStorage = std::constructible_from<S, const KVCacheConfig&> &&
    requires(S& s, const S& cs, int32_t layer, std::span<const Slot> slots,
             std::span<const float> kv, std::span<const BlockCopy> copies) {
  { cs.config() } -> std::same_as<const KVCacheConfig&>;
  { cs.bytes() } -> std::same_as<int64_t>;
  s.write(layer, slots, kv, kv);
  s.copy_blocks(copies);
  { cs.layer(layer) } -> std::same_as<KVLayerView>;
};

static_assert(PagedKVStorage<HostKVCache>);

}  // namespace pagedkv
