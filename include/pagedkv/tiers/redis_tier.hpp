#pragma once
/// @file redis_tier.hpp
/// The remote tier of the tiered prefix cache: block records in a Redis server (or a Redis
/// Cluster node, or Valkey) shared by every engine instance pointed at it, and RedisStream, which
/// appends KV events to a Redis stream for a KV-aware router. Client: hiredis.
///
/// Budget and LRU are the server's: the deployment sets `maxmemory <bytes>` and
/// `maxmemory-policy allkeys-lru`, and Redis evicts least-recently-used keys on its own (it
/// reports no evictions to clients, so take_evicted() is always empty). With `noeviction` a full
/// server answers put() with PutOutcome::kFull.
///
/// Faults: a down, stalled or restarted server never throws and never blocks for long. Every
/// command runs with a socket timeout of timeout_ms; an I/O error or a timeout drops the
/// connection, counts one failure, logs one line to stderr when the tier goes down and one when it
/// is reachable again, and opens a circuit breaker: for retry_after_ms every call returns kFailed /
/// empty / all-false at once, without touching the network. Bound: a call blocks at most about
/// 2 x timeout_ms (a connect, then one command; 3 x with a password), and at most one such stall
/// happens per retry_after_ms. The timeout applies to each read and write, so a server that
/// trickles its answer byte by byte can stretch one call; name resolution of `host` is not
/// bounded by it (give a numeric address or a name the resolver answers locally).
///
/// Source: LMCache's Redis remote backend (block records as plain string values under
/// content keys, the server's LRU as the budget); vLLM's KV events (published to a stream).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/tiers/kv_tier.hpp"

namespace pagedkv {

namespace detail {
class RedisLink;  // src/tiers/redis_tier.cpp: one hiredis connection with the circuit breaker
}  // namespace detail

/// Where and how to reach the Redis server. Checked by the RedisTier and RedisStream
/// constructors (they throw pagedkv::Error naming the first bad field and its value).
struct RedisTierConfig {
  std::string host = "127.0.0.1";  ///< numeric address or host name; ignored with unix_socket
  int port = 6379;                 ///< TCP port, 1..65535; ignored with unix_socket
  std::string unix_socket;         ///< path of the server's Unix socket; empty = TCP host:port
  std::string password;            ///< sent as AUTH after each connect; empty = none
  int timeout_ms = 50;             ///< ms: limit of the connect and of each read and write, >= 1
  int retry_after_ms = 1000;       ///< ms: after a failure, no reconnect before this, >= 0
  int64_t ttl_s = 0;               ///< seconds a stored value lives (SET EX); 0 = no expiry
  std::string key_prefix;          ///< prepended to every tier key (namespaces a shared server)
};

/// The server's memory as INFO memory reports it.
struct RedisMemoryInfo {
  int64_t used_bytes = 0;  ///< used_memory: bytes the server holds now (all keys, overhead)
  int64_t max_bytes = 0;   ///< maxmemory: the server's budget; 0 = unlimited
  std::string policy;      ///< maxmemory_policy, e.g. "allkeys-lru" (what the tier expects)
};

/// A KVTier on a Redis server: put() is `SET <key_prefix><key> <value> [EX ttl_s]`, get() is
/// `GET`, contains() is one pipelined batch of `EXISTS`, one per key, in one round trip. Values
/// are binary safe (zero bytes included).
///
/// stats(): budget_bytes 0 (the server's maxmemory), used_bytes and entries -1 (only the server
/// knows: see server_info()), evictions 0; failures counts real failed attempts (connects,
/// commands, error replies), not the calls the open circuit breaker answered without trying.
///
/// Internally synchronized: one mutex around the connection, so calls from several threads run
/// one at a time, each within the bound of the file comment (stats() waits for a call in flight).
class RedisTier final : public KVTier {
 public:
  /// Largest value Redis accepts (its proto-max-bulk-len default, 512 MiB): larger is kTooLarge.
  static constexpr int64_t kMaxValueBytes = int64_t{512} << 20;

