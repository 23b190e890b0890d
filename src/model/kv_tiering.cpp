#include "model/kv_tiering.hpp"

#include <fmt/format.h>

#include <charconv>

#include "pagedkv/error.hpp"
#include "pagedkv/tiers/block_record.hpp"
#include "pagedkv/tiers/disk_tier.hpp"
#include "pagedkv/tiers/host_tier.hpp"
#include "pagedkv/tiers/redis_tier.hpp"
#include "pagedkv/tiers/tier_key.hpp"

namespace pagedkv::model {

namespace {

RedisTierConfig redis_config(const TieringOptions& o) {
  const size_t colon = o.redis.rfind(':');
  int port = 0;
  const char* end = o.redis.data() + o.redis.size();
  if (colon == std::string::npos || colon == 0 ||
      std::from_chars(o.redis.data() + colon + 1, end, port).ptr != end) {
    throw Error(fmt::format("tiers: redis address '{}' is not host:port", o.redis));
  }
  RedisTierConfig c;
  c.host = o.redis.substr(0, colon);
  c.port = port;
  c.timeout_ms = o.redis_timeout_ms;
  return c;
}

std::vector<std::unique_ptr<KVTier>> make_tiers(const TieringOptions& o, int64_t record_bytes) {
  std::vector<std::unique_ptr<KVTier>> tiers;
  if (o.host_bytes > 0) tiers.push_back(std::make_unique<HostMemoryTier>(o.host_bytes));
  if (!o.disk_path.empty()) {
    if (o.disk_bytes <= 0) {
      throw Error(fmt::format("tiers: disk tier '{}' needs a budget > 0 (got {} bytes)",
                              o.disk_path, o.disk_bytes));
    }
    tiers.push_back(std::make_unique<DiskTier>(
        DiskTierConfig{o.disk_path, o.disk_bytes, record_bytes, /*direct_io=*/false}));
  }
  if (!o.redis.empty()) tiers.push_back(std::make_unique<RedisTier>(redis_config(o)));
  return tiers;
}

}  // namespace

KVTiering::KVTiering(const TieringOptions& options, const KVCacheConfig& storage)
    : options_(options), block_size_(storage.block_size) {
  if (dtype_is_quantized(storage.dtype)) {
    throw Error(
        fmt::format("tiers: kv dtype {} calibrates its scales per run, so no two runs "
                    "could share blocks; use fp32, fp16 or bf16",
                    dtype_name(storage.dtype)));
  }
  if (!options.events_stream.empty() && options.redis.empty()) {
    throw Error(
        fmt::format("tiers: events stream '{}' needs a redis address", options.events_stream));
  }
  const int64_t payload = kv_bytes_for_tokens(storage.num_layers, storage.num_kv_heads,
                                              storage.head_dim, storage.dtype, block_size_);
  const auto record = static_cast<int64_t>(block_record_bytes(block_size_, payload));
  std::vector<std::unique_ptr<KVTier>> tiers = make_tiers(options, record);
  if (!tiers.empty()) {
    TieredKVStoreConfig c;
    c.fingerprint = fingerprint_hash(kv_fingerprint(storage, options.model_id));
    c.block_size = block_size_;
    c.payload_bytes = payload;
    c.policy = options.policy;
    for (const auto& t : tiers) tier_names_.emplace_back(t->name());
    store_ = std::make_unique<TieredKVStore>(c, std::move(tiers));
  }
  if (!options.events_path.empty()) {
    publisher_ = std::make_unique<KVEventPublisher>(options.events_path);
    if (!options.events_stream.empty()) {
      stream_ = std::make_unique<RedisStream>(redis_config(options), options.events_stream);
      publisher_->set_stream(stream_.get());
    }
  }
}

KVTiering::~KVTiering() = default;

void KVTiering::store_published(BlockHash hash, const Published& p, const ReadBlock& read) {
  if (store_ == nullptr) return;
  const ChainedBlock block{hash, p.parent, p.check, p.tokens};
  (void)store_->store(block, read(p.block));  // a full queue drops it (counted)
}

void KVTiering::on_events(const std::vector<KVCacheEvent>& events, const ReadBlock& read) {
  const bool through = options_.policy == WritePolicy::kWriteThrough;
  for (const KVCacheEvent& e : events) {
    switch (e.kind) {
      case KVCacheEvent::Kind::kStored: {
        // A block is published only under a published parent (kv_cache_manager.hpp), so the
        // parent's check is known; a root block starts the chain at 0.
        const auto parent = published_.find(e.parent_hash);
        const uint64_t parent_check = parent == published_.end() ? 0 : parent->second.check;
        Published p{e.block, e.parent_hash, chain_check(parent_check, e.tokens, e.extra_key),
                    e.extra_key, e.tokens};
        if (through && !loading_.contains(e.hash)) store_published(e.hash, p, read);
        published_[e.hash] = std::move(p);
        break;
      }
      case KVCacheEvent::Kind::kEvicted:
      case KVCacheEvent::Kind::kRemoved:  // unreachable now, its bytes intact until reused
        if (!through) {
          if (const auto it = published_.find(e.hash); it != published_.end()) {
            store_published(e.hash, it->second, read);
          }
        }
        published_.erase(e.hash);
        break;
      case KVCacheEvent::Kind::kAllCleared:  // its kRemoved events came first: nothing left
        break;
    }
  }
  publish(events);
}

void KVTiering::publish(const std::vector<KVCacheEvent>& events) {
  if (publisher_ == nullptr) return;
  std::vector<KVEvent> batch = pool_events(events, block_size_, "POOL");
  if (store_ != nullptr) {
    const std::vector<KVEvent> more = tier_events(store_->take_events(), block_size_);
    batch.insert(batch.end(), more.begin(), more.end());
  }
  publisher_->publish(batch);
}

int64_t KVTiering::onboard(KVCacheManager& manager, SeqId seq, std::span<const TokenId> prompt,
                           int64_t computed, const ReadBlock& read, const WriteBlock& write) {
  if (store_ == nullptr || prompt.empty()) return computed;
  const int64_t bs = block_size_;
  const int64_t eligible = (static_cast<int64_t>(prompt.size()) - 1) / bs;  // one token runs
  const std::vector<ChainedBlock> chain = chain_blocks(prompt.first(eligible * bs), block_size_);
  const auto from = static_cast<size_t>(computed / bs);
  if (from >= chain.size()) return computed;
  const std::span<const ChainedBlock> rest = std::span(chain).subspan(from);
  const int32_t found = store_->lookup(rest);
  if (found == 0) return computed;
  const LoadTicket ticket = store_->load(rest.first(static_cast<size_t>(found)));
  if (ticket == 0) return computed;
  const LoadResult loaded = store_->wait(ticket);
  if (loaded.num_blocks == 0) return computed;
  const int64_t n = loaded.num_blocks * bs;
  const auto appended = manager.append_tokens(seq, prompt.subspan(computed, n));
  if (!appended) return computed;          // the pool is full: prefill them instead
  on_events(manager.take_events(), read);  // evicted blocks are written down before reuse
  for (int32_t b = 0; b < loaded.num_blocks; ++b) {
    write(static_cast<BlockId>(appended->slots[static_cast<size_t>(b * bs)] / bs),
          loaded.payloads[static_cast<size_t>(b)]);
    loading_.insert(rest[static_cast<size_t>(b)].hash);
  }
  manager.commit(seq, computed + n);
  on_events(manager.take_events(), read);
  loading_.clear();
  onboarded_tokens_ += n;
  return computed + n;
}

void KVTiering::flush() {
  if (store_ != nullptr) store_->flush();
  publish({});
}

void KVTiering::finish(const ReadBlock& read) {
  if (store_ != nullptr && options_.policy == WritePolicy::kOnEviction) {
    for (const auto& [hash, p] : published_) store_published(hash, p, read);
  }
  flush();
}

TieringReport KVTiering::report() const {
  TieringReport r;
  r.onboarded_tokens = onboarded_tokens_;
  if (publisher_ != nullptr) r.event_batches = publisher_->batches();
  if (store_ == nullptr) return r;
  const TieredKVStoreStats s = store_->stats();
  r.tiers = s.tiers;
  r.tier_names = tier_names_;
  r.loaded_blocks = s.loaded_blocks;
  for (size_t f = 1; f < s.faults.size(); ++f) r.refused_records += s.faults[f];
  r.stores_dropped = s.stores_dropped;
  return r;
}

}  // namespace pagedkv::model
