#pragma once
/// @file block_allocator.hpp
/// Fixed pool of block ids with reference counts: the metadata half of the page pool.
/// Host-only; holds no K/V data (see HostKVCache for storage).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagedkv/types.hpp"

namespace pagedkv {

namespace test_hooks {
struct ManagerCorruptor;  // tests/common/manager_corruptor.hpp: breaks state to test the checks
}  // namespace test_hooks

/// Hands out block ids from a pool of `num_blocks`, with per-block reference counts for sharing.
///
/// Every block is in exactly one state:
///  - free:      ref count 0, on the free list, holds nothing worth keeping;
///  - used:      ref count >= 1 (held by that many block tables);
///  - cached:    ref count 0 but marked cached (its contents are reusable by the prefix cache);
///               kept in least-recently-released order and evicted only when no free block is
///               left (as in vLLM v1's block pool, where one queue is both free list and LRU).
/// Invariant: num_free() + num_used() + num_cached() == num_blocks().
///
/// All operations are O(1), except allocate(n) which is O(n): free blocks wait in a FIFO ring
/// of ids, cached ones on an intrusive doubly linked list (a prefix hit takes one out of the
/// middle). Not internally synchronized.
///
/// Worked example: BlockAllocator a(3); a.allocate() -> 0, a.allocate() -> 1; a.release(0)
/// -> true (0 is free again, at the tail); a.allocate() -> 2; a.allocate() -> 0;
/// a.allocate() -> nullopt (exhausted, nothing changed). With a cached block: a.set_cached(2,
/// true); a.release(2) -> true (2 is cached, ref count 0); std::vector<BlockId> ev;
/// a.allocate(ev) -> 2 and ev == {2} (no free block was left, so cached 2 was evicted).
///
/// Evictions are reported to the caller (the `evicted` lists, evict_all_cached's result), never
/// by a callback into it, so an owner of cached contents holds no hook into the allocator and
/// both copy like plain values.
class BlockAllocator {
 public:
  /// A pool of ids [0, num_blocks), all free, in ascending order on the free list.
  /// Errors: throws pagedkv::Error if num_blocks < 1 or num_blocks > 2^30.
  explicit BlockAllocator(int32_t num_blocks);

  /// Takes one block (ref count 1). Uses a free block first; if none, evicts the least recently
  /// released cached block (its contents are lost: use the overload with `evicted` when
  /// something is keyed on them). Empty when neither exists; nothing changes then.
  [[nodiscard]] std::optional<BlockId> allocate();

  /// allocate() that reports an eviction: when the block is a cached one taken for reuse, its id
  /// is appended to `evicted` (which keeps its earlier contents), so the caller drops what it
  /// keyed on that content (KVCacheManager: the prefix-cache entry and a kEvicted event).
  /// Errors: std::bad_alloc from growing `evicted` leaves the allocator unchanged.
  [[nodiscard]] std::optional<BlockId> allocate(std::vector<BlockId>& evicted);

  /// Takes `n` blocks, all or nothing (empty and nothing changed when fewer than n are
  /// available). Errors: throws pagedkv::Error if n < 0.
  [[nodiscard]] std::optional<std::vector<BlockId>> allocate(int32_t n);

  /// allocate(n) that appends the ids of the cached blocks it evicts to `evicted`, in eviction
  /// (least recently released first) order; `evicted` is unchanged when the allocation fails.
  /// Errors: as allocate(n).
  [[nodiscard]] std::optional<std::vector<BlockId>> allocate(int32_t n,
                                                             std::vector<BlockId>& evicted);

  /// Adds one reference. A cached block with ref count 0 is taken back into use (prefix hit).
  /// Errors: throws pagedkv::Error if id is out of range or the block is free.
  void retain(BlockId id);

  /// Drops one reference; returns true when the count reached 0 (the block became free, or
  /// cached if marked cached). Errors: throws pagedkv::Error naming the id if it is out of range
  /// or already has ref count 0 (double release / release of a free block).
  bool release(BlockId id);

  /// release() of every id of a block table, last entry first (so that blocks becoming cached
  /// reach the LRU in that order: a table's tail is evicted before its head, which later prompts
  /// are likelier to share), skipping negative ids (entries that hold no block). Returns how
  /// many blocks reached ref count 0. Same result as the release() calls, in one pass.
  /// Errors: throws pagedkv::Error as release() does for the first bad id (in release order),
  /// after undoing the releases before it: a failed call changes nothing.
  int32_t release_table(std::span<const BlockId> table);

