#pragma once
/// @file host_tier.hpp
/// The host-memory tier: values in process memory within a byte budget, least recently used
/// evicted first. The first tier below the pool (vLLM's CPU offloading, SGLang HiCache's host
/// pool, LMCache's local CPU backend).

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedkv/tiers/kv_tier.hpp"

namespace pagedkv {

/// Host-memory KVTier. Memory: at most budget_bytes of values plus O(entries) bookkeeping.
/// Not pinned: a device pool reaches it through a staging copy (the pinned variant is open
/// work, docs/tiers.md). Internally synchronized (one mutex; every operation is O(1) expected
/// plus the copy of the value).
class HostMemoryTier final : public KVTier {
 public:
  /// An empty tier holding at most `budget_bytes` of values.
  /// Errors: throws pagedkv::Error naming the value if budget_bytes < 1.
  explicit HostMemoryTier(int64_t budget_bytes);

  /// "host".
  [[nodiscard]] std::string_view name() const override { return "host"; }
  /// TierMedium::kHost.
  [[nodiscard]] TierMedium medium() const override { return TierMedium::kHost; }
  /// See KVTier::put; kTooLarge when value.size() > budget_bytes.
  PutOutcome put(std::string_view key, std::span<const std::byte> value) override;
  /// See KVTier::get.
  [[nodiscard]] std::optional<std::vector<std::byte>> get(std::string_view key) override;
  /// See KVTier::contains (no LRU change).
  [[nodiscard]] std::vector<bool> contains(std::span<const std::string> keys) override;
  /// See KVTier::take_evicted.
  [[nodiscard]] std::vector<std::string> take_evicted() override;
  /// See KVTier::stats.
  [[nodiscard]] TierStats stats() const override;

 private:
  struct Entry {
    std::string key;
    std::vector<std::byte> value;
  };
  void erase_locked(std::list<Entry>::iterator it);

  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  std::vector<std::string> evicted_;
  TierStats stats_;
};

}  // namespace pagedkv
