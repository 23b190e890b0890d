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

BlockId PrefixCache::KeyIndex::find(BlockHash hash) const {
  if (size_ == 0) return -1;
  return cells_[position(hash)].block;
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

void PrefixCache::KeyIndex::prefetch(BlockHash hash) const {
  if (!cells_.empty()) __builtin_prefetch(&cells_[home(hash)]);
}

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  PAGEDKV_CHECK(num_blocks >= 1, "PrefixCache: num_blocks must be >= 1, got {}", num_blocks);
  PAGEDKV_CHECK(block_size >= 1, "PrefixCache: block_size must be >= 1, got {}", block_size);
}

void PrefixCache::check_block(BlockId block, const char* op) const {
  PAGEDKV_CHECK(block >= 0 && block < num_blocks_,
                "PrefixCache::{}: block id {} out of range [0, {})", op, block, num_blocks_);
}

const PrefixCache::Record* PrefixCache::registered(BlockId block) const {
  if (static_cast<size_t>(block) >= records_.size()) return nullptr;
  const Record& r = records_[static_cast<size_t>(block)];
  return r.entry.serial != 0 ? &r : nullptr;
}

void PrefixCache::cover(BlockId block) {
  const auto need = static_cast<size_t>(block) + 1;
  if (need <= records_.size()) return;
  const size_t n =
      std::min(std::max({need, 2 * records_.size(), size_t{64}}), static_cast<size_t>(num_blocks_));
  std::vector<Record> records(n);
  std::vector<TokenId> tokens(n * static_cast<size_t>(block_size_));
  std::copy(records_.begin(), records_.end(), records.begin());
  std::copy(tokens_.begin(), tokens_.end(), tokens.begin());
  records_ = std::move(records);
  tokens_ = std::move(tokens);
}

std::optional<BlockId> PrefixCache::lookup(BlockHash hash, uint64_t parent_serial,
                                           uint64_t extra_key,
                                           std::span<const TokenId> tokens) const {
  const BlockId block = by_hash_.find(hash);
  if (block < 0) return std::nullopt;
  const Entry& e = records_[static_cast<size_t>(block)].entry;
  // Confirm the content: a 64-bit key can collide, a wrong share would corrupt a sequence.
  if (e.parent_serial != parent_serial || e.extra_key != extra_key ||
      tokens.size() != static_cast<size_t>(block_size_) ||
      !std::equal(tokens.begin(), tokens.end(), row(block))) {
    return std::nullopt;
  }
  return block;
}

uint64_t PrefixCache::insert(BlockId block, const Entry& entry, std::span<const TokenId> tokens) {
  check_block(block, "insert");
  PAGEDKV_CHECK(registered(block) == nullptr, "PrefixCache::insert: block {} already registered",
                block);
  const BlockId holder = by_hash_.find(entry.hash);
  PAGEDKV_CHECK(holder < 0, "PrefixCache::insert: key {:#018x} already registered (block {})",
                entry.hash, holder);
  PAGEDKV_CHECK(static_cast<int64_t>(tokens.size()) == block_size_,
                "PrefixCache::insert: {} tokens, expected a full block of {}", tokens.size(),
                block_size_);
  // Everything that can run out of memory happens before the first change (cover() and the
  // index's growth keep the old arrays until the new ones are built), so a bad_alloc leaves
  // the cache as it was.
  cover(block);
  // The parent link, when the entry's parent is the registered entry of that key.
  BlockId parent = -1;
  if (entry.parent_serial != 0) {
    if (const BlockId p = by_hash_.find(entry.parent_hash);
        p >= 0 && records_[static_cast<size_t>(p)].entry.serial == entry.parent_serial) {
      parent = p;
    }
  }
  by_hash_.insert(entry.hash, block);
  const uint64_t serial = next_serial_++;
  Record& r = records_[static_cast<size_t>(block)];
  r.entry = entry;
  r.entry.serial = serial;
  r.parent = parent;
  r.first_child = -1;
  r.prev_sibling = -1;
  r.next_sibling = -1;
  if (parent >= 0) {
    Record& p = records_[static_cast<size_t>(parent)];
    r.next_sibling = p.first_child;
    if (p.first_child >= 0) records_[static_cast<size_t>(p.first_child)].prev_sibling = block;
    p.first_child = block;
  }
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<std::ptrdiff_t>(block) * block_size_);
  return serial;
}

std::optional<PrefixCache::Entry> PrefixCache::erase(BlockId block) {
  check_block(block, "erase");
  if (registered(block) == nullptr) return std::nullopt;
  Record& r = records_[static_cast<size_t>(block)];
  const Entry e = r.entry;
  by_hash_.erase(e.hash);
  unlink_parent(block);
  for (BlockId c = r.first_child; c >= 0;) {
    Record& child = records_[static_cast<size_t>(c)];
    const BlockId next = child.next_sibling;
    child.parent = child.next_sibling = child.prev_sibling = -1;
    c = next;
  }
  r = Record{};
  return e;
}

