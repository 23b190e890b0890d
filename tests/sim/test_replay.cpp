// Tests for src/sim/replay.hpp: the scheduler simulation on hand-worked tiny traces (exact
// steps, concurrency, preemptions, utilization, queueing delay, prefix hits), strategy parsing,
// token synthesis, and invariants over a slice of a real trace.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "pagedkv/error.hpp"
#include "sim/replay.hpp"
#include "sim/trace.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::one_byte_per_token;  // budgets and times in a test read as counts

using testing::make_trace;

void expect_conservation(const ReplayResult& r) {
  EXPECT_EQ(r.completed + r.rejected_too_long + r.rejected_too_large, r.requests);
  EXPECT_GE(r.util_mean, r.util_p5);
  EXPECT_LE(r.util_mean, 1.0);
  EXPECT_GE(r.util_p5, 0.0);
}

// Contiguous-exact, 10 positions. r0 (P4, O2) and r1 (P4, O2) and r2 (P3, O1) arrive at step 0.
//   step 0: admit r0 (reserve 6, prefill 4); r1 needs 6 more: 12 > 10, wait.   live 4 / 6
//   step 1: r0 decodes (5).                                                     live 5 / 6
//   step 2: r0 decodes (6), finishes.                                           live 6 / 6
//   step 3: admit r1 (reserve 6, prefill 4), r2 (reserve 4, prefill 3): 10.     live 7 / 10
//   step 4: r1 decodes (5), r2 decodes (4) and finishes.                        live 9 / 10
//   step 5: r1 decodes (6), finishes.                                           live 6 / 6
TEST(Replay, ContiguousExactHandWorked) {
  const Trace t = make_trace({{0, 4, 2}, {0, 4, 2}, {0, 3, 1}});
  const ReplayResult r = replay(t, one_byte_per_token(10), {StrategyKind::kContiguousExact, 0});
  EXPECT_EQ(r.strategy, "contiguous-exact");
  EXPECT_EQ(r.capacity_tokens, 10);
  EXPECT_EQ(r.completed, 3);
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(r.peak_concurrency, 2);
  EXPECT_DOUBLE_EQ(r.mean_concurrency, 8.0 / 6.0);
  EXPECT_EQ(r.preemptions, 0);
  EXPECT_EQ(r.processed_tokens, 11 + 5);
  EXPECT_EQ(r.generated_tokens, 5);
  EXPECT_DOUBLE_EQ(r.tokens_per_step, 16.0 / 6.0);
  EXPECT_DOUBLE_EQ(r.queue_mean_steps, 2.0);  // delays 0, 3, 3
  EXPECT_DOUBLE_EQ(r.queue_p99_steps, 3.0);
  EXPECT_NEAR(r.util_mean, (4.0 / 6 + 5.0 / 6 + 1 + 0.7 + 0.9 + 1) / 6, 1e-12);
  EXPECT_NEAR(r.util_p5, 4.0 / 6, 1e-4);  // nearest rank 1 of 6 = the minimum
  EXPECT_NEAR(r.frag_mean, 1 - r.util_mean, 1e-12);
  // Reserved 6,6,6,10,10,6 and wasted 2,1,0,3,1,0 positions (1 byte each) over 6 steps.
  EXPECT_DOUBLE_EQ(r.reserved_mean_bytes, 44.0 / 6);
  EXPECT_DOUBLE_EQ(r.waste_mean_bytes, 7.0 / 6);
  expect_conservation(r);
}

// The latency of the same run (step_ms 1: a token computed in step s is delivered at s + 1 ms).
//   r0: first token in step 1 -> TTFT 2 ms; done in step 2 -> e2e 3 ms; TPOT (3 - 2) / 1 = 1.
//   r1: admitted at 3, first token in step 4 -> TTFT 5; done in step 5 -> e2e 6; TPOT 1.
//   r2 (O1): first token and done in step 4 -> TTFT 5, e2e 5; no TPOT (one output token).
// TTFT {2, 5, 5}: p50 5 (rank 2), p99 5; normalized latency (3/2 + 6/2 + 5/1) / 3 ms per token;
// throughput 3 requests and 5 tokens over 6 ms.
TEST(Replay, LatencyAndThroughputHandWorked) {
  const Trace t = make_trace({{0, 4, 2}, {0, 4, 2}, {0, 3, 1}});
  const ReplayResult r = replay(t, one_byte_per_token(10), {StrategyKind::kContiguousExact, 0});
  EXPECT_DOUBLE_EQ(r.ttft_p50_ms, 5.0);
  EXPECT_DOUBLE_EQ(r.ttft_p99_ms, 5.0);
  EXPECT_DOUBLE_EQ(r.tpot_p50_ms, 1.0);
  EXPECT_DOUBLE_EQ(r.tpot_p99_ms, 1.0);
  EXPECT_NEAR(r.normalized_latency_s, (1.5 + 3.0 + 5.0) / 3 / 1000, 1e-15);
  EXPECT_DOUBLE_EQ(r.throughput_rps, 3 / 0.006);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s, 5 / 0.006);
}

