#pragma once
/// @file sweep.hpp
/// Request-rate sweeps: one replay per (rate, strategy), run in parallel, with the highest rate
/// per strategy that meets a latency target -- the experiment behind the vLLM paper's
/// throughput figures (Kwon et al., SOSP 2023, sec. 6.2: normalized latency vs request rate).

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sim/replay.hpp"
#include "sim/strategy.hpp"
#include "sim/svg.hpp"
#include "sim/trace.hpp"

namespace pagedkv::sim {

/// A latency target; unset fields are not checked. A run meets it when every set bound holds.
struct Slo {
  std::optional<double> normalized_latency_s;  ///< mean end-to-end / output tokens, s per token
  std::optional<double> ttft_p99_ms;
  std::optional<double> tpot_p99_ms;
  /// True when `r` meets every set bound (and completed at least one request).
  [[nodiscard]] bool met_by(const ReplayResult& r) const;
  /// "normalized latency <= 0.1 s/token, TTFT p99 <= 2000 ms", or "none".
  [[nodiscard]] std::string describe() const;
};

/// One point of a sweep.
struct SweepPoint {
  double rate_scale = 1;
  ReplayResult result;
};

/// Called once per finished run of a sweep: (runs finished so far, 1..total, runs in all, the
/// run's point: its rate and result, wall_seconds included). Called from the thread that ran
/// it, one call at a time (the sweep serializes them), `done` counting up by one per call.
using SweepProgressFn = std::function<void(int done, int total, const SweepPoint& finished)>;

/// Replays `trace` for every rate in `rates` (config.rate_scale replaced) and every strategy,
/// on up to `threads` threads (each run is independent and deterministic, so the result does
/// not depend on the thread count). Returns points in (strategy, rate) order: strategy-major,
/// rates as given. `progress` is called after each run (SweepProgressFn).
/// Errors: throws pagedkv::Error if rates is empty or holds a rate that is not > 0 and finite
/// (naming it), or as replay() does.
[[nodiscard]] std::vector<SweepPoint> sweep(const Trace& trace, const ReplayConfig& config,
                                            std::span<const Strategy> strategies,
                                            std::span<const double> rates, int threads,
                                            const SweepProgressFn& progress = {});

/// Per strategy, the highest swept rate whose run meets `slo` (0 when none does), in the order
/// of the strategies' first appearance in `points`.
[[nodiscard]] std::vector<std::pair<std::string, double>> max_rate_at_slo(
    std::span<const SweepPoint> points, const Slo& slo);

/// The sweep as a markdown table: rate, strategy, req/s, output tok/s, TTFT p50/p99, TPOT
/// p50/p99, normalized latency, preemptions, util mean, and whether the SLO is met.
[[nodiscard]] std::string format_sweep_table(std::span<const SweepPoint> points, const Slo& slo);

/// Normalized latency vs request rate (one line per strategy, as the paper plots it, x in
/// requests/s = rate multiple x `base_rps`, the trace's own rate) and throughput vs rate; when
/// `slo` sets any bound, a third panel of bars: per strategy, the throughput served (requests/s)
/// at its highest rate meeting the SLO (0 when none does). With a normalized-latency bound the
/// first panel draws it as a dashed line and stops its y axis at 5x the bound (the curves shoot
/// up past saturation).
[[nodiscard]] std::vector<SvgPanel> sweep_panels(std::span<const SweepPoint> points,
                                                 double base_rps, const std::string& title,
                                                 const Slo& slo = {});

}  // namespace pagedkv::sim
