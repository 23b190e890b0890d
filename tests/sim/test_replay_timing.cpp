// Tests for the replay's time models (src/sim/replay.hpp with step_time.hpp): hand-worked
// traces under the roofline model (each step's length from its work, arrivals seen at a step's
// start) and swap preemption with its host-link cost, against recompute.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pagedkv/error.hpp"
#include "sim/replay.hpp"
#include "sim/step_time.hpp"
#include "sim/sweep.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::HasSubstr;
using testing::one_byte_per_token;

Trace make_trace(const std::vector<std::array<double, 3>>& reqs) {
  Trace t;
  t.source = "hand";
  for (const auto& [ms, p, o] : reqs) {
    TraceRequest q;
    q.arrival_ms = ms;
    q.prompt_tokens = static_cast<int64_t>(p);
    q.output_tokens = static_cast<int64_t>(o);
    q.line = static_cast<int64_t>(t.requests.size()) + 1;
    t.requests.push_back(q);
  }
  t.rows_read = static_cast<int64_t>(t.requests.size());
  return t;
}

// A bandwidth-bound toy: 1000 weight bytes, 1 byte per KV position, 1e6 B/s at full efficiency
// -> a step lasts (1000 + positions read + positions written) us; FLOPs negligible, no overhead.
ReplayConfig toy_roofline(int64_t capacity) {
  ReplayConfig c = one_byte_per_token(capacity);
  RooflineModel m;
  m.weight_bytes = 1000;
  m.flops_per_token = 1;
  m.kv_bytes_per_token = 1;
  m.flops_per_pair = 1;
  m.bandwidth_bytes_per_s = 1e6;
  m.flops_per_s = 1e12;
  m.bandwidth_efficiency = 1;
  m.flops_efficiency = 1;
  m.overhead_ms = 0;
  c.roofline = m;
  return c;
}

// r0 (t 0, P4, O2), r1 (t 1.5 ms, P2, O1), contiguous-exact with room for both.
//   step 0 [0, 1.008):     r0 prefills [0, 4): reads 4, writes 4      -> 1.008 ms
//   step 1 [1.008, 2.014): r1 has not arrived at 1.008; r0 decodes at 4 (5 + 1) -> 1.006 ms
//   step 2 [2.014, 3.025): r0 decodes at 5 (6 + 1), r1 admitted, prefills 2 (2 + 2) -> 1.011;
//                          r0 finishes: e2e 3.025, TTFT 2.014 (end of its first decode)
//   step 3 [3.025, 4.029): r1 decodes at 2 (3 + 1) -> 1.004; e2e = TTFT = 4.029 - 1.5 = 2.529
TEST(ReplayTiming, RooflineStepsLastWhatTheirWorkCosts) {
  const Trace t = make_trace({{0, 4, 2}, {1.5, 2, 1}});
  const ReplayResult r = replay(t, toy_roofline(100), {StrategyKind::kContiguousExact, 0});
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.steps, 4);
  EXPECT_NEAR(r.mean_step_ms, 4.029 / 4, 1e-12);
  EXPECT_NEAR(r.ttft_p50_ms, 2.014, 1e-12);
  EXPECT_NEAR(r.ttft_p99_ms, 2.529, 1e-12);
  EXPECT_NEAR(r.tpot_p99_ms, 3.025 - 2.014, 1e-12);  // r0 only (output 2)
  EXPECT_NEAR(r.normalized_latency_s, (3.025 / 2 + 2.529 / 1) / 2 / 1000, 1e-15);
  EXPECT_NEAR(r.throughput_rps, 2 / 4.029e-3, 1e-6);
  // Time-weighted concurrency: 1 running for 1.008 + 1.006 ms, 2 for 1.011, 1 for 1.004.
  EXPECT_NEAR(r.mean_concurrency, (1.008 + 1.006 + 2 * 1.011 + 1.004) / 4.029, 1e-12);
}

// An idle gap under the roofline model is skipped to the next arrival and counts as time.
TEST(ReplayTiming, RooflineIdleGapCountsAsTime) {
  const Trace t = make_trace({{0, 1, 1}, {10, 1, 1}});
  const ReplayResult r = replay(t, toy_roofline(100), {StrategyKind::kContiguousExact, 0});
  // Each request: prefill [0, 1) 1.002 ms, decode at 1 (2 + 1) 1.003 ms. Ends at 10 + 2.005.
  EXPECT_EQ(r.steps, 4);
  EXPECT_NEAR(r.ttft_p99_ms, 2.005, 1e-12);
  EXPECT_NEAR(r.throughput_rps, 2 / 12.005e-3, 1e-6);
  EXPECT_NEAR(r.mean_concurrency, 4.01 / 12.005, 1e-12);
}

