#include "pagedkv/prefix_cache.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "detail/check.hpp"

namespace pagedkv {

BlockHash block_hash(BlockHash parent, std::span<const TokenId> tokens, uint64_t extra_key) {
  // One contiguous little-endian buffer so the key does not depend on struct padding; the
  // streaming API would avoid the copy but blocks are small (block_size int32s).
  std::vector<unsigned char> buf(16 + tokens.size() * sizeof(TokenId));
  std::memcpy(buf.data(), &parent, 8);
  std::memcpy(buf.data() + 8, &extra_key, 8);
  if (!tokens.empty()) std::memcpy(buf.data() + 16, tokens.data(), tokens.size() * sizeof(TokenId));
  return XXH3_64bits(buf.data(), buf.size());
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

std::optional<BlockId> PrefixCache::lookup(BlockHash hash, uint64_t parent_serial,
                                           uint64_t extra_key,
                                           std::span<const TokenId> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const Entry& e = by_block_.at(it->second);
  // Confirm the content: a 64-bit key can collide, a wrong share would corrupt a sequence.
  if (e.parent_serial != parent_serial || e.extra_key != extra_key ||
      !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end())) {
    return std::nullopt;
  }
  return it->second;
}

uint64_t PrefixCache::insert(BlockId block, Entry entry) {
  check_block(block, "insert");
  PAGEDKV_CHECK(!by_block_.contains(block), "PrefixCache::insert: block {} already registered",
                block);
  PAGEDKV_CHECK(!by_hash_.contains(entry.hash),
                "PrefixCache::insert: key {:#018x} already registered (block {})", entry.hash,
                by_hash_.contains(entry.hash) ? by_hash_.at(entry.hash) : -1);
  PAGEDKV_CHECK(static_cast<int64_t>(entry.tokens.size()) == block_size_,
                "PrefixCache::insert: {} tokens, expected a full block of {}", entry.tokens.size(),
                block_size_);
  entry.serial = next_serial_++;
  const uint64_t serial = entry.serial;
  by_hash_.emplace(entry.hash, block);
  by_block_.emplace(block, std::move(entry));
  return serial;
}

std::optional<PrefixCache::Entry> PrefixCache::erase(BlockId block) {
  check_block(block, "erase");
  auto it = by_block_.find(block);
  if (it == by_block_.end()) return std::nullopt;
  std::optional<Entry> e = std::move(it->second);
  by_block_.erase(it);
  by_hash_.erase(e->hash);
  return e;
}

const PrefixCache::Entry* PrefixCache::entry(BlockId block) const {
  check_block(block, "entry");
  auto it = by_block_.find(block);
  return it == by_block_.end() ? nullptr : &it->second;
}

std::optional<BlockId> PrefixCache::find(BlockHash hash) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  return it->second;
}

}  // namespace pagedkv
