#pragma once
// Private to the KVCacheManager sources: the plan of one append (shared by the append path and
// the kept set) and the inline helpers several of its files call on hot paths.

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {

/// Everything an append will do, computed without changing anything, so that can_append and
/// append_slots cannot disagree and the append can commit without a failure point.
struct KVCacheManager::AppendPlan {
  std::vector<int32_t> release;  // table entries whose block token eviction releases
  int32_t freed = 0;             // of those, blocks whose ref count drops to 0 (available again)
  std::vector<size_t> victims;   // kept tokens the policy evicts (indices into the kept set)
  bool refill = false;           // new tokens refill slots (a sparse kept set), see holes
  bool cow = false;              // copy the shared, partially filled last block first
  int32_t fresh = 0;             // blocks taken from the pool (copy-on-write included)
  // Refill: (entry, offset) of the first new tokens, in existing blocks; the rest go to fresh
  // blocks, placed at fresh_entries (an entry index, or -1 = append to the table).
  std::vector<std::pair<int32_t, int32_t>> holes;
  std::vector<int32_t> fresh_entries;
};

// Every device-pool allocation goes through here: the allocator reports the cached blocks it
// evicted for reuse, and their prefix-cache entries go before anything else happens. Common
// cases first: most decode steps need no block, and while free blocks cover the request
// nothing can be evicted.
inline std::optional<std::vector<BlockId>> KVCacheManager::allocate_blocks(int32_t n) {
  if (n == 0) return std::vector<BlockId>{};
  if (n <= allocator_.num_free()) return allocator_.allocate(n);
  return allocate_evicting(n);
}

// Full blocks wholly inside the positions no query at or after `t` sees (vLLM's
// remove_skipped_blocks): logical blocks j with j * bs >= begin, (j + 1) * bs <= end and
// j < t / bs, as [first, last) (empty when last <= first).
inline std::pair<int64_t, int64_t> KVCacheManager::released_block_range(int64_t t) const {
  const int64_t bs = config_.block_size;
  const PositionRange dead = policy_->released_positions(t);
  if (dead.end <= dead.begin) return {0, 0};
  const int64_t first = (std::max<int64_t>(dead.begin, 0) + bs - 1) / bs;
  const int64_t last = std::min(t / bs, dead.end / bs);
  return {first, last};
}

/// Table entries that hold a block (not released by token eviction).
inline int32_t live_blocks(std::span<const BlockId> blocks) {
  return static_cast<int32_t>(
      std::count_if(blocks.begin(), blocks.end(), [](BlockId b) { return b >= 0; }));
}

}  // namespace pagedkv
