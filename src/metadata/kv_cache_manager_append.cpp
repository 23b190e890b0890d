// KVCacheManager, appends: a plan computed without changing anything (what token eviction
// releases, copy-on-write, fresh blocks, where new tokens go), then a commit that cannot fail.
// The eviction policy is asked the same questions under every kind (eviction_policy.hpp).

#include <algorithm>

#include "core/check.hpp"
#include "metadata/manager_internal.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"

namespace pagedkv {

KVCacheManager::AppendPlan KVCacheManager::plan_append(const Sequence& s, int64_t n,
                                                       const char* op) const {
  PAGEDKV_CHECK(n >= 0, "KVCacheManager::{}: token count must be >= 0, got {}", op, n);
  PAGEDKV_CHECK(n <= kMaxTokensPerCall,
                "KVCacheManager::{}: {} tokens in one call exceed kMaxTokensPerCall {}", op, n,
                kMaxTokensPerCall);
  PAGEDKV_CHECK(config_.max_model_len == 0 || s.num_tokens + n <= config_.max_model_len,
                "KVCacheManager::{}: {} + {} tokens exceed max_model_len {}", op, s.num_tokens, n,
                config_.max_model_len);
  AppendPlan plan;
  if (n == 0) return plan;
  if (!s.kept.plan_refill(*policy_, s.blocks, allocator_, config_.block_size, s.num_tokens, n,
                          plan)) {
    plan_positional(s, n, plan);
  }
  return plan;
}

// A positional table: logical entry j holds positions [j * bs, (j + 1) * bs).
inline void KVCacheManager::plan_positional(const Sequence& s, int64_t n, AppendPlan& plan) const {
  const int64_t bs = config_.block_size;
  const int64_t t = s.num_tokens;
  // Release the full blocks that lie wholly in the positions no query at >= t sees.
  const auto [first, last] = released_block_range(t);
  for (int64_t j = first; j < last; ++j) {
    if (s.blocks[j] == kNoBlock) continue;
    plan.release.push_back(static_cast<int32_t>(j));
    if (allocator_.ref_count(s.blocks[j]) == 1) ++plan.freed;
  }
  // Copy-on-write: a partially filled last block that others may read (shared with a fork, or
  // still published after a truncate) gets a private copy before it is written.
  if (t % bs != 0) {
    const BlockId tail = s.blocks.back();
    plan.cow = allocator_.ref_count(tail) > 1 || allocator_.is_cached(tail);
  }
  plan.fresh = static_cast<int32_t>(std::min<int64_t>(
      blocks_for_tokens(t + n, bs) - static_cast<int64_t>(s.blocks.size()) + (plan.cow ? 1 : 0),
      INT32_MAX));
}

// The plan of an append of n tokens plus a look-ahead of k slots: the queries that take a
// look-ahead (can_append, blocks_needed_to_append, append_admission) answer for this one plan.
KVCacheManager::AppendPlan KVCacheManager::plan_lookahead(const Sequence& s, int64_t n, int64_t k,
                                                          const char* op) const {
  PAGEDKV_CHECK(k >= 0, "KVCacheManager::{}: num_lookahead_slots must be >= 0, got {}", op, k);
  PAGEDKV_CHECK(k <= kMaxTokensPerCall - std::clamp<int64_t>(n, 0, kMaxTokensPerCall),
                "KVCacheManager::{}: {} + {} look-ahead tokens exceed kMaxTokensPerCall {}", op, n,
                k, kMaxTokensPerCall);
  AppendPlan plan = plan_append(s, n, op);
  if (k == 0) return plan;
  // Look-ahead slots past max_model_len could never be appended: they are not counted.
  const int64_t room =
      config_.max_model_len > 0 ? config_.max_model_len - s.num_tokens : kMaxTokensPerCall;
  return plan_append(s, std::max(n, std::min(n + k, room)), op);
}

int32_t KVCacheManager::blocks_needed_to_append(SeqId seq, int64_t n,
                                                int64_t num_lookahead_slots) const {
  return plan_lookahead(get_running(seq, "blocks_needed_to_append"), n, num_lookahead_slots,
                        "blocks_needed_to_append")
      .fresh;
}

bool KVCacheManager::can_append(SeqId seq, int64_t n, int64_t num_lookahead_slots) const {
  const AppendPlan plan =
      plan_lookahead(get_running(seq, "can_append"), n, num_lookahead_slots, "can_append");
  return int64_t{plan.fresh} <= int64_t{allocator_.num_available()} + plan.freed;
}

Admission KVCacheManager::append_admission(SeqId seq, int64_t n,
                                           int64_t num_lookahead_slots) const {
  const Sequence& s = get_running(seq, "append_admission");
  // Past max_model_len no wait makes room: an answer, not an error, for a scheduler's query.
  if (n >= 0 && config_.max_model_len > 0 && s.num_tokens + n > config_.max_model_len) {
    return Admission::kNever;
  }
  const AppendPlan plan = plan_lookahead(s, n, num_lookahead_slots, "append_admission");
  if (int64_t{plan.fresh} <= int64_t{allocator_.num_available()} + plan.freed) {
    return Admission::kOk;
  }
  // Blocks the sequence would hold afterwards; a copy-on-write copy replaces the shared block.
  const int64_t held = int64_t{live_blocks(s.blocks)} - static_cast<int64_t>(plan.release.size()) +
                       plan.fresh - (plan.cow ? 1 : 0);
  return held > allocator_.num_blocks() ? Admission::kNever : Admission::kLater;
}

std::optional<AppendResult> KVCacheManager::append_slots(SeqId seq, int64_t n) {
  return do_append(seq, n, {}, true, "append_slots");
}

std::optional<AppendResult> KVCacheManager::append_slots(SeqId seq, int64_t n,
                                                         const AppendOptions& options) {
  return do_append(seq, n, {}, options.return_slots, "append_slots");
}

std::optional<AppendResult> KVCacheManager::append_tokens(SeqId seq,
                                                          std::span<const TokenId> tokens) {
  return do_append(seq, static_cast<int64_t>(tokens.size()), tokens, true, "append_tokens");
}

std::optional<AppendResult> KVCacheManager::append_tokens(SeqId seq,
                                                          std::span<const TokenId> tokens,
                                                          const AppendOptions& options) {
  return do_append(seq, static_cast<int64_t>(tokens.size()), tokens, options.return_slots,
                   "append_tokens");
}

std::optional<AppendResult> KVCacheManager::do_append(SeqId seq, int64_t n,
                                                      std::span<const TokenId> ids, bool slots,
                                                      const char* op) {
  // One lookup (an append runs once per sequence per decode step): get_running's checks.
  auto& s = const_cast<Sequence&>(get_running(seq, op));
  const int64_t t = s.num_tokens;
  if (fills_last_block(s, n)) {
    // 15 of 16 decode steps (block size 16): the tokens go into the last block, which this
    // sequence alone holds; nothing is taken, released or copied. The plan below would say
    // so too; this skips building it.
    AppendResult result;
    if (slots) append_position_slots(s.blocks, t, n, config_.block_size, result.slots);
    s.num_tokens += n;
    record_ids(s, n, ids);
    return result;
  }
  const AppendPlan plan = plan_append(s, n, op);
  if (int64_t{plan.fresh} > int64_t{allocator_.num_available()} + plan.freed) return std::nullopt;

  // Commit. Nothing below can fail for lack of blocks: the plan was checked against the pool.
  release_entries(s, plan.release);
  std::optional<std::vector<BlockId>> fresh = allocate_blocks(plan.fresh);
  PAGEDKV_CHECK(fresh.has_value(), "KVCacheManager::{}: internal: {} blocks not available", op,
                plan.fresh);

  AppendResult result;
  if (plan.refill) {
    result.slots.reserve(static_cast<size_t>(n));
    counters_.evicted_tokens += static_cast<int64_t>(plan.victims.size());
    s.kept.place_refill(s.blocks, s.placeholders, plan, *fresh, config_.block_size, t, n,
                        result.slots);
    if (!slots) result.slots = {};  // the refill places tokens slot by slot: computed anyway
  } else {
    place_positional(s, plan, *fresh, n, slots, result);
  }
  s.num_tokens += n;
  record_ids(s, n, ids);
  // Nothing to publish: the new tokens' K/V are not written yet (commit() publishes).
  return result;
}

// An append of n >= 1 tokens that plan_append would plan as nothing: no eviction policy (no
// release, no kept set), the tokens fit in the partly filled last block, which no other
// sequence shares and the prefix cache does not hold (no copy-on-write), within max_model_len.
inline bool KVCacheManager::fills_last_block(const Sequence& s, int64_t n) const {
  const int64_t bs = config_.block_size;
  const int64_t t = s.num_tokens;
  if (config_.eviction.kind != EvictionKind::kNone || s.kept.sparse() || n < 1 || t % bs == 0 ||
      t % bs + n > bs || (config_.max_model_len > 0 && t + n > config_.max_model_len)) {
    return false;
  }
  const BlockId tail = s.blocks.back();
  return tail != kNoBlock && allocator_.ref_count(tail) == 1 && !allocator_.is_cached(tail);
}

// The new tokens' ids: appended while all are known; unknown ones (an append without ids) stop
// the sequence keying its blocks.
inline void KVCacheManager::record_ids(Sequence& s, int64_t n, std::span<const TokenId> ids) {
  if (n == 0) return;
  if (ids.empty()) {
    s.ids_known = false;
    s.token_ids.clear();
    s.token_ids.shrink_to_fit();
  } else if (s.ids_known) {
    s.token_ids.insert(s.token_ids.end(), ids.begin(), ids.end());
  }
}

inline void KVCacheManager::release_entries(Sequence& s, const std::vector<int32_t>& entries) {
  for (int32_t j : entries) {
    s.placeholders[j] = s.blocks[j];
    s.blocks[j] = kNoBlock;
  }
  // Release after the table update, last entry first (the LRU then evicts later positions
  // before earlier ones, as free_sequence does).
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    allocator_.release(s.placeholders[*it]);
  }
  counters_.released_blocks += static_cast<int64_t>(entries.size());
}

inline void KVCacheManager::place_positional(Sequence& s, const AppendPlan& plan,
                                             const std::vector<BlockId>& fresh, int64_t n,
                                             bool slots, AppendResult& result) {
  const int64_t bs = config_.block_size;
  const int64_t t = s.num_tokens;
  auto next_fresh = fresh.begin();
  if (plan.cow) {
    const BlockId shared = s.blocks.back();
    const BlockId copy = *next_fresh++;
    result.copies.push_back({shared, copy});
    allocator_.release(shared);  // ref > 1, so this only drops our reference
    s.blocks.back() = copy;
  }
  for (; next_fresh != fresh.end(); ++next_fresh) {
    s.blocks.push_back(*next_fresh);
    s.placeholders.push_back(-1);
  }
  if (slots) append_position_slots(s.blocks, t, n, bs, result.slots);
  s.kept.add_positional(t, n, config_.block_size);
}

}  // namespace pagedkv
