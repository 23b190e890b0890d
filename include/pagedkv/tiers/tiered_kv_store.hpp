#pragma once
/// @file tiered_kv_store.hpp
/// The tiers below the block pool, driven asynchronously: stores go through a bounded queue to
/// every tier; a prompt's missed prefix is looked up tier by tier (how many leading blocks could
/// be loaded, before allocation: vLLM's get_num_new_matched_tokens), then loaded by a worker
/// thread and confirmed block by block (block_record.hpp) before the caller copies the bytes
/// into newly allocated pool blocks ("onboarding"). A failure in any tier is a miss: the engine
/// recomputes. Nothing here touches the pool; the caller moves bytes to and from its storage
/// (HostKVCache::block_bytes / set_block_bytes) on its own thread. docs/tiers.md.
///
/// Source: vLLM's KV connector protocol (get_num_new_matched_tokens, asynchronous loads that
/// complete before the request is scheduled) and OffloadingConnector; LMCache's storage manager
/// (local CPU -> local disk -> remote backends, looked up in that order).

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "pagedkv/tiers/block_record.hpp"
#include "pagedkv/tiers/kv_tier.hpp"
#include "pagedkv/tiers/tier_key.hpp"

namespace pagedkv {

/// When a block is written down to the tiers (the caller acts on it: TieredKVStore only stores
/// what store() is given).
enum class WritePolicy : uint8_t {
  kWriteThrough,  ///< every block the pool publishes (commit) is stored at once
  kOnEviction,    ///< a block is stored when the pool evicts it (KVCacheEvent::kEvicted)
};

/// Configuration of a TieredKVStore.
struct TieredKVStoreConfig {
  uint64_t fingerprint = 0;   ///< fingerprint_hash(kv_fingerprint(...)) of the pool
  int32_t block_size = 16;    ///< tokens per block, >= 1
  int64_t payload_bytes = 0;  ///< K/V bytes of one block (HostKVCache::block_bytes), >= 1
  WritePolicy policy = WritePolicy::kWriteThrough;  ///< for the caller; recorded in stats
  /// Blocks waiting to be stored, at most; store() beyond it drops the block (counted).
  size_t max_pending_stores = 1024;
  /// Load requests in flight, at most; load() beyond it is refused (counted).
  size_t max_pending_loads = 64;
};

/// Counters of a TieredKVStore; tiers[i] are the tiers' own (KVTier::stats) in lookup order.
struct TieredKVStoreStats {
  std::vector<TierStats> tiers;        ///< one per tier, in lookup order
  int64_t stores_queued = 0;           ///< store() calls accepted
  int64_t stores_dropped = 0;          ///< store() calls refused: the queue was full
  int64_t stores_skipped = 0;          ///< blocks a tier already held (not written again)
  int64_t loads_refused = 0;           ///< load() calls refused: too many loads in flight
  std::vector<int64_t> loaded_blocks;  ///< [tiers] blocks loaded and confirmed, per tier
  int64_t lookup_blocks = 0;           ///< blocks lookup() was asked about
  int64_t lookup_hits = 0;             ///< of those, blocks some tier held
  /// Records refused on load by their fault (RecordFault as index; [kNone] unused): a corrupt
  /// value or a collision is a miss, counted here, never a wrong hit.
  std::vector<int64_t> faults;
};

/// One change of what a tier holds, for KV events (kv_events.hpp).
struct TierEvent {
  bool stored = true;           ///< true: BlockStored; false: BlockRemoved (LRU eviction)
  TierMedium medium{};          ///< the tier's medium
  BlockHash hash = 0;           ///< the block's key
  BlockHash parent_hash = 0;    ///< stored only
  std::vector<TokenId> tokens;  ///< stored only: [block_size]
};

/// What a load produced: the leading blocks of the request that were found and confirmed, in
/// order (a miss or a refused record ends it: the rest is recomputed).
/// Shapes: payloads [num_blocks] of payload_bytes each; tier [num_blocks] lookup index.
struct LoadResult {
  int32_t num_blocks = 0;                        ///< leading blocks loaded
  std::vector<std::vector<std::byte>> payloads;  ///< [num_blocks] each block's K/V bytes
  std::vector<int32_t> tier;                     ///< [num_blocks] index of the tier it came from
};

/// Handle of an asynchronous load (load()); 0 = refused.
using LoadTicket = uint64_t;

/// Tiers in lookup order (nearest first, e.g. host, disk, Redis) behind one worker thread.
/// Thread safety: every public method may be called from any thread; the engine thread is
/// never blocked by tier I/O except in lookup() (contains(): host and disk answer from memory,
/// Redis in one round trip bounded by its timeout and circuit breaker, redis_tier.hpp) and in
/// the explicit waits (wait(), flush()).
class TieredKVStore {
 public:
  /// Starts the worker. Errors: throws pagedkv::Error naming the value if tiers is empty or
  /// holds a null tier, block_size < 1, payload_bytes < 1, or a queue bound is 0.
  TieredKVStore(const TieredKVStoreConfig& config, std::vector<std::unique_ptr<KVTier>> tiers);
  /// Finishes the queued stores (flush()), then stops the worker.
  ~TieredKVStore();
  TieredKVStore(const TieredKVStore&) = delete;             ///< owns a thread
  TieredKVStore& operator=(const TieredKVStore&) = delete;  ///< owns a thread