const PrefixCache::Entry* PrefixCache::entry(BlockId block) const {
  check_block(block, "entry");
  const Record* r = registered(block);
  return r == nullptr ? nullptr : &r->entry;
}

std::span<const TokenId> PrefixCache::tokens(BlockId block) const {
  check_block(block, "tokens");
  if (registered(block) == nullptr) return {};
  return {row(block), static_cast<size_t>(block_size_)};
}

void PrefixCache::prefetch_erase(std::span<const BlockId> blocks) const {
  // Two passes: all the records first, then (their keys known by then) the index cells, so
  // the misses of each pass overlap instead of following one another block by block.
  for (BlockId b : blocks) {
    if (b >= 0 && static_cast<size_t>(b) < records_.size()) __builtin_prefetch(&records_[b]);
  }
  for (BlockId b : blocks) {
    if (const Record* r = b >= 0 ? registered(b) : nullptr) by_hash_.prefetch(r->entry.hash);
  }
}

void PrefixCache::prefetch_block(BlockId block) const {
  if (block < 0 || static_cast<size_t>(block) >= records_.size()) return;
  __builtin_prefetch(&records_[static_cast<size_t>(block)], 1);
  __builtin_prefetch(row(block), 1);
}

void PrefixCache::unlink_parent(BlockId block) {
  Record& r = records_[static_cast<size_t>(block)];
  if (r.parent < 0) return;
  if (r.prev_sibling >= 0) {
    records_[static_cast<size_t>(r.prev_sibling)].next_sibling = r.next_sibling;
  } else {
    records_[static_cast<size_t>(r.parent)].first_child = r.next_sibling;
  }
  if (r.next_sibling >= 0) {
    records_[static_cast<size_t>(r.next_sibling)].prev_sibling = r.prev_sibling;
  }
  // r's own links are left: erase(), the only caller, resets the whole record.
}

void PrefixCache::children(BlockId block, std::vector<BlockId>& out) const {
  check_block(block, "children");
  const Record* r = registered(block);
  if (r == nullptr) return;
  for (BlockId c = r->first_child; c >= 0; c = records_[static_cast<size_t>(c)].next_sibling) {
    out.push_back(c);
  }
}

void PrefixCache::check_invariants() const {
  const auto covered = static_cast<BlockId>(records_.size());
  PAGEDKV_CHECK(covered <= num_blocks_ &&
                    tokens_.size() == records_.size() * static_cast<size_t>(block_size_),
                "invariant: prefix records cover {} blocks of a pool of {}, with {} token ids",
                covered, num_blocks_, tokens_.size());
  int32_t num_registered = 0;
  int32_t with_parent = 0;  // records that name a parent
  int32_t listed = 0;       // records found in their parent's child list
  for (BlockId b = 0; b < covered; ++b) {
    const Record& r = records_[static_cast<size_t>(b)];
    if (r.entry.serial == 0) {
      PAGEDKV_CHECK(r.parent < 0 && r.first_child < 0,
                    "invariant: unregistered block {} has a parent or children", b);
      continue;
    }
    ++num_registered;
    with_parent += r.parent >= 0 ? 1 : 0;
    const BlockId found = by_hash_.find(r.entry.hash);
    PAGEDKV_CHECK(found == b, "invariant: prefix key {:#018x} of block {} finds block {}",
                  r.entry.hash, b, found < 0 ? -1 : found);
    PAGEDKV_CHECK(r.entry.serial < next_serial_,
                  "invariant: prefix entry of block {} has serial {} (next {})", b, r.entry.serial,
                  next_serial_);
    BlockId prev = -1;
    int32_t steps = 0;
    for (BlockId c = r.first_child; c >= 0; prev = c, c = records_[c].next_sibling) {
      PAGEDKV_CHECK(c < covered && ++steps <= covered && records_[c].parent == b &&
                        records_[c].prev_sibling == prev && records_[c].entry.serial != 0,
                    "invariant: block {} in the child list of block {} (after {}) is not a "
                    "registered child linked back to it",
                    c, b, prev);
      ++listed;
    }
  }
  // Every child list holds only blocks that name its owner (above), so a record that names a
  // parent without being in its list makes the two counts differ.
  PAGEDKV_CHECK(listed == with_parent,
                "invariant: {} prefix entries name a parent block, {} are in their parent's child "
                "list",
                with_parent, listed);
  PAGEDKV_CHECK(num_registered == by_hash_.size(),
                "invariant: {} blocks hold a prefix entry, the key index {} keys", num_registered,
                by_hash_.size());
}

}  // namespace pagedkv
