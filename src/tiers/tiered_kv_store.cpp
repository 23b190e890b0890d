#include "pagedkv/tiers/tiered_kv_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "pagedkv/error.hpp"

namespace pagedkv {

namespace {

constexpr size_t kNumFaults = static_cast<size_t>(RecordFault::kWrongContent) + 1;
constexpr size_t kMaxStoreBatch = 64;  // blocks per contains() round trip of the worker

// The block hash of a tier key (tier_key()): its last 16 hex digits.
BlockHash hash_of_key(const std::string& key) {
  return key.size() < 16 ? 0 : std::stoull(key.substr(key.size() - 16), nullptr, 16);
}

// Copies `blocks` with their tokens into `tokens`, re-pointing each block's view there.
std::vector<ChainedBlock> own_blocks(std::span<const ChainedBlock> blocks,
                                     std::vector<TokenId>& tokens) {
  size_t n = 0;
  for (const ChainedBlock& b : blocks) n += b.tokens.size();
  tokens.clear();
  tokens.reserve(n);
  for (const ChainedBlock& b : blocks)
    tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
  std::vector<ChainedBlock> out(blocks.begin(), blocks.end());
  size_t at = 0;
  for (ChainedBlock& b : out) {
    b.tokens = std::span<const TokenId>(tokens).subspan(at, b.tokens.size());
    at += b.tokens.size();
  }
  return out;
}

}  // namespace

TieredKVStore::TieredKVStore(const TieredKVStoreConfig& config,
                             std::vector<std::unique_ptr<KVTier>> tiers)
    : config_(config), tiers_(std::move(tiers)) {
  if (tiers_.empty()) throw Error("TieredKVStore: no tiers");
  for (size_t i = 0; i < tiers_.size(); ++i) {
    if (!tiers_[i]) throw Error(fmt::format("TieredKVStore: tier {} is null", i));
  }
  if (config.block_size < 1) {
    throw Error(fmt::format("TieredKVStore: block_size {} < 1", config.block_size));
  }
  if (config.payload_bytes < 1) {
    throw Error(fmt::format("TieredKVStore: payload_bytes {} < 1", config.payload_bytes));
  }
  if (config.max_pending_stores == 0 || config.max_pending_loads == 0) {
    throw Error(
        fmt::format("TieredKVStore: max_pending_stores {} and max_pending_loads {} must "
                    "be >= 1",
                    config.max_pending_stores, config.max_pending_loads));
  }
  stats_.loaded_blocks.assign(tiers_.size(), 0);
  stats_.faults.assign(kNumFaults, 0);
  worker_ = std::thread([this] { run(); });
}

TieredKVStore::~TieredKVStore() {
  flush();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

bool TieredKVStore::store(const ChainedBlock& block, std::span<const std::byte> payload) {
  if (static_cast<int64_t>(payload.size()) != config_.payload_bytes) {
    throw Error(fmt::format("TieredKVStore::store: payload of {} bytes, the pool's blocks have {}",
                            payload.size(), config_.payload_bytes));
  }
  if (static_cast<int64_t>(block.tokens.size()) != config_.block_size) {
    throw Error(fmt::format("TieredKVStore::store: block of {} tokens, block_size is {}",
                            block.tokens.size(), config_.block_size));
  }
  PendingStore p;
  p.tokens.assign(block.tokens.begin(), block.tokens.end());
  p.block = block;
  p.payload.assign(payload.begin(), payload.end());
  {
    std::lock_guard lock(mu_);
    if (stores_.size() >= config_.max_pending_stores) {
      ++stats_.stores_dropped;
      return false;
    }
    stores_.push_back(std::move(p));
    stores_.back().block.tokens = stores_.back().tokens;  // the deque element's own copy
    ++stats_.stores_queued;
  }
  wake_.notify_one();
  return true;
}

int32_t TieredKVStore::lookup(std::span<const ChainedBlock> blocks) {
  std::vector<std::string> keys;
  keys.reserve(blocks.size());
  for (const ChainedBlock& b : blocks) keys.push_back(tier_key(config_.fingerprint, b.hash));
  std::vector<bool> held(keys.size(), false);
  for (const auto& tier : tiers_) {
    const std::vector<bool> in_tier = tier->contains(keys);
    for (size_t i = 0; i < held.size(); ++i) held[i] = held[i] || in_tier[i];
  }
  const auto n = static_cast<int32_t>(std::find(held.begin(), held.end(), false) - held.begin());
  std::lock_guard lock(mu_);
  stats_.lookup_blocks += static_cast<int64_t>(blocks.size());
  stats_.lookup_hits += n;
  return n;
}

LoadTicket TieredKVStore::load(std::span<const ChainedBlock> blocks) {
  auto p = std::make_shared<PendingLoad>();
  p->blocks = own_blocks(blocks, p->tokens);
  {
    std::lock_guard lock(mu_);
    if (in_flight_.size() >= config_.max_pending_loads) {
      ++stats_.loads_refused;
      return 0;
    }
    p->ticket = next_ticket_++;
    loads_.push_back(p);
    in_flight_.push_back(p);
  }
  wake_.notify_one();
  return p->ticket;
}

std::optional<LoadResult> TieredKVStore::poll(LoadTicket ticket) {
  std::lock_guard lock(mu_);
  const auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                               [&](const auto& p) { return p->ticket == ticket; });
  if (it == in_flight_.end()) {
    throw Error(fmt::format("TieredKVStore::poll: unknown load ticket {}", ticket));
  }
  if (!(*it)->result) return std::nullopt;
  LoadResult r = std::move(*(*it)->result);
  in_flight_.erase(it);
  return r;
}

LoadResult TieredKVStore::wait(LoadTicket ticket) {
  for (;;) {
    if (auto r = poll(ticket)) return std::move(*r);
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] {
      return std::any_of(in_flight_.begin(), in_flight_.end(),
                         [&](const auto& p) { return p->ticket == ticket && p->result; });
    });
  }
}

