#pragma once
// Private to the KVCacheManager sources: the plan of one append (shared by the append path and
// the kept set) and the inline helpers several of its files call on hot paths.

#include <cstdint>
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

}  // namespace pagedkv
