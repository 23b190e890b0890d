// KVCacheManager, prefix-cache bookkeeping: admission and prompts (the longest cached prefix is
// shared), registration of blocks that become full, cached blocks the allocator evicts, reset.
// Source: vLLM automatic prefix caching (chained block hashes, LRU of unreferenced blocks).

#include <utility>

#include "core/check.hpp"
#include "metadata/manager_internal.hpp"

namespace pagedkv {

namespace {
/// Walks the cached prefix of `prompt` from the root: for each of its first `max_blocks` full
/// blocks that hits (content confirmed), calls on_hit(block, key, entry serial); stops at the
/// first miss. Both the admission query and the add walk with it, so they cannot disagree.
template <typename OnHit>
void walk_prefix(const PrefixCache& prefix, std::span<const TokenId> prompt, int64_t block_size,
                 uint64_t extra_key, int64_t max_blocks, OnHit&& on_hit) {
  BlockHash parent = kRootBlockHash;
  uint64_t parent_serial = 0;
  for (int64_t j = 0; j < max_blocks; ++j) {
    auto tokens = prompt.subspan(j * block_size, block_size);
    const BlockHash h = block_hash(parent, tokens, extra_key);
    std::optional<BlockId> b = prefix.lookup(h, parent_serial, extra_key, tokens);
    if (!b) break;
    parent = h;
    parent_serial = prefix.entry(*b)->serial;
    on_hit(*b, h, parent_serial);
  }
}

/// Full blocks of a prompt that may hit: one token is always left for the model to compute.
int64_t eligible_blocks(int64_t len, int64_t block_size) {
  return len > 0 ? (len - 1) / block_size : 0;
}

/// Prefix-cache lookup result for a prompt.
struct PrefixMatch {
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;
  std::vector<uint64_t> serials;
  int64_t eligible = 0;  // full blocks that could have hit
};
}  // namespace

Admission KVCacheManager::can_add_sequence(std::span<const TokenId> prompt,
                                           uint64_t extra_key) const {
  const int64_t len = static_cast<int64_t>(prompt.size());
  const int64_t bs = config_.block_size;
  if (config_.max_model_len > 0 && len > config_.max_model_len) return Admission::kNever;
  const int64_t total_needed = blocks_for_tokens(len, bs);
  if (total_needed > int64_t{allocator_.num_blocks()} - watermark_blocks_) return Admission::kNever;
  int64_t hits = 0;
  int64_t from_lru = 0;  // hit blocks cached with ref count 0: they leave the available pool
  if (config_.enable_prefix_caching) {
    walk_prefix(prefix_, prompt, bs, extra_key, eligible_blocks(len, bs),
                [&](BlockId b, BlockHash, uint64_t) {
                  ++hits;
                  if (allocator_.ref_count(b) == 0) ++from_lru;
                });
  }
  const int64_t after = int64_t{allocator_.num_available()} - from_lru - (total_needed - hits);
  return after >= watermark_blocks_ ? Admission::kOk : Admission::kLater;
}

std::optional<AddResult> KVCacheManager::add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                                      uint64_t extra_key) {
  PAGEDKV_CHECK(seq != kPaddingSeq, "KVCacheManager::add_sequence: id {} is reserved for padding",
                seq);
  PAGEDKV_CHECK(!seqs_.contains(seq), "KVCacheManager::add_sequence: sequence {} already exists",
                seq);
  if (can_add_sequence(prompt, extra_key) != Admission::kOk) return std::nullopt;

  const int64_t len = static_cast<int64_t>(prompt.size());
  const int64_t bs = config_.block_size;
  PrefixMatch match;
  if (config_.enable_prefix_caching) {
    match.eligible = eligible_blocks(len, bs);
    walk_prefix(prefix_, prompt, bs, extra_key, match.eligible,
                [&](BlockId b, BlockHash h, uint64_t serial) {
                  match.blocks.push_back(b);
                  match.hashes.push_back(h);
                  match.serials.push_back(serial);
                });
  }
  // Retain hits before allocating: a hit that sits in the LRU must not be evicted by our own
  // allocation.
  for (BlockId b : match.blocks) allocator_.retain(b);
  const int32_t fresh =
      static_cast<int32_t>(blocks_for_tokens(len, bs)) - static_cast<int32_t>(match.blocks.size());
  std::optional<std::vector<BlockId>> ids = allocate_blocks(fresh);
  // can_add_sequence() said kOk, so the pool covers `fresh` after the retains.
  PAGEDKV_CHECK(ids.has_value(), "KVCacheManager::add_sequence: internal: {} blocks not available",
                fresh);

  Sequence s = new_sequence();
  s.blocks = match.blocks;
  s.blocks.insert(s.blocks.end(), ids->begin(), ids->end());
  s.placeholders.assign(s.blocks.size(), -1);
  s.num_tokens = len;
  s.token_ids.assign(prompt.begin(), prompt.end());
  s.hashes = match.hashes;
  s.serials = match.serials;
  s.extra_key = extra_key;
  s.kept.add_positional(0, len, config_.block_size);

  AddResult result;
  result.num_computed_tokens = static_cast<int64_t>(match.blocks.size()) * bs;
  result.append.slots.reserve(static_cast<size_t>(len - result.num_computed_tokens));
  for (int64_t p = result.num_computed_tokens; p < len; ++p) {
    result.append.slots.push_back(static_cast<Slot>(s.blocks[p / bs]) * bs + p % bs);
  }
  if (config_.enable_prefix_caching) {
    counters_.prefix_query_tokens += len;
    counters_.prefix_hit_tokens += result.num_computed_tokens;
    counters_.prefix_hits += static_cast<int64_t>(match.blocks.size());
    counters_.prefix_misses += match.eligible - static_cast<int64_t>(match.blocks.size());
  }
  Sequence& stored = seqs_.emplace(seq, std::move(s)).first->second;
  register_full_blocks(stored);
  return result;
}

