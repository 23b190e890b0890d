// Tests for src/sim/report.hpp and svg.hpp: the Markdown table, the JSON fields, the trace
// summary and the SVG text (structure, escaping, gaps, deterministic output).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "sim/model_preset.hpp"
#include "sim/replay.hpp"
#include "sim/report.hpp"
#include "sim/svg.hpp"
#include "sim/trace.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Trace small_trace() {
  std::istringstream in(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:46,10,2\nbad,1,1\n2023-11-16 18:15:47,30,4\n");
  return read_azure_csv(in, "s.csv");
}

/// A budget of 1000 token positions.
ReplayConfig config() { return testing::one_byte_per_token(1000); }

TEST(Report, TraceSummaryCountsSkippedRows) {
  EXPECT_EQ(format_trace_summary(small_trace()),
            "trace s.csv (azure-csv): 3 rows read, 2 requests, 1 skipped; span 1.0 s; mean "
            "prompt 20.0, mean output 3.0 tokens (skipped: 1 bad timestamp)");
}

TEST(Report, TableAndJsonHaveEveryStrategy) {
  const Trace t = small_trace();
  std::vector<ReplayResult> rs;
  for (const char* s : {"contiguous-exact", "paged-16"}) {
    rs.push_back(replay(t, config(), parse_strategy(s)));
  }
  const std::string table = format_replay_table(rs);
  EXPECT_THAT(table, HasSubstr("| strategy | util mean | util p5 |"));
  EXPECT_THAT(table, HasSubstr("\n| contiguous-exact | "));
  EXPECT_THAT(table, HasSubstr("\n| paged-16 | "));

  const nlohmann::json j = replay_to_json(t, find_preset("gpt2"), config(), rs, true);
  EXPECT_EQ(j["trace"]["rows_skipped"], 1);
  EXPECT_EQ(j["trace"]["problems"][0],
            "s.csv:3: TIMESTAMP 'bad' is not 'YYYY-MM-DD HH:MM:SS[.f]' "
            "or a number of seconds");
  ASSERT_EQ(j["strategies"].size(), 2u);
  const nlohmann::json& p = j["strategies"][1];
  EXPECT_EQ(p["strategy"], "paged-16");
  EXPECT_EQ(p["num_blocks"], 62);
  EXPECT_EQ(p["completed"], 2);
  for (const char* key : {"utilization_mean", "utilization_p5", "fragmentation_mean",
                          "peak_concurrency", "mean_concurrency", "preemptions", "tokens_per_step",
                          "queue_mean_steps", "queue_p99_steps", "prefix_hit_rate", "series"}) {
    EXPECT_TRUE(p.contains(key)) << key;
  }
  EXPECT_FALSE(
      replay_to_json(t, find_preset("gpt2"), config(), rs, false)["strategies"][0].contains(
          "series"));
}

TEST(Svg, PanelsLegendsEscapingAndGaps) {
  SvgPanel a{"A <title> & more", "x", "y", {}, true, 1.0};
  a.series.push_back(
      {"s1", {{0, 0.5}, {1, std::numeric_limits<double>::quiet_NaN()}, {2, 1}}, false, true});
  a.series.push_back({"dashed", {{0, 0.1}, {2, 0.2}}, true, false});
  SvgPanel empty{"empty", "x", "y", {}, true, 0.0};
  const std::string svg = render_svg({a, empty}, 800, 300);
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"800\" "
                             "height=\"600\""));
  EXPECT_THAT(svg, HasSubstr("A &lt;title&gt; &amp; more"));
  EXPECT_THAT(svg, Not(HasSubstr("<title> &")));
  EXPECT_THAT(svg, HasSubstr("stroke-dasharray=\"6 4\""));
  EXPECT_THAT(svg, HasSubstr("<circle"));
  // The NaN breaks s1 into two sub-paths: "M... M...".
  const size_t path = svg.find("<path d=\"M");
  ASSERT_NE(path, std::string::npos);
  EXPECT_NE(svg.find(" M", path + 9), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(svg, render_svg({a, empty}, 800, 300));  // deterministic
}

TEST(Svg, ReplayPanelsOneLinePerStrategy) {
  const Trace t = small_trace();
  std::vector<ReplayResult> rs = {replay(t, config(), parse_strategy("paged-8")),
                                  replay(t, config(), parse_strategy("contiguous-max"))};
  const auto panels = replay_panels(rs, "T");
  ASSERT_EQ(panels.size(), 3u);
  EXPECT_EQ(panels[0].series.size(), 2u);
  EXPECT_EQ(panels[0].series[0].label, "paged-8");
  EXPECT_TRUE(panels[0].series[1].dashed);  // contiguous strategies are dashed
  EXPECT_EQ(panels[0].y_max, 1.0);
}

}  // namespace
}  // namespace pagedkv::sim
