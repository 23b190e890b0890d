#pragma once
/// @file kv_cache_stats.hpp
/// Counters and the optional event log of a KVCacheManager: what a scheduler's metrics and a
/// cache-aware router read. Host-only plain data.

#include <cstdint>
#include <string_view>
#include <vector>

#include "pagedkv/metadata/prefix_cache.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Snapshot of a KVCacheManager. Units: blocks unless named `_tokens`.
/// Invariants (checked by KVCacheManager::check_invariants and the property tests):
///   free_blocks + used_blocks + cached_blocks == total_blocks;
///   usage == used_blocks / total_blocks;
///   prefix_hit_tokens <= prefix_query_tokens; prefix_hit_tokens == prefix_hits * block_size;
///   host_used_blocks <= host_total_blocks, and equals the live table entries of the swapped
///   sequences; swapped_in_blocks <= swapped_out_blocks (freeing a swapped sequence drops its
///   host blocks without a swap-in).
struct KVCacheStats {
  int32_t total_blocks = 0;           ///< device pool size
  int32_t free_blocks = 0;            ///< ref count 0, not cached
  int32_t used_blocks = 0;            ///< ref count >= 1 (held by at least one block table)
  int32_t cached_blocks = 0;          ///< ref count 0 but holding prefix-cached content (evictable)
  double usage = 0.0;                 ///< used_blocks / total_blocks, in [0, 1]
  int32_t num_sequences = 0;          ///< registered sequences, swapped ones included
  int32_t num_swapped_sequences = 0;  ///< sequences whose blocks are in the host pool

  int64_t prefix_query_tokens = 0;  ///< prompt tokens of every prefix-cached add
  int64_t prefix_hit_tokens = 0;    ///< of those, tokens served from the cache
  int64_t prefix_hits = 0;          ///< blocks served from the cache
  /// Full prompt blocks eligible for a hit (at most (prompt_len - 1) / block_size per prompt,
  /// since one token is always recomputed) that were not in the cache.
  int64_t prefix_misses = 0;
  int64_t prefix_evictions = 0;  ///< cached ref-0 blocks taken for reuse (LRU), counted once each
  int32_t prefix_cached_entries = 0;  ///< blocks registered in the prefix cache (any ref count)

  int64_t preemptions = 0;         ///< swap_out + preempt calls that succeeded
  int64_t swapped_out_blocks = 0;  ///< blocks copied device -> host, cumulative
  int64_t swapped_in_blocks = 0;   ///< blocks copied host -> device, cumulative
  int32_t host_total_blocks = 0;   ///< host swap pool size (config.num_host_blocks)
  int32_t host_used_blocks = 0;    ///< host blocks holding swapped-out data now

  int64_t released_blocks = 0;  ///< block references dropped by token eviction, cumulative
  int64_t evicted_tokens = 0;   ///< tokens evicted by a score-based policy, cumulative

  /// prefix_hit_tokens / prefix_query_tokens, 0 when nothing was queried.
  [[nodiscard]] double prefix_hit_rate() const {
    return prefix_query_tokens == 0
               ? 0.0
               : static_cast<double>(prefix_hit_tokens) / static_cast<double>(prefix_query_tokens);
  }
};

/// One entry of the event log (KVCacheManagerConfig::enable_events), for cache-aware routers
/// that mirror which prefixes a worker holds (vLLM's KV events: BlockStored / BlockRemoved /
/// AllBlocksCleared).
struct KVCacheEvent {
  /// What happened to the block's prefix-cache registration.
  enum class Kind : uint8_t {
    kStored,   ///< a full block was registered in the prefix cache (hash, parent, tokens set)
    kRemoved,  ///< a block left the prefix cache without being reused (reset_prefix_cache, or
               ///< its parent entry was removed or evicted: nothing could reach it)
    kEvicted,  ///< a cached ref-0 block was evicted (LRU) to be reused for other content
    /// reset_prefix_cache emptied the prefix cache (vLLM's AllBlocksCleared): the last event of
    /// a reset, after one kRemoved per entry it dropped (none when it was empty), so a
    /// consumer that handles kRemoved alone stays right and one that knows kAllCleared may
    /// drop its whole mirror. block = -1, hash = 0.
    kAllCleared,
  };
  Kind kind = Kind::kStored;    ///< what happened
  BlockId block = -1;           ///< the device-pool block concerned
  BlockHash hash = 0;           ///< content key of the registration stored, removed or evicted
  BlockHash parent_hash = 0;    ///< kStored only
  uint64_t extra_key = 0;       ///< kStored only
  std::vector<TokenId> tokens;  ///< kStored only: [block_size]
  /// KV cache group of the registration: HybridKVCacheManager keys its prefix cache by (hash,
  /// group), so the same hash is stored once per group; always 0 from KVCacheManager.
  int32_t group = 0;
};

/// "stored", "removed", "evicted", "all_cleared".
[[nodiscard]] std::string_view event_kind_name(KVCacheEvent::Kind kind);

}  // namespace pagedkv