void TieredKVStore::flush() {
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return stores_.empty() && stores_running_ == 0; });
}

TieredKVStoreStats TieredKVStore::stats() const {
  std::lock_guard lock(mu_);
  TieredKVStoreStats s = stats_;
  s.tiers.clear();
  for (const auto& t : tiers_) s.tiers.push_back(t->stats());
  return s;
}

std::vector<TierEvent> TieredKVStore::take_events() {
  std::lock_guard lock(mu_);
  return std::exchange(events_, {});
}

void TieredKVStore::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !loads_.empty() || !stores_.empty(); });
    if (!loads_.empty()) {  // loads first: they are on a request's time to first token
      const std::shared_ptr<PendingLoad> p = loads_.front();
      loads_.pop_front();
      lock.unlock();
      run_load(*p);
      lock.lock();
      done_.notify_all();
    } else if (!stores_.empty()) {
      std::vector<PendingStore> batch;
      while (!stores_.empty() && batch.size() < kMaxStoreBatch) {
        batch.push_back(std::move(stores_.front()));
        batch.back().block.tokens = batch.back().tokens;
        stores_.pop_front();
      }
      stores_running_ = batch.size();
      lock.unlock();
      write_batch(batch);
      lock.lock();
      stores_running_ = 0;
      done_.notify_all();
    } else if (stopping_) {
      return;
    }
  }
}

void TieredKVStore::write_batch(std::vector<PendingStore>& batch) {
  std::vector<std::string> keys;
  for (const PendingStore& p : batch) keys.push_back(tier_key(config_.fingerprint, p.block.hash));
  std::vector<bool> repair(keys.size(), false);
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) repair[i] = refused_.erase(keys[i]) > 0;
  }
  for (size_t t = 0; t < tiers_.size(); ++t) {
    std::vector<bool> held = tiers_[t]->contains(keys);
    for (size_t i = 0; i < keys.size(); ++i) held[i] = held[i] && !repair[i];
    int64_t skipped = 0;
    std::vector<TierEvent> stored;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (held[i]) {
        ++skipped;
        continue;
      }
      const ChainedBlock& b = batch[i].block;
      const std::vector<std::byte> record =
          encode_block_record(config_.fingerprint, b, batch[i].payload);
      if (tiers_[t]->put(keys[i], record) == PutOutcome::kStored) {
        stored.push_back(TierEvent{true, tiers_[t]->medium(), b.hash, b.parent_hash,
                                   std::vector<TokenId>(b.tokens.begin(), b.tokens.end())});
      }
    }
    std::lock_guard lock(mu_);
    stats_.stores_skipped += skipped;
    for (TierEvent& e : stored) events_.push_back(std::move(e));
    collect_evictions(t);
  }
}

// Called with mu_ held: the tier's LRU removals become BlockRemoved events.
void TieredKVStore::collect_evictions(size_t tier) {
  for (const std::string& key : tiers_[tier]->take_evicted()) {
    events_.push_back(TierEvent{false, tiers_[tier]->medium(), hash_of_key(key), 0, {}});
  }
}

void TieredKVStore::run_load(PendingLoad& load) {
  LoadResult r;
  std::vector<int64_t> faults(kNumFaults, 0);
  std::vector<std::string> refused;
  for (const ChainedBlock& b : load.blocks) {
    const std::string key = tier_key(config_.fingerprint, b.hash);
    bool found = false;
    for (size_t t = 0; t < tiers_.size() && !found; ++t) {
      const std::optional<std::vector<std::byte>> value = tiers_[t]->get(key);
      if (!value) continue;
      std::span<const std::byte> payload;
      const RecordFault fault =
          decode_block_record(*value, config_.fingerprint, b, config_.payload_bytes, payload);
      if (fault != RecordFault::kNone) {
        ++faults[static_cast<size_t>(fault)];
        refused.push_back(key);
        continue;  // a farther tier may still hold a good copy
      }
      r.payloads.emplace_back(payload.begin(), payload.end());
      r.tier.push_back(static_cast<int32_t>(t));
      found = true;
      // Promote: the nearer tiers keep a copy, so the next hit on this block is cheaper.
      for (size_t near = 0; near < t; ++near) (void)tiers_[near]->put(key, *value);
    }
    if (!found) break;
  }
  r.num_blocks = static_cast<int32_t>(r.payloads.size());
  std::lock_guard lock(mu_);
  for (size_t f = 0; f < kNumFaults; ++f) stats_.faults[f] += faults[f];
  for (std::string& key : refused) refused_.insert(std::move(key));
  for (const int32_t t : r.tier) ++stats_.loaded_blocks[static_cast<size_t>(t)];
  load.result = std::move(r);
}

}  // namespace pagedkv