// --rate-scale 2 halves every arrival time: r1 at 8 ms arrives at 4 ms (step 4) instead.
//   rate 1: r0 (P2, O1) steps 0-1; idle until r1 at step 8: steps 8-9.  10 steps, TTFT 2, 2
//   rate 2: r1 arrives at step 4: steps 4-5.                               6 steps, TTFT 2, 2
// Fractional arrivals keep their fraction: r1 at 9 ms / 2 = 4.5 ms -> step 4, TTFT 6 - 4.5 = 1.5.
TEST(Replay, RateScaleDividesArrivalTimes) {
  const Trace t = make_trace({{0, 2, 1}, {8, 2, 1}});
  ReplayConfig c = one_byte_per_token(10);
  const ReplayResult r1 = replay(t, c, {StrategyKind::kContiguousExact, 0});
  EXPECT_EQ(r1.steps, 10);
  EXPECT_DOUBLE_EQ(r1.ttft_p99_ms, 2.0);
  c.rate_scale = 2.0;
  const ReplayResult r2 = replay(t, c, {StrategyKind::kContiguousExact, 0});
  EXPECT_EQ(r2.steps, 6);
  EXPECT_DOUBLE_EQ(r2.ttft_p99_ms, 2.0);
  EXPECT_DOUBLE_EQ(r2.throughput_rps, 2 / 0.006);
  const ReplayResult r3 =
      replay(make_trace({{0, 2, 1}, {9, 2, 1}}), c, {StrategyKind::kContiguousExact, 0});
  EXPECT_DOUBLE_EQ(r3.ttft_p50_ms, 1.5);  // {1.5, 2}: rank 1
  c.rate_scale = 0.0;
  EXPECT_THAT(
      [&] {
        (void)replay(t, c, {StrategyKind::kContiguousExact, 0});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("rate scale must be > 0")));
}

// Contiguous-max reserves max_context (here 6) per request: only one of two fits in 10.
TEST(Replay, ContiguousMaxReservesTheMaximum) {
  ReplayConfig c = one_byte_per_token(10);
  c.max_context = 6;
  const Trace t = make_trace({{0, 2, 2}, {0, 2, 2}});
  const ReplayResult r = replay(t, c, {StrategyKind::kContiguousMax, 0});
  // step 0: r0 reserves 6 (prefill 2); 1: decode 3; 2: decode 4, done; 3: r1 prefill; 4; 5.
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(r.peak_concurrency, 1);
  EXPECT_DOUBLE_EQ(r.queue_mean_steps, 1.5);
  EXPECT_NEAR(r.util_mean, (2.0 + 3 + 4 + 2 + 3 + 4) / 6 / 6, 1e-12);
  expect_conservation(r);
}

// Paged, block size 2, 4 blocks (8 positions), no watermark. r0 (P4, O3), r1 (P3, O3) at 0.
//   step 0: admit r0 (2 blocks), r1 (2 blocks); pool full.          live 7 / 8 reserved
//   step 1: r0's decode needs a 3rd block: preempt the newest, r1 (its 2 blocks freed, back to
//           the queue front to recompute its 3 prompt positions); r0 -> 5.   live 5 / 6
//           r1 needs 2 blocks, 1 free: wait.
//   step 2: r0 -> 6 (same block).                                  live 6 / 6
//   step 3: r0 -> 7 (4th block), done; r1 still waits (0 free).     live 7 / 8
//   step 4: r1 admitted again: prefill 3.                           live 3 / 4
//   steps 5, 6, 7: r1 decodes 4, 5 (3rd block), 6; done.            4/4, 5/6, 6/6
TEST(Replay, PagedPreemptionHandWorked) {
  const Trace t = make_trace({{0, 4, 3}, {0, 3, 3}});
  const ReplayResult r = replay(t, one_byte_per_token(8), {StrategyKind::kPaged, 2});
  EXPECT_EQ(r.strategy, "paged-2");
  EXPECT_EQ(r.num_blocks, 4);
  EXPECT_EQ(r.capacity_tokens, 8);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.steps, 8);
  EXPECT_EQ(r.preemptions, 1);
  EXPECT_EQ(r.recomputed_tokens, 3);
  EXPECT_EQ(r.peak_concurrency, 2);
  EXPECT_DOUBLE_EQ(r.mean_concurrency, 9.0 / 8.0);
  EXPECT_EQ(r.processed_tokens, 7 + 1 + 1 + 1 + 3 + 3);
  EXPECT_EQ(r.generated_tokens, 6);
  EXPECT_DOUBLE_EQ(r.queue_mean_steps, 0.0);  // both first admitted at step 0
  EXPECT_NEAR(r.util_mean, (7.0 / 8 + 5.0 / 6 + 1 + 7.0 / 8 + 3.0 / 4 + 1 + 5.0 / 6 + 1) / 8,
              1e-12);
  EXPECT_NEAR(r.util_p5, 0.75, 1e-4);
  expect_conservation(r);
}

