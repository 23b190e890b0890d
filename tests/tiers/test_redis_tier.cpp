// RedisTier and RedisStream against a real redis-server on 127.0.0.1 (tiers/redis_server.hpp):
// binary round trips, pipelined contains, TTL, the server's own LRU and noeviction answer, and
// the faults (down, stalled, killed and restarted) within a time bound with the breaker counted.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "common/error_message.hpp"
#include "pagedkv/tiers/redis_tier.hpp"
#include "tiers/redis_server.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using testing::message_of;
using testing::RedisServer;
using testing::RedisServerOptions;
using Clock = std::chrono::steady_clock;

std::vector<std::byte> bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

std::vector<std::byte> pattern(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + i / 7) % 256);
  return v;
}

RedisTierConfig config_for(int port) {
  RedisTierConfig c;
  c.port = port;
  c.timeout_ms = 50;
  c.retry_after_ms = 200;
  return c;
}

/// Milliseconds fn takes.
double ms_of(auto&& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// A reply of a command on a fresh raw hiredis connection (for what the tier does not expose).
struct RawReply {
  explicit RawReply(int port, std::vector<std::string> argv) {
    redisContext* c = redisConnect("127.0.0.1", port);
    std::vector<const char*> p;
    std::vector<size_t> n;
    for (const std::string& a : argv) p.push_back(a.c_str()), n.push_back(a.size());
    if (c != nullptr && c->err == 0) {
      r = static_cast<redisReply*>(
          redisCommandArgv(c, static_cast<int>(p.size()), p.data(), n.data()));
    }
    if (c != nullptr) redisFree(c);
  }
  ~RawReply() {
    if (r != nullptr) freeReplyObject(r);
  }
  redisReply* r = nullptr;
};

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PAGEDKV_REQUIRE_REDIS();
    server_.start();
  }
  RedisServer server_;
};

TEST_F(RedisTierTest, RoundTripsBinaryValuesWithZeroBytes) {
  RedisTier tier(config_for(server_.port()));
  const std::vector<std::byte> small = bytes(std::string_view("a\0b\0\0c", 6));
  const std::vector<std::byte> big = pattern(size_t{1} << 20);
  EXPECT_EQ(tier.put("small", small), PutOutcome::kStored);
  EXPECT_EQ(tier.put("big", big), PutOutcome::kStored);
  EXPECT_EQ(tier.get("small"), small);
  EXPECT_EQ(tier.get("big"), big);
  const TierStats s = tier.stats();
  EXPECT_EQ(s.puts, 2);
  EXPECT_EQ(s.gets, 2);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.bytes_written, int64_t{6 + (1 << 20)});
  EXPECT_EQ(s.bytes_read, s.bytes_written);
  EXPECT_EQ(s.failures, 0);
  EXPECT_EQ(s.budget_bytes, 0);
  EXPECT_EQ(s.used_bytes, -1);
  EXPECT_EQ(s.entries, -1);
  EXPECT_TRUE(tier.take_evicted().empty());
  EXPECT_EQ(tier.name(), "redis");
  EXPECT_EQ(tier.medium(), TierMedium::kRedis);
}

TEST_F(RedisTierTest, MissIsEmptyAndNotAFailure) {
  RedisTier tier(config_for(server_.port()));
  EXPECT_EQ(tier.get("absent"), std::nullopt);
  EXPECT_EQ(tier.stats().gets, 1);
  EXPECT_EQ(tier.stats().hits, 0);
  EXPECT_EQ(tier.stats().failures, 0);
}

TEST_F(RedisTierTest, OverwriteReplacesTheValue) {
  RedisTier tier(config_for(server_.port()));
  EXPECT_EQ(tier.put("k", bytes("first")), PutOutcome::kStored);
  EXPECT_EQ(tier.put("k", bytes("second, longer")), PutOutcome::kStored);
  EXPECT_EQ(tier.get("k"), bytes("second, longer"));
}

TEST_F(RedisTierTest, ContainsPipelinesHundredKeysInOrder) {
  RedisTier tier(config_for(server_.port()));
  std::vector<std::string> keys;
  std::vector<bool> expected;
  for (int i = 0; i < 100; ++i) {
    keys.push_back("key" + std::to_string(i));
    expected.push_back(i % 3 == 0);
    if (i % 3 == 0) ASSERT_EQ(tier.put(keys.back(), bytes("v")), PutOutcome::kStored);
  }
  EXPECT_EQ(tier.contains(keys), expected);
  EXPECT_TRUE(tier.contains({}).empty());
  EXPECT_EQ(tier.stats().failures, 0);
}

