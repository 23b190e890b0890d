// KVCacheManager, preemption: swapping a sequence's live blocks to the host pool and back, and
// recompute preemption (free now, prefill again later).

#include <algorithm>

#include "core/check.hpp"
#include "metadata/manager_internal.hpp"

namespace pagedkv {

bool KVCacheManager::can_swap_out(SeqId seq) const {
  const Sequence& s = get_running(seq, "can_swap_out");
  return host_.has_value() && live_blocks(s.blocks) <= host_->num_available();
}

Admission KVCacheManager::swap_out_admission(SeqId seq) const {
  if (can_swap_out(seq)) return Admission::kOk;
  const Sequence& s = get(seq, "swap_out_admission");
  // Without a host pool, or with one smaller than the sequence, no wait makes room.
  return !host_ || live_blocks(s.blocks) > host_->num_blocks() ? Admission::kNever
                                                               : Admission::kLater;
}

std::optional<SwapResult> KVCacheManager::swap_out(SeqId seq) {
  if (!can_swap_out(seq)) return std::nullopt;
  Sequence& s = get(seq, "swap_out");
  const int32_t n = live_blocks(s.blocks);
  // The host pool never caches (nothing registers its blocks), so it evicts nothing.
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
  for (auto it = device.rbegin(); it != device.rend(); ++it) allocator_.release(*it);
  s.swapped = true;
  ++counters_.preemptions;
  counters_.swapped_out_blocks += n;
  return result;
}

// Blocks an append of n tokens takes right after a swap-in, net of what token eviction frees in
// the same append. Positional policies: exact (the swapped-in table is private, so no
// copy-on-write). A kept-list policy refills freed slots first: ceil(n / bs) bounds it.
int64_t KVCacheManager::lookahead_blocks(const Sequence& s, int64_t n) const {
  const int64_t bs = config_.block_size;
  if (config_.max_model_len > 0) n = std::min(n, config_.max_model_len - s.num_tokens);
  if (n <= 0) return 0;
  if (policy_->scores_tokens()) return blocks_for_tokens(n, bs);
  const int64_t t = s.num_tokens;
  int64_t freed = 0;
  const auto [first, last] = released_block_range(t);
  for (int64_t j = first; j < last; ++j) freed += s.blocks[j] != kNoBlock ? 1 : 0;
  const int64_t fresh = blocks_for_tokens(t + n, bs) - static_cast<int64_t>(s.blocks.size());
  return std::max<int64_t>(0, fresh - freed);
}

Admission KVCacheManager::swap_in_admission(SeqId seq, int64_t num_lookahead_slots) const {
  const Sequence& s = get(seq, "swap_in");
  PAGEDKV_CHECK(s.swapped, "KVCacheManager::swap_in: sequence {} is not swapped out", seq);
  PAGEDKV_CHECK(num_lookahead_slots >= 0,
                "KVCacheManager::swap_in: num_lookahead_slots must be >= 0, got {}",
                num_lookahead_slots);
  constexpr int64_t kFar = int64_t{1} << 50;
  const int64_t need =
      live_blocks(s.blocks) + lookahead_blocks(s, std::min(num_lookahead_slots, kFar));
  if (int64_t{allocator_.num_available()} - need >= watermark_blocks_) return Admission::kOk;
  return need > int64_t{allocator_.num_blocks()} - watermark_blocks_ ? Admission::kNever
                                                                     : Admission::kLater;
}

bool KVCacheManager::can_swap_in(SeqId seq, int64_t num_lookahead_slots) const {
  return swap_in_admission(seq, num_lookahead_slots) == Admission::kOk;
}

std::optional<SwapResult> KVCacheManager::swap_in(SeqId seq, int64_t num_lookahead_slots) {
  if (!can_swap_in(seq, num_lookahead_slots)) return std::nullopt;
  Sequence& s = get(seq, "swap_in");
  const int32_t n = live_blocks(s.blocks);
  std::optional<std::vector<BlockId>> ids = allocate_blocks(n);
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

}  // namespace pagedkv
