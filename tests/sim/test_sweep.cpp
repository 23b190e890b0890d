// Tests for src/sim/sweep.hpp: rate sweeps over a hand-worked trace (each point equals a single
// replay at that rate), the SLO and the highest rate meeting it, thread-count independence,
// and bad rates.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <utility>

#include "pagedkv/error.hpp"
#include "sim/replay.hpp"
#include "sim/sweep.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::one_byte_per_token;

// Four requests (P4, O4) 5 ms apart; 8 positions of memory, step 1 ms. At rate x1 each finishes
// (steps 0-4) before the next arrives: TTFT 2 ms, normalized latency 5 / 4 ms per token. At x4
// all four arrive within 4 ms and queue for memory, so latency grows with the rate.
Trace four_requests() {
  Trace t;
  t.source = "hand";
  for (int i = 0; i < 4; ++i) {
    TraceRequest q;
    q.arrival_ms = 5.0 * i;
    q.prompt_tokens = 4;
    q.output_tokens = 4;
    q.line = i + 1;
    t.requests.push_back(q);
  }
  t.rows_read = 4;
  return t;
}

TEST(Sweep, EachPointIsTheReplayAtItsRate) {
  const Trace t = four_requests();
  const ReplayConfig c = one_byte_per_token(8);
  const std::vector<Strategy> strategies = {{StrategyKind::kContiguousExact, 0},
                                            {StrategyKind::kPaged, 4}};
  const std::vector<double> rates = {1, 4};
  const auto points = sweep(t, c, strategies, rates, 2);
  ASSERT_EQ(points.size(), 4u);
  for (size_t i = 0; i < points.size(); ++i) {
    ReplayConfig ci = c;
    ci.rate_scale = rates[i % 2];
    const ReplayResult want = replay(t, ci, strategies[i / 2]);
    EXPECT_EQ(points[i].rate_scale, rates[i % 2]);
    EXPECT_EQ(points[i].result.strategy, want.strategy);
    EXPECT_EQ(points[i].result.steps, want.steps);
    EXPECT_DOUBLE_EQ(points[i].result.normalized_latency_s, want.normalized_latency_s);
  }
  // Hand-worked x1: no queueing, TTFT 2 ms, e2e 5 ms for 4 tokens.
  EXPECT_DOUBLE_EQ(points[0].result.ttft_p99_ms, 2.0);
  EXPECT_NEAR(points[0].result.normalized_latency_s, 5.0 / 4 / 1000, 1e-15);
  EXPECT_GT(points[1].result.normalized_latency_s, points[0].result.normalized_latency_s);
}

TEST(Sweep, SloAndMaxRate) {
  const Trace t = four_requests();
  const std::vector<Strategy> strategies = {{StrategyKind::kContiguousExact, 0}};
  const std::vector<double> rates = {0.5, 1, 2, 4};
  const auto points = sweep(t, one_byte_per_token(8), strategies, rates, 1);
  Slo slo;
  slo.normalized_latency_s = 5.0 / 4 / 1000;  // exactly x1's: met at 0.5 and 1
  auto best = max_rate_at_slo(points, slo);
  ASSERT_EQ(best.size(), 1u);
  EXPECT_EQ(best[0].first, "contiguous-exact");
  EXPECT_EQ(best[0].second, 1.0);
  slo.normalized_latency_s = 1e-9;  // nothing meets it
  EXPECT_EQ(max_rate_at_slo(points, slo)[0].second, 0.0);
  EXPECT_EQ(Slo{}.describe(), "none");
  const Slo both{0.1, 2000.0, std::nullopt};
  EXPECT_EQ(both.describe(), "normalized latency <= 0.1 s/token, TTFT p99 <= 2000 ms");
  EXPECT_THAT(format_sweep_table(points, slo), HasSubstr("| x0.5 | contiguous-exact | 4 | 0 |"));
}

// The table's done and rejected columns: a fifth request longer than max_context (P + O = 12 >
// 10) is rejected at every rate, the four others done.
TEST(Sweep, TableCountsDoneAndRejected) {
  Trace t = four_requests();
  TraceRequest long_one;
  long_one.arrival_ms = 1.0;
  long_one.prompt_tokens = 6;
  long_one.output_tokens = 6;
  long_one.line = 5;
  t.requests.push_back(long_one);
  t.rows_read = 5;
  ReplayConfig c = one_byte_per_token(8);
  c.max_context = 10;
  const std::vector<Strategy> strategies = {{StrategyKind::kContiguousExact, 0}};
  const std::vector<double> rates = {1, 2};
  const auto points = sweep(t, c, strategies, rates, 1);
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[0].result.completed, 4);
  EXPECT_EQ(points[0].result.rejected_too_long, 1);
  const std::string table = format_sweep_table(points, Slo{});
  EXPECT_THAT(table, HasSubstr("| done | rejected |"));
  EXPECT_THAT(table, HasSubstr("| x1 | contiguous-exact | 4 | 1 |"));
  EXPECT_THAT(table, HasSubstr("| x2 | contiguous-exact | 4 | 1 |"));
}

