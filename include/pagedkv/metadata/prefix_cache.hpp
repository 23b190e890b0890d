#pragma once
/// @file prefix_cache.hpp
/// Automatic prefix caching: content keys of full blocks (a hash chained over the prefix) and
/// the index from key to the physical block holding that content. Host-only metadata; the
/// KVCacheManager owns one and keeps it consistent with its BlockAllocator.
///
/// Source: vLLM automatic prefix caching (v1 block pool: chained block hashes over full blocks,
/// unreferenced cached blocks evicted least-recently-used first); hash: xxHash XXH3-64.

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "pagedkv/types.hpp"

namespace pagedkv {

namespace test_hooks {
struct ManagerCorruptor;  // tests/common/manager_corruptor.hpp: breaks state to test the checks
}  // namespace test_hooks

/// Content key of one full block: XXH3-64 of (parent key, extra key, the block's token ids).
using BlockHash = uint64_t;

/// Parent key of the first block of every sequence.
inline constexpr BlockHash kRootBlockHash = 0x9E3779B97F4A7C15ull;

/// Key of a full block: XXH3_64bits over the little-endian bytes of
/// [parent (u64), extra_key (u64), tokens[0], ..., tokens[n-1] (i32 each)], seed 0.
/// Chaining over the parent makes the key depend on the whole prefix, so equal blocks after
/// different prefixes get different keys. `extra_key` separates caches that must not share
/// (adapter id, multimodal hash, per-tenant cache salt); 0 = none.
/// Worked example: block_hash(kRootBlockHash, {1, 2, 3, 4}, 0) is the key of a first block
/// holding tokens 1..4; the second block's key is block_hash(k1, {5, 6, 7, 8}, 0), where k1 is
/// the first block's key.
[[nodiscard]] BlockHash block_hash(BlockHash parent, std::span<const TokenId> tokens,
                                   uint64_t extra_key);

/// Index of cached full blocks: key -> block, with each entry's token ids, extra key and the
/// identity of its parent entry, so a key match is confirmed on content before sharing (a hash
/// collision is a miss, never a wrong share).
///
/// Every registered entry gets a unique serial number (never reused; 0 means "no entry", the
/// parent serial of first blocks). A child entry records its parent's serial, and lookup()
/// confirms it, so a hit guarantees that the whole prefix, not only this block, is identical
/// to what was stored. At most one block is registered per key; a second block with the same
/// content stays unregistered (it is freed normally).
///
/// Parent links: an entry inserted while its parent entry (parent_hash with parent_serial) is
/// registered is linked under it, and children() lists the entries linked under a block, so an
/// owner can remove a whole subtree when a parent goes (KVCacheManager does: no entry is ever
/// left that a walk from the root cannot reach). erase() unlinks an entry's children (they stay
/// registered, with no parent link).
///
/// Every operation is O(1) expected (erase: plus O(children)). Layout, for the cache misses a
/// prefix-caching workload pays (every full block is registered once and, as an LRU victim, the
/// coldest state of all, erased once): one 64-byte record per pool block (the entry and its
/// parent, child and sibling links: one cache line), the blocks' token ids in one
/// [blocks, block_size] array (no allocation per entry), and an open-addressing index over the
/// keys. The records and ids cover block ids up to the highest one registered so far (grown
/// geometrically), so memory follows the part of the pool prefix caching has used: at most
/// num_blocks x (64 + 4 x block_size) bytes, plus 16 bytes per index cell (at most 4 per entry).
///
/// Worked example (block_size 2): insert(3, {.hash = 42, .parent_hash = kRootBlockHash}, {10,
/// 11}) -> serial 1; lookup(42, 0, 0, {10, 11}) -> 3; lookup(42, 0, 0, {10, 12}) -> empty (same
/// key, other content); tokens(3) -> {10, 11}; erase(3) -> the entry with serial 1; entry(3) ->
/// nullptr.
///
/// Not internally synchronized.
class PrefixCache {
 public:
  /// One registered block's key and the identity of its parent entry (its token ids: tokens()).
  struct Entry {
    BlockHash hash = 0;          ///< block_hash(parent_hash, tokens, extra_key): the content key
    BlockHash parent_hash = 0;   ///< key of the previous block, kRootBlockHash for a first block
    uint64_t serial = 0;         ///< unique id of this entry, >= 1 (insert() assigns it)
    uint64_t parent_serial = 0;  ///< serial of the parent entry, 0 for a first block
    uint64_t extra_key = 0;      ///< the salt the key was computed with (0 = none)
  };

  /// An empty index for a pool of `num_blocks` blocks of `block_size` tokens; allocates nothing
  /// until the first insert(). Errors: throws pagedkv::Error if num_blocks < 1 or block_size < 1.
  PrefixCache(int32_t num_blocks, int32_t block_size);

  /// The block registered for (hash) whose content equals (parent_serial, extra_key, tokens);
  /// empty on a miss (no entry, or an entry whose content differs: a collision).
  [[nodiscard]] std::optional<BlockId> lookup(BlockHash hash, uint64_t parent_serial,
                                              uint64_t extra_key,
                                              std::span<const TokenId> tokens) const;

  /// Registers `block` as holding `tokens` ([block_size] ids) under the key and parent `entry`
  /// describes (entry.serial is ignored: the new serial is assigned here and returned).
  /// Errors: throws pagedkv::Error if the block id is out of range, the block is already
  /// registered, the key is already taken, or tokens.size() != block_size; std::bad_alloc when
  /// memory runs out. Either way the cache is left as it was.
  uint64_t insert(BlockId block, const Entry& entry, std::span<const TokenId> tokens);