  /// A tier that connects on its first call (a server down now is not an error: the call fails
  /// and counts). Errors: throws pagedkv::Error on an invalid config: empty host (without
  /// unix_socket), port outside 1..65535, timeout_ms < 1, retry_after_ms < 0, ttl_s < 0, or a
  /// host, socket path or password holding a zero byte; the message names the field and value.
  explicit RedisTier(RedisTierConfig config);
  ~RedisTier() override;
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  /// "redis".
  [[nodiscard]] std::string_view name() const override { return "redis"; }
  /// TierMedium::kRedis.
  [[nodiscard]] TierMedium medium() const override { return TierMedium::kRedis; }

  /// SET; kFull when the server is out of memory (an "OOM" error reply: maxmemory reached under
  /// noeviction), kTooLarge above kMaxValueBytes (nothing sent), kFailed on an I/O failure, a
  /// timeout, an open breaker or another error reply. Units: value in bytes.
  /// Errors: throws pagedkv::Error if key or value is empty.
  PutOutcome put(std::string_view key, std::span<const std::byte> value) override;

  /// GET: the value, or empty on a miss (a nil reply, not a failure) or a failure.
  /// Errors: throws pagedkv::Error if key is empty.
  [[nodiscard]] std::optional<std::vector<std::byte>> get(std::string_view key) override;

  /// One pipelined round trip of EXISTS, one per key; all false on a failure (counted once).
  /// No keys: no round trip. Shapes: out [keys.size()].
  /// Errors: throws pagedkv::Error if a key is empty (before anything is sent).
  [[nodiscard]] std::vector<bool> contains(std::span<const std::string> keys) override;

  /// Always empty: Redis evicts on its own and tells no client.
  [[nodiscard]] std::vector<std::string> take_evicted() override { return {}; }

  /// A snapshot of the counters (see the class comment for the fields only the server knows).
  [[nodiscard]] TierStats stats() const override;

  /// INFO memory of the server, or empty on a failure (counted like any call).
  [[nodiscard]] std::optional<RedisMemoryInfo> server_info();

  /// The config the tier was built with.
  [[nodiscard]] const RedisTierConfig& config() const { return config_; }

 private:
  [[nodiscard]] std::string full_key(std::string_view key) const;

  RedisTierConfig config_;
  mutable std::mutex mu_;  // guards link_ and stats_
  std::unique_ptr<detail::RedisLink> link_;
  TierStats stats_;
};

/// Appends entries to one Redis stream: `XADD <stream_key> MAXLEN ~ <max_len> * <field> <json>`,
/// for publishing KV events (BlockStored, BlockRemoved, AllBlocksCleared as JSON) to routers
/// that read the stream (XREAD). The stream key is used as given (config.key_prefix does not
/// apply); ttl_s is ignored. Same connection, timeout bound and circuit breaker as RedisTier.
/// Internally synchronized.
class RedisStream {
 public:
  /// A publisher that connects on its first xadd(). `max_len`: entries the server keeps, about
  /// (MAXLEN ~ trims whole radix-tree nodes, so a few more may stay).
  /// Errors: throws pagedkv::Error on an invalid config (as RedisTier), an empty stream_key or
  /// max_len < 1, naming the value.
  RedisStream(RedisTierConfig config, std::string stream_key, int64_t max_len = 10000);
  ~RedisStream();
  RedisStream(const RedisStream&) = delete;
  RedisStream& operator=(const RedisStream&) = delete;

  /// Appends one entry {field: json}; true when the server took it, false on any failure
  /// (counted, never thrown; a lost event is the router's stale view, not an engine error).
  /// Errors: throws pagedkv::Error if field is empty.
  bool xadd(std::string_view field, std::string_view json);

  /// Entries the server took.
  [[nodiscard]] int64_t added() const;
  /// Failed attempts (connects, commands, error replies), as TierStats::failures.
  [[nodiscard]] int64_t failures() const;
  /// The stream's key.
  [[nodiscard]] const std::string& stream_key() const { return stream_key_; }

 private:
  std::string stream_key_;
  std::string max_len_;    // decimal, as sent
  mutable std::mutex mu_;  // guards link_ and added_
  std::unique_ptr<detail::RedisLink> link_;
  int64_t added_ = 0;
};

}  // namespace pagedkv
