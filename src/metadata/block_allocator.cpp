#include "pagedkv/metadata/block_allocator.hpp"

#include <algorithm>
#include <random>

#include "core/check.hpp"

namespace pagedkv {

BlockAllocator::BlockAllocator(int32_t num_blocks) {
  PAGEDKV_CHECK(num_blocks >= 1 && num_blocks <= (1 << 30),
                "BlockAllocator: num_blocks must be in [1, 2^30], got {}", num_blocks);
  state_.assign(num_blocks, 0);
  prev_.assign(num_blocks, -1);
  next_.assign(num_blocks, -1);
  free_ring_.resize(num_blocks);
  for (BlockId id = 0; id < num_blocks; ++id) push_free(id);
}

void BlockAllocator::check_id(BlockId id, const char* op) const {
  PAGEDKV_CHECK(id >= 0 && id < num_blocks(),
                "BlockAllocator::{}: block id {} out of range [0, {})", op, id, num_blocks());
}

void BlockAllocator::push_back(List& list, BlockId id) {
  prev_[id] = list.tail;
  next_[id] = -1;
  if (list.tail >= 0) {
    next_[list.tail] = id;
  } else {
    list.head = id;
  }
  list.tail = id;
  ++list.size;
}

void BlockAllocator::unlink(List& list, BlockId id) {
  const BlockId p = prev_[id];
  const BlockId n = next_[id];
  if (p >= 0) {
    next_[p] = n;
  } else {
    list.head = n;
  }
  if (n >= 0) {
    prev_[n] = p;
  } else {
    list.tail = p;
  }
  prev_[id] = next_[id] = -1;
  --list.size;
}

void BlockAllocator::push_free(BlockId id) {
  const int32_t n = num_blocks();
  const int32_t tail = free_head_ + free_size_;
  free_ring_[tail >= n ? tail - n : tail] = id;
  ++free_size_;
}

BlockId BlockAllocator::pop_free() {
  const BlockId id = free_ring_[free_head_];
  free_head_ = free_head_ + 1 == num_blocks() ? 0 : free_head_ + 1;
  --free_size_;
  return id;
}

// Precondition: lru_.size > 0. The cached block at the LRU head loses its contents.
inline BlockId BlockAllocator::evict_lru() {
  const BlockId id = lru_.head;
  unlink(lru_, id);
  state_[id] = 0;  // ref 0, no longer cached
  return id;
}

// One block for an allocation the caller has checked: a free one, else the LRU head.
inline BlockId BlockAllocator::take() {
  const BlockId id = free_size_ > 0 ? pop_free() : evict_lru();
  state_[id] = 1;
  return id;
}

std::optional<BlockId> BlockAllocator::allocate() {
  BlockId id;
  if (free_size_ > 0) {
    id = pop_free();
  } else if (lru_.size > 0) {
    id = evict_lru();
  } else {
    return std::nullopt;
  }
  state_[id] = 1;
  return id;
}

std::optional<BlockId> BlockAllocator::allocate(std::vector<BlockId>& evicted) {
  BlockId id;
  if (free_size_ > 0) {
    id = pop_free();
  } else if (lru_.size > 0) {
    // Report first: if growing the list throws, nothing has changed here.
    evicted.push_back(lru_.head);
    id = evict_lru();
  } else {
    return std::nullopt;
  }
  state_[id] = 1;
  return id;
}

std::optional<std::vector<BlockId>> BlockAllocator::allocate(int32_t n) {
  PAGEDKV_CHECK(n >= 0, "BlockAllocator::allocate: block count must be >= 0, got {}", n);
  if (n > num_available()) return std::nullopt;
  std::vector<BlockId> ids;
  ids.reserve(n);
  for (int32_t i = 0; i < n; ++i) ids.push_back(take());
  return ids;
}

std::optional<std::vector<BlockId>> BlockAllocator::allocate(int32_t n,
                                                             std::vector<BlockId>& evicted) {
  PAGEDKV_CHECK(n >= 0, "BlockAllocator::allocate: block count must be >= 0, got {}", n);
  if (n > num_available()) return std::nullopt;
  // Free blocks first, then one eviction per block still missing (as n calls of allocate()
  // would do). Both lists are reserved up front, so nothing below can throw halfway.
  const int32_t from_lru = n > free_size_ ? n - free_size_ : 0;
  std::vector<BlockId> ids;
  ids.reserve(n);
  if (from_lru > 0) evicted.reserve(evicted.size() + static_cast<size_t>(from_lru));
  for (int32_t i = from_lru; i < n; ++i) ids.push_back(take());
  for (int32_t i = 0; i < from_lru; ++i) {
    const BlockId id = evict_lru();
    state_[id] = 1;
    evicted.push_back(id);
    ids.push_back(id);
  }
  return ids;
}

void BlockAllocator::retain(BlockId id) {
  check_id(id, "retain");
  if (ref(id) == 0) {
    PAGEDKV_CHECK(cached(id), "BlockAllocator::retain: block {} is free (not allocated)", id);
    unlink(lru_, id);  // prefix-cache hit on an evictable block: back into use
  }
  ++state_[id];
}

inline bool BlockAllocator::release_unchecked(BlockId id) {
  const uint32_t state = --state_[id];
  if ((state & ~kCachedBit) != 0) return false;
  if (state != 0) {
    push_back(lru_, id);  // cached
  } else {
    push_free(id);
  }
  return true;
}

bool BlockAllocator::release(BlockId id) {
  check_id(id, "release");
  PAGEDKV_CHECK(ref(id) > 0, "BlockAllocator::release: block {} is not allocated (double free?)",
                id);
  return release_unchecked(id);
}

int32_t BlockAllocator::release_table(std::span<const BlockId> table) {
  int32_t reached_zero = 0;
  for (size_t k = table.size(); k-- > 0;) {
    const BlockId id = table[k];
    if (id < 0) continue;
    if (id >= num_blocks() || ref(id) <= 0) {
      // Undo, newest first: a block that reached 0 here is the last one pushed on its list.
      for (size_t u = k + 1; u < table.size(); ++u) {
        const BlockId done = table[u];
        if (done < 0) continue;
        if (ref(done) == 0) {
          if (cached(done)) {
            unlink(lru_, done);
          } else {
            --free_size_;
          }
        }
        ++state_[done];
      }
      check_id(id, "release");
      detail::fail("BlockAllocator::release: block {} is not allocated (double free?)", id);
    }
    reached_zero += release_unchecked(id) ? 1 : 0;
  }
  return reached_zero;
}

void BlockAllocator::set_cached(BlockId id, bool cached) {
  check_id(id, "set_cached");
  PAGEDKV_CHECK(ref(id) > 0 || this->cached(id),
                "BlockAllocator::set_cached: block {} is free (not allocated)", id);
  if (this->cached(id) == cached) return;
  if (ref(id) == 0) {  // cached with ref 0 -> uncache: move from the LRU to the free list
    unlink(lru_, id);
    push_free(id);
  }
  state_[id] = cached ? state_[id] | kCachedBit : state_[id] & ~kCachedBit;
}

std::vector<BlockId> BlockAllocator::evict_all_cached() {
  std::vector<BlockId> evicted;
  evicted.reserve(static_cast<size_t>(lru_.size));
  while (lru_.size > 0) {
    const BlockId id = evict_lru();
    push_free(id);
    evicted.push_back(id);
  }
  return evicted;
}

void BlockAllocator::shuffle_free_list(uint64_t seed) {
  std::vector<BlockId> ids = free_list();
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  free_head_ = 0;
  free_size_ = 0;
  for (BlockId id : ids) push_free(id);
}

int32_t BlockAllocator::ref_count(BlockId id) const {
  check_id(id, "ref_count");
  return ref(id);
}

bool BlockAllocator::is_free(BlockId id) const {
  check_id(id, "is_free");
  return state_[id] == 0;
}

bool BlockAllocator::is_cached(BlockId id) const {
  check_id(id, "is_cached");
  return cached(id);
}

std::vector<BlockId> BlockAllocator::free_list() const {
  std::vector<BlockId> ids;
  ids.reserve(free_size_);
  for (int32_t k = 0, i = free_head_; k < free_size_; ++k, i = i + 1 == num_blocks() ? 0 : i + 1) {
    ids.push_back(free_ring_[i]);
  }
  return ids;
}

std::vector<BlockId> BlockAllocator::cached_lru() const {
  std::vector<BlockId> ids;
  ids.reserve(lru_.size);
  for (BlockId id = lru_.head; id >= 0; id = next_[id]) ids.push_back(id);
  return ids;
}

void BlockAllocator::check_invariants() const {
  const int32_t n = num_blocks();
  PAGEDKV_CHECK(free_size_ >= 0 && free_size_ <= n && free_head_ >= 0 && free_head_ < n,
                "invariant: free list of {} blocks from ring index {} in a pool of {}", free_size_,
                free_head_, n);
  std::vector<uint8_t> listed(n, 0);  // 1: on the free list, 2: on the LRU list
  for (int32_t k = 0, i = free_head_; k < free_size_; ++k, i = i + 1 == n ? 0 : i + 1) {
    const BlockId id = free_ring_[i];
    PAGEDKV_CHECK(id >= 0 && id < n, "invariant: free-list entry {} is block id {} out of range", k,
                  id);
    PAGEDKV_CHECK(!listed[id], "invariant: block {} is on the free list twice (entry {})", id, k);
    PAGEDKV_CHECK(state_[id] == 0,
                  "invariant: free-list entry {} is block {} with ref count {} and cached flag {}",
                  k, id, ref(id), cached(id));
    listed[id] = 1;
  }
  BlockId prev = -1;
  int32_t count = 0;
  for (BlockId id = lru_.head; id >= 0; prev = id, id = next_[id], ++count) {
    PAGEDKV_CHECK(id < n, "invariant: LRU link after block {} is block id {} out of range", prev,
                  id);
    PAGEDKV_CHECK(!listed[id],
                  "invariant: LRU block {} is already on the {} list (a cycle or a "
                  "block on both lists)",
                  id, listed[id] == 1 ? "free" : "LRU");
    PAGEDKV_CHECK(prev_[id] == prev, "invariant: LRU block {} links back to {} but follows {}", id,
                  prev_[id], prev);
    PAGEDKV_CHECK(state_[id] == kCachedBit,
                  "invariant: LRU block {} has ref count {} and cached flag {}", id, ref(id),
                  cached(id));
    listed[id] = 2;
  }
  PAGEDKV_CHECK(count == lru_.size && prev == lru_.tail,
                "invariant: LRU list walks {} blocks to tail {}, but records size {} and tail {}",
                count, prev, lru_.size, lru_.tail);
  for (BlockId id = 0; id < n; ++id) {
    PAGEDKV_CHECK(ref(id) >= 0, "invariant: block {} has ref count {}", id, ref(id));
    PAGEDKV_CHECK(ref(id) > 0 || listed[id],
                  "invariant: block {} has ref count 0 but is on neither the free nor the LRU list "
                  "(cached flag {})",
                  id, cached(id));
  }
}

}  // namespace pagedkv
