#pragma once
// Test-only access that breaks a manager's state on purpose, so the tests of check_invariants()
// (the oracle of the manager tests and the fuzz targets) can show that each check fires. The
// classes befriend this struct by a forward declaration; nothing here is reachable from the
// library, and no production path knows of it.

#include <cstddef>
#include <cstdint>

#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::test_hooks {

struct ManagerCorruptor {
  static BlockAllocator& device_pool(KVCacheManager& m) { return m.allocator_; }
  static BlockAllocator& host_pool(KVCacheManager& m) { return *m.host_; }
  static PrefixCache& prefix(KVCacheManager& m) { return m.prefix_; }

  // ---- BlockAllocator ----
  static void set_ref_count(BlockAllocator& a, BlockId b, int32_t count) {
    a.state_[b] = (a.state_[b] & BlockAllocator::kCachedBit) |
                  (static_cast<uint32_t>(count) & ~BlockAllocator::kCachedBit);
  }
  static void set_cached_flag(BlockAllocator& a, BlockId b, bool cached) {
    a.state_[b] = cached ? a.state_[b] | BlockAllocator::kCachedBit
                         : a.state_[b] & ~BlockAllocator::kCachedBit;
  }
  /// Entry k of the free list (k = 0 is the next block allocate() hands out).
  static void set_free_entry(BlockAllocator& a, int32_t k, BlockId b) {
    a.free_ring_[(a.free_head_ + k) % a.num_blocks()] = b;
  }
  static void set_lru_next(BlockAllocator& a, BlockId b, BlockId next) { a.next_[b] = next; }
  static void set_lru_prev(BlockAllocator& a, BlockId b, BlockId prev) { a.prev_[b] = prev; }

  // ---- PrefixCache ----
  /// Changes the key stored in block b's entry (the key index still maps the old key).
  static void set_entry_hash(PrefixCache& p, BlockId b, BlockHash hash) {
    p.records_[static_cast<size_t>(b)].entry.hash = hash;
  }
  /// Points the key index's cell of `hash` at block b (the records stay as they were).
  static void set_key_block(PrefixCache& p, BlockHash hash, BlockId b) {
    p.by_hash_.cells_[p.by_hash_.position(hash)].block = b;
  }
  static void set_entry_serial(PrefixCache& p, BlockId b, uint64_t serial) {
    p.records_[static_cast<size_t>(b)].entry.serial = serial;
  }
  /// The serial the next insert hands out (every registered serial is below it).
  static uint64_t next_serial(const PrefixCache& p) { return p.next_serial_; }
  static void set_parent_of(PrefixCache& p, BlockId b, BlockId parent) {
    p.records_[static_cast<size_t>(b)].parent = parent;
  }

  // ---- KVCacheManager ----
  static void set_table_entry(KVCacheManager& m, SeqId s, size_t j, BlockId b) {
    m.seqs_.at(s).blocks[j] = b;
  }
  /// Heavy hitters: kept token i of sequence s now claims `position` at (entry, offset).
  static void set_kept_token(KVCacheManager& m, SeqId s, size_t i, int64_t position, int32_t entry,
                             int32_t offset) {
    auto& k = m.seqs_.at(s).kept.tokens_.at(i);
    k.position = position;
    k.entry = entry;
    k.offset = offset;
  }
  static void erase_kept_token(KVCacheManager& m, SeqId s, size_t i) {
    auto& tokens = m.seqs_.at(s).kept.tokens_;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(i));
  }
  static void set_num_tokens(KVCacheManager& m, SeqId s, int64_t n) {
    m.seqs_.at(s).num_tokens = n;
  }
};

}  // namespace pagedkv::test_hooks
