#include "pagedkv/metadata/prefix_cache.hpp"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <utility>

#include "core/check.hpp"

namespace pagedkv {

BlockHash block_hash(BlockHash parent, std::span<const TokenId> tokens, uint64_t extra_key) {
  // One contiguous little-endian buffer so the key does not depend on struct padding; the
  // streaming API would avoid the copy but blocks are small (block_size int32s). Blocks of up
  // to 256 tokens hash from the stack: a heap buffer per call was a malloc/free for every
  // full block a replay registers or looks up.
  constexpr size_t kStackTokens = 256;
  std::array<unsigned char, 16 + kStackTokens * sizeof(TokenId)> stack_buf;
  std::vector<unsigned char> heap_buf;
  unsigned char* buf = stack_buf.data();
  const size_t size = 16 + tokens.size() * sizeof(TokenId);
  if (tokens.size() > kStackTokens) {
    heap_buf.resize(size);
    buf = heap_buf.data();
  }
  std::memcpy(buf, &parent, 8);
  std::memcpy(buf + 8, &extra_key, 8);
  if (!tokens.empty()) std::memcpy(buf + 16, tokens.data(), tokens.size() * sizeof(TokenId));
  return XXH3_64bits(buf, size);
}

// Why not std::unordered_map: with two node-based maps (block -> entry, key -> block), erase
// and find took ~40% of a prefix-caching replay of the Mooncake trace, chasing node pointers
// and dividing by a prime bucket count at every step. Here a lookup is one probe into a flat
// table plus one array read, and registering or forgetting a block allocates nothing beyond
// the entry's tokens.

std::optional<BlockId> PrefixCache::KeyIndex::find(BlockHash hash) const {
  if (size_ == 0) return std::nullopt;
  const Cell& c = cells_[position(hash)];
  if (c.block < 0) return std::nullopt;
  return c.block;
}

size_t PrefixCache::KeyIndex::home(BlockHash hash) const {
  // Fibonacci hashing: keys are XXH3 values, but callers may register any 64-bit key, and the
  // multiply spreads patterned ones (small integers, multiples of 2^k) over the top bits.
  return static_cast<size_t>((hash * 0x9E3779B97F4A7C15ull) >> shift_);
}

size_t PrefixCache::KeyIndex::position(BlockHash hash) const {
  const size_t mask = cells_.size() - 1;
  size_t i = home(hash);
  while (cells_[i].block >= 0 && cells_[i].hash != hash) i = (i + 1) & mask;
  return i;
}

void PrefixCache::KeyIndex::insert(BlockHash hash, BlockId block) {
  if (2 * (static_cast<size_t>(size_) + 1) > cells_.size()) grow();
  cells_[position(hash)] = {hash, block};
  ++size_;
}

void PrefixCache::KeyIndex::erase(BlockHash hash) {
  const size_t mask = cells_.size() - 1;
  size_t hole = position(hash);
  // Backward-shift deletion (Knuth, TAOCP vol. 3, 6.4 Algorithm R): move later members of the
  // probe run into the hole unless their home lies cyclically in (hole, i].
  for (size_t i = (hole + 1) & mask; cells_[i].block >= 0; i = (i + 1) & mask) {
    const size_t h = home(cells_[i].hash);
    const bool stays = hole < i ? (hole < h && h <= i) : (hole < h || h <= i);
    if (!stays) {
      cells_[hole] = cells_[i];
      hole = i;
    }
  }
  cells_[hole] = Cell{};
  --size_;
}

void PrefixCache::KeyIndex::grow() {
  const size_t capacity = cells_.empty() ? 16 : 2 * cells_.size();
  // The new table exists before the old one is given up: a bad_alloc loses nothing.
  std::vector<Cell> old = std::exchange(cells_, std::vector<Cell>(capacity));
  shift_ = 64 - std::countr_zero(capacity);
  size_ = 0;
  for (const Cell& c : old) {
    if (c.block >= 0) insert(c.hash, c.block);
  }
}

namespace {

/// Makes room for one more element, growing geometrically (as push_back would).
template <typename T>
void reserve_one_more(std::vector<T>& v) {
  if (v.size() == v.capacity()) v.reserve(std::max<size_t>(16, 2 * v.capacity()));
}

}  // namespace

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  PAGEDKV_CHECK(num_blocks >= 1, "PrefixCache: num_blocks must be >= 1, got {}", num_blocks);
  PAGEDKV_CHECK(block_size >= 1, "PrefixCache: block_size must be >= 1, got {}", block_size);
}