  /// Unregisters `block`; returns its entry, or empty if it was not registered. Entries linked
  /// under it lose their parent link (they stay registered).
  /// Errors: throws if the id is out of range.
  std::optional<Entry> erase(BlockId block);

  /// Appends to `out` the blocks whose entries are linked under `block`'s entry (inserted while
  /// it was their registered parent), in no particular order; nothing when `block` is not
  /// registered. Errors: throws if the id is out of range.
  void children(BlockId block, std::vector<BlockId>& out) const;

  /// Entry of a registered block, or nullptr; the pointer is valid until the next insert() or
  /// erase(). Errors: throws if the id is out of range.
  [[nodiscard]] const Entry* entry(BlockId block) const;
  /// Token ids of a registered block ([block_size]), empty when it is not registered; valid
  /// until the next insert() or erase(). Errors: throws if the id is out of range.
  [[nodiscard]] std::span<const TokenId> tokens(BlockId block) const;
  /// Block registered under `hash`, or empty.
  [[nodiscard]] std::optional<BlockId> find(BlockHash hash) const {
    // Inline: the optional is built in the caller's registers (returned from the library, GCC
    // assembles it on the stack and reloads it whole, a store-forwarding stall per call).
    const BlockId b = by_hash_.find(hash);
    return b >= 0 ? std::optional<BlockId>(b) : std::nullopt;
  }

  /// A hint, no change: starts loading the state erase() will touch for each of `blocks` (their
  /// records, then their keys' index cells), so that a caller about to erase many blocks (the
  /// victims of one allocation) waits for those cache misses once, not once per block.
  /// Blocks out of range or not registered are skipped.
  void prefetch_erase(std::span<const BlockId> blocks) const;

  /// A hint, no change: starts loading the index cell where find(hash) and insert() of `hash`
  /// look first, for a caller that knows many keys before it looks them up (the keys of the
  /// blocks one commit registers).
  void prefetch_key(BlockHash hash) const { by_hash_.prefetch(hash); }
  /// A hint, no change: starts loading `block`'s record and token row for an insert() (or an
  /// entry() check) soon; a block beyond the records' cover or out of range is skipped.
  void prefetch_block(BlockId block) const;

  /// Registered blocks.
  [[nodiscard]] int32_t size() const { return by_hash_.size(); }
  /// Tokens per block: the length of every entry's tokens.
  [[nodiscard]] int32_t block_size() const { return block_size_; }

  /// Checks the index's own structure: each registered block's key finds it and its serial was
  /// handed out; as many keys as registered blocks; each child list runs both ways and holds
  /// only registered blocks whose parent is that list's owner. O(num_blocks + index cells).
  /// Errors: throws pagedkv::Error naming the block (or key) of the first violation.
  void check_invariants() const;

 private:
  friend struct test_hooks::ManagerCorruptor;
  /// Key -> block, linear probing over a power-of-two table kept at most half full; erase
  /// shifts the following run back, so there are no tombstones and probes stay short.
  class KeyIndex {
   public:
    [[nodiscard]] BlockId find(BlockHash hash) const;  // -1: absent
    void insert(BlockHash hash, BlockId block);        // precondition: hash absent
    void erase(BlockHash hash);                        // precondition: hash present
    void prefetch(BlockHash hash) const;               // the home cell of hash
    [[nodiscard]] int32_t size() const { return size_; }

   private:
    friend struct test_hooks::ManagerCorruptor;
    struct Cell {
      BlockHash hash = 0;
      BlockId block = -1;  // -1 = empty cell
    };
    [[nodiscard]] size_t home(BlockHash hash) const;
    [[nodiscard]] size_t position(BlockHash hash) const;  // the cell of hash, or an empty one
    void grow();

    std::vector<Cell> cells_;  // [capacity], a power of two (empty before the first insert)
    int32_t size_ = 0;
    int shift_ = 64;  // 64 - log2(capacity): home() takes the top bits of a Fibonacci product
  };

  /// One pool block's prefix state, one cache line: its entry (serial 0 = not registered) and
  /// its links, -1 = none: the block of the parent entry, the first child, and the doubly
  /// linked list of siblings.
  struct alignas(64) Record {
    Entry entry;
    BlockId parent = -1;
    BlockId first_child = -1;
    BlockId next_sibling = -1;
    BlockId prev_sibling = -1;
  };

  void check_block(BlockId block, const char* op) const;
  /// The record of `block` when it is registered, else nullptr (block in range).
  [[nodiscard]] const Record* registered(BlockId block) const;
  /// Grows records_ and tokens_ to cover `block` (geometrically, up to num_blocks_); the old
  /// arrays stay until the new ones exist, so a bad_alloc changes nothing.
  void cover(BlockId block);
  void unlink_parent(BlockId block);  // from its parent's child list
  [[nodiscard]] const TokenId* row(BlockId block) const {
    return tokens_.data() + static_cast<size_t>(block) * static_cast<size_t>(block_size_);
  }

  int32_t num_blocks_;
  int32_t block_size_;
  uint64_t next_serial_ = 1;
  std::vector<Record> records_;  // [covered blocks]: blocks [0, records_.size())
  std::vector<TokenId> tokens_;  // [records_.size(), block_size]: each registered block's ids
  KeyIndex by_hash_;
};

}  // namespace pagedkv
