// KVCacheManager::KeptSet: what token eviction keeps of one sequence. Implicit (a mask rule,
// nothing stored) under positional policies; under a policy that scores tokens (heavy hitters,
// H2O) the explicit list of kept tokens with their slots and accumulated scores, the victims'
// removal and the refill of the slots they free.

#include <algorithm>
#include <cmath>

#include "core/check.hpp"
#include "metadata/manager_internal.hpp"

namespace pagedkv {

void KVCacheManager::KeptSet::add_tokens(int64_t first, int64_t n, int32_t block_size) {
  tokens_.reserve(tokens_.size() + static_cast<size_t>(n));
  for (int64_t p = first; p < first + n; ++p) {
    tokens_.push_back(
        {p, static_cast<int32_t>(p / block_size), static_cast<int32_t>(p % block_size), 0.0});
  }
}

bool KVCacheManager::KeptSet::plan_listed(const EvictionPolicy& policy,
                                          std::span<const BlockId> blocks,
                                          const BlockAllocator& pool, int32_t block_size,
                                          int64_t next, int64_t n, AppendPlan& plan) const {
  std::vector<KeptTokenScore> scores;
  scores.reserve(tokens_.size());
  for (const Token& k : tokens_) scores.push_back({k.position, k.score});
  plan.victims = policy.select_victims(scores, next, n);
  if (!sparse_ && plan.victims.empty()) return false;
  plan_sparse(blocks, pool, block_size, n, plan);
  return true;
}

// Live tokens per entry once the victims are gone; emptied blocks are released; new tokens fill
// free offsets of blocks this sequence owns alone and that the prefix cache does not hold (their
// contents must not change), then fresh blocks, put first where entries were released.
void KVCacheManager::KeptSet::plan_sparse(std::span<const BlockId> blocks,
                                          const BlockAllocator& pool, int32_t block_size, int64_t n,
                                          AppendPlan& plan) const {
  plan.refill = true;
  const int64_t bs = block_size;
  const size_t num_entries = blocks.size();
  std::vector<std::vector<uint8_t>> used(num_entries);
  std::vector<int32_t> live(num_entries, 0);
  std::vector<uint8_t> is_victim(tokens_.size(), 0);
  for (size_t v : plan.victims) is_victim[v] = 1;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (is_victim[i]) continue;
    const Token& k = tokens_[i];
    if (used[k.entry].empty()) used[k.entry].assign(static_cast<size_t>(bs), 0);
    used[k.entry][k.offset] = 1;
    ++live[k.entry];
  }
  std::vector<uint8_t> released(num_entries, 0);
  for (size_t j = 0; j < num_entries; ++j) {
    if (blocks[j] == kNoBlock || live[j] > 0) continue;
    plan.release.push_back(static_cast<int32_t>(j));
    released[j] = 1;
    if (pool.ref_count(blocks[j]) == 1) ++plan.freed;
  }
  for (size_t j = 0; j < num_entries && static_cast<int64_t>(plan.holes.size()) < n; ++j) {
    const BlockId b = blocks[j];
    if (b == kNoBlock || released[j] || pool.ref_count(b) != 1 || pool.is_cached(b)) continue;
    for (int32_t off = 0; off < bs && static_cast<int64_t>(plan.holes.size()) < n; ++off) {
      if (used[j].empty() || !used[j][off]) plan.holes.emplace_back(static_cast<int32_t>(j), off);
    }
  }
  const int64_t rest = n - static_cast<int64_t>(plan.holes.size());
  plan.fresh = static_cast<int32_t>(std::min<int64_t>(blocks_for_tokens(rest, bs), INT32_MAX));
  for (size_t j = 0;
       j < num_entries && static_cast<int32_t>(plan.fresh_entries.size()) < plan.fresh; ++j) {
    if (blocks[j] == kNoBlock || released[j]) plan.fresh_entries.push_back(static_cast<int32_t>(j));
  }
  while (static_cast<int32_t>(plan.fresh_entries.size()) < plan.fresh) {
    plan.fresh_entries.push_back(-1);
  }
}

void KVCacheManager::KeptSet::erase(std::span<const size_t> victims) {
  if (victims.empty()) return;
  std::vector<uint8_t> gone(tokens_.size(), 0);
  for (size_t v : victims) gone[v] = 1;
  size_t w = 0;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!gone[i]) tokens_[w++] = tokens_[i];
  }
  tokens_.resize(w);
}