// The plots: latency and throughput lines per strategy; with an SLO, the bound as a dashed line,
// the latency axis stopped at 5x the bound, and bars of the throughput at the highest rate
// meeting it (x1 here: 4 requests over the 20 steps of 1 ms that x1 takes, 200 requests/s).
TEST(Sweep, PanelsWithTheSloBars) {
  const Trace t = four_requests();
  const std::vector<Strategy> strategies = {{StrategyKind::kContiguousExact, 0}};
  const std::vector<double> rates = {0.5, 1, 2, 4};
  const auto points = sweep(t, one_byte_per_token(8), strategies, rates, 1);
  EXPECT_EQ(sweep_panels(points, 200, "t").size(), 2u);
  Slo slo;
  slo.normalized_latency_s = 5.0 / 4 / 1000;
  const auto panels = sweep_panels(points, 200, "t", slo);
  ASSERT_EQ(panels.size(), 3u);
  ASSERT_EQ(panels[0].series.size(), 2u);  // the strategy and the SLO line
  EXPECT_EQ(panels[0].series[0].points.size(), 4u);
  EXPECT_DOUBLE_EQ(panels[0].series[0].points[1].first, 200.0);  // rate x1 = 200 requests/s
  EXPECT_TRUE(panels[0].series[1].dashed);
  EXPECT_DOUBLE_EQ(panels[0].series[1].points[0].second, slo.normalized_latency_s.value());
  EXPECT_DOUBLE_EQ(panels[0].y_max, 5 * slo.normalized_latency_s.value());
  ASSERT_EQ(panels[2].bars.size(), 1u);
  EXPECT_EQ(panels[2].bars[0].first, "contiguous-exact");
  EXPECT_DOUBLE_EQ(panels[2].bars[0].second, points[1].result.throughput_rps);
  EXPECT_DOUBLE_EQ(points[1].result.throughput_rps, 4 / 20e-3);  // done at the end of step 19
  const std::string svg = render_svg(panels);
  EXPECT_THAT(svg, HasSubstr("<title>contiguous-exact: 200</title></rect>"));
  EXPECT_THAT(svg, HasSubstr("clip-path=\"url(#clip0)\""));
}

TEST(Sweep, ThreadCountDoesNotChangeResults) {
  const Trace t = four_requests();
  const std::vector<Strategy> strategies = {{StrategyKind::kPaged, 2}, {StrategyKind::kPaged, 4}};
  const std::vector<double> rates = {0.7, 1.3, 3};
  const auto a = sweep(t, one_byte_per_token(8), strategies, rates, 1);
  const auto b = sweep(t, one_byte_per_token(8), strategies, rates, 4);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].result.steps, b[i].result.steps);
    EXPECT_EQ(a[i].result.preemptions, b[i].result.preemptions);
    EXPECT_DOUBLE_EQ(a[i].result.ttft_p99_ms, b[i].result.ttft_p99_ms);
  }
}

TEST(Sweep, ProgressReportsEveryRunOnceCountingUp) {
  const Trace t = four_requests();
  const std::vector<Strategy> strategies = {{StrategyKind::kPaged, 2}, {StrategyKind::kPaged, 4}};
  const std::vector<double> rates = {0.7, 1.3, 3};
  for (int threads : {1, 3}) {
    std::vector<int> dones;
    std::set<std::pair<std::string, double>> runs;
    const auto points = sweep(t, one_byte_per_token(8), strategies, rates, threads,
                              [&](int done, int total, const SweepPoint& p) {
                                EXPECT_EQ(total, 6);
                                dones.push_back(done);
                                runs.emplace(p.result.strategy, p.rate_scale);
                                EXPECT_GT(p.result.steps, 0);  // the finished run's result
                              });
    EXPECT_THAT(dones, ElementsAre(1, 2, 3, 4, 5, 6)) << threads << " threads";
    EXPECT_EQ(runs.size(), 6u);
    EXPECT_TRUE(runs.contains({"paged-2", 0.7}));
    EXPECT_TRUE(runs.contains({"paged-4", 3.0}));
    EXPECT_EQ(points.size(), 6u);
  }
  // An exception from the callback reaches the caller, from any thread.
  EXPECT_THROW((void)sweep(t, one_byte_per_token(8), strategies, rates, 2,
                           [](int, int, const SweepPoint&) { throw Error("stop"); }),
               Error);
}

TEST(Sweep, BadRatesThrowNamingThem) {
  const Trace t = four_requests();
  const std::vector<Strategy> s = {{StrategyKind::kPaged, 4}};
  const std::vector<double> bad = {1, -2};
  EXPECT_THAT([&] { (void)sweep(t, one_byte_per_token(8), s, bad, 1); },
              ::testing::ThrowsMessage<Error>(HasSubstr("rate -2 must be > 0")));
  EXPECT_THAT([&] { (void)sweep(t, one_byte_per_token(8), s, std::vector<double>{}, 1); },
              ::testing::ThrowsMessage<Error>(HasSubstr("no rate given")));
}

}  // namespace
}  // namespace pagedkv::sim
