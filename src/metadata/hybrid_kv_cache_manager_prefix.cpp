// HybridKVCacheManager, prefix caching across KV cache groups: the longest hit every group can
// serve (each by its own rule, searched to a fixpoint), prompts that share it, commit (publish
// after write, per group under (hash, group)), and cached blocks the allocator evicts.
// Source: vLLM v1 HybridKVCacheCoordinator / single_type_kv_cache_manager (find_longest_cache_hit
// per attention kind over one BlockPool, block hashes keyed per group).

#include <algorithm>
#include <utility>

#include "core/check.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {

/// The prefix hit of a prompt: what add_sequence shares, what lookup_prefix reports and what
/// can_add_sequence counts (one computation, so they cannot disagree).
struct HybridKVCacheManager::Hit {
  int64_t blocks = 0;                         // hit blocks k: h = k x block_size tokens
  std::vector<BlockHash> hashes;              // [eligible] keys of the prompt's full blocks
  std::vector<std::vector<BlockId>> found;    // [group][eligible] cached block, or kNullBlock
  std::vector<std::vector<uint64_t>> serial;  // [group][eligible] its entry's serial, or 0
  std::vector<std::vector<bool>> needed;      // [group][blocks] entries the group needs at h
  int64_t from_lru = 0;                       // needed blocks cached with ref count 0
};

namespace {

/// Entries a group needs at hit point k blocks: its sinks below k and [first, k), where first
/// is the entry of the first position the query at k x bs sees (0 for a full group).
struct NeededRange {
  int64_t sinks;  // [0, sinks)
  int64_t first;  // [first, k), first >= sinks
};

NeededRange needed_range(const KVCacheGroupSpec& spec, int64_t k, int64_t bs) {
  const int64_t sinks = std::min(blocks_for_tokens(spec.sink_tokens, bs), k);
  return {sinks, std::max(sinks, spec.first_visible(k * bs) / bs)};
}

/// Largest k' <= k at which a group has every entry it needs cached; misses[j] counts the
/// uncached entries among [0, j). k' = 0 always qualifies (nothing needed).
int64_t largest_valid(const KVCacheGroupSpec& spec, std::span<const int64_t> misses, int64_t k,
                      int64_t bs) {
  for (; k > 0; --k) {
    const NeededRange r = needed_range(spec, k, bs);
    if (misses[r.sinks] == 0 && misses[k] - misses[r.first] == 0) return k;
  }
  return 0;
}

bool is_needed(const NeededRange& r, int64_t j) { return j < r.sinks || j >= r.first; }

}  // namespace