// The same two requests in a pool of 8 blocks never preempt, and paged-1 wastes nothing.
TEST(Replay, PagedBlockSizeOneIsAlwaysFullyUtilized) {
  const Trace t = make_trace({{0, 4, 3}, {0, 3, 3}, {2, 5, 1}});
  const ReplayResult r = replay(t, one_byte_per_token(100), {StrategyKind::kPaged, 1});
  EXPECT_EQ(r.preemptions, 0);
  EXPECT_DOUBLE_EQ(r.util_mean, 1.0);
  EXPECT_DOUBLE_EQ(r.util_p5, 1.0);
  EXPECT_DOUBLE_EQ(r.waste_mean_bytes, 0.0);
  expect_conservation(r);
}

// A request whose P + O exceeds max_context is rejected by every strategy; one that cannot fit
// the budget even alone is rejected by the strategy that cannot hold it.
TEST(Replay, RejectsTooLongAndTooLarge) {
  ReplayConfig c = one_byte_per_token(8);
  c.max_context = 20;
  const Trace t = make_trace({{0, 18, 5}, {0, 6, 4}, {0, 2, 2}});
  for (const char* name :
       {"contiguous-max", "contiguous-exact", "paged-1", "paged-2", "paged-8", "prefix-4"}) {
    SCOPED_TRACE(name);
    const ReplayResult r = replay(t, c, parse_strategy(name));
    EXPECT_EQ(r.rejected_too_long, 1);  // 18 + 5 > 20, for every strategy
    // contiguous-max reserves 20 > 8 for anyone; the others cannot hold 6 + 4 = 10 > 8.
    EXPECT_EQ(r.rejected_too_large, std::string(name) == "contiguous-max" ? 2 : 1);
    EXPECT_EQ(r.completed, std::string(name) == "contiguous-max" ? 0 : 1);
    expect_conservation(r);
  }
}

// Idle gaps are skipped but still count as time; arrival steps come from the timestamps.
TEST(Replay, IdleGapsCountAsTime) {
  ReplayConfig c = one_byte_per_token(100);
  c.step_ms = 10.0;
  const Trace t = make_trace({{0, 2, 1}, {95, 2, 1}});  // arrives at step 9
  const ReplayResult r = replay(t, c, {StrategyKind::kPaged, 4});
  // r0: steps 0 (prefill), 1 (decode); idle 2..8; r1: steps 9, 10.
  EXPECT_EQ(r.steps, 11);
  EXPECT_DOUBLE_EQ(r.mean_concurrency, 4.0 / 11);
  EXPECT_DOUBLE_EQ(r.queue_mean_steps, 0.0);
  ASSERT_FALSE(r.series.empty());
  EXPECT_DOUBLE_EQ(r.series.front().time_s, 0.005);  // centre of step 0, 10 ms steps
}

// Chunked prefill: a 10-token prompt with 4 tokens per step takes 3 steps; decodes of running
// requests go first.
TEST(Replay, ChunkedPrefillRespectsTheTokenBudget) {
  ReplayConfig c = one_byte_per_token(100);
  c.max_batch_tokens = 4;
  const Trace t = make_trace({{0, 10, 2}});
  const ReplayResult r = replay(t, c, {StrategyKind::kPaged, 4});
  // steps 0, 1, 2: prefill 4, 4, 2; steps 3, 4: decode.
  EXPECT_EQ(r.steps, 5);
  EXPECT_EQ(r.processed_tokens, 12);
}

