#pragma once
/// @file tier_sim.hpp
/// Tiers below the pool in the replay (docs/tiers.md, docs/memory.md "Tiers in the replay"):
/// capacity-only models of the host-memory and disk tiers of TieredKVStore
/// (pagedkv/tiers/tiered_kv_store.hpp). A tier holds block keys (the manager's chained block
/// hashes), not bytes: the replay drives metadata only. The rules are the store's:
///  - a store writes the block to every tier that does not hold it yet (a tier that holds it
///    marks it most recently used); each tier evicts least-recently-used blocks past its
///    capacity (bytes / block bytes, whole blocks);
///  - a lookup walks the prompt's chain from the first block the pool missed and stops at the
///    first block no tier holds; each block comes from the nearest tier holding it, and is then
///    promoted into every nearer tier (a load from disk also lands in host memory).
/// What the write policy feeds in is the replay's choice (TierWrite).

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedkv/metadata/prefix_cache.hpp"

namespace pagedkv::sim {

/// When a cached block is written down to the tiers (TieringOptions::policy in the model layer).
enum class TierWrite {
  kOnEviction,    ///< when the pool evicts it (or its registration is dropped)
  kWriteThrough,  ///< as soon as it is published in the pool's prefix cache
};

/// One tier of the replay, nearest first.
struct ReplayTier {
  std::string name;             ///< "host", "disk", ... (reports)
  int64_t bytes = 0;            ///< capacity, bytes (>= 0; whole blocks are kept)
  double load_bytes_per_s = 0;  ///< read bandwidth into the pool, bytes/s (> 0)
};

/// What one tier did in a replay.
struct ReplayTierResult {
  std::string name;
  int64_t capacity_blocks = 0;  ///< bytes / block bytes
  int64_t stored_blocks = 0;    ///< blocks written (promotions included)
  int64_t evicted_blocks = 0;   ///< blocks dropped by LRU
  int64_t hit_blocks = 0;       ///< blocks loaded from this tier into the pool
  int64_t hit_tokens = 0;       ///< hit_blocks x block size: prefill tokens it saved
  double load_seconds = 0;      ///< simulated time of those loads, s
};

/// The tiers of one replay: LRU sets of block keys with block capacities.
class TierStack {
 public:
  /// `block_bytes`: bytes of one block's K/V, all layers (>= 1).
  TierStack(const std::vector<ReplayTier>& tiers, int64_t block_bytes, int32_t block_size);

  /// Writes `key` to every tier (see the file comment).
  void store(BlockHash key);

  /// Loads the run of `chain` that starts at `from` and that the tiers hold, at most `limit`
  /// blocks: returns how many blocks were found and adds the load time (ms) of each to `ms`.
  int64_t load(std::span<const BlockHash> chain, size_t from, int64_t limit, double& ms);

  [[nodiscard]] bool empty() const { return tiers_.empty(); }
  [[nodiscard]] const std::vector<ReplayTierResult>& results() const { return results_; }

 private:
  struct Tier {
    int64_t capacity = 0;
    double load_ms_per_block = 0;
    std::list<BlockHash> lru;  // front = most recently used
    std::unordered_map<BlockHash, std::list<BlockHash>::iterator> where;
  };
  void put(size_t t, BlockHash key);

  std::vector<Tier> tiers_;
  std::vector<ReplayTierResult> results_;
  int32_t block_size_;
};

}  // namespace pagedkv::sim