TEST_F(RedisTierTest, TtlExpiresTheValue) {
  RedisTierConfig c = config_for(server_.port());
  c.ttl_s = 1;
  RedisTier tier(c);
  ASSERT_EQ(tier.put("short", bytes("lived")), PutOutcome::kStored);
  RawReply pttl(server_.port(), {"PTTL", "short"});
  ASSERT_NE(pttl.r, nullptr);
  EXPECT_GT(pttl.r->integer, 0);
  EXPECT_LE(pttl.r->integer, 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(tier.get("short"), std::nullopt);
}

TEST_F(RedisTierTest, KeyPrefixIsolatesTwoTiersOnOneServer) {
  RedisTierConfig ca = config_for(server_.port());
  RedisTierConfig cb = ca;
  ca.key_prefix = "modelA:";
  cb.key_prefix = "modelB:";
  RedisTier a(ca);
  RedisTier b(cb);
  ASSERT_EQ(a.put("blk", bytes("from A")), PutOutcome::kStored);
  EXPECT_EQ(b.get("blk"), std::nullopt);
  EXPECT_EQ(b.contains(std::vector<std::string>{"blk"}), std::vector<bool>{false});
  ASSERT_EQ(b.put("blk", bytes("from B")), PutOutcome::kStored);
  EXPECT_EQ(a.get("blk"), bytes("from A"));
  EXPECT_EQ(b.get("blk"), bytes("from B"));
  RawReply raw(server_.port(), {"GET", "modelA:blk"});
  ASSERT_NE(raw.r, nullptr);
  EXPECT_EQ(std::string(raw.r->str, raw.r->len), "from A");
}

TEST(RedisTierServer, NoevictionServerAnswersFull) {
  PAGEDKV_REQUIRE_REDIS();
  RedisServer server(
      RedisServerOptions{.maxmemory_bytes = 4 << 20, .maxmemory_policy = "noeviction"});
  server.start();
  RedisTier tier(config_for(server.port()));
  const std::vector<std::byte> value = pattern(64 << 10);
  PutOutcome last = PutOutcome::kStored;
  for (int i = 0; i < 200 && last == PutOutcome::kStored; ++i) {
    last = tier.put("k" + std::to_string(i), value);
  }
  EXPECT_EQ(last, PutOutcome::kFull);
  EXPECT_EQ(tier.stats().rejected, 1);
  EXPECT_EQ(tier.stats().failures, 0);
}

TEST(RedisTierServer, LruServerEvictsOnItsOwnAndReportsMemory) {
  PAGEDKV_REQUIRE_REDIS();
  RedisServer server(RedisServerOptions{.maxmemory_bytes = 4 << 20});
  server.start();
  RedisTier tier(config_for(server.port()));
  const std::vector<std::byte> value = pattern(64 << 10);
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(tier.put("k" + std::to_string(i), value), PutOutcome::kStored) << i;
  }
  EXPECT_EQ(tier.get("k0"), std::nullopt);
  EXPECT_EQ(tier.get("k199"), value);
  const std::optional<RedisMemoryInfo> info = tier.server_info();
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->max_bytes, 4 << 20);
  EXPECT_EQ(info->policy, "allkeys-lru");
  EXPECT_GT(info->used_bytes, 0);
  EXPECT_LE(info->used_bytes, int64_t{5} << 20);
}

TEST(RedisTierFaults, DownServerFailsFastAndCountsEachAttempt) {
  RedisTierConfig c = config_for(testing::pick_free_port());
  c.retry_after_ms = 0;  // every call tries again
  RedisTier tier(c);
  EXPECT_LT(ms_of([&] { EXPECT_EQ(tier.put("k", bytes("v")), PutOutcome::kFailed); }), 500);
  EXPECT_LT(ms_of([&] { EXPECT_EQ(tier.get("k"), std::nullopt); }), 500);
  const std::vector<std::string> keys = {"a", "b"};
  EXPECT_LT(ms_of([&] { EXPECT_EQ(tier.contains(keys), (std::vector<bool>{false, false})); }), 500);
  EXPECT_EQ(tier.stats().failures, 3);
  EXPECT_EQ(tier.stats().puts, 0);
}

