#include "sim/sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "core/check.hpp"

namespace pagedkv::sim {

bool Slo::met_by(const ReplayResult& r) const {
  if (r.completed == 0) return false;
  if (normalized_latency_s && !(r.normalized_latency_s <= *normalized_latency_s)) return false;
  if (ttft_p99_ms && !(r.ttft_p99_ms <= *ttft_p99_ms)) return false;
  if (tpot_p99_ms && !(r.tpot_p99_ms <= *tpot_p99_ms)) return false;
  return true;
}

std::string Slo::describe() const {
  std::string s;
  const auto add = [&](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
  if (normalized_latency_s)
    add(fmt::format("normalized latency <= {} s/token", *normalized_latency_s));
  if (ttft_p99_ms) add(fmt::format("TTFT p99 <= {} ms", *ttft_p99_ms));
  if (tpot_p99_ms) add(fmt::format("TPOT p99 <= {} ms", *tpot_p99_ms));
  return s.empty() ? "none" : s;
}

std::vector<SweepPoint> sweep(const Trace& trace, const ReplayConfig& config,
                              std::span<const Strategy> strategies, std::span<const double> rates,
                              int threads, const SweepProgressFn& progress) {
  PAGEDKV_CHECK(!rates.empty(), "sweep: no rate given");
  for (double r : rates) {
    PAGEDKV_CHECK(r > 0 && std::isfinite(r), "sweep: rate {} must be > 0 and finite", r);
  }
  std::vector<SweepPoint> points;
  for (const Strategy& s : strategies) {
    (void)s;
    for (double r : rates) points.push_back({r, {}});
  }
  // Validate every config before any thread starts, so an error comes from this thread.
  for (const SweepPoint& p : points) {
    ReplayConfig c = config;
    c.rate_scale = p.rate_scale;
    validate(c);
  }
  const int total = static_cast<int>(points.size());
  std::atomic<int> next{0};
  int done = 0;      // guarded by mutex
  std::mutex mutex;  // done, error, and the progress calls
  std::exception_ptr error;
  // Takes runs until none is left; the first error is kept and rethrown on the calling thread.
  const auto work = [&] {
    for (int i = next++; i < total; i = next++) {
      const auto k = static_cast<size_t>(i);
      try {
        ReplayConfig c = config;
        c.rate_scale = points[k].rate_scale;
        points[k].result = replay(trace, c, strategies[k / rates.size()]);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      const std::lock_guard<std::mutex> lock(mutex);
      ++done;
      if (!progress || error) continue;
      try {
        progress(done, total, points[k]);
      } catch (...) {  // from a worker thread too: rethrown on the calling one
        error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, std::min(threads, total)); ++t) pool.emplace_back(work);
  work();  // the calling thread works too
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return points;
}

std::vector<std::pair<std::string, double>> max_rate_at_slo(std::span<const SweepPoint> points,
                                                            const Slo& slo) {
  std::vector<std::pair<std::string, double>> out;
  for (const SweepPoint& p : points) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const auto& e) { return e.first == p.result.strategy; });
    if (it == out.end()) {
      out.emplace_back(p.result.strategy, 0.0);
      it = out.end() - 1;
    }
    if (slo.met_by(p.result)) it->second = std::max(it->second, p.rate_scale);
  }
  return out;
}

std::string format_sweep_table(std::span<const SweepPoint> points, const Slo& slo) {
  std::string out =
      "| rate | strategy | done | rejected | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | TPOT "
      "p50 ms | TPOT p99 ms | norm lat s/tok | preempt | util mean | SLO |\n"
      "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
      "--- |\n";
  for (const SweepPoint& p : points) {
    const ReplayResult& r = p.result;
    // Rejected: too long for max_context, or never fitting this strategy's budget; the
    // latency columns cover the done requests only.
    out += fmt::format(
        "| x{} | {} | {} | {} | {:.2f} | {:.0f} | {:.0f} | {:.0f} | {:.1f} | {:.1f} | {:.3f} | {} "
        "| "
        "{:.3f} | {} |\n",
        p.rate_scale, r.strategy, r.completed, r.rejected_too_long + r.rejected_too_large,
        r.throughput_rps, r.output_tokens_per_s, r.ttft_p50_ms, r.ttft_p99_ms, r.tpot_p50_ms,
        r.tpot_p99_ms, r.normalized_latency_s, r.preemptions, r.util_mean,
        slo.met_by(r) ? "met" : "missed");
  }
  return out;
}

std::vector<SvgPanel> sweep_panels(std::span<const SweepPoint> points, double base_rps,
                                   const std::string& title, const Slo& slo) {
  SvgPanel latency{title + ": normalized latency vs request rate",
                   "request rate (requests/s)",
                   "normalized latency (s/token)",
                   {}};
  SvgPanel throughput{title + ": throughput vs request rate",
                      "request rate (requests/s)",
                      "served (requests/s)",
                      {}};
  for (const SweepPoint& p : points) {
    auto find = [&](SvgPanel& panel) -> SvgSeries& {
      for (SvgSeries& s : panel.series) {
        if (s.label == p.result.strategy) return s;
      }
      panel.series.push_back({p.result.strategy, {}, false, true});
      return panel.series.back();
    };
    const double x = p.rate_scale * base_rps;
    find(latency).points.emplace_back(x, p.result.normalized_latency_s);
    find(throughput).points.emplace_back(x, p.result.throughput_rps);
  }
  for (SvgPanel* panel : {&latency, &throughput}) {
    for (SvgSeries& s : panel->series) std::sort(s.points.begin(), s.points.end());
  }
  if (slo.normalized_latency_s && !latency.series.empty()) {
    const double bound = *slo.normalized_latency_s;
    const auto& pts = latency.series.front().points;
    latency.series.push_back({"SLO " + fmt::format("{:g}", bound) + " s/token",
                              {{pts.front().first, bound}, {pts.back().first, bound}},
                              true,
                              false});
    latency.y_max = 5 * bound;
  }
  if (slo.describe() == "none") return {latency, throughput};
  SvgPanel bars{title + ": throughput at the SLO (" + slo.describe() + ")",
                "",
                "served at the highest rate meeting it (requests/s)",
                {}};
  for (const auto& [name, rate] : max_rate_at_slo(points, slo)) {
    double served = 0;
    for (const SweepPoint& p : points) {
      if (p.result.strategy == name && p.rate_scale == rate) served = p.result.throughput_rps;
    }
    bars.bars.emplace_back(name, served);
  }
  return {latency, throughput, bars};
}

}  // namespace pagedkv::sim