int32_t PrefixCache::entry_index(BlockId block) const {
  return entry_of_.empty() ? -1 : entry_of_[block];
}

void PrefixCache::check_block(BlockId block, const char* op) const {
  PAGEDKV_CHECK(block >= 0 && block < num_blocks_,
                "PrefixCache::{}: block id {} out of range [0, {})", op, block, num_blocks_);
}

std::optional<BlockId> PrefixCache::lookup(BlockHash hash, uint64_t parent_serial,
                                           uint64_t extra_key,
                                           std::span<const TokenId> tokens) const {
  const std::optional<BlockId> block = by_hash_.find(hash);
  if (!block) return std::nullopt;
  const Entry& e = entries_[entry_of_[*block]];
  // Confirm the content: a 64-bit key can collide, a wrong share would corrupt a sequence.
  if (e.parent_serial != parent_serial || e.extra_key != extra_key ||
      !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
    return std::nullopt;
  }
  return block;
}

uint64_t PrefixCache::insert(BlockId block, Entry entry) {
  check_block(block, "insert");
  PAGEDKV_CHECK(entry_index(block) < 0, "PrefixCache::insert: block {} already registered", block);
  const std::optional<BlockId> holder = by_hash_.find(entry.hash);
  PAGEDKV_CHECK(!holder, "PrefixCache::insert: key {:#018x} already registered (block {})",
                entry.hash, holder.value_or(-1));
  PAGEDKV_CHECK(static_cast<int64_t>(entry.tokens.size()) == block_size_,
                "PrefixCache::insert: {} tokens, expected a full block of {}", entry.tokens.size(),
                block_size_);
  // Everything that can run out of memory happens before the first change (the index's own
  // growth keeps the old table until the new one is built), so a bad_alloc leaves the cache as
  // it was; the pushes below then fit in reserved capacity and cannot throw.
  if (entry_of_.empty()) {
    const auto n = static_cast<size_t>(num_blocks_);
    std::vector<int32_t> entry_of(n, -1), parent_of(n, -1), first(n, -1), next(n, -1), prev(n, -1);
    entry_of_ = std::move(entry_of);
    parent_of_ = std::move(parent_of);
    first_child_ = std::move(first);
    next_sibling_ = std::move(next);
    prev_sibling_ = std::move(prev);
  }
  reserve_one_more(entries_);
  reserve_one_more(block_of_);
  // The parent link, when the entry's parent is the registered entry of that key.
  BlockId parent = -1;
  if (entry.parent_serial != 0) {
    if (const std::optional<BlockId> p = by_hash_.find(entry.parent_hash);
        p && entries_[entry_of_[*p]].serial == entry.parent_serial) {
      parent = *p;
    }
  }
  by_hash_.insert(entry.hash, block);
  const uint64_t serial = next_serial_++;
  entry.serial = serial;
  parent_of_[block] = parent;
  if (parent >= 0) {
    next_sibling_[block] = first_child_[parent];
    prev_sibling_[block] = -1;
    if (first_child_[parent] >= 0) prev_sibling_[first_child_[parent]] = block;
    first_child_[parent] = block;
  }
  entry_of_[block] = static_cast<int32_t>(entries_.size());
  entries_.push_back(std::move(entry));
  block_of_.push_back(block);
  return serial;
}