TEST(RedisTierFaults, BreakerSkipsTheNetworkAndLogsOnceUntilRetry) {
  RedisTierConfig c = config_for(testing::pick_free_port());
  c.retry_after_ms = 300;
  RedisTier tier(c);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(tier.put("k", bytes("v")), PutOutcome::kFailed);
  EXPECT_EQ(tier.stats().failures, 1);
  const double skipped = ms_of([&] {
    for (int i = 0; i < 50; ++i) {
      EXPECT_EQ(tier.put("k", bytes("v")), PutOutcome::kFailed);
      EXPECT_EQ(tier.get("k"), std::nullopt);
    }
  });
  EXPECT_EQ(tier.stats().failures, 1);
  EXPECT_LT(skipped, 50);  // 100 calls with no network attempt
  std::this_thread::sleep_for(std::chrono::milliseconds(350));
  EXPECT_EQ(tier.put("k", bytes("v")), PutOutcome::kFailed);
  EXPECT_EQ(tier.stats().failures, 2);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("redis tier 127.0.0.1:" + std::to_string(c.port) + " unavailable ("));
  EXPECT_THAT(log, HasSubstr("serving by recompute, retrying every 300 ms"));
  EXPECT_EQ(log.find("unavailable"), log.rfind("unavailable")) << log;  // one line per outage
}

TEST_F(RedisTierTest, StalledServerTimesOutWithinBoundThenRecovers) {
  RedisTier tier(config_for(server_.port()));
  ASSERT_EQ(tier.put("k", bytes("v")), PutOutcome::kStored);
  server_.pause();
  EXPECT_LT(ms_of([&] { EXPECT_EQ(tier.get("k"), std::nullopt); }), 500);
  EXPECT_EQ(tier.stats().failures, 1);
  EXPECT_LT(ms_of([&] { EXPECT_EQ(tier.get("k"), std::nullopt); }), 20);  // breaker open
  server_.resume();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(tier.get("k"), bytes("v"));
  EXPECT_EQ(tier.stats().failures, 1);
}

TEST_F(RedisTierTest, KilledServerRestartedOnTheSamePortServesAgain) {
  RedisTier tier(config_for(server_.port()));
  ASSERT_EQ(tier.put("old", bytes("v")), PutOutcome::kStored);
  server_.kill_hard();
  // A large value: writes to the reset socket raise SIGPIPE, which must not kill the process.
  EXPECT_EQ(tier.put("big", pattern(size_t{4} << 20)), PutOutcome::kFailed);
  const int64_t failures = tier.stats().failures;
  EXPECT_GE(failures, 1);
  const int port = server_.port();
  server_.start();
  EXPECT_EQ(server_.port(), port);
  EXPECT_EQ(tier.put("new", bytes("v2")), PutOutcome::kFailed);  // breaker still open
  EXPECT_EQ(tier.stats().failures, failures);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(tier.put("new", bytes("v2")), PutOutcome::kStored);
  EXPECT_EQ(tier.get("new"), bytes("v2"));
  EXPECT_EQ(tier.get("old"), std::nullopt);  // no persistence: the restart lost it
  EXPECT_EQ(tier.stats().failures, failures);
}

TEST(RedisTierServer, PasswordIsSentAfterConnect) {
  PAGEDKV_REQUIRE_REDIS();
  RedisServer server(RedisServerOptions{.extra_args = {"--requirepass", "s3cret"}});
  server.start();
  RedisTierConfig c = config_for(server.port());
  RedisTier anonymous(c);
  EXPECT_EQ(anonymous.put("k", bytes("v")), PutOutcome::kFailed);  // NOAUTH error reply
  EXPECT_EQ(anonymous.stats().failures, 1);
  c.password = "wrong";
  RedisTier wrong(c);
  EXPECT_EQ(wrong.get("k"), std::nullopt);
  EXPECT_EQ(wrong.stats().failures, 1);
  c.password = "s3cret";
  RedisTier tier(c);
  EXPECT_EQ(tier.put("k", bytes("v")), PutOutcome::kStored);
  EXPECT_EQ(tier.get("k"), bytes("v"));
}

TEST(RedisTierServer, UnixSocketRoundTrip) {
  PAGEDKV_REQUIRE_REDIS();
  RedisServer server(RedisServerOptions{.unix_socket = true});
  server.start();
  RedisTierConfig c;
  c.unix_socket = server.unix_socket_path();
  c.port = 0;  // ignored with a socket path
  RedisTier tier(c);
  EXPECT_EQ(tier.put("k", bytes("over unix")), PutOutcome::kStored);
  EXPECT_EQ(tier.get("k"), bytes("over unix"));
}

