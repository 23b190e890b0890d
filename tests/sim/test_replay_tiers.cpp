// Tests for the replay's tiers below the pool (sim/tier_sim.hpp, ReplayConfig::tiers): the
// LRU tier stack on its own, then hand-worked traces where a pool too small to keep a prefix
// gets it back from the host or disk tier, under both write policies, and the real Mooncake
// trace against the same replay without tiers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>

#include "pagedkv/error.hpp"
#include "sim/replay.hpp"
#include "sim/tier_sim.hpp"
#include "sim/trace.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::HasSubstr;
using testing::make_trace;
using testing::one_byte_per_token;

constexpr double kHostBw = 1600.0;  // bytes/s: a 16-byte block loads in 10 ms
constexpr double kDiskBw = 800.0;   // 20 ms per block

// The stack alone: capacity in whole blocks, LRU eviction, nearest tier first, promotion.
TEST(TierStack, LruCapacityNearestFirstAndPromotion) {
  // Blocks of 16 bytes: host holds 2 (40 bytes round down), disk 4.
  TierStack s({{"host", 40, kHostBw}, {"disk", 64, kDiskBw}}, 16, 4);
  ASSERT_EQ(s.results()[0].capacity_blocks, 2);
  ASSERT_EQ(s.results()[1].capacity_blocks, 4);
  for (BlockHash k : {1, 2, 3}) s.store(k);  // host keeps 2, 3; disk 1, 2, 3
  EXPECT_EQ(s.results()[0].evicted_blocks, 1);
  EXPECT_EQ(s.results()[1].evicted_blocks, 0);
  // Chain 1, 2, 3, 9: host holds {3, 2}, so 1 comes from disk, and its promotion to host
  // evicts 2; 2 then comes from disk too, its promotion evicting 3; so does 3. 9 is nowhere:
  // the run stops there.
  const std::array<BlockHash, 4> chain = {1, 2, 3, 9};
  double ms = 0;
  EXPECT_EQ(s.load(chain, 0, 10, ms), 3);
  EXPECT_EQ(s.results()[0].hit_blocks, 0);
  EXPECT_EQ(s.results()[1].hit_blocks, 3);
  EXPECT_EQ(s.results()[1].hit_tokens, 12);
  EXPECT_DOUBLE_EQ(ms, 3 * 20.0);
  // Host now holds 2 and 3 (the last two promoted): both come from host, then 1 from disk.
  ms = 0;
  const std::array<BlockHash, 3> again = {2, 3, 1};
  EXPECT_EQ(s.load(again, 0, 10, ms), 3);
  EXPECT_EQ(s.results()[0].hit_blocks, 2);
  EXPECT_EQ(s.results()[1].hit_blocks, 4);
  EXPECT_DOUBLE_EQ(ms, 2 * 10.0 + 20.0);
  // `from` and `limit` bound the run.
  ms = 0;
  EXPECT_EQ(s.load(again, 1, 1, ms), 1);
  EXPECT_DOUBLE_EQ(ms, 10.0);
}

TEST(TierStack, ZeroCapacityTierHoldsNothing) {
  TierStack s({{"host", 15, kHostBw}}, 16, 4);
  s.store(7);
  const std::array<BlockHash, 1> chain = {7};
  double ms = 0;
  EXPECT_EQ(s.load(chain, 0, 1, ms), 0);
  EXPECT_EQ(s.results()[0].stored_blocks, 0);
}

// Three requests of 128 prompt tokens and 1 output, blocks of 16, a pool of 9 blocks (one
// request fills it: 129 positions = 9 blocks). r0 (hash ids 1, 2) runs alone and leaves its 8
// full blocks cached; r1 (3, 4) evicts all of them; r2 repeats r0's prompt. The pool has
// nothing of r0 left, so without tiers r2 prefills all 128 tokens; with a host tier of 8
// blocks on eviction, r0's 8 blocks went there when r1 evicted them, and r2 loads 7 of them
// ((128 - 1) / 16: the last prompt token is always computed) and prefills 16.
Trace evicted_prefix_trace() {
  return make_trace({{0, 128, 1, {1, 2}}, {10, 128, 1, {3, 4}}, {20, 128, 1, {1, 2}}}, 64);
}