// Prefix caching: r1 shares r0's first 512-token hash block. With 16-token blocks, r1 reuses
// r0's 32 cached blocks (512 positions) and computes only its last 88.
TEST(Replay, PrefixCachingSharesEqualHashBlocks) {
  const Trace t = make_trace({{0, 600, 1, {7, 8}}, {5, 600, 1, {7, 9}}}, 512);
  ReplayConfig c = one_byte_per_token(10000);
  c.max_context = 10000;
  const ReplayResult r = replay(t, c, {StrategyKind::kPagedPrefix, 16});
  EXPECT_EQ(r.strategy, "prefix-16");
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.prefix_query_tokens, 1200);
  EXPECT_EQ(r.prefix_hit_tokens, 512);
  EXPECT_DOUBLE_EQ(r.prefix_hit_rate, 512.0 / 1200);
  EXPECT_EQ(r.processed_tokens, 600 + 1 + 88 + 1);
  // Without prefix caching nothing is shared.
  const ReplayResult p = replay(t, c, {StrategyKind::kPaged, 16});
  EXPECT_EQ(p.prefix_hit_tokens, 0);
  EXPECT_EQ(p.processed_tokens, 1202);
}

// Two requests running at once with the same prefix share its blocks: live positions count a
// shared block once, so utilization stays <= 1.
TEST(Replay, SharedBlocksCountOnceInUtilization) {
  const Trace t = make_trace({{0, 1024, 4, {3, 4}}, {1, 1024, 4, {3, 4}}}, 512);
  ReplayConfig c = one_byte_per_token(100000);
  c.max_context = 10000;
  const ReplayResult r = replay(t, c, {StrategyKind::kPagedPrefix, 16});
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.prefix_hit_tokens, 1008);  // (1024 - 1) / 16 = 63 blocks: one token recomputed
  EXPECT_LE(r.util_mean, 1.0);
  expect_conservation(r);
}

TEST(Replay, Deterministic) {
  const Trace t = make_trace({{0, 40, 9}, {1, 33, 20}, {1, 70, 3}, {4, 12, 30}, {9, 50, 5}});
  for (const Strategy& s : default_strategies()) {
    const ReplayResult a = replay(t, one_byte_per_token(128), s);
    const ReplayResult b = replay(t, one_byte_per_token(128), s);
    EXPECT_EQ(a.steps, b.steps) << s.name();
    EXPECT_EQ(a.preemptions, b.preemptions) << s.name();
    EXPECT_EQ(a.util_mean, b.util_mean) << s.name();
    expect_conservation(a);
  }
}

TEST(Replay, InvalidConfigThrows) {
  const Trace t = make_trace({{0, 4, 2}});
  ReplayConfig c = one_byte_per_token(10);
  c.step_ms = 0;
  EXPECT_THAT([&] { (void)replay(t, c, {}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("step must be > 0 ms")));
  c = one_byte_per_token(10);
  EXPECT_THAT(
      [&] {
        (void)replay(t, c, {StrategyKind::kPaged, 16});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("holds no block of 16 tokens")));
}

TEST(Strategy, NamesRoundTrip) {
  std::vector<std::string> names;
  for (const Strategy& s : default_strategies()) {
    names.push_back(s.name());
    const Strategy back = parse_strategy(s.name());
    EXPECT_EQ(back.kind, s.kind);
    EXPECT_EQ(back.block_size, s.block_size);
  }
  EXPECT_THAT(names, ElementsAre("contiguous-max", "contiguous-exact", "paged-1", "paged-8",
                                 "paged-16", "paged-32", "paged-128", "prefix-16"));
  for (const char* bad : {"paged", "paged-0", "paged-x", "prefix-", "buddy-16"}) {
    EXPECT_THAT([&] { (void)parse_strategy(bad); },
                ::testing::ThrowsMessage<Error>(HasSubstr("unknown strategy")))
        << bad;
  }
}

TEST(SynthesizeTokens, EqualHashIdsGiveEqualTokens) {
  const Trace t = make_trace({{0, 600, 1, {7, 8}}, {0, 600, 1, {7, 9}}, {0, 600, 1}}, 512);
  const auto a = synthesize_tokens(t, 0, 0, 600, 32000);
  const auto b = synthesize_tokens(t, 1, 0, 600, 32000);
  const auto c = synthesize_tokens(t, 2, 0, 600, 32000);
  ASSERT_EQ(a.size(), 600u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 512, b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 512, a.end(), b.begin() + 512));
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + 512, c.begin()));
  for (TokenId id : a) {
    EXPECT_GE(id, 3);
    EXPECT_LT(id, 32000);
  }
  // Generated positions (past the prompt) are the request's own.
  EXPECT_NE(synthesize_tokens(t, 0, 600, 616, 32000), synthesize_tokens(t, 1, 600, 616, 32000));
  // A sub-range equals the same slice of the whole.
  const auto mid = synthesize_tokens(t, 0, 500, 520, 32000);
  EXPECT_TRUE(std::equal(mid.begin(), mid.end(), a.begin() + 500));
}

