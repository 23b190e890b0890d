// HybridKVCacheManager, preemption of a sequence across all its groups at once: swapping its
// live entries to the host pool and back, and recompute (free now, prefill again later). Null
// entries are never swapped: they hold nothing.

#include <algorithm>

#include "core/check.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {

namespace {
int64_t live_entries(const std::vector<std::vector<BlockId>>& tables) {
  int64_t n = 0;
  for (const std::vector<BlockId>& t : tables) {
    n += std::count_if(t.begin(), t.end(),
                       [](BlockId b) { return b != HybridKVCacheManager::kNullBlock; });
  }
  return n;
}

/// Gives each live entry its block from `ids` (in group, then table order) and lists the moves.
HybridSwapResult remap(std::vector<std::vector<BlockId>>& tables, const std::vector<BlockId>& ids) {
  HybridSwapResult r;
  r.copies.reserve(ids.size());
  r.copy_groups.reserve(ids.size());
  size_t k = 0;
  for (size_t g = 0; g < tables.size(); ++g) {
    for (BlockId& b : tables[g]) {
      if (b == HybridKVCacheManager::kNullBlock) continue;
      r.copies.push_back({b, ids[k]});
      r.copy_groups.push_back(static_cast<int32_t>(g));
      b = ids[k++];
    }
  }
  return r;
}
}  // namespace

bool HybridKVCacheManager::can_swap_out(SeqId seq) const {
  const Sequence& s = get_running(seq, "can_swap_out");
  return host_.has_value() && live_entries(s.tables) <= host_->num_available();
}

std::optional<HybridSwapResult> HybridKVCacheManager::swap_out(SeqId seq) {
  if (!can_swap_out(seq)) return std::nullopt;
  Sequence& s = get(seq, "swap_out");
  const auto n = static_cast<int32_t>(live_entries(s.tables));
  std::vector<std::vector<BlockId>> device = s.tables;  // copied before any change
  // The host pool never caches (nothing publishes its blocks), so it evicts nothing.
  std::optional<std::vector<BlockId>> host_ids = host_->allocate(n);
  PAGEDKV_CHECK(host_ids.has_value(), "swap_out: internal: {} host blocks not available", n);
  HybridSwapResult r = remap(s.tables, *host_ids);
  release_tables(device, pool_);  // published blocks stay cached
  s.swapped = true;
  ++counters_.preemptions;
  counters_.swapped_out_blocks += n;
  return r;
}

bool HybridKVCacheManager::can_swap_in(SeqId seq) const {
  const Sequence& s = get(seq, "can_swap_in");
  PAGEDKV_CHECK(s.swapped, "can_swap_in: sequence {} is not swapped out", seq);
  return live_entries(s.tables) <= pool_.num_available();
}

std::optional<HybridSwapResult> HybridKVCacheManager::swap_in(SeqId seq) {
  const Sequence& check = get(seq, "swap_in");
  PAGEDKV_CHECK(check.swapped, "swap_in: sequence {} is not swapped out", seq);
  if (!can_swap_in(seq)) return std::nullopt;
  Sequence& s = get(seq, "swap_in");
  std::vector<std::vector<BlockId>> host = s.tables;
  const std::vector<BlockId> ids = allocate_evicting(static_cast<int32_t>(live_entries(s.tables)));
  HybridSwapResult r = remap(s.tables, ids);
  release_tables(host, *host_);
  s.swapped = false;
  counters_.swapped_in_blocks += static_cast<int64_t>(ids.size());
  return r;
}

bool HybridKVCacheManager::is_swapped(SeqId seq) const { return get(seq, "is_swapped").swapped; }

PreemptedSequence HybridKVCacheManager::preempt(SeqId seq) {
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

}  // namespace pagedkv
