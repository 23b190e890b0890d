#include "pagedkv/metadata/kv_cache_manager.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/check.hpp"

namespace pagedkv {

namespace {
const KVCacheManagerConfig& validated(const KVCacheManagerConfig& config) {
  PAGEDKV_CHECK(config.num_blocks >= 1, "KVCacheManager: num_blocks must be >= 1, got {}",
                config.num_blocks);
  PAGEDKV_CHECK(config.block_size >= 1, "KVCacheManager: block_size must be >= 1, got {}",
                config.block_size);
  PAGEDKV_CHECK(config.num_host_blocks >= 0, "KVCacheManager: num_host_blocks must be >= 0, got {}",
                config.num_host_blocks);
  PAGEDKV_CHECK(config.watermark >= 0.0 && config.watermark < 1.0,
                "KVCacheManager: watermark must be in [0, 1), got {}", config.watermark);
  PAGEDKV_CHECK(config.max_model_len >= 0,
                "KVCacheManager: max_model_len must be >= 0 (0 = unlimited), got {}",
                config.max_model_len);
  return config;
}
}  // namespace

std::string_view admission_name(Admission admission) {
  switch (admission) {
    case Admission::kOk:
      return "ok";
    case Admission::kLater:
      return "later";
    case Admission::kNever:
      return "never";
  }
  return "unknown";
}

std::string_view event_kind_name(KVCacheEvent::Kind kind) {
  switch (kind) {
    case KVCacheEvent::Kind::kStored:
      return "stored";
    case KVCacheEvent::Kind::kRemoved:
      return "removed";
    case KVCacheEvent::Kind::kEvicted:
      return "evicted";
  }
  return "unknown";
}

/// Everything an append will do, computed without changing anything, so that can_append and
/// append_slots cannot disagree and the append can commit without a failure point.
struct KVCacheManager::AppendPlan {
  std::vector<int32_t> release;  // table entries whose block token eviction releases
  int32_t freed = 0;             // of those, blocks whose ref count drops to 0 (available again)
  std::vector<size_t> victims;   // heavy hitters: indices into Sequence::kept
  bool sparse = false;           // heavy hitters: new tokens fill holes (explicit kept list)
  bool cow = false;              // copy the shared, partially filled last block first
  int32_t fresh = 0;             // blocks taken from the pool (copy-on-write included)
  // Sparse: (entry, offset) of the first new tokens, in existing blocks; the rest go to fresh
  // blocks, placed at fresh_entries (an entry index, or -1 = append to the table).
  std::vector<std::pair<int32_t, int32_t>> holes;
  std::vector<int32_t> fresh_entries;
};

KVCacheManager::KVCacheManager(const KVCacheManagerConfig& config)
    : config_(validated(config)),
      allocator_(config.num_blocks),
      host_(config.num_host_blocks > 0 ? std::make_unique<BlockAllocator>(config.num_host_blocks)
                                       : nullptr),
      prefix_(config.num_blocks, config.block_size),
      policy_(make_eviction_policy(config.eviction)),
      watermark_blocks_(static_cast<int32_t>(std::floor(config.watermark * config.num_blocks))) {
  allocator_.set_eviction_listener([this](BlockId b) { on_evict(b); });
  counters_.host_total_blocks = config.num_host_blocks;
}

KVCacheManager::KVCacheManager(const KVCacheManager& other)
    : config_(other.config_),
      allocator_(other.allocator_),
      host_(other.host_ ? std::make_unique<BlockAllocator>(*other.host_) : nullptr),
      prefix_(other.prefix_),
      policy_(other.policy_),
      watermark_blocks_(other.watermark_blocks_),
      seqs_(other.seqs_),
      counters_(other.counters_),
      events_(other.events_) {
  // The copied listener would still point at `other`.
  allocator_.set_eviction_listener([this](BlockId b) { on_evict(b); });
}

KVCacheManager& KVCacheManager::operator=(const KVCacheManager& other) {
  if (this != &other) {
    KVCacheManager copy(other);
    *this = std::move(copy);
  }
  return *this;
}

KVCacheManager::KVCacheManager(KVCacheManager&& other) noexcept
    : config_(std::move(other.config_)),
      allocator_(std::move(other.allocator_)),
      host_(std::move(other.host_)),
      prefix_(std::move(other.prefix_)),
      policy_(std::move(other.policy_)),
      watermark_blocks_(other.watermark_blocks_),
      seqs_(std::move(other.seqs_)),
      counters_(other.counters_),
      events_(std::move(other.events_)) {
  allocator_.set_eviction_listener([this](BlockId b) { on_evict(b); });
}

KVCacheManager& KVCacheManager::operator=(KVCacheManager&& other) noexcept {
  config_ = std::move(other.config_);
  allocator_ = std::move(other.allocator_);
  host_ = std::move(other.host_);
  prefix_ = std::move(other.prefix_);
  policy_ = std::move(other.policy_);
  watermark_blocks_ = other.watermark_blocks_;
  seqs_ = std::move(other.seqs_);
  counters_ = other.counters_;
  events_ = std::move(other.events_);
  allocator_.set_eviction_listener([this](BlockId b) { on_evict(b); });
  return *this;
}

const KVCacheManager::Sequence& KVCacheManager::get(SeqId seq, const char* op) const {
  auto it = seqs_.find(seq);
  PAGEDKV_CHECK(it != seqs_.end(), "KVCacheManager::{}: unknown sequence {}", op, seq);
  return it->second;
}

KVCacheManager::Sequence& KVCacheManager::get(SeqId seq, const char* op) {
  return const_cast<Sequence&>(std::as_const(*this).get(seq, op));
}

const KVCacheManager::Sequence& KVCacheManager::get_running(SeqId seq, const char* op) const {
  const Sequence& s = get(seq, op);
  PAGEDKV_CHECK(!s.swapped, "KVCacheManager::{}: sequence {} is swapped out (swap_in first)", op,
                seq);
  return s;
}

void KVCacheManager::emit(KVCacheEvent event) {
  if (config_.enable_events) events_.push_back(std::move(event));
}

void KVCacheManager::on_evict(BlockId b) {
  // The allocator is about to hand a cached ref-0 block out for other content: forget it.
  std::optional<PrefixCache::Entry> e = prefix_.erase(b);
  ++counters_.prefix_evictions;
  if (!e) return;
  KVCacheEvent event;
  event.kind = KVCacheEvent::Kind::kEvicted;
  event.block = b;
  event.hash = e->hash;
  emit(std::move(event));
}

void KVCacheManager::release_block(BlockId b) { allocator_.release(b); }

// ---- admission and prompts ---------------------------------------------------------------------

namespace {
/// Prefix-cache lookup result for a prompt.
struct PrefixMatch {
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;
  std::vector<uint64_t> serials;
  int32_t from_lru = 0;  // hit blocks that are cached with ref count 0
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
  // Prefix hits (same walk as add_sequence).
  int64_t hits = 0;
  int64_t from_lru = 0;
  if (config_.enable_prefix_caching && len > 0) {
    BlockHash parent = kRootBlockHash;
    uint64_t parent_serial = 0;
    for (int64_t j = 0; j < (len - 1) / bs; ++j) {
      auto tokens = prompt.subspan(j * bs, bs);
      const BlockHash h = block_hash(parent, tokens, extra_key);
      std::optional<BlockId> b = prefix_.lookup(h, parent_serial, extra_key, tokens);
      if (!b) break;
      ++hits;
      if (allocator_.ref_count(*b) == 0) ++from_lru;
      parent = h;
      parent_serial = prefix_.entry(*b)->serial;
    }
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
  if (config_.enable_prefix_caching && len > 0) {
    match.eligible = (len - 1) / bs;
    BlockHash parent = kRootBlockHash;
    uint64_t parent_serial = 0;
    for (int64_t j = 0; j < match.eligible; ++j) {
      auto tokens = prompt.subspan(j * bs, bs);
      const BlockHash h = block_hash(parent, tokens, extra_key);
      std::optional<BlockId> b = prefix_.lookup(h, parent_serial, extra_key, tokens);
      if (!b) break;
      match.blocks.push_back(*b);
      match.hashes.push_back(h);
      parent = h;
      parent_serial = prefix_.entry(*b)->serial;
      match.serials.push_back(parent_serial);
    }
  }
  // Retain hits before allocating: a hit that sits in the LRU must not be evicted by our own
  // allocation.
  for (BlockId b : match.blocks) allocator_.retain(b);
  const int32_t fresh =
      static_cast<int32_t>(blocks_for_tokens(len, bs)) - static_cast<int32_t>(match.blocks.size());
  std::optional<std::vector<BlockId>> ids = allocator_.allocate(fresh);
  // can_add_sequence() said kOk, so the pool covers `fresh` after the retains.
  PAGEDKV_CHECK(ids.has_value(), "KVCacheManager::add_sequence: internal: {} blocks not available",
                fresh);

  Sequence s;
  s.blocks = match.blocks;
  s.blocks.insert(s.blocks.end(), ids->begin(), ids->end());
  s.placeholders.assign(s.blocks.size(), -1);
  s.num_tokens = len;
  s.token_ids.assign(prompt.begin(), prompt.end());
  s.hashes = match.hashes;
  s.serials = match.serials;
  s.extra_key = extra_key;
  if (policy_->kind() == EvictionKind::kHeavyHitters) {
    s.kept.reserve(static_cast<size_t>(len));
    for (int64_t p = 0; p < len; ++p) {
      s.kept.push_back({p, static_cast<int32_t>(p / bs), static_cast<int32_t>(p % bs), 0.0});
    }
  }

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

void KVCacheManager::add_sequence(SeqId seq) {
  PAGEDKV_CHECK(seq != kPaddingSeq, "KVCacheManager::add_sequence: id {} is reserved for padding",
                seq);
  PAGEDKV_CHECK(!seqs_.contains(seq), "KVCacheManager::add_sequence: sequence {} already exists",
                seq);
  seqs_.emplace(seq, Sequence{});
}

void KVCacheManager::register_full_blocks(Sequence& s) {
  if (!config_.enable_prefix_caching || !s.ids_known || s.sparse) return;
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

// ---- free, fork --------------------------------------------------------------------------------

void KVCacheManager::free_sequence(SeqId seq) {
  Sequence& s = get(seq, "free_sequence");
  BlockAllocator& pool = s.swapped ? *host_ : allocator_;
  // Tail blocks first: if they become cached, they are evicted before the head blocks that
  // other prompts are more likely to share.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) {
    if (*it != kNoBlock) pool.release(*it);
  }
  seqs_.erase(seq);
}

void KVCacheManager::fork(SeqId parent, SeqId child) {
  const Sequence& p = get_running(parent, "fork");
  PAGEDKV_CHECK(child != kPaddingSeq, "KVCacheManager::fork: id {} is reserved for padding", child);
  PAGEDKV_CHECK(!seqs_.contains(child), "KVCacheManager::fork: sequence {} already exists", child);
  Sequence copy = p;  // copy before emplace: emplace may rehash and move p
  for (BlockId b : copy.blocks) {
    if (b != kNoBlock) allocator_.retain(b);
  }
  seqs_.emplace(child, std::move(copy));
}

// ---- append ------------------------------------------------------------------------------------

KVCacheManager::AppendPlan KVCacheManager::plan_append(const Sequence& s, int64_t n,
                                                       const char* op) const {
  PAGEDKV_CHECK(n >= 0, "KVCacheManager::{}: token count must be >= 0, got {}", op, n);
  PAGEDKV_CHECK(config_.max_model_len == 0 || s.num_tokens + n <= config_.max_model_len,
                "KVCacheManager::{}: {} + {} tokens exceed max_model_len {}", op, s.num_tokens, n,
                config_.max_model_len);
  const int64_t bs = config_.block_size;
  const int64_t t = s.num_tokens;
  AppendPlan plan;
  if (n == 0) return plan;

  if (policy_->kind() == EvictionKind::kHeavyHitters) {
    std::vector<KeptTokenScore> scores;
    scores.reserve(s.kept.size());
    for (const Kept& k : s.kept) scores.push_back({k.position, k.score});
    plan.victims = policy_->select_victims(scores, t, n);
    plan.sparse = s.sparse || !plan.victims.empty();
  }

  if (!plan.sparse) {
    if (policy_->is_positional() && policy_->kind() != EvictionKind::kNone) {
      // Release full blocks none of whose positions a query at >= t can see. The policies'
      // unneeded set is one interval of positions, so checking both ends of a block suffices.
      const int64_t full = t / bs;
      for (int64_t j = 0; j < full; ++j) {
        if (s.blocks[j] == kNoBlock) continue;
        if (!policy_->is_needed(j * bs, t) && !policy_->is_needed((j + 1) * bs - 1, t)) {
          plan.release.push_back(static_cast<int32_t>(j));
          if (allocator_.ref_count(s.blocks[j]) == 1) ++plan.freed;
        }
      }
    }
    // Copy-on-write: writing into a shared, partially filled last block needs a private copy.
    plan.cow = t % bs != 0 && allocator_.ref_count(s.blocks.back()) > 1;
    plan.fresh = static_cast<int32_t>(std::min<int64_t>(
        blocks_for_tokens(t + n, bs) - static_cast<int64_t>(s.blocks.size()) + (plan.cow ? 1 : 0),
        INT32_MAX));
    return plan;
  }

  // Sparse (heavy hitters after the first eviction): live tokens per entry once the victims
  // are gone; emptied blocks are released; new tokens fill free offsets of blocks this
  // sequence owns alone and that the prefix cache does not hold (their contents must not
  // change), then fresh blocks.
  const size_t num_entries = s.blocks.size();
  std::vector<std::vector<uint8_t>> used(num_entries);
  std::vector<int32_t> live(num_entries, 0);
  std::vector<uint8_t> is_victim(s.kept.size(), 0);
  for (size_t v : plan.victims) is_victim[v] = 1;
  for (size_t i = 0; i < s.kept.size(); ++i) {
    if (is_victim[i]) continue;
    const Kept& k = s.kept[i];
    if (used[k.entry].empty()) used[k.entry].assign(static_cast<size_t>(bs), 0);
    used[k.entry][k.offset] = 1;
    ++live[k.entry];
  }
  std::vector<uint8_t> released(num_entries, 0);
  for (size_t j = 0; j < num_entries; ++j) {
    if (s.blocks[j] == kNoBlock || live[j] > 0) continue;
    plan.release.push_back(static_cast<int32_t>(j));
    released[j] = 1;
    if (allocator_.ref_count(s.blocks[j]) == 1) ++plan.freed;
  }
  for (size_t j = 0; j < num_entries && static_cast<int64_t>(plan.holes.size()) < n; ++j) {
    const BlockId b = s.blocks[j];
    if (b == kNoBlock || released[j] || allocator_.ref_count(b) != 1 || allocator_.is_cached(b)) {
      continue;
    }
    for (int32_t off = 0; off < bs && static_cast<int64_t>(plan.holes.size()) < n; ++off) {
      if (used[j].empty() || !used[j][off]) plan.holes.emplace_back(static_cast<int32_t>(j), off);
    }
  }
  const int64_t rest = n - static_cast<int64_t>(plan.holes.size());
  plan.fresh = static_cast<int32_t>(std::min<int64_t>(blocks_for_tokens(rest, bs), INT32_MAX));
  for (size_t j = 0;
       j < num_entries && static_cast<int32_t>(plan.fresh_entries.size()) < plan.fresh; ++j) {
    if (s.blocks[j] == kNoBlock || released[j])
      plan.fresh_entries.push_back(static_cast<int32_t>(j));
  }
  while (static_cast<int32_t>(plan.fresh_entries.size()) < plan.fresh)
    plan.fresh_entries.push_back(-1);
  return plan;
}

int32_t KVCacheManager::blocks_needed_to_append(SeqId seq, int64_t n) const {
  return plan_append(get_running(seq, "blocks_needed_to_append"), n, "blocks_needed_to_append")
      .fresh;
}

bool KVCacheManager::can_append(SeqId seq, int64_t n) const {
  const AppendPlan plan = plan_append(get_running(seq, "can_append"), n, "can_append");
  return int64_t{plan.fresh} <= int64_t{allocator_.num_available()} + plan.freed;
}

std::optional<AppendResult> KVCacheManager::append_slots(SeqId seq, int64_t n) {
  return do_append(seq, n, {}, "append_slots");
}

std::optional<AppendResult> KVCacheManager::append_tokens(SeqId seq,
                                                          std::span<const TokenId> tokens) {
  return do_append(seq, static_cast<int64_t>(tokens.size()), tokens, "append_tokens");
}

std::optional<AppendResult> KVCacheManager::do_append(SeqId seq, int64_t n,
                                                      std::span<const TokenId> ids,
                                                      const char* op) {
  get_running(seq, op);
  Sequence& s = get(seq, op);
  const AppendPlan plan = plan_append(s, n, op);
  if (int64_t{plan.fresh} > int64_t{allocator_.num_available()} + plan.freed) return std::nullopt;

  // Commit. Nothing below can fail for lack of blocks: the plan was checked against the pool.
  const int64_t bs = config_.block_size;
  const int64_t t = s.num_tokens;
  if (!plan.victims.empty()) {
    std::vector<uint8_t> gone(s.kept.size(), 0);
    for (size_t v : plan.victims) gone[v] = 1;
    size_t w = 0;
    for (size_t i = 0; i < s.kept.size(); ++i) {
      if (!gone[i]) s.kept[w++] = s.kept[i];
    }
    s.kept.resize(w);
    counters_.evicted_tokens += static_cast<int64_t>(plan.victims.size());
  }
  for (int32_t j : plan.release) {
    s.placeholders[j] = s.blocks[j];
    s.blocks[j] = kNoBlock;
  }
  // Release after the table update, last entry first (the LRU then evicts later positions
  // before earlier ones, as free_sequence does).
  for (auto it = plan.release.rbegin(); it != plan.release.rend(); ++it) {
    release_block(s.placeholders[*it]);
  }
  counters_.released_blocks += static_cast<int64_t>(plan.release.size());
  std::optional<std::vector<BlockId>> fresh = allocator_.allocate(plan.fresh);
  PAGEDKV_CHECK(fresh.has_value(), "KVCacheManager::{}: internal: {} blocks not available", op,
                plan.fresh);

  AppendResult result;
  result.slots.reserve(static_cast<size_t>(n));
  const bool h2o = policy_->kind() == EvictionKind::kHeavyHitters;
  if (!plan.sparse) {
    auto next_fresh = fresh->begin();
    if (plan.cow) {
      const BlockId shared = s.blocks.back();
      const BlockId copy = *next_fresh++;
      result.copies.push_back({shared, copy});
      allocator_.release(shared);  // ref > 1, so this only drops our reference
      s.blocks.back() = copy;
    }
    for (; next_fresh != fresh->end(); ++next_fresh) {
      s.blocks.push_back(*next_fresh);
      s.placeholders.push_back(-1);
    }
    for (int64_t pos = t; pos < t + n; ++pos) {
      result.slots.push_back(static_cast<Slot>(s.blocks[pos / bs]) * bs + pos % bs);
      if (h2o) {
        s.kept.push_back(
            {pos, static_cast<int32_t>(pos / bs), static_cast<int32_t>(pos % bs), 0.0});
      }
    }
  } else {
    s.sparse = true;
    std::vector<std::pair<int32_t, int32_t>> targets = plan.holes;
    for (size_t f = 0; f < fresh->size(); ++f) {
      int32_t entry = plan.fresh_entries[f];
      if (entry < 0) {
        entry = static_cast<int32_t>(s.blocks.size());
        s.blocks.push_back((*fresh)[f]);
        s.placeholders.push_back(-1);
      } else {
        s.blocks[entry] = (*fresh)[f];
        s.placeholders[entry] = -1;
      }
      for (int32_t off = 0; off < bs && static_cast<int64_t>(targets.size()) < n; ++off) {
        targets.emplace_back(entry, off);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const auto [entry, off] = targets[i];
      result.slots.push_back(static_cast<Slot>(s.blocks[entry]) * bs + off);
      s.kept.push_back({t + i, entry, off, 0.0});
    }
  }
  s.num_tokens += n;
  if (n > 0) {
    if (ids.empty()) {
      // Unknown token ids: the sequence can no longer key its blocks.
      s.ids_known = false;
      s.token_ids.clear();
      s.token_ids.shrink_to_fit();
    } else if (s.ids_known) {
      s.token_ids.insert(s.token_ids.end(), ids.begin(), ids.end());
    }
  }
  register_full_blocks(s);
  return result;
}

// ---- metadata ----------------------------------------------------------------------------------

BatchMetadata KVCacheManager::batch_metadata(std::span<const SeqId> seqs,
                                             std::span<const int64_t> num_new_tokens) const {
  BatchMetadata meta;
  batch_metadata(seqs, num_new_tokens, meta);
  return meta;
}

void KVCacheManager::batch_metadata(std::span<const SeqId> seqs,
                                    std::span<const int64_t> num_new_tokens,
                                    BatchMetadata& out) const {
  PAGEDKV_CHECK(seqs.size() == num_new_tokens.size(),
                "KVCacheManager::batch_metadata: {} sequences but {} new-token counts", seqs.size(),
                num_new_tokens.size());
  const int64_t bs = config_.block_size;
  // Every check first, so that a throw leaves `out` untouched; nullptr marks a padding row.
  std::vector<const Sequence*> rows(seqs.size(), nullptr);
  int64_t total_new = 0;
  int64_t total_blocks = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n_new = num_new_tokens[i];
    if (seqs[i] == kPaddingSeq) {
      PAGEDKV_CHECK(n_new == 0,
                    "KVCacheManager::batch_metadata: padding row {} must have 0 new tokens, got {}",
                    i, n_new);
      continue;
    }
    const Sequence& s = get_running(seqs[i], "batch_metadata");
    PAGEDKV_CHECK(!s.sparse,
                  "KVCacheManager::batch_metadata: sequence {} has evicted heavy-hitter tokens; "
                  "its table is not positional (use kept_tokens + paged_attention_over_slots)",
                  seqs[i]);
    PAGEDKV_CHECK(n_new >= 0 && n_new <= s.num_tokens,
                  "KVCacheManager::batch_metadata: sequence {} has {} tokens, cannot write {} new",
                  seqs[i], s.num_tokens, n_new);
    PAGEDKV_CHECK(s.num_tokens <= INT32_MAX,
                  "KVCacheManager::batch_metadata: sequence {} context {} exceeds int32", seqs[i],
                  s.num_tokens);
    for (int64_t pos = s.num_tokens - n_new; pos < s.num_tokens; ++pos) {
      PAGEDKV_CHECK(s.blocks[pos / bs] != kNoBlock,
                    "KVCacheManager::batch_metadata: position {} of sequence {} is in a block "
                    "released by token eviction",
                    pos, seqs[i]);
    }
    rows[i] = &s;
    total_new += n_new;
    total_blocks += blocks_for_tokens(s.num_tokens, bs);
  }
  // The formats' int32 offsets (query_start, CSR indptr), checked here rather than by the
  // builders below, which run after `out` has been partly written.
  PAGEDKV_CHECK(total_new <= INT32_MAX,
                "KVCacheManager::batch_metadata: {} new tokens overflow the int32 query_start",
                total_new);
  PAGEDKV_CHECK(total_blocks <= INT32_MAX,
                "KVCacheManager::batch_metadata: {} blocks in the batch overflow the int32 indptr",
                total_blocks);

  // Tables are read in place; only one with entries released by token eviction is copied, to
  // put back the id each released block had: never read under the policy's mask, and a valid
  // id, so kernels' range checks hold. (A kernel that ignored the mask would read a block now
  // owned by someone else; the NaN-poisoning tests catch exactly that.)
  std::vector<std::span<const BlockId>> tables(seqs.size());
  std::vector<int32_t> lens(seqs.size(), 0);
  std::vector<std::vector<BlockId>> patched;  // reserved before the first push: spans stay valid
  out.block_size = config_.block_size;
  out.slot_mapping.clear();
  out.slot_mapping.reserve(static_cast<size_t>(total_new));
  out.query_start.clear();
  out.query_start.reserve(seqs.size() + 1);
  out.query_start.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence* s = rows[i];
    const int64_t n_new = s == nullptr ? 0 : num_new_tokens[i];
    out.query_start.push_back(out.query_start.back() + static_cast<int32_t>(n_new));
    if (s == nullptr) continue;
    tables[i] = s->blocks;
    // Ids are >= 0 and kNoBlock is -1, so OR-ing the entries sets the sign bit exactly when one
    // was released; this reduction vectorizes, where std::find took a third of the call.
    uint32_t bits = 0;
    for (BlockId b : s->blocks) bits |= static_cast<uint32_t>(b);
    if (static_cast<int32_t>(bits) < 0) {
      if (patched.empty()) patched.reserve(seqs.size());
      std::vector<BlockId>& table = patched.emplace_back(s->blocks);
      for (size_t j = 0; j < table.size(); ++j) {
        if (table[j] == kNoBlock) table[j] = s->placeholders[j];
      }
      tables[i] = table;
    }
    lens[i] = static_cast<int32_t>(s->num_tokens);
    for (int64_t pos = s->num_tokens - n_new; pos < s->num_tokens; ++pos) {
      out.slot_mapping.push_back(slot_for_position(s->blocks, pos, config_.block_size));
    }
  }
  build_padded_block_tables(tables, lens, config_.block_size, out.padded);
  build_csr_block_tables(tables, lens, config_.block_size, out.csr);
}

KeptTokens KVCacheManager::kept_tokens(std::span<const SeqId> seqs) const {
  KeptTokens out;
  out.indptr.reserve(seqs.size() + 1);
  out.indptr.push_back(0);
  const int64_t bs = config_.block_size;
  for (SeqId id : seqs) {
    if (id != kPaddingSeq) {
      const Sequence& s = get_running(id, "kept_tokens");
      if (policy_->kind() == EvictionKind::kHeavyHitters) {
        for (const Kept& k : s.kept) {
          out.slots.push_back(static_cast<Slot>(s.blocks[k.entry]) * bs + k.offset);
          out.positions.push_back(k.position);
        }
      } else {
        // Visible from the last token, q = T - 1: [0, min(S, T)) and [max(S, T - W), T).
        const int64_t t = s.num_tokens;
        const EvictionPolicyConfig& c = policy_->config();
        const bool windowed = policy_->kind() != EvictionKind::kNone;
        const int64_t sinks = windowed ? std::min<int64_t>(c.sinks, t) : t;
        const int64_t lo = windowed ? std::max<int64_t>(sinks, t - c.window) : t;
        auto add = [&](int64_t p) {
          out.slots.push_back(static_cast<Slot>(s.blocks[p / bs]) * bs + p % bs);
          out.positions.push_back(p);
        };
        for (int64_t p = 0; p < sinks; ++p) add(p);
        for (int64_t p = lo; p < t; ++p) add(p);
      }
    }
    PAGEDKV_CHECK(out.slots.size() <= static_cast<size_t>(INT32_MAX),
                  "KVCacheManager::kept_tokens: {} kept tokens exceed int32", out.slots.size());
    out.indptr.push_back(static_cast<int32_t>(out.slots.size()));
  }
  return out;
}

void KVCacheManager::accumulate_attention(SeqId seq, std::span<const float> weights) {
  Sequence& s = get(seq, "accumulate_attention");
  PAGEDKV_CHECK(!s.swapped, "KVCacheManager::accumulate_attention: sequence {} is swapped out",
                seq);
  PAGEDKV_CHECK(policy_->kind() == EvictionKind::kHeavyHitters,
                "KVCacheManager::accumulate_attention: policy '{}' keeps no scores (heavy hitters "
                "only)",
                eviction_kind_name(policy_->kind()));
  PAGEDKV_CHECK(
      weights.size() == s.kept.size(),
      "KVCacheManager::accumulate_attention: {} weights for {} kept tokens of sequence {}",
      weights.size(), s.kept.size(), seq);
  for (size_t i = 0; i < weights.size(); ++i) {
    PAGEDKV_CHECK(std::isfinite(weights[i]) && weights[i] >= 0.0f,
                  "KVCacheManager::accumulate_attention: weight {} of sequence {} is {}", i, seq,
                  weights[i]);
  }
  for (size_t i = 0; i < weights.size(); ++i) s.kept[i].score += weights[i];
}

// ---- swap and preemption -----------------------------------------------------------------------

namespace {
int32_t live_blocks(std::span<const BlockId> blocks) {
  return static_cast<int32_t>(
      std::count_if(blocks.begin(), blocks.end(), [](BlockId b) { return b >= 0; }));
}
}  // namespace

bool KVCacheManager::can_swap_out(SeqId seq) const {
  const Sequence& s = get_running(seq, "can_swap_out");
  return host_ != nullptr && live_blocks(s.blocks) <= host_->num_available();
}

std::optional<SwapResult> KVCacheManager::swap_out(SeqId seq) {
  if (!can_swap_out(seq)) return std::nullopt;
  Sequence& s = get(seq, "swap_out");
  const int32_t n = live_blocks(s.blocks);
  std::optional<std::vector<BlockId>> host_ids = host_->allocate(n);
  PAGEDKV_CHECK(host_ids.has_value(), "KVCacheManager::swap_out: internal: {} host blocks", n);
  SwapResult result;
  std::vector<BlockId> device;
  device.reserve(static_cast<size_t>(n));
  size_t k = 0;
  for (BlockId& b : s.blocks) {
    if (b == kNoBlock) continue;
    result.copies.push_back({b, (*host_ids)[k]});
    device.push_back(b);
    b = (*host_ids)[k++];
  }
  for (auto it = device.rbegin(); it != device.rend(); ++it) release_block(*it);
  s.swapped = true;
  ++counters_.preemptions;
  counters_.swapped_out_blocks += n;
  return result;
}

bool KVCacheManager::can_swap_in(SeqId seq) const {
  const Sequence& s = get(seq, "can_swap_in");
  PAGEDKV_CHECK(s.swapped, "KVCacheManager::can_swap_in: sequence {} is not swapped out", seq);
  return int64_t{allocator_.num_available()} - live_blocks(s.blocks) >= watermark_blocks_;
}

std::optional<SwapResult> KVCacheManager::swap_in(SeqId seq) {
  if (!can_swap_in(seq)) return std::nullopt;
  Sequence& s = get(seq, "swap_in");
  const int32_t n = live_blocks(s.blocks);
  std::optional<std::vector<BlockId>> ids = allocator_.allocate(n);
  PAGEDKV_CHECK(ids.has_value(), "KVCacheManager::swap_in: internal: {} blocks", n);
  SwapResult result;
  size_t k = 0;
  for (BlockId& b : s.blocks) {
    if (b == kNoBlock) continue;
    result.copies.push_back({b, (*ids)[k]});
    host_->release(b);
    b = (*ids)[k++];
  }
  s.swapped = false;
  counters_.swapped_in_blocks += n;
  return result;
}

bool KVCacheManager::is_swapped(SeqId seq) const { return get(seq, "is_swapped").swapped; }

PreemptedSequence KVCacheManager::preempt(SeqId seq) {
  const Sequence& s = get_running(seq, "preempt");
  PreemptedSequence out;
  out.seq = seq;
  out.num_tokens = s.num_tokens;
  out.extra_key = s.extra_key;
  if (s.ids_known) out.tokens = s.token_ids;
  free_sequence(seq);
  ++counters_.preemptions;
  return out;
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

// ---- queries -----------------------------------------------------------------------------------

int64_t KVCacheManager::num_tokens(SeqId seq) const { return get(seq, "num_tokens").num_tokens; }

std::span<const BlockId> KVCacheManager::block_table(SeqId seq) const {
  return get(seq, "block_table").blocks;
}

std::vector<SeqId> KVCacheManager::sequences() const {
  std::vector<SeqId> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

double KVCacheManager::usage() const {
  return static_cast<double>(allocator_.num_used()) / allocator_.num_blocks();
}

KVCacheStats KVCacheManager::stats() const {
  KVCacheStats st = counters_;
  st.total_blocks = allocator_.num_blocks();
  st.free_blocks = allocator_.num_free();
  st.used_blocks = allocator_.num_used();
  st.cached_blocks = allocator_.num_cached();
  st.usage = usage();
  st.num_sequences = num_sequences();
  st.num_swapped_sequences = static_cast<int32_t>(
      std::count_if(seqs_.begin(), seqs_.end(), [](const auto& kv) { return kv.second.swapped; }));
  st.prefix_cached_entries = prefix_.size();
  st.host_total_blocks = config_.num_host_blocks;
  st.host_used_blocks = host_ ? host_->num_used() : 0;
  return st;
}

std::vector<KVCacheEvent> KVCacheManager::take_events() { return std::exchange(events_, {}); }

void KVCacheManager::check_invariants() const {
  const int32_t total = allocator_.num_blocks();
  const int64_t bs = config_.block_size;
  PAGEDKV_CHECK(allocator_.num_free() + allocator_.num_used() + allocator_.num_cached() == total,
                "invariant: free {} + used {} + cached {} != total {}", allocator_.num_free(),
                allocator_.num_used(), allocator_.num_cached(), total);
  std::vector<int32_t> holders(total, 0);
  std::vector<int32_t> host_holders(host_ ? host_->num_blocks() : 0, 0);
  int32_t host_live = 0;
  for (const auto& [id, s] : seqs_) {
    PAGEDKV_CHECK(s.placeholders.size() == s.blocks.size(),
                  "invariant: sequence {} has {} placeholders for {} table entries", id,
                  s.placeholders.size(), s.blocks.size());
    if (!s.sparse) {
      const int64_t need = blocks_for_tokens(s.num_tokens, bs);
      PAGEDKV_CHECK(static_cast<int64_t>(s.blocks.size()) == need,
                    "invariant: sequence {} has {} tokens but {} blocks (expected {})", id,
                    s.num_tokens, s.blocks.size(), need);
    }
    for (size_t j = 0; j < s.blocks.size(); ++j) {
      const BlockId b = s.blocks[j];
      if (b == kNoBlock) {
        PAGEDKV_CHECK(s.sparse || (s.placeholders[j] >= 0 && s.placeholders[j] < total),
                      "invariant: sequence {} entry {} released without a valid placeholder", id,
                      j);
        continue;
      }
      PAGEDKV_CHECK(s.placeholders[j] == -1,
                    "invariant: sequence {} entry {} is live but has placeholder {}", id, j,
                    s.placeholders[j]);
      if (s.swapped) {
        PAGEDKV_CHECK(b >= 0 && b < static_cast<BlockId>(host_holders.size()),
                      "invariant: swapped sequence {} holds host block id {} out of range", id, b);
        ++host_holders[b];
        ++host_live;
      } else {
        PAGEDKV_CHECK(b >= 0 && b < total, "invariant: sequence {} holds block id {} out of range",
                      id, b);
        ++holders[b];
      }
    }
    // The last (partially filled) block of a positional sequence is never released.
    if (!s.sparse && s.num_tokens % bs != 0) {
      PAGEDKV_CHECK(s.blocks.back() != kNoBlock,
                    "invariant: sequence {} released its partially filled last block", id);
    }
    if (policy_->kind() == EvictionKind::kHeavyHitters) {
      std::vector<std::vector<uint8_t>> seen(s.blocks.size());
      std::vector<int32_t> live(s.blocks.size(), 0);
      int64_t prev = -1;
      for (const Kept& k : s.kept) {
        PAGEDKV_CHECK(k.position > prev && k.position < s.num_tokens,
                      "invariant: sequence {} kept position {} out of order or range", id,
                      k.position);
        prev = k.position;
        PAGEDKV_CHECK(k.entry >= 0 && k.entry < static_cast<int32_t>(s.blocks.size()) &&
                          s.blocks[k.entry] != kNoBlock && k.offset >= 0 && k.offset < bs,
                      "invariant: sequence {} keeps position {} in a released or missing block", id,
                      k.position);
        if (seen[k.entry].empty()) seen[k.entry].assign(static_cast<size_t>(bs), 0);
        PAGEDKV_CHECK(!seen[k.entry][k.offset],
                      "invariant: sequence {} keeps two tokens in one slot (entry {}, offset {})",
                      id, k.entry, k.offset);
        seen[k.entry][k.offset] = 1;
        ++live[k.entry];
        if (!s.sparse) {
          PAGEDKV_CHECK(k.entry == k.position / bs && k.offset == k.position % bs,
                        "invariant: positional sequence {} keeps position {} off its slot", id,
                        k.position);
        }
      }
      if (!s.sparse) {
        PAGEDKV_CHECK(static_cast<int64_t>(s.kept.size()) == s.num_tokens,
                      "invariant: positional sequence {} keeps {} of {} tokens", id, s.kept.size(),
                      s.num_tokens);
      }
      for (size_t j = 0; j < s.blocks.size(); ++j) {
        PAGEDKV_CHECK(s.blocks[j] == kNoBlock || live[j] > 0,
                      "invariant: sequence {} holds block {} with no kept token", id, s.blocks[j]);
      }
    }
  }
  int32_t used = 0;
  int32_t registered = 0;
  for (BlockId b = 0; b < total; ++b) {
    PAGEDKV_CHECK(allocator_.ref_count(b) == holders[b],
                  "invariant: block {} has ref count {} but {} tables hold it", b,
                  allocator_.ref_count(b), holders[b]);
    PAGEDKV_CHECK(!(allocator_.is_free(b) && holders[b] > 0),
                  "invariant: block {} is free and referenced", b);
    if (holders[b] > 0) ++used;
    const bool has_entry = prefix_.entry(b) != nullptr;
    PAGEDKV_CHECK(has_entry == allocator_.is_cached(b),
                  "invariant: block {} prefix entry {} but allocator cached flag {}", b, has_entry,
                  allocator_.is_cached(b));
    if (has_entry) {
      ++registered;
      PAGEDKV_CHECK(prefix_.find(prefix_.entry(b)->hash) == b,
                    "invariant: block {} entry key does not map back to it", b);
    }
  }
  PAGEDKV_CHECK(used == allocator_.num_used(), "invariant: {} blocks held but allocator says {}",
                used, allocator_.num_used());
  PAGEDKV_CHECK(registered == prefix_.size(), "invariant: {} registered blocks but index has {}",
                registered, prefix_.size());
  if (host_) {
    for (BlockId b = 0; b < host_->num_blocks(); ++b) {
      PAGEDKV_CHECK(host_->ref_count(b) == host_holders[b],
                    "invariant: host block {} has ref count {} but {} tables hold it", b,
                    host_->ref_count(b), host_holders[b]);
    }
    PAGEDKV_CHECK(host_->num_used() == host_live && host_->num_cached() == 0,
                  "invariant: host pool uses {} blocks, swapped tables hold {}", host_->num_used(),
                  host_live);
  } else {
    PAGEDKV_CHECK(host_live == 0, "invariant: {} host blocks held without a host pool", host_live);
  }
  PAGEDKV_CHECK(counters_.prefix_hit_tokens == counters_.prefix_hits * bs &&
                    counters_.prefix_hit_tokens <= counters_.prefix_query_tokens,
                "invariant: prefix hit tokens {} vs hits {} x {} and queries {}",
                counters_.prefix_hit_tokens, counters_.prefix_hits, bs,
                counters_.prefix_query_tokens);
}

}  // namespace pagedkv