ReplayConfig nine_blocks() {
  ReplayConfig c = one_byte_per_token(9 * 16);
  c.max_context = 1000;
  return c;
}

TEST(ReplayTiers, HostTierServesAPrefixThePoolEvicted) {
  const Trace t = evicted_prefix_trace();
  const ReplayResult cold = replay(t, nine_blocks(), {StrategyKind::kPagedPrefix, 16});
  EXPECT_EQ(cold.prefix_hit_tokens, 0);
  EXPECT_EQ(cold.processed_tokens, 3 * 129);
  EXPECT_TRUE(cold.tiers.empty());

  ReplayConfig c = nine_blocks();
  c.tiers = {{"host", 8 * 16, kHostBw}};
  const ReplayResult r = replay(t, c, {StrategyKind::kPagedPrefix, 16});
  EXPECT_EQ(r.completed, 3);
  EXPECT_EQ(r.prefix_hit_tokens, 0);
  ASSERT_EQ(r.tiers.size(), 1U);
  const ReplayTierResult& host = r.tiers[0];
  EXPECT_EQ(host.name, "host");
  EXPECT_EQ(host.capacity_blocks, 8);
  EXPECT_EQ(host.hit_blocks, 7);
  EXPECT_EQ(host.hit_tokens, 112);
  // r0's 8 blocks (evicted by r1), then r1's 8 (evicted by r2, after r2's load), which push
  // out all of r0's.
  EXPECT_EQ(host.stored_blocks, 16);
  EXPECT_EQ(host.evicted_blocks, 8);
  EXPECT_DOUBLE_EQ(host.load_seconds, 7 * 16 / kHostBw);
  EXPECT_EQ(r.processed_tokens, 129 + 129 + 16 + 1);
  // r2 waits for its 70 ms load (7 blocks of 16 bytes at 1600 bytes/s), admitted at 20 ms:
  // it prefills its last 16 tokens at step 90 and decodes at step 91, so its first token comes
  // at 92 ms, TTFT 72 ms (the slowest, so p99); cold, r2 prefills at step 20 and decodes at 21.
  // The others do not wait: steps stay 1 ms, and the run ends at step 92.
  EXPECT_DOUBLE_EQ(r.ttft_p99_ms, 72.0);
  EXPECT_DOUBLE_EQ(cold.ttft_p99_ms, 2.0);
  EXPECT_EQ(r.steps, 92);
}

// Write-through writes every block as it is published: r1's 8 blocks, published after r0's,
// push r0's out of an 8-block host tier before r2 asks, so r2 finds nothing. On eviction
// (above) r1's blocks only went down when r2 evicted them, after r2's load.
TEST(ReplayTiers, WriteThroughFillsTheTierAtPublication) {
  ReplayConfig c = nine_blocks();
  c.tiers = {{"host", 8 * 16, kHostBw}};
  c.tier_write = TierWrite::kWriteThrough;
  const ReplayResult r = replay(evicted_prefix_trace(), c, {StrategyKind::kPagedPrefix, 16});
  ASSERT_EQ(r.tiers.size(), 1U);
  EXPECT_EQ(r.tiers[0].hit_tokens, 0);
  EXPECT_EQ(r.tiers[0].stored_blocks, 3 * 8);
  EXPECT_EQ(r.processed_tokens, 3 * 129);
  // A host tier of 16 blocks keeps both prefixes: r2 loads 7 blocks again.
  c.tiers = {{"host", 16 * 16, kHostBw}};
  const ReplayResult big = replay(evicted_prefix_trace(), c, {StrategyKind::kPagedPrefix, 16});
  EXPECT_EQ(big.tiers[0].hit_tokens, 112);
  EXPECT_EQ(big.processed_tokens, 129 + 129 + 16 + 1);
}