// tests/sim/test_replay.cpp PagedPreemptionHandWorked with swap: paged-2, 8 positions, r0 (P4,
// O3), r1 (P3, O3), constant 1 ms steps, host link 2000 B/s = 0.5 ms per position.
//   step 0 [0, 1):     both admitted, 7 / 8
//   step 1 [1, 3.5):   r0 needs a block: r1 (3 positions) swapped out, 1.5 ms; r0 -> 5  5 / 6
//   step 2 [3.5, 4.5): r0 -> 6; step 3 [4.5, 5.5): r0 -> 7, done          6 / 6, 7 / 8
//   step 4 [5.5, 8):   r1 swapped in (3 positions, 1.5 ms), no prefill    3 / 4
//   steps 5-7 [8, 11): r1 decodes 4, 5, 6; done at 11                     4/4, 5/6, 6/6
TEST(ReplayTiming, SwapPreemptionHandWorked) {
  const Trace t = make_trace({{0, 4, 3}, {0, 3, 3}});
  ReplayConfig c = one_byte_per_token(8);
  c.preemption = Preemption::kSwap;
  c.host_link_bytes_per_s = 2000;
  const ReplayResult r = replay(t, c, {StrategyKind::kPaged, 2});
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.steps, 8);
  EXPECT_EQ(r.preemptions, 1);
  EXPECT_EQ(r.swapped_tokens, 3);
  EXPECT_EQ(r.recomputed_tokens, 0);
  EXPECT_DOUBLE_EQ(r.swap_seconds, 3e-3);
  EXPECT_EQ(r.processed_tokens, 7 + 1 + 1 + 1 + 3);  // recompute: 16 (3 prompt positions again)
  EXPECT_NEAR(r.throughput_rps, 2 / 11e-3, 1e-6);
  EXPECT_NEAR(r.ttft_p50_ms, 3.5, 1e-12);  // r0: end of step 1
  EXPECT_NEAR(r.ttft_p99_ms, 9.0, 1e-12);  // r1: end of step 5
  EXPECT_NEAR(r.util_mean,
              (7.0 / 8 + 2.5 * 5 / 6 + 1 + 7.0 / 8 + 2.5 * 3 / 4 + 1 + 5.0 / 6 + 1) / 11, 1e-12);
  // The same trace with recompute takes 8 ms and discards 3 computed positions.
  c.preemption = Preemption::kRecompute;
  const ReplayResult rc = replay(t, c, {StrategyKind::kPaged, 2});
  EXPECT_EQ(rc.recomputed_tokens, 3);
  EXPECT_EQ(rc.swapped_tokens, 0);
  EXPECT_DOUBLE_EQ(rc.swap_seconds, 0.0);
  EXPECT_NEAR(rc.throughput_rps, 2 / 8e-3, 1e-6);
}

// Swap on the roofline model: the swap copy adds to the step's own length.
TEST(ReplayTiming, SwapUnderRooflineAddsCopyTime) {
  const Trace t = make_trace({{0, 4, 3}, {0, 3, 3}});
  ReplayConfig c = toy_roofline(8);
  c.preemption = Preemption::kSwap;
  c.host_link_bytes_per_s = 1e6;  // 1 us per position: 3 out + 3 in = 6 us
  const ReplayResult swap = replay(t, c, {StrategyKind::kPaged, 2});
  EXPECT_EQ(swap.swapped_tokens, 3);
  EXPECT_NEAR(swap.swap_seconds, 6e-6, 1e-15);
  // Steps (bytes: 1000 + read + written): 0: prefills 4 and 3 -> 1014; 1: r0 decode at 4 -> 1006
  // + 3 out; 2: at 5 -> 1007; 3: at 6 -> 1008; 4: swap-in 3, nothing computed -> 1000 + 3;
  // 5-7: r1 at 3, 4, 5 -> 1005, 1006, 1007.
  const double total_us = 1014 + 1009 + 1007 + 1008 + 1003 + 1005 + 1006 + 1007;
  EXPECT_EQ(swap.steps, 8);
  EXPECT_NEAR(swap.mean_step_ms, total_us / 1000 / 8, 1e-12);
  EXPECT_EQ(swap.processed_tokens, 7 + 3 + 3);
}

// The SLO search under the roofline model, answer by hand: alone, a (P4, O2) request takes
// 1.008 + 1.006 + 1.007 = 3.021 ms (the first test's steps), normalized latency 1.5105 ms per
// token. Eight of them 10 ms apart: at rate xk they arrive every 10 / k ms, so they never
// overlap while 10 / k >= 3.021 (k <= 3.31). At x4 (2.5 ms) the second arrives during the
// first's last step and waits for the next step start: latency above the bound. Max rate: x3.
TEST(ReplayTiming, SloSearchUnderRooflineHasTheHandAnswer) {
  std::vector<std::array<double, 3>> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back({10.0 * i, 4, 2});
  const Trace t = make_trace(reqs);
  const std::vector<Strategy> strategies = {{StrategyKind::kPaged, 4}};
  const std::vector<double> rates = {1, 2, 3, 4, 5};
  const auto points = sweep(t, toy_roofline(100), strategies, rates, 1);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(points[i].result.normalized_latency_s, 3.021 / 2 / 1000, 1e-15) << rates[i];
  }
  EXPECT_GT(points[3].result.normalized_latency_s, 3.021 / 2 / 1000 + 1e-7);
  Slo slo;
  slo.normalized_latency_s = 3.021 / 2 / 1000 + 1e-9;
  EXPECT_EQ(max_rate_at_slo(points, slo).at(0).second, 3.0);
}

TEST(ReplayTiming, BadHostLinkAndModelThrow) {
  const Trace t = make_trace({{0, 4, 2}});
  ReplayConfig c = one_byte_per_token(8);
  c.host_link_bytes_per_s = 0;
  EXPECT_THAT(
      [&] {
        (void)replay(t, c, {StrategyKind::kPaged, 2});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("host link bandwidth must be > 0")));
  c = toy_roofline(8);
  c.roofline->flops_efficiency = 2;
  EXPECT_THAT(
      [&] {
        (void)replay(t, c, {StrategyKind::kPaged, 2});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("FLOPs efficiency must be in (0, 1]")));
}

}  // namespace
}  // namespace pagedkv::sim
