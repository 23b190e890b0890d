#include "sim/replay_pools.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <span>
#include <unordered_map>

#include "core/check.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"

namespace pagedkv::sim {

namespace {

using replay_detail::Active;
using replay_detail::Admit;
using replay_detail::Pool;
using replay_detail::synthesize_into;

// ---- token synthesis ---------------------------------------------------------------------------

// splitmix64 finalizer (Steele et al., "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a bijective mix, so distinct (key, position) pairs rarely collide.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// An id in [3, vocab_size) from the hash: the high half of h x (vocab_size - 3) (Lemire, "Fast
// random integer generation in an interval", TOMACS 2019), a multiply where `%` was a 64-bit
// division (a third of a Mooncake prefix-16 replay).
// `inner` is mix64(position).
TokenId token_from_inner(uint64_t key, uint64_t inner, int32_t vocab_size) {
  const uint64_t h = mix64(key ^ inner);
  const auto range = static_cast<unsigned __int128>(static_cast<uint64_t>(vocab_size - 3));
  return static_cast<TokenId>(3 + static_cast<uint64_t>((h * range) >> 64));
}

TokenId token_for(uint64_t key, int64_t position, int32_t vocab_size) {
  return token_from_inner(key, mix64(static_cast<uint64_t>(position)), vocab_size);
}

// fill_ids runs per prompt position (145 M positions in a Mooncake replay): compiled once more
// for AVX-512 and AVX2, chosen at load time by the CPU (GCC/Clang function multiversioning),
// where its loop runs 8 or 4 positions at once. Not under sanitizers (ifunc resolvers run
// before their runtime is up).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define PAGEDKV_SIM_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PAGEDKV_SIM_VECTOR_CLONES
#endif

// out[i] = token_from_inner(key, inner[i], vocab_size) for i < n, in 64-bit lanes only: the
// high half of h x range (range < 2^32) is (hi x range + (lo x range >> 32)) >> 32 with h = hi
// 2^32 + lo, exactly (the dropped fraction of lo x range / 2^32 cannot carry into bit 64).
PAGEDKV_SIM_VECTOR_CLONES void fill_ids(uint64_t key, const uint64_t* inner, int64_t n,
                                        int32_t vocab_size, TokenId* out) {
  const auto range = static_cast<uint64_t>(vocab_size - 3);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = mix64(key ^ inner[i]);
    const uint64_t high = ((h >> 32) * range + (((h & 0xFFFFFFFFu) * range) >> 32)) >> 32;
    out[i] = static_cast<TokenId>(3 + high);
  }
}

/// Keys of unique content have the top bit set; hash-id keys never do (ids are < 2^63).
uint64_t own_key(size_t index) { return (uint64_t{1} << 63) | static_cast<uint64_t>(index); }

/// The id at prompt-or-generated position `pos` of request `index` (synthesize_tokens, one id).
TokenId token_at(const Trace& trace, size_t index, int64_t pos, int32_t vocab_size) {
  const TraceRequest& r = trace.requests[index];
  const int64_t hb = trace.hash_block_tokens;
  if (hb > 0 && pos < r.prompt_tokens && pos / hb < static_cast<int64_t>(r.hash_count)) {
    return token_for(static_cast<uint64_t>(trace.hashes(r)[static_cast<size_t>(pos / hb)]),
                     pos % hb, vocab_size);
  }
  return token_for(own_key(index), pos, vocab_size);
}

// ---- memory strategies -------------------------------------------------------------------------

/// The replay writes no K/V, so it asks the managers for no slots (8 bytes per token it would
/// never read): only the blocks and counts, which are the same either way.
constexpr AppendOptions kNoSlots{.return_slots = false};

class ContiguousPool final : public Pool {
 public:
  ContiguousPool(int64_t capacity_tokens, bool reserve_max, int64_t max_context, int32_t width)
      : capacity_(capacity_tokens),
        reserve_max_(reserve_max),
        max_context_(max_context),
        width_(width) {}

