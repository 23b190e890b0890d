// KVCacheManager, preemption: swapping a sequence's live blocks to the host pool and back, and
// recompute preemption (free now, prefill again later).

#include <algorithm>

#include "core/check.hpp"
#include "metadata/manager_internal.hpp"

namespace pagedkv {

namespace {
int32_t live_blocks(std::span<const BlockId> blocks) {
  return static_cast<int32_t>(
      std::count_if(blocks.begin(), blocks.end(), [](BlockId b) { return b >= 0; }));
}
}  // namespace

bool KVCacheManager::can_swap_out(SeqId seq) const {
  const Sequence& s = get_running(seq, "can_swap_out");
  return host_.has_value() && live_blocks(s.blocks) <= host_->num_available();
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

bool KVCacheManager::can_swap_in(SeqId seq) const {
  const Sequence& s = get(seq, "can_swap_in");
  PAGEDKV_CHECK(s.swapped, "KVCacheManager::can_swap_in: sequence {} is not swapped out", seq);
  return int64_t{allocator_.num_available()} - live_blocks(s.blocks) >= watermark_blocks_;
}

std::optional<SwapResult> KVCacheManager::swap_in(SeqId seq) {
  if (!can_swap_in(seq)) return std::nullopt;
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