  /// Queues `block` (its tokens are copied) with `payload` (payload_bytes of K/V, copied) to be
  /// written to every tier that does not hold it yet, and over any copy a load refused (a
  /// corrupt value is repaired by the next store of its block). Returns false, dropping it, when
  /// max_pending_stores blocks are already waiting. Errors: throws pagedkv::Error if
  /// payload.size() != payload_bytes or block.tokens.size() != block_size.
  bool store(const ChainedBlock& block, std::span<const std::byte> payload);

  /// How many leading blocks of `blocks` some tier holds now (by key; the load confirms the
  /// content). Units: blocks (x block_size = the tokens a load may bring).
  [[nodiscard]] int32_t lookup(std::span<const ChainedBlock> blocks);

  /// Starts loading the leading blocks of `blocks` (copied); returns its ticket, or 0 when
  /// max_pending_loads loads are in flight (counted; the caller recomputes).
  [[nodiscard]] LoadTicket load(std::span<const ChainedBlock> blocks);
  /// The result of a finished load (handing it over: a second poll answers empty), or empty
  /// while it runs. Errors: throws pagedkv::Error on an unknown ticket.
  [[nodiscard]] std::optional<LoadResult> poll(LoadTicket ticket);
  /// Waits for the load and hands its result over. Errors: as poll().
  [[nodiscard]] LoadResult wait(LoadTicket ticket);

  /// Waits until every queued store has been written (or failed).
  void flush();
  /// A snapshot of the counters.
  [[nodiscard]] TieredKVStoreStats stats() const;
  /// The tier events since the last call (stores that succeeded, LRU removals), in order.
  [[nodiscard]] std::vector<TierEvent> take_events();
  /// The configuration.
  [[nodiscard]] const TieredKVStoreConfig& config() const { return config_; }
  /// Tiers in lookup order.
  [[nodiscard]] size_t num_tiers() const { return tiers_.size(); }

 private:
  struct PendingStore {
    ChainedBlock block;  // tokens views `tokens`
    std::vector<TokenId> tokens;
    std::vector<std::byte> payload;
  };
  struct PendingLoad {
    LoadTicket ticket = 0;
    std::vector<ChainedBlock> blocks;  // tokens view `tokens`
    std::vector<TokenId> tokens;
    std::optional<LoadResult> result;
  };

  void run();
  void write_batch(std::vector<PendingStore>& batch);
  void run_load(PendingLoad& load);
  void collect_evictions(size_t tier);

  TieredKVStoreConfig config_;
  std::vector<std::unique_ptr<KVTier>> tiers_;
  mutable std::mutex mu_;
  std::condition_variable wake_;  // work queued, or stopping
  std::condition_variable done_;  // a store batch or a load finished
  std::deque<PendingStore> stores_;
  std::deque<std::shared_ptr<PendingLoad>> loads_;       // queued
  std::vector<std::shared_ptr<PendingLoad>> in_flight_;  // queued or running or finished
  size_t stores_running_ = 0;
  LoadTicket next_ticket_ = 1;
  bool stopping_ = false;
  TieredKVStoreStats stats_;
  std::vector<TierEvent> events_;
  // Keys whose record a load refused: the next store of that block overwrites them (repair).
  std::unordered_set<std::string> refused_;
  std::thread worker_;  // last: starts after every member above exists
};

}  // namespace pagedkv