TEST_F(RedisTierTest, ConcurrentCallersAreSerialized) {
  RedisTier tier(config_for(server_.port()));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&tier, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string key = std::to_string(t) + ":" + std::to_string(i);
        EXPECT_EQ(tier.put(key, bytes(key)), PutOutcome::kStored);
        EXPECT_EQ(tier.get(key), bytes(key));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(tier.stats().puts, 200);
  EXPECT_EQ(tier.stats().hits, 200);
  EXPECT_EQ(tier.stats().failures, 0);
}

TEST_F(RedisTierTest, StreamXaddAppearsInXrange) {
  RedisStream stream(config_for(server_.port()), "kv_events");
  EXPECT_TRUE(stream.xadd("event", R"({"type":"BlockStored","block_hashes":[1]})"));
  EXPECT_TRUE(stream.xadd("event", R"({"type":"AllBlocksCleared"})"));
  EXPECT_EQ(stream.added(), 2);
  RawReply range(server_.port(), {"XRANGE", "kv_events", "-", "+"});
  ASSERT_NE(range.r, nullptr);
  ASSERT_EQ(range.r->type, REDIS_REPLY_ARRAY);
  ASSERT_EQ(range.r->elements, 2u);
  const redisReply* fields = range.r->element[1]->element[1];  // [id, [field, value]]
  ASSERT_EQ(fields->elements, 2u);
  EXPECT_EQ(std::string(fields->element[0]->str), "event");
  EXPECT_EQ(std::string(fields->element[1]->str), R"({"type":"AllBlocksCleared"})");
}

TEST(RedisStreamFaults, DownServerDropsTheEventFast) {
  RedisStream stream(config_for(testing::pick_free_port()), "kv_events");
  EXPECT_LT(ms_of([&] { EXPECT_FALSE(stream.xadd("event", "{}")); }), 500);
  EXPECT_EQ(stream.failures(), 1);
  EXPECT_EQ(stream.added(), 0);
}

TEST(RedisTierConfigCheck, InvalidConfigThrowsNamingTheValue) {
  auto with = [](auto edit) {
    RedisTierConfig c;
    edit(c);
    return message_of([&] { RedisTier tier(c); });
  };
  EXPECT_THAT(with([](auto& c) { c.port = 0; }), HasSubstr("port 0 is outside 1..65535"));
  EXPECT_THAT(with([](auto& c) { c.port = 70000; }), HasSubstr("port 70000"));
  EXPECT_THAT(with([](auto& c) { c.timeout_ms = 0; }), HasSubstr("timeout_ms 0 must be >= 1"));
  EXPECT_THAT(with([](auto& c) { c.retry_after_ms = -5; }), HasSubstr("retry_after_ms -5"));
  EXPECT_THAT(with([](auto& c) { c.ttl_s = -1; }), HasSubstr("ttl_s -1"));
  EXPECT_THAT(with([](auto& c) { c.host.clear(); }), HasSubstr("host is empty"));
  EXPECT_THAT(with([](auto& c) { c.host = std::string("evil\0host", 9); }),
              HasSubstr("host holds a zero byte"));
  EXPECT_THAT(message_of([] { RedisStream s(RedisTierConfig{}, ""); }),
              HasSubstr("empty stream_key"));
  EXPECT_THAT(message_of([] { RedisStream s(RedisTierConfig{}, "s", 0); }), HasSubstr("max_len 0"));
  RedisTier tier(RedisTierConfig{});  // no server needed: nothing below reaches the network
  EXPECT_THAT(message_of([&] { (void)tier.put("", bytes("v")); }), HasSubstr("put: empty key"));
  EXPECT_THAT(message_of([&] { (void)tier.put("k", {}); }), HasSubstr("empty value for key k"));
  EXPECT_THAT(message_of([&] { (void)tier.get(""); }), HasSubstr("get: empty key"));
  const std::vector<std::string> keys = {"a", ""};
  EXPECT_THAT(message_of([&] { (void)tier.contains(keys); }), HasSubstr("contains: empty key"));
  EXPECT_EQ(tier.stats().failures, 0);
}

}  // namespace
}  // namespace pagedkv
