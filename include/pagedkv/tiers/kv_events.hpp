#pragma once
/// @file kv_events.hpp
/// KV events in vLLM's shape, for KV-aware routers that follow which instance holds which
/// prefix: BlockStored (block hashes, parent hash, token ids, block size, medium), BlockRemoved
/// (block hashes, medium) and AllBlocksCleared, in batches with a timestamp, published as JSON
/// lines to a file or stdout and optionally to a Redis stream.
///
/// Source: vLLM vllm/distributed/kv_events.py (KVEventBatch, BlockStored, BlockRemoved,
/// AllBlocksCleared; vLLM publishes them with msgpack over ZMQ, here JSON with a "type" field).
/// Schema: docs/tiers.md, "KV events".

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/metadata/kv_cache_stats.hpp"
#include "pagedkv/tiers/tiered_kv_store.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// One event of a batch.
struct KVEvent {
  /// vLLM's event classes.
  enum class Type : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };
  Type type = Type::kBlockStored;              ///< which event
  std::vector<BlockHash> block_hashes;         ///< stored / removed blocks, in chain order
  std::optional<BlockHash> parent_block_hash;  ///< BlockStored: the first block's parent, none
                                               ///< for a first block of a prompt
  std::vector<TokenId> token_ids;              ///< BlockStored: [block_hashes.size() * block_size]
  int32_t block_size = 0;                      ///< BlockStored: tokens per block
  std::string medium;  ///< where: "GPU" or "POOL" (the pool), "CPU", "DISK", "REDIS"
};

/// The manager's log (KVCacheManager::take_events) as events of the pool: kStored ->
/// BlockStored, kRemoved and kEvicted -> BlockRemoved, kAllCleared -> AllBlocksCleared, each
/// with `medium` (the pool's: "GPU" for a device pool, "POOL" for a host one). A first block's
/// parent (kRootBlockHash) is none.
[[nodiscard]] std::vector<KVEvent> pool_events(std::span<const KVCacheEvent> events,
                                               int32_t block_size, std::string_view medium);
/// A tier store's log (TieredKVStore::take_events) as events, medium the tier's
/// (tier_medium_name).
[[nodiscard]] std::vector<KVEvent> tier_events(std::span<const TierEvent> events,
                                               int32_t block_size);

/// One JSON line (no newline) for a batch: {"ts": seconds since the epoch (float),
/// "events": [...], "data_parallel_rank": null}; each event {"type": "BlockStored",
/// "block_hashes": [...], "parent_block_hash": u64 or null, "token_ids": [...], "block_size": n,
/// "lora_id": null, "medium": "..."} / {"type": "BlockRemoved", "block_hashes": [...],
/// "medium": "..."} / {"type": "AllBlocksCleared", "medium": "..."} (the medium that was
/// cleared: a pool's reset leaves the tiers' blocks; vLLM's has no medium). Hashes are
/// unsigned 64-bit integers.
[[nodiscard]] std::string kv_event_batch_json(double ts, std::span<const KVEvent> events);

class RedisStream;  // redis_tier.hpp

/// Writes event batches as JSON lines to a file (or stdout) and optionally XADDs each to a
/// Redis stream (field "batch"). An empty batch is not published. A failed write is counted,
/// never thrown (the engine keeps serving).
class KVEventPublisher {
 public:
  /// Publishes to `path`, appended; "-" is stdout. Errors: throws pagedkv::Error naming the
  /// path if it cannot be opened.
  explicit KVEventPublisher(const std::string& path);
  /// Also XADD every batch to `stream` (not owned; must outlive the publisher; may be null).
  void set_stream(RedisStream* stream) { stream_ = stream; }
  ~KVEventPublisher();
  KVEventPublisher(const KVEventPublisher&) = delete;             ///< owns a FILE
  KVEventPublisher& operator=(const KVEventPublisher&) = delete;  ///< owns a FILE

  /// Publishes one batch stamped now (nothing for an empty batch).
  void publish(std::span<const KVEvent> events);
  /// Batches published.
  [[nodiscard]] int64_t batches() const { return batches_; }
  /// Writes (file or stream) that failed.
  [[nodiscard]] int64_t failures() const { return failures_; }

 private:
  std::FILE* out_ = nullptr;
  bool owned_ = false;
  RedisStream* stream_ = nullptr;
  int64_t batches_ = 0;
  int64_t failures_ = 0;
};

}  // namespace pagedkv