  Admit admit(Active& r, bool /*alone*/) override {
    // A group of width w reserves w independent copies (no sharing between reservations).
    const int64_t need = width_ * (reserve_max_ ? max_context_ : r.prompt + r.output);
    if (need > capacity_) return Admit::kNever;
    if (reserved_ + need > capacity_) return Admit::kLater;
    r.reserved = need;
    reserved_ += need;
    r.cached = r.target;
    live_ += r.target;
    return Admit::kOk;
  }
  // The reservation covers P + O positions, so a decode never runs out of memory.
  bool append_one(Active& r) override {
    // After the step every one of the width copies holds cached + 1 positions.
    live_ += width_ * (r.cached + 1) - int64_t{r.members} * r.cached;
    r.members = width_;
    return true;
  }
  void release(Active& r) override {
    reserved_ -= r.reserved;
    live_ -= int64_t{r.members} * r.cached;
    r.reserved = 0;
  }
  int64_t live() const override { return live_; }
  int64_t reserved() const override { return reserved_; }

 private:
  int64_t capacity_;
  bool reserve_max_;
  int64_t max_context_;
  int32_t width_;
  int64_t reserved_ = 0;
  int64_t live_ = 0;
};

/// Paged strategies: everything goes through KVCacheManager's own API (admission with its
/// watermark, add_sequence with the prompt, append, recompute preemption, prefix caching and
/// its LRU eviction of cached blocks).
class PagedPool final : public Pool {
 public:
  PagedPool(const Trace& trace, const ReplayConfig& config, int32_t num_blocks, int32_t block_size,
            bool prefix)
      : trace_(trace),
        vocab_size_(config.vocab_size),
        block_size_(block_size),
        prefix_(prefix),
        manager_(
            KVCacheManagerConfig{.num_blocks = num_blocks,
                                 .block_size = block_size,
                                 .enable_prefix_caching = prefix,
                                 .watermark = config.watermark,
                                 .max_model_len = reachable_len(config, num_blocks, block_size),
                                 .enable_events = prefix && !config.tiers.empty()}),
        width_(config.group_width),
        mode_(config.group_mode),
        chooser_(seeded_beam_chooser(config.beam_seed, config.group_width)),
        tiers_(prefix ? config.tiers : std::vector<ReplayTier>{},
               config.kv_bytes_per_token * block_size, block_size),
        tier_write_(config.tier_write) {}

  Admit admit(Active& r, bool /*alone*/) override {
    // A request that could not finish even alone (above the watermark) would be preempted by
    // its own growth forever: reject it up front. With this check a lone request always gets
    // kOk, so the scheduler cannot stall.
    const int64_t limit = manager_.num_total_blocks() - manager_.watermark_blocks();
    if (group_blocks(r) > limit) return Admit::kNever;
    std::span<const TokenId> ids;
    if (prefix_) {
      // Only the queue's head is tried, often several steps running: synthesize its ids once,
      // into one buffer reused by every request (no allocation per admission).
      if (scratch_index_ != r.index || static_cast<int64_t>(scratch_.size()) != r.target) {
        synthesize_into(trace_, r.index, 0, r.target, vocab_size_, scratch_);
        scratch_index_ = r.index;
      }
      ids = scratch_;
    } else {
      // Without prefix caching only the prompt length matters; share one zero buffer.
      if (static_cast<int64_t>(zeros_.size()) < r.target) zeros_.resize(r.target, 0);
      ids = std::span<const TokenId>(zeros_).first(static_cast<size_t>(r.target));
    }
    switch (manager_.can_add_sequence(ids)) {
      case Admission::kNever:
        return Admit::kNever;
      case Admission::kLater:
        return Admit::kLater;
      case Admission::kOk:
        break;
    }
    // No slots (kNoSlots): the replay writes no K/V.
    // max_new_tokens: the output still to come. It sizes the manager's id list (so decode
    // appends do not copy a long prompt's ids again); its never-fits test cannot fire here,
    // since group_blocks() above already holds prompt + output.
    const std::optional<AddResult> added = manager_.add_sequence(
        seq(r), ids, AddOptions{.max_new_tokens = r.output - r.generated, .return_slots = false});
    PAGEDKV_CHECK(added.has_value(), "replay: add_sequence failed after can_add_sequence kOk");
    r.cached = r.target;
    r.computed = added->num_computed_tokens;
    if (!tiers_.empty() && !r.swapped) onboard(r);
    scratch_index_ = kNoRequest;
    waste_ += waste(r.cached);
    sync_tiers();
    return Admit::kOk;
  }

