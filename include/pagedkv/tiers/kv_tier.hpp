#pragma once
/// @file kv_tier.hpp
/// One tier below the block pool of a tiered prefix cache: a byte store of block records under
/// string keys, with a size budget and least-recently-used eviction. Implementations: host
/// memory (host_tier.hpp), a local disk file (disk_tier.hpp), a Redis server (redis_tier.hpp).
/// TieredKVStore (tiered_kv_store.hpp) drives them; docs/tiers.md explains the design.
///
/// Source: the tiers of vLLM's OffloadingConnector / LMCache (CPU, local disk, remote Redis),
/// SGLang's HiCache (device -> host -> storage).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv {

/// Where a tier keeps its records; also the `medium` of its KV events ("CPU", "DISK", "REDIS").
enum class TierMedium : uint8_t {
  kHost,   ///< process memory ("CPU")
  kDisk,   ///< a local file ("DISK")
  kRedis,  ///< a Redis server or cluster shared by engine instances ("REDIS")
};

/// "CPU", "DISK", "REDIS": the medium names of KV events (vLLM's BlockStored.medium).
[[nodiscard]] std::string_view tier_medium_name(TierMedium medium);

/// What put() did.
enum class PutOutcome : uint8_t {
  kStored,    ///< the value is held under the key (older entries may have been evicted for it)
  kTooLarge,  ///< the value alone exceeds the tier's budget or record size: not stored
  kFull,      ///< the tier stopped accepting (disk full, server out of memory): not stored
  kFailed,    ///< an I/O or connection failure: not stored (counted in TierStats::failures)
};

/// Counters of one tier. Units: bytes unless named otherwise; cumulative unless marked "now".
struct TierStats {
  int64_t budget_bytes = 0;   ///< configured budget; 0 = the server's own (Redis maxmemory)
  int64_t used_bytes = 0;     ///< now: bytes of the values held (-1 when only the server knows)
  int64_t entries = 0;        ///< now: values held (-1 when only the server knows)
  int64_t puts = 0;           ///< put() calls that stored their value
  int64_t rejected = 0;       ///< put() calls answered kTooLarge or kFull
  int64_t gets = 0;           ///< get() calls
  int64_t hits = 0;           ///< get() calls that returned a value
  int64_t evictions = 0;      ///< entries dropped by LRU to stay within the budget
  int64_t failures = 0;       ///< I/O or connection failures (put, get, contains)
  int64_t bytes_written = 0;  ///< value bytes stored by put()
  int64_t bytes_read = 0;     ///< value bytes returned by get()
};

/// A store of opaque values (encoded block records, block_record.hpp) under string keys
/// (TierKey::str(), tier_key.hpp), bounded by a byte budget with LRU eviction.
///
/// Contract of every implementation:
///  - internally synchronized: TieredKVStore's worker thread calls put() and get() while the
///    engine thread calls contains(); every method may be called from any thread;
///  - I/O and connection failures never throw: they return kFailed / empty / false and count in
///    stats().failures; only contract violations (an empty key or value) throw pagedkv::Error;
///  - a value returned by get() is byte-for-byte what put() stored, or the caller detects the
///    difference (block records carry a checksum; a corrupt value is the caller's miss);
///  - get() and contains() refresh nothing but the entry's LRU position.
class KVTier {
 public:
  virtual ~KVTier() = default;

  /// "host", "disk", "redis": the tier's name in stats tables and log lines.
  [[nodiscard]] virtual std::string_view name() const = 0;
  /// Where the tier keeps its values.
  [[nodiscard]] virtual TierMedium medium() const = 0;

  /// Stores `value` under `key`, replacing an existing value, evicting least-recently-used
  /// entries as needed to stay within the budget. Errors: throws pagedkv::Error if key or value
  /// is empty; failures are the outcome, never an exception.
  virtual PutOutcome put(std::string_view key, std::span<const std::byte> value) = 0;

  /// The value under `key` (marking it most recently used), or empty on a miss or a failure.
  /// Errors: throws pagedkv::Error if key is empty.
  [[nodiscard]] virtual std::optional<std::vector<std::byte>> get(std::string_view key) = 0;

  /// For each key in order, whether the tier holds it now: one round trip for a remote tier.
  /// A failure answers false for every key (counted once). Shapes: out [keys.size()].
  /// Errors: throws pagedkv::Error if a key is empty.
  [[nodiscard]] virtual std::vector<bool> contains(std::span<const std::string> keys) = 0;

  /// Keys this tier dropped by LRU eviction since the last call, oldest first (for BlockRemoved
  /// events); empty for a tier whose server evicts on its own (Redis).
  [[nodiscard]] virtual std::vector<std::string> take_evicted() = 0;

  /// A snapshot of the counters.
  [[nodiscard]] virtual TierStats stats() const = 0;
};

}  // namespace pagedkv