void KVCacheManager::register_full_blocks(Sequence& s) {
  // A sparse table's entries do not hold the positions their index says: nothing to key.
  if (!config_.enable_prefix_caching || !s.ids_known || s.kept.sparse()) return;
  const int64_t bs = config_.block_size;
  for (int64_t j = static_cast<int64_t>(s.hashes.size()); (j + 1) * bs <= s.num_tokens; ++j) {
    const BlockHash parent = j == 0 ? kRootBlockHash : s.hashes[j - 1];
    const uint64_t parent_serial = j == 0 ? 0 : s.serials[j - 1];
    std::span<const TokenId> tokens(s.token_ids.data() + j * bs, static_cast<size_t>(bs));
    const BlockHash h = block_hash(parent, tokens, s.extra_key);
    uint64_t serial = 0;
    const BlockId b = s.blocks[j];
    // A block is registered only when its whole prefix is (parent_serial != 0): lookups walk
    // from the root, so an entry after a gap could never be reached.
    if ((j == 0 || parent_serial != 0) && b != kNoBlock) {
      if (std::optional<BlockId> existing = prefix_.find(h)) {
        // Same key: the same content computed twice (keep the first, chain on it) or a
        // collision (stop the chain).
        if (prefix_.lookup(h, parent_serial, s.extra_key, tokens)) {
          serial = prefix_.entry(*existing)->serial;
        }
      } else if (prefix_.entry(b) == nullptr && allocator_.ref_count(b) == 1) {
        serial = prefix_.insert(b, {.hash = h,
                                    .parent_hash = parent,
                                    .parent_serial = parent_serial,
                                    .extra_key = s.extra_key,
                                    .tokens = {tokens.begin(), tokens.end()}});
        allocator_.set_cached(b, true);
        // Events are off by default: copy the tokens for one only when it is kept.
        if (config_.enable_events) {
          emit({.kind = KVCacheEvent::Kind::kStored,
                .block = b,
                .hash = h,
                .parent_hash = parent,
                .extra_key = s.extra_key,
                .tokens = {tokens.begin(), tokens.end()}});
        }
      }
    }
    s.hashes.push_back(h);
    s.serials.push_back(serial);
  }
}

std::optional<std::vector<BlockId>> KVCacheManager::allocate_evicting(int32_t n) {
  // A member list, so that its capacity is kept: an eviction costs no heap allocation.
  evicted_.clear();
  std::optional<std::vector<BlockId>> ids = allocator_.allocate(n, evicted_);
  for (BlockId b : evicted_) drop_evicted(b);
  evicted_.clear();
  return ids;
}

void KVCacheManager::drop_evicted(BlockId b) {
  // The allocator handed a cached ref-0 block out for other content: forget that content.
  std::optional<PrefixCache::Entry> e = prefix_.erase(b);
  ++counters_.prefix_evictions;
  if (!e) return;
  KVCacheEvent event;
  event.kind = KVCacheEvent::Kind::kEvicted;
  event.block = b;
  event.hash = e->hash;
  emit(std::move(event));
}

int32_t KVCacheManager::reset_prefix_cache() {
  int32_t n = 0;
  for (BlockId b = 0; b < allocator_.num_blocks(); ++b) {
    std::optional<PrefixCache::Entry> e = prefix_.erase(b);
    if (!e) continue;
    allocator_.set_cached(b, false);
    KVCacheEvent event;
    event.kind = KVCacheEvent::Kind::kRemoved;
    event.block = b;
    event.hash = e->hash;
    emit(std::move(event));
    ++n;
  }
  return n;
}

}  // namespace pagedkv