HybridKVCacheManager::Hit HybridKVCacheManager::find_hit(std::span<const TokenId> prompt,
                                                         uint64_t extra_key) const {
  const int64_t bs = config_.block_size;
  const auto len = static_cast<int64_t>(prompt.size());
  const size_t groups = config_.groups.size();
  // One token is always left for the model to compute, as KVCacheManager (eligible_blocks).
  const int64_t eligible = config_.enable_prefix_caching && len > 0 ? (len - 1) / bs : 0;
  Hit hit;
  hit.found.assign(groups, std::vector<BlockId>(static_cast<size_t>(eligible), kNullBlock));
  hit.serial.assign(groups, std::vector<uint64_t>(static_cast<size_t>(eligible), 0));
  hit.hashes.reserve(static_cast<size_t>(eligible));
  BlockHash parent = kRootBlockHash;
  for (int64_t j = 0; j < eligible; ++j) {
    parent = block_hash(parent, prompt.subspan(static_cast<size_t>(j * bs), bs), extra_key);
    hit.hashes.push_back(parent);
  }
  std::vector<std::vector<int64_t>> misses(groups);
  for (size_t g = 0; g < groups; ++g) {
    const PrefixCache& pc = prefix_[g];
    const bool full = config_.groups[g].kind == GroupAttention::kFull;
    uint64_t parent_serial = 0;
    for (int64_t j = 0; j < eligible; ++j) {
      const auto tokens = prompt.subspan(static_cast<size_t>(j * bs), bs);
      const BlockHash h = hit.hashes[static_cast<size_t>(j)];
      // A full group walks the chain of entries from the root (a hit confirms the whole
      // prefix); a local group's entries stand alone, confirmed on their parent key too.
      const std::optional<BlockId> b = pc.lookup(h, full ? parent_serial : 0, extra_key, tokens);
      const BlockHash want_parent =
          j == 0 ? kRootBlockHash : hit.hashes[static_cast<size_t>(j - 1)];
      if (!b || pc.entry(*b)->parent_hash != want_parent) {
        if (full) break;
        continue;
      }
      hit.found[g][static_cast<size_t>(j)] = *b;
      hit.serial[g][static_cast<size_t>(j)] = parent_serial = pc.entry(*b)->serial;
    }
    misses[g].assign(static_cast<size_t>(eligible) + 1, 0);
    for (int64_t j = 0; j < eligible; ++j) {
      misses[g][static_cast<size_t>(j + 1)] =
          misses[g][static_cast<size_t>(j)] + (hit.found[g][static_cast<size_t>(j)] == kNullBlock);
    }
  }
  // Fixpoint (vLLM v1 HybridKVCacheCoordinator): every group shrinks k to its own largest valid
  // point at or below it; k stays >= the largest point valid for all (each group's answer is),
  // so when no group shrinks it any more, k is that point. Full groups go first (their answer
  // is the hit run from the root), local groups check from the right.
  int64_t k = eligible;
  for (bool changed = true; changed && k > 0;) {
    changed = false;
    for (size_t g = 0; g < groups; ++g) {
      const int64_t kg = largest_valid(config_.groups[g], misses[g], k, bs);
      if (kg < k) {
        k = kg;
        changed = true;
      }
    }
  }
  hit.blocks = k;
  hit.needed.assign(groups, std::vector<bool>(static_cast<size_t>(k), false));
  for (size_t g = 0; g < groups; ++g) {
    const NeededRange r = needed_range(config_.groups[g], k, bs);
    for (int64_t j = 0; j < k; ++j) {
      if (!is_needed(r, j)) continue;
      hit.needed[g][static_cast<size_t>(j)] = true;
      hit.from_lru += pool_.ref_count(hit.found[g][static_cast<size_t>(j)]) == 0;
    }
  }
  return hit;
}

HybridPrefixLookup HybridKVCacheManager::lookup_prefix(std::span<const TokenId> prompt,
                                                       uint64_t extra_key) const {
  const Hit hit = find_hit(prompt, extra_key);
  HybridPrefixLookup out;
  out.num_computed_tokens = hit.blocks * config_.block_size;
  out.blocks.resize(config_.groups.size());
  for (size_t g = 0; g < config_.groups.size(); ++g) {
    for (int64_t j = 0; j < hit.blocks; ++j) {
      out.blocks[g].push_back(hit.needed[g][static_cast<size_t>(j)]
                                  ? hit.found[g][static_cast<size_t>(j)]
                                  : kNullBlock);
    }
  }
  return out;
}

namespace {
/// Fresh blocks a prompt of `len` tokens takes after a hit of `hit_blocks`: every group gets
/// its entries from the hit point on (an add appends from there, releasing nothing).
int64_t fresh_blocks(int64_t groups, int64_t len, int64_t hit_blocks, int64_t bs) {
  return groups * (blocks_for_tokens(len, bs) - hit_blocks);
}
}  // namespace

Admission HybridKVCacheManager::can_add_sequence(std::span<const TokenId> prompt,
                                                 uint64_t extra_key) const {
  const auto len = static_cast<int64_t>(prompt.size());
  const Hit hit = find_hit(prompt, extra_key);
  const int64_t groups = num_groups();
  const int64_t need = fresh_blocks(groups, len, hit.blocks, config_.block_size) + hit.from_lru;
  if (need <= pool_.num_available()) return Admission::kOk;
  return fresh_blocks(groups, len, 0, config_.block_size) > config_.num_blocks - 1
             ? Admission::kNever
             : Admission::kLater;
}