  bool append_one(Active& r) override {
    if (width_ > 1) return append_group(r);
    std::optional<AppendResult> appended;
    if (prefix_) {
      // Generated tokens are recorded too, so a recomputed request can hit its own blocks.
      const std::array<TokenId, 1> id = {token_at(trace_, r.index, r.cached, vocab_size_)};
      appended = manager_.append_tokens(seq(r), id, kNoSlots);
    } else {
      appended = manager_.append_slots(seq(r), 1, kNoSlots);
    }
    if (!appended) return false;
    waste_ += waste(r.cached + 1) - waste(r.cached);
    sync_tiers();
    return true;
  }

  void commit(const Active& r) override {
    const auto g = groups_.find(r.index);
    if (g == groups_.end()) {
      manager_.commit(seq(r), r.computed);
    } else {
      for (SeqId m : g->second) manager_.commit(m, r.computed);
    }
    sync_tiers();
  }

  void release(Active& r) override {
    const auto g = groups_.find(r.index);
    if (g == groups_.end()) {
      manager_.free_sequence(seq(r));
    } else {
      for (SeqId m : g->second) manager_.free_sequence(m);
      groups_.erase(g);
    }
    forget(r);
  }
  // A group is one preemption (the manager counts its first sequence's); the rest are freed.
  void preempt(Active& r) override {
    const auto g = groups_.find(r.index);
    if (g == groups_.end()) {
      (void)manager_.preempt(seq(r));
    } else {
      (void)manager_.preempt(g->second.front());
      for (size_t k = 1; k < g->second.size(); ++k) manager_.free_sequence(g->second[k]);
      groups_.erase(g);
    }
    forget(r);
  }

  // Physical positions holding a token: a block shared by several requests counts once.
  int64_t live() const override { return reserved() - waste_; }
  int64_t reserved() const override {
    return static_cast<int64_t>(manager_.allocator().num_used()) * block_size_;
  }
  void finish(ReplayResult& res) const override {
    const KVCacheStats st = manager_.stats();
    res.prefix_query_tokens = st.prefix_query_tokens;
    res.prefix_hit_tokens = st.prefix_hit_tokens;
    res.prefix_hit_rate = st.prefix_hit_rate();
    res.prefix_evictions = st.prefix_evictions;
    res.tiers = tiers_.results();
    PAGEDKV_CHECK(st.preemptions == res.preemptions,
                  "replay: manager counted {} preemptions, scheduler {}", st.preemptions,
                  res.preemptions);
  }

 private:
  static SeqId seq(const Active& r) { return static_cast<SeqId>(r.index); }
  // The manager rejects a max_model_len its pool could never hold; a replay sweeps budgets
  // below max_context, and admit() already rejects (kNever) what cannot fit this pool alone,
  // so the manager's limit is max_context clamped to the pool.
  static int64_t reachable_len(const ReplayConfig& config, int32_t num_blocks, int32_t block_size) {
    return std::min<int64_t>(config.max_context, int64_t{num_blocks} * block_size);
  }
  // Empty positions of the last, partially filled block. Only full blocks are ever shared
  // (prefix caching), so reserved - live == the sum of this over running requests.
  int64_t waste(int64_t tokens) const {
    return blocks_for_tokens(tokens, block_size_) * block_size_ - tokens;
  }
  void forget(Active& r) { waste_ -= int64_t{r.members} * waste(r.cached); }
  /// Blocks the request's group may hold alone: its own sequence's; for a group, the full
  /// prompt blocks once plus, per member, the rest and one block in flight (an upper bound).
  int64_t group_blocks(const Active& r) const {
    const int64_t total = blocks_for_tokens(r.prompt + r.output, block_size_);
    if (width_ == 1) return total;
    const int64_t full = (r.prompt - 1) / block_size_;
    return full + width_ * (total - full + 1);
  }
  bool append_group(Active& r);
  void onboard(Active& r);
  void sync_tiers();

