#include "pagedkv/tiers/host_tier.hpp"

#include <fmt/format.h>

#include <utility>

#include "pagedkv/error.hpp"

namespace pagedkv {

namespace {

void check_key(std::string_view key, const char* op) {
  if (key.empty()) throw Error(fmt::format("HostMemoryTier::{}: empty key", op));
}

}  // namespace

HostMemoryTier::HostMemoryTier(int64_t budget_bytes) {
  if (budget_bytes < 1) {
    throw Error(fmt::format("HostMemoryTier: budget_bytes {} < 1", budget_bytes));
  }
  stats_.budget_bytes = budget_bytes;
}

void HostMemoryTier::erase_locked(std::list<Entry>::iterator it) {
  stats_.used_bytes -= static_cast<int64_t>(it->value.size());
  --stats_.entries;
  index_.erase(it->key);
  lru_.erase(it);
}

PutOutcome HostMemoryTier::put(std::string_view key, std::span<const std::byte> value) {
  check_key(key, "put");
  if (value.empty()) throw Error("HostMemoryTier::put: empty value");
  std::lock_guard lock(mu_);
  const auto size = static_cast<int64_t>(value.size());
  if (size > stats_.budget_bytes) {
    ++stats_.rejected;
    return PutOutcome::kTooLarge;
  }
  // Copy first: a bad_alloc here leaves the tier as it was.
  Entry fresh{std::string(key), std::vector<std::byte>(value.begin(), value.end())};
  if (auto it = index_.find(fresh.key); it != index_.end()) erase_locked(it->second);
  while (stats_.used_bytes + size > stats_.budget_bytes) {
    evicted_.push_back(lru_.back().key);
    ++stats_.evictions;
    erase_locked(std::prev(lru_.end()));
  }
  lru_.push_front(std::move(fresh));
  index_.emplace(lru_.front().key, lru_.begin());
  stats_.used_bytes += size;
  ++stats_.entries;
  ++stats_.puts;
  stats_.bytes_written += size;
  return PutOutcome::kStored;
}

std::optional<std::vector<std::byte>> HostMemoryTier::get(std::string_view key) {
  check_key(key, "get");
  std::lock_guard lock(mu_);
  ++stats_.gets;
  const auto it = index_.find(std::string(key));
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  ++stats_.hits;
  stats_.bytes_read += static_cast<int64_t>(it->second->value.size());
  return it->second->value;
}

std::vector<bool> HostMemoryTier::contains(std::span<const std::string> keys) {
  std::vector<bool> out(keys.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i], "contains");
    out[i] = index_.contains(keys[i]);
  }
  return out;
}

std::vector<std::string> HostMemoryTier::take_evicted() {
  std::lock_guard lock(mu_);
  return std::exchange(evicted_, {});
}

TierStats HostMemoryTier::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace pagedkv