void KVCacheManager::KeptSet::place_refill(std::vector<BlockId>& blocks,
                                           std::vector<BlockId>& placeholders,
                                           const AppendPlan& plan, std::span<const BlockId> fresh,
                                           int32_t block_size, int64_t first, int64_t n,
                                           std::vector<Slot>& slots) {
  erase(plan.victims);
  sparse_ = true;
  std::vector<std::pair<int32_t, int32_t>> targets = plan.holes;
  for (size_t f = 0; f < fresh.size(); ++f) {
    int32_t entry = plan.fresh_entries[f];
    if (entry < 0) {
      entry = static_cast<int32_t>(blocks.size());
      blocks.push_back(fresh[f]);
      placeholders.push_back(-1);
    } else {
      blocks[entry] = fresh[f];
      placeholders[entry] = -1;
    }
    for (int32_t off = 0; off < block_size && static_cast<int64_t>(targets.size()) < n; ++off) {
      targets.emplace_back(entry, off);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto [entry, off] = targets[i];
    slots.push_back(static_cast<Slot>(blocks[entry]) * block_size + off);
    tokens_.push_back({first + i, entry, off, 0.0});
  }
}

void KVCacheManager::KeptSet::append_kept(std::span<const BlockId> blocks, int64_t num_tokens,
                                          AttentionMask mask, int32_t block_size,
                                          KeptTokens& out) const {
  const int64_t bs = block_size;
  if (scored_) {
    for (const Token& k : tokens_) {
      out.slots.push_back(static_cast<Slot>(blocks[k.entry]) * bs + k.offset);
      out.positions.push_back(k.position);
    }
    return;
  }
  // Visible from the last token, q = T - 1: [0, min(S, T)) and [max(S, T - W), T); all of
  // [0, T) when the mask is unbounded.
  const int64_t t = num_tokens;
  const bool windowed = mask.window_left >= 0;
  const int64_t sinks = windowed ? std::min<int64_t>(mask.sink_tokens, t) : t;
  const int64_t lo = windowed ? std::max<int64_t>(sinks, t - mask.window_left) : t;
  auto add = [&](int64_t p) {
    out.slots.push_back(static_cast<Slot>(blocks[p / bs]) * bs + p % bs);
    out.positions.push_back(p);
  };
  for (int64_t p = 0; p < sinks; ++p) add(p);
  for (int64_t p = lo; p < t; ++p) add(p);
}

void KVCacheManager::KeptSet::accumulate(SeqId seq, std::span<const float> weights,
                                         EvictionKind kind) {
  PAGEDKV_CHECK(scored_,
                "KVCacheManager::accumulate_attention: policy '{}' keeps no scores (heavy hitters "
                "only)",
                eviction_kind_name(kind));
  PAGEDKV_CHECK(
      weights.size() == tokens_.size(),
      "KVCacheManager::accumulate_attention: {} weights for {} kept tokens of sequence {}",
      weights.size(), tokens_.size(), seq);
  for (size_t i = 0; i < weights.size(); ++i) {
    PAGEDKV_CHECK(std::isfinite(weights[i]) && weights[i] >= 0.0f,
                  "KVCacheManager::accumulate_attention: weight {} of sequence {} is {}", i, seq,
                  weights[i]);
  }
  for (size_t i = 0; i < weights.size(); ++i) tokens_[i].score += weights[i];
}

void KVCacheManager::KeptSet::check(SeqId id, std::span<const BlockId> blocks, int64_t num_tokens,
                                    int32_t block_size) const {
  if (!scored_) return;
  const int64_t bs = block_size;
  std::vector<std::vector<uint8_t>> seen(blocks.size());
  std::vector<int32_t> live(blocks.size(), 0);
  int64_t prev = -1;
  for (const Token& k : tokens_) {
    PAGEDKV_CHECK(k.position > prev && k.position < num_tokens,
                  "invariant: sequence {} kept position {} out of order or range", id, k.position);
    prev = k.position;
    PAGEDKV_CHECK(k.entry >= 0 && k.entry < static_cast<int32_t>(blocks.size()) &&
                      blocks[k.entry] != kNoBlock && k.offset >= 0 && k.offset < bs,
                  "invariant: sequence {} keeps position {} in a released or missing block", id,
                  k.position);
    if (seen[k.entry].empty()) seen[k.entry].assign(static_cast<size_t>(bs), 0);
    PAGEDKV_CHECK(!seen[k.entry][k.offset],
                  "invariant: sequence {} keeps two tokens in one slot (entry {}, offset {})", id,
                  k.entry, k.offset);
    seen[k.entry][k.offset] = 1;
    ++live[k.entry];
    if (!sparse_) {
      PAGEDKV_CHECK(k.entry == k.position / bs && k.offset == k.position % bs,
                    "invariant: positional sequence {} keeps position {} off its slot", id,
                    k.position);
    }
  }
  if (!sparse_) {
    PAGEDKV_CHECK(static_cast<int64_t>(tokens_.size()) == num_tokens,
                  "invariant: positional sequence {} keeps {} of {} tokens", id, tokens_.size(),
                  num_tokens);
  }
  for (size_t j = 0; j < blocks.size(); ++j) {
    PAGEDKV_CHECK(blocks[j] == kNoBlock || live[j] > 0,
                  "invariant: sequence {} holds block {} with no kept token", id, blocks[j]);
  }
}

}  // namespace pagedkv
