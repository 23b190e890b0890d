// KVCacheManager: construction, the sequence registry (add, free, fork) and read-only queries.
// The rest of the class lives in focused files: kv_cache_manager_prefix.cpp (prompts, prefix-
// cache bookkeeping, commit, evicted cached blocks), kv_cache_manager_append.cpp (append
// planning and execution), kv_cache_manager_batch.cpp (batch metadata, kept sets, scores),
// kv_cache_manager_swap.cpp (swap, preemption, look-ahead), kv_cache_manager_rollback.cpp
// (truncate), kv_cache_manager_invariants.cpp, and the kept set of token eviction in
// kept_set.cpp.

#include "pagedkv/metadata/kv_cache_manager.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/check.hpp"
#include "core/enum_names.hpp"
#include "metadata/manager_internal.hpp"

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

constexpr detail::EnumName<Admission> kAdmissionNames[] = {
    {Admission::kOk, "ok"},
    {Admission::kLater, "later"},
    {Admission::kNever, "never"},
};

constexpr detail::EnumName<KVCacheEvent::Kind> kEventKindNames[] = {
    {KVCacheEvent::Kind::kStored, "stored"},
    {KVCacheEvent::Kind::kRemoved, "removed"},
    {KVCacheEvent::Kind::kEvicted, "evicted"},
    {KVCacheEvent::Kind::kAllCleared, "all_cleared"},
};

template <typename E>
std::string_view name_or_unknown(std::span<const detail::EnumName<E>> table, E value) {
  const std::string_view name = detail::enum_name<E>(table, value);
  return name.empty() ? "unknown" : name;
}
}  // namespace

std::string_view admission_name(Admission admission) {
  return name_or_unknown<Admission>(kAdmissionNames, admission);
}

std::string_view event_kind_name(KVCacheEvent::Kind kind) {
  return name_or_unknown<KVCacheEvent::Kind>(kEventKindNames, kind);
}

KVCacheManager::KVCacheManager(const KVCacheManagerConfig& config)
    : config_(validated(config)),
      allocator_(config.num_blocks),
      host_(config.num_host_blocks > 0
                ? std::optional<BlockAllocator>(std::in_place, config.num_host_blocks)
                : std::nullopt),
      prefix_(config.num_blocks, config.block_size),
      policy_(make_eviction_policy(config.eviction)),
      watermark_blocks_(static_cast<int32_t>(std::floor(config.watermark * config.num_blocks))) {
  counters_.host_total_blocks = config.num_host_blocks;
  // A sequence the pool could never hold would be accepted and then answered "not now"
  // forever (a retrying scheduler hangs): reject the configuration instead.
  if (config_.max_model_len > 0) {
    const int64_t need = min_blocks_held(config_.max_model_len);
    PAGEDKV_CHECK(need <= config_.num_blocks,
                  "KVCacheManager: max_model_len {} needs {} blocks of {} tokens (eviction '{}'), "
                  "more than num_blocks {}",
                  config_.max_model_len, need, config_.block_size,
                  eviction_kind_name(policy_->kind()), config_.num_blocks);
  }
}

int64_t KVCacheManager::min_blocks_held(int64_t num_tokens) const {
  PAGEDKV_CHECK(num_tokens >= 0, "KVCacheManager::min_blocks_held: num_tokens must be >= 0, got {}",
                num_tokens);
  const int64_t bs = config_.block_size;
  // A score-based policy keeps at most budget() tokens once decoding: at least that many slots.
  if (policy_->scores_tokens()) {
    const int64_t budget = policy_->budget();
    return blocks_for_tokens(budget < 0 ? num_tokens : std::min(num_tokens, budget), bs);
  }
  const AttentionMask mask = policy_->attention_mask();
  if (mask.window_left < 0) return blocks_for_tokens(num_tokens, bs);
  // A bounded mask: after appending position p one at a time the sequence holds
  // ceil((p + 1) / bs) blocks minus those released before that append. Past the sinks and the
  // window this repeats with period bs, so the peak is reached within one more period.
  const int64_t horizon =
      std::min(num_tokens, int64_t{mask.sink_tokens} + mask.window_left + 2 * bs);
  int64_t peak = 0;
  for (int64_t p = 0; p < horizon; ++p) {
    const auto [first, last] = released_block_range(p);
    peak = std::max(peak, blocks_for_tokens(p + 1, bs) - std::max<int64_t>(0, last - first));
  }
  return peak;
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

// The policy decides once, for the sequence's whole life, whether its kept set is a list.
KVCacheManager::Sequence KVCacheManager::new_sequence() const {
  Sequence s;
  s.kept = KeptSet(policy_->scores_tokens());
  return s;
}

void KVCacheManager::emit(KVCacheEvent event) {
  if (config_.enable_events) events_.push_back(std::move(event));
}

void KVCacheManager::add_sequence(SeqId seq) {
  PAGEDKV_CHECK(seq != kPaddingSeq, "KVCacheManager::add_sequence: id {} is reserved for padding",
                seq);
  PAGEDKV_CHECK(!seqs_.contains(seq), "KVCacheManager::add_sequence: sequence {} already exists",
                seq);
  seqs_.emplace(seq, new_sequence());
}

void KVCacheManager::free_sequence(SeqId seq) {
  Sequence& s = get(seq, "free_sequence");
  BlockAllocator& pool = s.swapped ? *host_ : allocator_;
  // Tail blocks first (release_table): if they become cached, they are evicted before the
  // head blocks that other prompts are more likely to share. kNoBlock entries are skipped.
  pool.release_table(s.blocks);
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

}  // namespace pagedkv