// A host tier of 4 blocks above a disk tier of 16: r0's 8 evicted blocks all reach the disk,
// only 4 stay in host memory. r2's 7 blocks come from the nearest tier holding each; host and
// disk together supply all 7, the disk at least the 3 the host cannot hold.
TEST(ReplayTiers, DiskTierBelowASmallHostTier) {
  ReplayConfig c = nine_blocks();
  c.tiers = {{"host", 4 * 16, kHostBw}, {"disk", 16 * 16, kDiskBw}};
  const ReplayResult r = replay(evicted_prefix_trace(), c, {StrategyKind::kPagedPrefix, 16});
  ASSERT_EQ(r.tiers.size(), 2U);
  const ReplayTierResult& host = r.tiers[0];
  const ReplayTierResult& disk = r.tiers[1];
  EXPECT_EQ(host.hit_blocks + disk.hit_blocks, 7);
  EXPECT_GE(disk.hit_blocks, 3);
  EXPECT_DOUBLE_EQ(host.load_seconds, static_cast<double>(host.hit_blocks) * 16 / kHostBw);
  EXPECT_DOUBLE_EQ(disk.load_seconds, static_cast<double>(disk.hit_blocks) * 16 / kDiskBw);
  EXPECT_EQ(r.processed_tokens, 129 + 129 + 16 + 1);
}

// Strategies without prefix caching have no block keys: tiers change nothing for them.
TEST(ReplayTiers, IgnoredWithoutPrefixCaching) {
  ReplayConfig c = nine_blocks();
  c.tiers = {{"host", 8 * 16, kHostBw}};
  const ReplayResult r = replay(evicted_prefix_trace(), c, {StrategyKind::kPaged, 16});
  EXPECT_TRUE(r.tiers.empty());
  EXPECT_EQ(r.processed_tokens, 3 * 129);
}

TEST(ReplayTiers, ValidateNamesTheTier) {
  ReplayConfig c = nine_blocks();
  c.tiers = {{"disk", -1, kDiskBw}};
  EXPECT_THAT([&] { validate(c); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tier 'disk' size must be >= 0")));
  c.tiers = {{"host", 16, 0.0}};
  EXPECT_THAT([&] { validate(c); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tier 'host' load bandwidth")));
}

// The Mooncake trace (hash ids per 512 tokens), one request at a time (no preemption, so the
// token accounting is exact) on a pool that cannot keep every shared prefix: a host tier only
// adds hits (the pool sees the same requests in the same order), and every prompt token is
// either found in the pool, found in the tier or prefilled.
TEST(ReplayTiers, MooncakeTierHitsAddToPoolHits) {
  PAGEDKV_REQUIRE_TRACES();
  Trace t = read_trace((testing::traces_dir() / "mooncake_conversation_trace.jsonl").string());
  t.requests.resize(std::min<size_t>(t.requests.size(), 400));
  ReplayConfig c = one_byte_per_token(200000);
  c.max_context = 200000;
  c.max_seqs = 1;
  const Strategy s{StrategyKind::kPagedPrefix, 16};
  const ReplayResult pool_only = replay(t, c, s);
  c.tiers = {{"host", 4000000, 25e9}};
  const ReplayResult tiered = replay(t, c, s);
  for (const ReplayResult* r : {&pool_only, &tiered}) {
    ASSERT_EQ(r->preemptions, 0);
    EXPECT_EQ(r->completed, static_cast<int64_t>(t.requests.size()));
    const int64_t tier_hits = r->tiers.empty() ? 0 : r->tiers[0].hit_tokens;
    EXPECT_EQ(r->processed_tokens,
              r->prefix_query_tokens - r->prefix_hit_tokens - tier_hits + r->generated_tokens);
  }
  EXPECT_EQ(tiered.prefix_query_tokens, pool_only.prefix_query_tokens);
  EXPECT_GE(tiered.prefix_hit_tokens, pool_only.prefix_hit_tokens);
  ASSERT_EQ(tiered.tiers.size(), 1U);
  EXPECT_GT(tiered.tiers[0].hit_tokens, 0);
  EXPECT_EQ(tiered.tiers[0].hit_tokens % 16, 0);
}

}  // namespace
}  // namespace pagedkv::sim
