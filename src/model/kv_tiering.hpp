#pragma once
/// @file kv_tiering.hpp
/// The paged backend's link to the tiers below its pool (pagedkv/tiers, docs/tiers.md): builds
/// the tiers a run asks for, writes published blocks down (write-through at commit, or when the
/// pool evicts them), onboards a prompt's missed prefix from the tiers into newly allocated
/// blocks before its prefill, and publishes the pool's and the tiers' KV events.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/tiers/kv_events.hpp"
#include "pagedkv/tiers/tiered_kv_store.hpp"

namespace pagedkv {
class RedisStream;
}

namespace pagedkv::model {

/// Which tiers a run uses and how (all off by default). Units: bytes, ms.
struct TieringOptions {
  int64_t host_bytes = 0;                           ///< host-memory tier budget; 0 = no host tier
  std::string disk_path;                            ///< local-disk tier file; empty = no disk tier
  int64_t disk_bytes = 0;                           ///< disk tier budget (> 0 with a path)
  std::string redis;                                ///< "host:port" of the Redis tier; empty = none
  int32_t redis_timeout_ms = 50;                    ///< per-command timeout of the Redis tier
  WritePolicy policy = WritePolicy::kWriteThrough;  ///< when blocks are written down
  std::string events_path;    ///< KV events as JSON lines ("-" = stdout); empty = none
  std::string events_stream;  ///< also XADD them to this Redis stream (needs redis)
  /// Identity of the weights (KVFingerprint::model_id): engines share blocks only when equal.
  std::string model_id;
  /// Whether any tier is asked for.
  [[nodiscard]] bool has_tier() const {
    return host_bytes > 0 || !disk_path.empty() || !redis.empty();
  }
  /// Whether any tier or event output is asked for.
  [[nodiscard]] bool enabled() const { return has_tier() || !events_path.empty(); }
};

/// What the tiers did in a run, for the report.
struct TieringReport {
  int64_t onboarded_tokens = 0;  ///< prompt tokens loaded from the tiers instead of prefilled
  std::vector<std::string> tier_names;  ///< in lookup order
  std::vector<int64_t> loaded_blocks;   ///< [tiers] blocks onboarded from each
  std::vector<TierStats> tiers;         ///< [tiers] each tier's counters
  int64_t refused_records = 0;  ///< records refused on load (corrupt, collision, other model)
  int64_t stores_dropped = 0;   ///< blocks not written down: the store queue was full
  int64_t event_batches = 0;    ///< KV event batches published
};

/// One backend's tiers. Not synchronized: the backend's (engine) thread calls it; the
/// TieredKVStore inside does its I/O on its own worker.
class KVTiering {
 public:
  /// A block's bytes, all layers (HostKVCache::block_bytes).
  using ReadBlock = std::function<std::vector<std::byte>(BlockId)>;
  /// Restores a block's bytes (HostKVCache::set_block_bytes).
  using WriteBlock = std::function<void(BlockId, std::span<const std::byte>)>;

  /// The tiers of `options` over a pool of `storage` geometry. "POOL" is the pool's medium in
  /// events. Errors: throws pagedkv::Error naming the value for no tier, an 8-bit dtype (its
  /// scales are calibrated per run: no two runs would share), a disk path without a budget, a
  /// malformed "host:port", or events_stream without redis; as the tiers' constructors.
  KVTiering(const TieringOptions& options, const KVCacheConfig& storage);
  ~KVTiering();
  KVTiering(const KVTiering&) = delete;             ///< owns the store
  KVTiering& operator=(const KVTiering&) = delete;  ///< owns the store

  /// Handles the manager's events after a call that may allocate or publish, BEFORE the new
  /// owner of an evicted block writes it: records published blocks, writes them down
  /// (write-through) or writes evicted ones (on eviction), publishes the events.
  void on_events(const std::vector<KVCacheEvent>& events, const ReadBlock& read);

  /// Loads the leading blocks of `prompt` after its `computed` cached tokens (a multiple of the
  /// block size) from the tiers into newly appended blocks of `seq`, and commits them; returns
  /// the tokens cached now (>= computed). A miss, a refused record or a full pool loads less
  /// (never an error: the prefill computes the rest).
  int64_t onboard(KVCacheManager& manager, SeqId seq, std::span<const TokenId> prompt,
                  int64_t computed, const ReadBlock& read, const WriteBlock& write);

  /// Waits for the queued stores and publishes the events so far.
  void flush();

  /// End of a run: with the on-eviction policy, writes every block still published in the pool
  /// down; waits for the queued stores; publishes the last events.
  void finish(const ReadBlock& read);

  /// What the tiers did so far.
  [[nodiscard]] TieringReport report() const;

 private:
  struct Published {
    BlockId block = -1;
    BlockHash parent = 0;
    uint64_t check = 0;
    uint64_t extra_key = 0;
    std::vector<TokenId> tokens;
  };
  void store_published(BlockHash hash, const Published& p, const ReadBlock& read);
  void publish(const std::vector<KVCacheEvent>& events);

  TieringOptions options_;
  int32_t block_size_;
  std::unique_ptr<RedisStream> stream_;
  std::unique_ptr<KVEventPublisher> publisher_;
  std::unique_ptr<TieredKVStore> store_;
  std::vector<std::string> tier_names_;                 // in lookup order
  std::unordered_map<BlockHash, Published> published_;  // the pool's prefix index, mirrored
  std::unordered_set<BlockHash> loading_;               // onboarded now: already in the tiers
  int64_t onboarded_tokens_ = 0;
};

}  // namespace pagedkv::model