  const Trace& trace_;
  int32_t vocab_size_;
  int32_t block_size_;
  bool prefix_;
  KVCacheManager manager_;
  std::vector<TokenId> zeros_;
  std::vector<TokenId> scratch_;  // prefix: ids of the request scratch_index_ is trying
  static constexpr size_t kNoRequest = ~size_t{0};
  size_t scratch_index_ = kNoRequest;
  int64_t waste_ = 0;  // sum over running requests of members x waste(cached)
  int32_t width_;
  SharingMode mode_;
  BeamChooser chooser_;
  // Sharing groups, by trace index: the live sequences of each request that has forked (a
  // request without an entry is the one sequence seq(r)). Forked ids count up from 2^40, above
  // every trace index.
  std::unordered_map<size_t, std::vector<SeqId>> groups_;
  SeqId next_member_ = SeqId{1} << 40;
  TierStack tiers_;  // empty without tiers (or without prefix caching)
  TierWrite tier_write_;
  std::vector<BlockHash> chain_;  // onboard(): the prompt's block keys
};

// The prompt's full blocks past the pool's hit, from the tiers: at most up to the last full
// block before the final prompt token (which is always computed, as the manager's own hit is
// capped), loaded into the blocks add_sequence just allocated. The scheduler charges r.load_ms.
void PagedPool::onboard(Active& r) {
  const int64_t hit_blocks = r.computed / block_size_;
  const int64_t max_blocks = (r.target - 1) / block_size_;
  if (r.computed % block_size_ != 0 || hit_blocks >= max_blocks) return;
  chain_.clear();
  BlockHash parent = kRootBlockHash;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const auto tokens = std::span<const TokenId>(scratch_).subspan(
        static_cast<size_t>(b * block_size_), static_cast<size_t>(block_size_));
    parent = block_hash(parent, tokens, 0);
    chain_.push_back(parent);
  }
  const int64_t loaded =
      tiers_.load(chain_, static_cast<size_t>(hit_blocks), max_blocks - hit_blocks, r.load_ms);
  r.computed += loaded * block_size_;
}

// Blocks the pool published or let go since the last call go down to the tiers, per the
// write policy.
void PagedPool::sync_tiers() {
  if (tiers_.empty()) return;
  for (const KVCacheEvent& e : manager_.take_events()) {
    // Write-back: what left the pool (kAllCleared names no block: its kRemoved came first).
    const bool write =
        tier_write_ == TierWrite::kWriteThrough
            ? e.kind == KVCacheEvent::Kind::kStored
            : e.kind == KVCacheEvent::Kind::kRemoved || e.kind == KVCacheEvent::Kind::kEvicted;
    if (write) tiers_.store(e.hash);
  }
}

// One decode token for every member of r's group: the first decode (or the first after a
// recompute) forks the sequence into width members; a beam step forks each beam once per
// extra survivor and frees the beams without any (sharing.hpp), then every member appends.
bool PagedPool::append_group(Active& r) {
  // Each append takes at most one block (a copy-on-write copy or a new block): check first,
  // so that a short pool changes nothing.
  if (manager_.allocator().num_available() < width_) return false;
  std::vector<SeqId>& g = groups_.try_emplace(r.index, std::vector<SeqId>{seq(r)}).first->second;
  if (static_cast<int32_t>(g.size()) < width_) {
    while (static_cast<int32_t>(g.size()) < width_) {
      manager_.fork(g.front(), next_member_);
      g.push_back(next_member_++);
    }
  } else if (mode_ == SharingMode::kBeamSearch) {
    std::vector<int32_t> children(static_cast<size_t>(width_), 0);
    for (int32_t p : chooser_(width_)) ++children[static_cast<size_t>(p)];
    std::vector<SeqId> next;
    for (size_t b = 0; b < g.size(); ++b) {
      if (children[b] == 0) continue;
      next.push_back(g[b]);
      for (int32_t k = 1; k < children[b]; ++k) {
        manager_.fork(g[b], next_member_);
        next.push_back(next_member_++);
      }
    }
    for (size_t b = 0; b < g.size(); ++b) {
      if (children[b] == 0) manager_.free_sequence(g[b]);
    }
    g = std::move(next);
  }
  const std::array<TokenId, 1> id = {token_at(trace_, r.index, r.cached, vocab_size_)};
  for (SeqId m : g) {
    const bool ok = prefix_ ? manager_.append_tokens(m, id, kNoSlots).has_value()
                            : manager_.append_slots(m, 1, kNoSlots).has_value();
    PAGEDKV_CHECK(ok, "replay: internal: group member {} could not append", m);
  }
  waste_ += width_ * waste(r.cached + 1) - int64_t{r.members} * waste(r.cached);
  r.members = width_;
  sync_tiers();
  return true;
}

}  // namespace