  /// Marks whether a block's contents are cached (reusable). A cached block whose ref count
  /// drops to 0 is kept (state cached) instead of freed. Unmarking a cached block with ref
  /// count 0 frees it. Errors: throws pagedkv::Error if id is out of range or the block is free.
  void set_cached(BlockId id, bool cached);

  /// Frees every cached block with ref count 0; returns their ids, least recently released
  /// first (the caller drops what it keyed on their contents).
  std::vector<BlockId> evict_all_cached();

  /// Reorders the free list by a seeded shuffle (std::mt19937_64), so tests get scattered
  /// (non-monotonic) ids, reproducibly for a given seed and free list.
  void shuffle_free_list(uint64_t seed);

  /// Ref count of a block (0 for free and cached blocks).
  /// Errors: throws pagedkv::Error if id is out of range.
  [[nodiscard]] int32_t ref_count(BlockId id) const;
  /// True when the block is free (ref 0, not cached). Errors: id out of range throws.
  [[nodiscard]] bool is_free(BlockId id) const;
  /// True when the block is marked cached (any ref count). Errors: id out of range throws.
  [[nodiscard]] bool is_cached(BlockId id) const;

  /// Pool size: valid ids are [0, num_blocks()).
  [[nodiscard]] int32_t num_blocks() const { return static_cast<int32_t>(state_.size()); }
  /// Blocks on the free list.
  [[nodiscard]] int32_t num_free() const { return free_size_; }
  /// Cached blocks with ref count 0 (evictable).
  [[nodiscard]] int32_t num_cached() const { return lru_.size; }
  /// Blocks with ref count >= 1.
  [[nodiscard]] int32_t num_used() const { return num_blocks() - num_free() - num_cached(); }
  /// Blocks allocate() can still hand out: num_free() + num_cached().
  [[nodiscard]] int32_t num_available() const { return num_free() + num_cached(); }

  /// Ids of the free list from head (next to allocate) to tail. O(num_free). For tests and dumps.
  [[nodiscard]] std::vector<BlockId> free_list() const;
  /// Ids of cached ref-0 blocks, least recently released first. O(num_cached).
  [[nodiscard]] std::vector<BlockId> cached_lru() const;

  /// Checks the pool's own structure: the free list holds distinct in-range ids of free blocks
  /// (ref count 0, not cached); the LRU list's links run both ways, its size and tail match, and
  /// it holds only cached ref-0 blocks; no ref count is negative; every ref-0 block is on exactly
  /// one of the two lists. O(num_blocks). Errors: throws pagedkv::Error naming the block (and
  /// list entry) of the first violation.
  void check_invariants() const;

 private:
  friend struct test_hooks::ManagerCorruptor;
  struct List {
    BlockId head = -1;
    BlockId tail = -1;
    int32_t size = 0;
  };
  void check_id(BlockId id, const char* op) const;
  void push_back(List& list, BlockId id);
  void unlink(List& list, BlockId id);
  void push_free(BlockId id);
  BlockId pop_free();
  inline BlockId evict_lru();  // defined in block_allocator.cpp, its only user (-fPIC: inlinable)

  // Per block, one word: the ref count in the low 31 bits (read sign-extended, so that a corrupt
  // negative count stays visible to check_invariants) and the cached flag in the top bit, so a
  // release, which reads both, touches one cache line of the pool instead of two.
  static constexpr uint32_t kCachedBit = uint32_t{1} << 31;
  [[nodiscard]] int32_t ref(BlockId id) const { return static_cast<int32_t>(state_[id] << 1) >> 1; }
  [[nodiscard]] bool cached(BlockId id) const { return (state_[id] & kCachedBit) != 0; }
  inline bool release_unchecked(BlockId id);  // block_allocator.cpp; precondition: ref(id) > 0
  inline BlockId take();  // block_allocator.cpp; precondition: num_available() > 0
  std::vector<uint32_t> state_;
  std::vector<BlockId> prev_;  // LRU links
  std::vector<BlockId> next_;
  // The free list needs no removal from the middle, so it is a ring rather than a linked list:
  // allocate and release touch only the ring's two ends, never a neighbouring block's links.
  std::vector<BlockId> free_ring_;  // [num_blocks]; the free list is free_size_ ids from free_head_
  int32_t free_head_ = 0;
  int32_t free_size_ = 0;
  List lru_;
};

}  // namespace pagedkv
