// KVCacheManager, prefix-cache bookkeeping: admission and prompts (the longest published prefix
// is shared; chunked prefill; never vs later), read-only lookup, commit (publish after write:
// only committed full blocks under a live parent entry are registered), cached blocks the
// allocator evicts (with the entries below them), reset.
// Source: vLLM automatic prefix caching (chained block hashes, LRU of unreferenced blocks).

#include <algorithm>
#include <array>
#include <utility>

#include "core/check.hpp"
#include "metadata/manager_internal.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"

namespace pagedkv {

namespace {
/// Walks the cached prefix of `prompt` from the root: for each of its first `max_blocks` full
/// blocks that hits (content confirmed), calls on_hit(block, key, entry serial); stops at the
/// first miss. Both the admission query and the add walk with it, so they cannot disagree.
template <typename OnHit>
void walk_prefix(const PrefixCache& prefix, std::span<const TokenId> prompt, int64_t block_size,
                 uint64_t extra_key, int64_t max_blocks, OnHit&& on_hit) {
  // Keys are a chain over the tokens alone, so they are computed kAhead blocks before their
  // lookup, each index cell prefetched then: the probes' cache misses overlap.
  constexpr int64_t kAhead = 8;
  std::array<BlockHash, kAhead> keys{};
  BlockHash chain = kRootBlockHash;
  int64_t computed = 0;
  const auto compute_to = [&](int64_t end) {
    for (; computed < std::min(end, max_blocks); ++computed) {
      chain = block_hash(chain, prompt.subspan(computed * block_size, block_size), extra_key);
      keys[static_cast<size_t>(computed % kAhead)] = chain;
      prefix.prefetch_key(chain);
    }
  };
  uint64_t parent_serial = 0;
  for (int64_t j = 0; j < max_blocks; ++j) {
    compute_to(j + kAhead);
    const BlockHash h = keys[static_cast<size_t>(j % kAhead)];
    std::optional<BlockId> b =
        prefix.lookup(h, parent_serial, extra_key, prompt.subspan(j * block_size, block_size));
    if (!b) break;
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

/// The prefix hits of a prompt and what admitting it takes now (shared by the admission query
/// and the add, so they cannot disagree).
struct AddPlan {
  PrefixMatch match;
  int64_t tokens = 0;    // tokens the sequence holds after the add
  int64_t fresh = 0;     // blocks allocated now
  int64_t hits = 0;      // blocks shared from the cache
  int64_t from_lru = 0;  // hit blocks cached with ref count 0: they leave the available pool
};

void check_options(const AddOptions& options) {
  PAGEDKV_CHECK(options.max_new_tokens >= 0,
                "KVCacheManager::add_sequence: max_new_tokens must be >= 0, got {}",
                options.max_new_tokens);
  PAGEDKV_CHECK(options.first_chunk_tokens >= -1,
                "KVCacheManager::add_sequence: first_chunk_tokens must be >= 0 (or -1 = the "
                "whole prompt), got {}",
                options.first_chunk_tokens);
}

/// `keep`: record the hit blocks, keys and serials (the add needs them, the query only counts).
AddPlan plan_add(const PrefixCache& prefix, const BlockAllocator& pool,
                 const KVCacheManagerConfig& config, std::span<const TokenId> prompt,
                 const AddOptions& options, bool keep) {
  const int64_t len = static_cast<int64_t>(prompt.size());
  const int64_t bs = config.block_size;
  AddPlan plan;
  if (config.enable_prefix_caching) {
    plan.match.eligible = eligible_blocks(len, bs);
    walk_prefix(prefix, prompt, bs, options.extra_key, plan.match.eligible,
                [&](BlockId b, BlockHash h, uint64_t serial) {
                  ++plan.hits;
                  if (pool.ref_count(b) == 0) ++plan.from_lru;
                  if (!keep) return;
                  plan.match.blocks.push_back(b);
                  plan.match.hashes.push_back(h);
                  plan.match.serials.push_back(serial);
                });
  }
  const int64_t hits = plan.hits;
  const int64_t rest = len - hits * bs;
  const int64_t chunk = options.first_chunk_tokens;
  plan.tokens = hits * bs + (chunk < 0 ? rest : std::min(chunk, rest));
  plan.fresh = blocks_for_tokens(plan.tokens, bs) - hits;
  return plan;
}
}  // namespace

Admission KVCacheManager::never_fits(int64_t len, const AddOptions& options) const {
  const int64_t total = len + options.max_new_tokens;
  if (config_.max_model_len > 0 && total > config_.max_model_len) return Admission::kNever;
  // The prompt is admitted above the watermark; the growth after it may use the reserve.
  if (blocks_for_tokens(len, config_.block_size) >
      int64_t{allocator_.num_blocks()} - watermark_blocks_) {
    return Admission::kNever;
  }
  if (options.max_new_tokens > 0 && min_blocks_held(total) > allocator_.num_blocks()) {
    return Admission::kNever;
  }
  return Admission::kOk;
}

Admission KVCacheManager::can_add_sequence(std::span<const TokenId> prompt,
                                           uint64_t extra_key) const {
  return can_add_sequence(prompt, AddOptions{.extra_key = extra_key});
}

Admission KVCacheManager::can_add_sequence(std::span<const TokenId> prompt,
                                           const AddOptions& options) const {
  check_options(options);
  if (never_fits(static_cast<int64_t>(prompt.size()), options) == Admission::kNever) {
    return Admission::kNever;
  }
  const AddPlan plan = plan_add(prefix_, allocator_, config_, prompt, options, false);
  const int64_t after = int64_t{allocator_.num_available()} - plan.from_lru - plan.fresh;
  return after >= watermark_blocks_ ? Admission::kOk : Admission::kLater;
}

PrefixLookup KVCacheManager::lookup_prefix(std::span<const TokenId> prompt,
                                           uint64_t extra_key) const {
  PrefixLookup out;
  if (!config_.enable_prefix_caching) return out;
  const int64_t bs = config_.block_size;
  walk_prefix(prefix_, prompt, bs, extra_key,
              eligible_blocks(static_cast<int64_t>(prompt.size()), bs),
              [&](BlockId b, BlockHash, uint64_t) { out.blocks.push_back(b); });
  out.num_computed_tokens = static_cast<int64_t>(out.blocks.size()) * bs;
  return out;
}

std::optional<AddResult> KVCacheManager::add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                                      uint64_t extra_key) {
  return add_sequence(seq, prompt, AddOptions{.extra_key = extra_key});
}

std::optional<AddResult> KVCacheManager::add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                                      const AddOptions& options) {
  PAGEDKV_CHECK(seq != kPaddingSeq, "KVCacheManager::add_sequence: id {} is reserved for padding",
                seq);
  PAGEDKV_CHECK(!seqs_.contains(seq), "KVCacheManager::add_sequence: sequence {} already exists",
                seq);
  // can_add_sequence(prompt, options) == kOk, with one walk of the cached prefix for both.
  check_options(options);
  if (never_fits(static_cast<int64_t>(prompt.size()), options) == Admission::kNever) {
    return std::nullopt;
  }
  AddPlan plan = plan_add(prefix_, allocator_, config_, prompt, options, true);
  if (int64_t{allocator_.num_available()} - plan.from_lru - plan.fresh < watermark_blocks_) {
    return std::nullopt;
  }
  PrefixMatch& match = plan.match;
  const int64_t len = static_cast<int64_t>(prompt.size());
  const int64_t bs = config_.block_size;
  // Retain hits before allocating: a hit that sits in the LRU must not be evicted by our own
  // allocation.
  for (BlockId b : match.blocks) allocator_.retain(b);
  const auto fresh = static_cast<int32_t>(plan.fresh);
  std::optional<std::vector<BlockId>> ids = allocate_blocks(fresh);
  // can_add_sequence() said kOk, so the pool covers `fresh` after the retains.
  PAGEDKV_CHECK(ids.has_value(), "KVCacheManager::add_sequence: internal: {} blocks not available",
                fresh);

  Sequence s = new_sequence();
  s.blocks = std::move(match.blocks);
  s.blocks.insert(s.blocks.end(), ids->begin(), ids->end());
  s.placeholders.assign(s.blocks.size(), -1);
  s.num_tokens = plan.tokens;
  // Room for the whole prompt and the tokens the request may generate: appends up to there do
  // not copy the list again (it can be a long prompt's worth of ids).
  s.token_ids.reserve(static_cast<size_t>(len + options.max_new_tokens));
  s.token_ids.assign(prompt.begin(), prompt.begin() + plan.tokens);
  s.hashes = std::move(match.hashes);
  s.serials = std::move(match.serials);
  s.extra_key = options.extra_key;
  s.kept.add_positional(0, plan.tokens, config_.block_size);

  AddResult result;
  result.num_computed_tokens = static_cast<int64_t>(s.hashes.size()) * bs;
  s.committed = result.num_computed_tokens;  // hit blocks hold written K/V
  if (options.return_slots) {
    append_position_slots(s.blocks, result.num_computed_tokens,
                          plan.tokens - result.num_computed_tokens, bs, result.append.slots);
  }
  if (config_.enable_prefix_caching) {
    const auto hits = static_cast<int64_t>(s.hashes.size());
    counters_.prefix_query_tokens += len;
    counters_.prefix_hit_tokens += result.num_computed_tokens;
    counters_.prefix_hits += hits;
    counters_.prefix_misses += match.eligible - hits;
  }
  seqs_.emplace(seq, std::move(s));
  return result;
}

int32_t KVCacheManager::commit(SeqId seq, int64_t num_tokens) {
  // One lookup: commit runs once per sequence per step.
  auto& s = const_cast<Sequence&>(get_running(seq, "commit"));
  PAGEDKV_CHECK(num_tokens >= 0 && num_tokens <= s.num_tokens,
                "KVCacheManager::commit: {} tokens for sequence {}, which holds {}", num_tokens,
                seq, s.num_tokens);
  if (num_tokens <= s.committed) return 0;
  s.committed = num_tokens;
  return register_full_blocks(s);
}

int64_t KVCacheManager::num_committed_tokens(SeqId seq) const {
  return get(seq, "num_committed_tokens").committed;
}

bool KVCacheManager::entry_alive(BlockHash hash, uint64_t serial) const {
  const std::optional<BlockId> b = prefix_.find(hash);
  return b && prefix_.entry(*b)->serial == serial;
}

int32_t KVCacheManager::register_full_blocks(Sequence& s) {
  // A sparse table's entries do not hold the positions their index says: nothing to key.
  if (!config_.enable_prefix_caching || !s.ids_known || !s.publishable || s.kept.sparse()) {
    return 0;
  }
  const int64_t bs = config_.block_size;
  const auto first = static_cast<int64_t>(s.hashes.size());
  const int64_t last = s.committed / bs;  // full committed blocks: keys [first, last) are new
  if (last <= first) return 0;
  // The keys first (a chain over the tokens, no lookups), each index cell and block record
  // prefetched as its key is known: a fresh key's cell and a reused block's record are cache
  // misses, and a prefill chunk registers hundreds of blocks, so their misses overlap instead
  // of following one another.
  // Room for both lists first (geometric, as push_back: commits come one decode block at a
  // time), so that a bad_alloc cannot leave keys without serials.
  for (auto* v : {&s.hashes, &s.serials}) {
    if (v->capacity() < static_cast<size_t>(last)) {
      v->reserve(std::max(static_cast<size_t>(last), 2 * v->capacity()));
    }
  }
  for (int64_t j = first; j < last; ++j) {
    const BlockHash parent = j == 0 ? kRootBlockHash : s.hashes[j - 1];
    std::span<const TokenId> tokens(s.token_ids.data() + j * bs, static_cast<size_t>(bs));
    s.hashes.push_back(block_hash(parent, tokens, s.extra_key));
    prefix_.prefetch_key(s.hashes.back());
    prefix_.prefetch_block(s.blocks[j]);  // its record is read, then written by the insert
  }
  int32_t published = 0;
  for (int64_t j = first; j < last; ++j) {
    const BlockHash parent = j == 0 ? kRootBlockHash : s.hashes[j - 1];
    const uint64_t parent_serial = j == 0 ? 0 : s.serials[j - 1];
    std::span<const TokenId> tokens(s.token_ids.data() + j * bs, static_cast<size_t>(bs));
    const BlockHash h = s.hashes[j];
    uint64_t serial = 0;
    const BlockId b = s.blocks[j];
    // A block is registered only under the very parent entry its chain recorded, while that
    // entry is still in the index: lookups walk from the root, so an entry below a gap (after
    // reset_prefix_cache, or once the parent entry was evicted) could never be reached, would
    // hold its key and would announce a parent that is gone. The chain stops there instead.
    // Within this call nothing is erased, so the previous block's entry, registered or found by
    // the previous iteration (parent_serial != 0), is still alive: only the first block's parent
    // (from an earlier commit) is looked up.
    const bool parent_alive =
        j == 0 || (parent_serial != 0 && (j > first || entry_alive(parent, parent_serial)));
    if (parent_alive && b != kNoBlock) {
      if (std::optional<BlockId> existing = prefix_.find(h)) {
        // Same key: the same content computed twice (keep the first, chain on it) or a
        // collision (stop the chain).
        if (prefix_.lookup(h, parent_serial, s.extra_key, tokens)) {
          serial = prefix_.entry(*existing)->serial;
        }
      } else if (prefix_.entry(b) == nullptr) {
        serial = prefix_.insert(b,
                                {.hash = h,
                                 .parent_hash = parent,
                                 .parent_serial = parent_serial,
                                 .extra_key = s.extra_key},
                                tokens);
        allocator_.set_cached(b, true);
        ++published;
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
    s.serials.push_back(serial);
  }
  return published;
}

std::optional<std::vector<BlockId>> KVCacheManager::allocate_evicting(int32_t n) {
  // A member list, so that its capacity is kept: an eviction costs no heap allocation.
  evicted_.clear();
  std::optional<std::vector<BlockId>> ids = allocator_.allocate(n, evicted_);
  // LRU victims are the coldest blocks of all: load their prefix state in one pass first.
  prefix_.prefetch_erase(evicted_);
  for (BlockId b : evicted_) drop_evicted(b);
  evicted_.clear();
  return ids;
}

void KVCacheManager::drop_evicted(BlockId b) {
  // The allocator handed a cached ref-0 block out for other content: forget that content, and
  // everything chained below it, which no lookup could reach any more.
  ++counters_.prefix_evictions;
  if (prefix_.entry(b) == nullptr) return;  // already dropped below an evicted parent
  drop_descendants(b);
  std::optional<PrefixCache::Entry> e = prefix_.erase(b);
  KVCacheEvent event;
  event.kind = KVCacheEvent::Kind::kEvicted;
  event.block = b;
  event.hash = e->hash;
  emit(std::move(event));
}

void KVCacheManager::drop_descendants(BlockId b) {
  // Depth first from b; each removed entry is a kRemoved event. A descendant nobody holds
  // becomes free; one in use stays with its sequences, unshareable; one the current allocation
  // just evicted is no longer cached (drop_evicted skips it later).
  std::vector<BlockId> todo;
  prefix_.children(b, todo);
  while (!todo.empty()) {
    const BlockId c = todo.back();
    todo.pop_back();
    prefix_.children(c, todo);
    std::optional<PrefixCache::Entry> e = prefix_.erase(c);
    if (allocator_.is_cached(c)) allocator_.set_cached(c, false);
    KVCacheEvent event;
    event.kind = KVCacheEvent::Kind::kRemoved;
    event.block = c;
    event.hash = e->hash;
    emit(std::move(event));
  }
}

int32_t KVCacheManager::reset_prefix_cache() {
  // K/V computed before the reset (e.g. under old weights) must never be shared afterwards, nor
  // any block after them (it attends to them): such a sequence publishes nothing more.
  for (auto& [id, s] : seqs_) {
    if (s.committed > 0) s.publishable = false;
  }
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
  // After the per-entry events, so that a consumer of kRemoved alone stays right.
  KVCacheEvent cleared;
  cleared.kind = KVCacheEvent::Kind::kAllCleared;
  emit(std::move(cleared));
  return n;
}

}  // namespace pagedkv