std::unique_ptr<Pool> replay_detail::make_pool(const Trace& trace, const ReplayConfig& config,
                                               const Strategy& strategy, ReplayResult& res) {
  const int64_t budget_tokens = config.kv_memory_bytes / config.kv_bytes_per_token;
  switch (strategy.kind) {
    case StrategyKind::kContiguousMax:
    case StrategyKind::kContiguousExact:
      res.capacity_tokens = budget_tokens;
      return std::make_unique<ContiguousPool>(budget_tokens,
                                              strategy.kind == StrategyKind::kContiguousMax,
                                              config.max_context, config.group_width);
    case StrategyKind::kHybrid:
      return replay_detail::make_hybrid_pool(config, strategy, res);
    case StrategyKind::kPaged:
    case StrategyKind::kPagedPrefix:
      break;
  }
  PAGEDKV_CHECK(strategy.block_size >= 1, "replay: block size must be >= 1, got {}",
                strategy.block_size);
  const int64_t blocks = std::min<int64_t>(budget_tokens / strategy.block_size, 1 << 30);
  PAGEDKV_CHECK(
      blocks >= 1, "replay: KV memory {} bytes holds no block of {} tokens ({} bytes each)",
      config.kv_memory_bytes, strategy.block_size, config.kv_bytes_per_token * strategy.block_size);
  res.block_size = strategy.block_size;
  res.num_blocks = static_cast<int32_t>(blocks);
  res.capacity_tokens = blocks * strategy.block_size;
  return std::make_unique<PagedPool>(trace, config, res.num_blocks, strategy.block_size,
                                     strategy.kind == StrategyKind::kPagedPrefix);
}

// Declared in replay.hpp; defined here, beside the prefix pool that feeds its ids to the manager.
std::vector<TokenId> synthesize_tokens(const Trace& trace, size_t index, int64_t begin, int64_t end,
                                       int32_t vocab_size) {
  std::vector<TokenId> out;
  synthesize_into(trace, index, begin, end, vocab_size, out);
  return out;
}

void replay_detail::synthesize_into(const Trace& trace, size_t index, int64_t begin, int64_t end,
                                    int32_t vocab_size, std::vector<TokenId>& out) {
  PAGEDKV_CHECK(index < trace.requests.size(), "synthesize_tokens: request {} out of range ({})",
                index, trace.requests.size());
  PAGEDKV_CHECK(0 <= begin && begin <= end, "synthesize_tokens: bad range [{}, {})", begin, end);
  PAGEDKV_CHECK(vocab_size >= 4, "synthesize_tokens: vocab size must be >= 4, got {}", vocab_size);
  const TraceRequest& r = trace.requests[index];
  const std::span<const int64_t> hashes = trace.hashes(r);
  const int64_t hb = trace.hash_block_tokens;
  // Positions below `shared_end` take their hash block's ids; walk them block by block so the
  // loop divides once per block, not per position.
  const int64_t shared_end =
      hb > 0 ? std::min(r.prompt_tokens, static_cast<int64_t>(hashes.size()) * hb) : 0;
  out.resize(static_cast<size_t>(end - begin));
  TokenId* dst = out.data();
  int64_t pos = begin;
  // token_for(key, off) = mix(key ^ mix(off)): the inner mix of each offset of a hash block is
  // the same in every block, so it is computed once per thread, not once per position.
  static thread_local std::vector<uint64_t> inner;
  if (shared_end > 0 && static_cast<int64_t>(inner.size()) != hb) {
    inner.resize(static_cast<size_t>(hb));
    for (int64_t off = 0; off < hb; ++off) inner[off] = mix64(static_cast<uint64_t>(off));
  }
  while (pos < std::min(end, shared_end)) {
    const int64_t block = pos / hb;
    const auto key = static_cast<uint64_t>(hashes[static_cast<size_t>(block)]);
    const int64_t stop = std::min({end, shared_end, (block + 1) * hb});
    const int64_t off = pos - block * hb;
    fill_ids(key, inner.data() + off, stop - pos, vocab_size, dst);
    dst += stop - pos;
    pos = stop;
  }
  const uint64_t own = own_key(index);
  for (; pos < end; ++pos) *dst++ = token_for(own, pos, vocab_size);
}

}  // namespace pagedkv::sim