// The ids' formula written out independently (replay.hpp, synthesize_tokens): splitmix64's
// finalizer, id = 3 + high half of mix(key ^ mix(offset)) x (vocab - 3); hash-id keys for the
// shared blocks (offset within the 512-token block), the request's own key (top bit | index)
// with the absolute position past them.
uint64_t splitmix_finalizer(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
TokenId expected_id(uint64_t key, uint64_t offset, int32_t vocab) {
  const uint64_t h = splitmix_finalizer(key ^ splitmix_finalizer(offset));
  return static_cast<TokenId>(
      3 + static_cast<uint64_t>((static_cast<unsigned __int128>(h) * (vocab - 3)) >> 64));
}

TEST(SynthesizeTokens, IdsFollowTheFormulaExactly) {
  // Two hash blocks (ids 7 and 123456789) and 88 own positions, for vocab sizes from the
  // smallest to Llama 3's, over sub-ranges that start and end inside blocks (the vectorized
  // fill handles any length and alignment).
  const Trace t = make_trace({{0, 1112, 1, {7, 123456789, 5}}}, 512);
  for (const int32_t vocab : {4, 32000, 128256, 1 << 30}) {
    const std::vector<TokenId> all = synthesize_tokens(t, 0, 0, 1200, vocab);
    ASSERT_EQ(all.size(), 1200u);
    for (int64_t p = 0; p < 1200; ++p) {
      const TokenId want = p < 512    ? expected_id(7, p, vocab)
                           : p < 1024 ? expected_id(123456789, p - 512, vocab)
                           : p < 1112 ? expected_id(5, p - 1024, vocab)
                                      : expected_id(uint64_t{1} << 63, p, vocab);
      ASSERT_EQ(all[static_cast<size_t>(p)], want) << "position " << p << " vocab " << vocab;
    }
    for (const auto& [begin, end] :
         {std::pair<int64_t, int64_t>{3, 517}, {511, 513}, {1000, 1150}}) {
      const std::vector<TokenId> part = synthesize_tokens(t, 0, begin, end, vocab);
      EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + begin)) << begin;
    }
  }
  // Vocab 4 leaves one id: 3.
  EXPECT_EQ(synthesize_tokens(t, 0, 0, 1, 4), std::vector<TokenId>{3});
}

// A real trace slice: invariants hold for every strategy, and the orderings that the memory
// arithmetic guarantees: exact reservation never queues longer than max reservation, and paged
// utilization falls as the block size grows.
TEST(RealTraces, AzureConversationSliceInvariants) {
  PAGEDKV_REQUIRE_TRACES();
  Trace t = read_trace((testing::traces_dir() / "AzureLLMInferenceTrace_conv.csv").string());
  t.requests.resize(2000);
  ReplayConfig c;
  c.kv_bytes_per_token = 524288;  // Llama-2-7B fp16
  c.kv_memory_bytes = int64_t{8} << 30;
  c.max_context = 4096;
  std::vector<ReplayResult> rs;
  for (const Strategy& s : default_strategies()) {
    rs.push_back(replay(t, c, s));
    expect_conservation(rs.back());
    EXPECT_EQ(rs.back().rejected_too_long, rs.front().rejected_too_long);
  }
  EXPECT_LE(rs[1].queue_mean_steps, rs[0].queue_mean_steps);
  EXPECT_DOUBLE_EQ(rs[2].util_mean, 1.0);  // paged-1
  for (size_t i = 3; i < 7; ++i) EXPECT_LT(rs[i].util_mean, rs[i - 1].util_mean);
  EXPECT_GT(rs[4].util_mean, rs[1].util_mean);  // paged-16 beats the oracle reservation
  EXPECT_GT(rs[4].peak_concurrency, rs[0].peak_concurrency);
}

}  // namespace
}  // namespace pagedkv::sim
