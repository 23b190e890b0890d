#include "sim/tier_sim.hpp"

#include "core/check.hpp"

namespace pagedkv::sim {

TierStack::TierStack(const std::vector<ReplayTier>& tiers, int64_t block_bytes, int32_t block_size)
    : block_size_(block_size) {
  PAGEDKV_CHECK(block_bytes >= 1, "replay tiers: block bytes must be >= 1, got {}", block_bytes);
  for (const ReplayTier& t : tiers) {
    Tier tier;
    tier.capacity = t.bytes / block_bytes;
    tier.load_ms_per_block = 1000.0 * static_cast<double>(block_bytes) / t.load_bytes_per_s;
    tiers_.push_back(std::move(tier));
    results_.push_back(ReplayTierResult{.name = t.name, .capacity_blocks = t.bytes / block_bytes});
  }
}

void TierStack::put(size_t t, BlockHash key) {
  Tier& tier = tiers_[t];
  if (const auto it = tier.where.find(key); it != tier.where.end()) {
    tier.lru.splice(tier.lru.begin(), tier.lru, it->second);
    return;
  }
  if (tier.capacity == 0) return;
  if (static_cast<int64_t>(tier.lru.size()) == tier.capacity) {
    tier.where.erase(tier.lru.back());
    tier.lru.pop_back();
    ++results_[t].evicted_blocks;
  }
  tier.lru.push_front(key);
  tier.where.emplace(key, tier.lru.begin());
  ++results_[t].stored_blocks;
}

void TierStack::store(BlockHash key) {
  for (size_t t = 0; t < tiers_.size(); ++t) put(t, key);
}

int64_t TierStack::load(std::span<const BlockHash> chain, size_t from, int64_t limit, double& ms) {
  int64_t found = 0;
  for (size_t i = from; i < chain.size() && found < limit; ++i, ++found) {
    size_t t = 0;
    while (t < tiers_.size() && !tiers_[t].where.contains(chain[i])) ++t;
    if (t == tiers_.size()) break;
    ReplayTierResult& res = results_[t];
    ++res.hit_blocks;
    res.hit_tokens += block_size_;
    res.load_seconds += tiers_[t].load_ms_per_block / 1000.0;
    ms += tiers_[t].load_ms_per_block;
    for (size_t n = 0; n <= t; ++n) put(n, chain[i]);  // touch it here, promote it nearer
  }
  return found;
}

}  // namespace pagedkv::sim