std::optional<HybridAddResult> HybridKVCacheManager::add_sequence(SeqId seq,
                                                                  std::span<const TokenId> prompt,
                                                                  uint64_t extra_key) {
  PAGEDKV_CHECK(!seqs_.contains(seq), "add_sequence: sequence {} already exists", seq);
  const auto len = static_cast<int64_t>(prompt.size());
  const int64_t bs = config_.block_size;
  Hit hit = find_hit(prompt, extra_key);
  const int64_t need = fresh_blocks(num_groups(), len, hit.blocks, bs) + hit.from_lru;
  if (need > pool_.num_available()) return std::nullopt;

  const int64_t h = hit.blocks * bs;
  Sequence s = new_sequence();
  s.num_tokens = h;
  s.committed = h;  // hit blocks hold written K/V
  s.extra_key = extra_key;
  s.token_ids.assign(prompt.begin(), prompt.begin() + h);
  s.hashes.assign(hit.hashes.begin(), hit.hashes.begin() + hit.blocks);
  for (size_t g = 0; g < config_.groups.size(); ++g) {
    s.tables[g].assign(static_cast<size_t>(hit.blocks), kNullBlock);
    s.serials[g].assign(hit.serial[g].begin(), hit.serial[g].begin() + hit.blocks);
    for (int64_t j = 0; j < hit.blocks; ++j) {
      if (hit.needed[g][static_cast<size_t>(j)]) {
        s.tables[g][static_cast<size_t>(j)] = hit.found[g][static_cast<size_t>(j)];
      }
    }
  }
  seqs_.emplace(seq, std::move(s));
  // Retain the hits before allocating: a hit waiting in the LRU must not be evicted by this very
  // add. The fresh blocks then come exactly as an append from h (nothing to release or copy).
  for (const std::vector<BlockId>& table : seqs_.at(seq).tables) {
    for (BlockId b : table) {
      if (b != kNullBlock) pool_.retain(b);
    }
  }
  std::optional<HybridAppendResult> append =
      do_append(seq, len - h, prompt.subspan(static_cast<size_t>(h)), true, true, "add_sequence");
  // The pool was checked above against the hits' retains and every fresh block.
  PAGEDKV_CHECK(append.has_value(), "add_sequence: internal: {} blocks not available", need);
  if (config_.enable_prefix_caching) {
    counters_.prefix_query_tokens += len;
    counters_.prefix_hit_tokens += h;
    counters_.prefix_hits += hit.blocks;
    counters_.prefix_misses += static_cast<int64_t>(hit.hashes.size()) - hit.blocks;
  }
  return HybridAddResult{.num_computed_tokens = h, .append = std::move(*append)};
}

int32_t HybridKVCacheManager::commit(SeqId seq, int64_t num_tokens) {
  (void)get_running(seq, "commit");
  Sequence& s = get(seq, "commit");
  PAGEDKV_CHECK(num_tokens >= 0 && num_tokens <= s.num_tokens,
                "commit: {} tokens for sequence {}, which holds {}", num_tokens, seq, s.num_tokens);
  if (num_tokens <= s.committed) return 0;
  s.committed = num_tokens;
  if (!config_.enable_prefix_caching || !s.ids_known) return 0;
  const int64_t bs = config_.block_size;
  int32_t published = 0;
  for (auto j = static_cast<int64_t>(s.hashes.size()); (j + 1) * bs <= s.committed; ++j) {
    const BlockHash parent = j == 0 ? kRootBlockHash : s.hashes[static_cast<size_t>(j - 1)];
    const BlockHash h = block_hash(
        parent, std::span<const TokenId>(s.token_ids).subspan(static_cast<size_t>(j * bs), bs),
        s.extra_key);
    for (size_t g = 0; g < config_.groups.size(); ++g) {
      s.serials[g].push_back(publish_block(s, g, j, h, published));
    }
    s.hashes.push_back(h);
  }
  return published;
}

int64_t HybridKVCacheManager::num_committed_tokens(SeqId seq) const {
  return get(seq, "num_committed_tokens").committed;
}