std::optional<PrefixCache::Entry> PrefixCache::erase(BlockId block) {
  check_block(block, "erase");
  const int32_t i = entry_index(block);
  if (i < 0) return std::nullopt;
  std::optional<Entry> e = std::move(entries_[i]);
  by_hash_.erase(e->hash);
  unlink_parent(block);
  for (BlockId c = first_child_[block]; c >= 0;) {
    const BlockId next = next_sibling_[c];
    parent_of_[c] = next_sibling_[c] = prev_sibling_[c] = -1;
    c = next;
  }
  first_child_[block] = -1;
  // Keep entries_ dense: the last entry takes the freed place.
  const int32_t last = static_cast<int32_t>(entries_.size()) - 1;
  if (i != last) {
    entries_[i] = std::move(entries_[last]);
    block_of_[i] = block_of_[last];
    entry_of_[block_of_[i]] = i;
  }
  entries_.pop_back();
  block_of_.pop_back();
  entry_of_[block] = -1;
  return e;
}

const PrefixCache::Entry* PrefixCache::entry(BlockId block) const {
  check_block(block, "entry");
  const int32_t i = entry_index(block);
  return i < 0 ? nullptr : &entries_[i];
}

std::optional<BlockId> PrefixCache::find(BlockHash hash) const { return by_hash_.find(hash); }

void PrefixCache::unlink_parent(BlockId block) {
  const BlockId parent = parent_of_[block];
  if (parent < 0) return;
  const BlockId prev = prev_sibling_[block];
  const BlockId next = next_sibling_[block];
  if (prev >= 0) {
    next_sibling_[prev] = next;
  } else {
    first_child_[parent] = next;
  }
  if (next >= 0) prev_sibling_[next] = prev;
  parent_of_[block] = next_sibling_[block] = prev_sibling_[block] = -1;
}

void PrefixCache::children(BlockId block, std::vector<BlockId>& out) const {
  check_block(block, "children");
  if (entry_index(block) < 0) return;
  for (BlockId c = first_child_[block]; c >= 0; c = next_sibling_[c]) out.push_back(c);
}

void PrefixCache::check_invariants() const {
  const auto num_entries = static_cast<int32_t>(entries_.size());
  PAGEDKV_CHECK(
      static_cast<int32_t>(block_of_.size()) == num_entries && by_hash_.size() == num_entries,
      "invariant: prefix index has {} entries, {} entry blocks and {} keys", num_entries,
      block_of_.size(), by_hash_.size());
  for (int32_t i = 0; i < num_entries; ++i) {
    const BlockId b = block_of_[i];
    const Entry& e = entries_[i];
    PAGEDKV_CHECK(b >= 0 && b < num_blocks_ && entry_of_[b] == i,
                  "invariant: prefix entry {} is recorded for block {}, which maps to entry {}", i,
                  b, b >= 0 && b < num_blocks_ ? entry_of_[b] : -1);
    const std::optional<BlockId> found = by_hash_.find(e.hash);
    PAGEDKV_CHECK(found == b, "invariant: prefix key {:#018x} of block {} finds block {}", e.hash,
                  b, found.value_or(-1));
    PAGEDKV_CHECK(static_cast<int64_t>(e.tokens.size()) == block_size_ && e.serial >= 1 &&
                      e.serial < next_serial_,
                  "invariant: prefix entry of block {} has {} tokens (block size {}) and serial {} "
                  "(next {})",
                  b, e.tokens.size(), block_size_, e.serial, next_serial_);
  }
  const auto mapped =
      std::count_if(entry_of_.begin(), entry_of_.end(), [](int32_t i) { return i >= 0; });
  PAGEDKV_CHECK(mapped == num_entries, "invariant: {} blocks map to a prefix entry, {} entries",
                mapped, num_entries);
  for (BlockId p = 0; p < static_cast<BlockId>(first_child_.size()); ++p) {
    BlockId prev = -1;
    int32_t steps = 0;
    for (BlockId c = first_child_[p]; c >= 0; prev = c, c = next_sibling_[c]) {
      PAGEDKV_CHECK(c < num_blocks_ && ++steps <= num_entries && parent_of_[c] == p &&
                        prev_sibling_[c] == prev && entry_of_[c] >= 0,
                    "invariant: block {} in the child list of block {} (after {}) is not a "
                    "registered child linked back to it",
                    c, p, prev);
    }
    PAGEDKV_CHECK(first_child_[p] < 0 || entry_of_[p] >= 0,
                  "invariant: unregistered block {} has children", p);
  }
}

}  // namespace pagedkv