uint64_t HybridKVCacheManager::publish_block(Sequence& s, size_t g, int64_t j, BlockHash h,
                                             int32_t& published) {
  PrefixCache& pc = prefix_[g];
  const bool full = config_.groups[g].kind == GroupAttention::kFull;
  const int64_t bs = config_.block_size;
  const std::span<const TokenId> tokens =
      std::span<const TokenId>(s.token_ids).subspan(static_cast<size_t>(j * bs), bs);
  const BlockHash parent = j == 0 ? kRootBlockHash : s.hashes[static_cast<size_t>(j - 1)];
  const uint64_t parent_serial = full && j > 0 ? s.serials[g][static_cast<size_t>(j - 1)] : 0;
  if (full && j > 0) {
    // A full group's lookups walk from the root: an entry under a gap could never be reached.
    const std::optional<BlockId> p = pc.find(parent);
    if (parent_serial == 0 || !p || pc.entry(*p)->serial != parent_serial) return 0;
  }
  if (const std::optional<BlockId> existing = pc.find(h)) {
    // The same content computed twice (keep the first, chain on it) or a collision (stop).
    const std::optional<BlockId> same = pc.lookup(h, parent_serial, s.extra_key, tokens);
    return same && pc.entry(*same)->parent_hash == parent ? pc.entry(*same)->serial : 0;
  }
  const BlockId b = s.tables[g][static_cast<size_t>(j)];
  if (b == kNullBlock || pc.entry(b) != nullptr) return 0;  // released before its commit
  const uint64_t serial = pc.insert(
      b,
      {.hash = h, .parent_hash = parent, .parent_serial = parent_serial, .extra_key = s.extra_key},
      tokens);
  pool_.set_cached(b, true);
  ++published;
  // Events are off by default: copy the tokens for one only when it is kept.
  if (config_.enable_events) {
    emit({.kind = KVCacheEvent::Kind::kStored,
          .block = b,
          .hash = h,
          .parent_hash = parent,
          .extra_key = s.extra_key,
          .tokens = {tokens.begin(), tokens.end()},
          .group = static_cast<int32_t>(g)});
  }
  return serial;
}

void HybridKVCacheManager::emit(KVCacheEvent event) {
  if (config_.enable_events) events_.push_back(std::move(event));
}

KVCacheStats HybridKVCacheManager::stats() const {
  KVCacheStats st = counters_;
  st.total_blocks = pool_.num_blocks();
  st.free_blocks = pool_.num_free();
  st.used_blocks = pool_.num_used();
  st.cached_blocks = pool_.num_cached();
  st.usage = static_cast<double>(st.used_blocks) / st.total_blocks;
  st.num_sequences = static_cast<int32_t>(seqs_.size());
  st.num_swapped_sequences = static_cast<int32_t>(
      std::count_if(seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second.swapped; }));
  for (const PrefixCache& pc : prefix_) st.prefix_cached_entries += pc.size();
  st.host_total_blocks = config_.num_host_blocks;
  st.host_used_blocks = host_ ? host_->num_used() - 1 : 0;  // its block 0 is reserved
  return st;
}

std::vector<KVCacheEvent> HybridKVCacheManager::take_events() { return std::exchange(events_, {}); }

std::vector<BlockId> HybridKVCacheManager::allocate_evicting(int32_t n) {
  evicted_.clear();
  std::optional<std::vector<BlockId>> ids = pool_.allocate(n, evicted_);
  PAGEDKV_CHECK(ids.has_value(), "hybrid manager: internal: {} blocks not available", n);
  // LRU victims are the coldest blocks of all: load their prefix state in one pass first.
  for (const PrefixCache& pc : prefix_) pc.prefetch_erase(evicted_);
  for (BlockId b : evicted_) drop_evicted(b);
  evicted_.clear();
  return std::move(*ids);
}

void HybridKVCacheManager::drop_evicted(BlockId b) {
  // The block now holds other content: its key goes (a reused block's hash is reset), and in a
  // full group every entry chained below it, which no walk from the root could reach.
  ++counters_.prefix_evictions;
  for (size_t g = 0; g < prefix_.size(); ++g) {
    PrefixCache& pc = prefix_[g];
    if (pc.entry(b) == nullptr) continue;
    std::vector<BlockId> todo;
    pc.children(b, todo);
    while (!todo.empty()) {
      const BlockId c = todo.back();
      todo.pop_back();
      pc.children(c, todo);
      const std::optional<PrefixCache::Entry> e = pc.erase(c);
      // In use: stays with its sequences, unshareable; ref 0: free; evicted by this very
      // allocation: no longer marked, its own drop finds no entry.
      if (pool_.is_cached(c)) pool_.set_cached(c, false);
      emit({.kind = KVCacheEvent::Kind::kRemoved,
            .block = c,
            .hash = e->hash,
            .tokens = {},
            .group = static_cast<int32_t>(g)});
    }
    const std::optional<PrefixCache::Entry> e = pc.erase(b);
    emit({.kind = KVCacheEvent::Kind::kEvicted,
          .block = b,
          .hash = e->hash,
          .tokens = {},
          .group = static_cast<int32_t>(g)});
    return;
  }
}

}  // namespace pagedkv
