#pragma once
/// @file report.hpp
/// Text, JSON and plot renderings of traces and replay results, shared by `pagedkv replay`, the
/// benchmark and docs/memory.md (the tables are Markdown, pasted there as printed).

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "sim/model_preset.hpp"
#include "sim/replay.hpp"
#include "sim/svg.hpp"
#include "sim/trace.hpp"

namespace pagedkv::sim {

/// One paragraph: source, format, rows read / accepted / skipped (by reason), span, token means.
[[nodiscard]] std::string format_trace_summary(const Trace& trace);

/// Markdown table, one row per strategy: utilization mean and p5, need utilization (n/a where
/// undefined, ReplayResult::need_util_mean), fragmentation, peak and mean
/// concurrency, preemptions, tokens and generated tokens per step, queueing delay mean and
/// p99 (steps), prefix hit rate, completed and rejected requests, simulated steps, wall time.
[[nodiscard]] std::string format_replay_table(std::span<const ReplayResult> results);

/// Markdown table of where prompt tokens were found, for the results that ran with tiers
/// (ReplayConfig::tiers): per strategy a pool row (prefix hits), one row per tier (capacity,
/// hit tokens, their share of the prompt tokens looked up, blocks stored and evicted, load
/// time in s) and an "all" row (prefill tokens saved). Empty when no result has tiers.
[[nodiscard]] std::string format_tier_table(std::span<const ReplayResult> results);

/// Everything about a run as JSON: model, config, trace summary, one object per strategy (every
/// ReplayResult field; the time series only when with_series).
[[nodiscard]] nlohmann::json replay_to_json(const Trace& trace, const ModelPreset& model,
                                            const ReplayConfig& config,
                                            std::span<const ReplayResult> results,
                                            bool with_series);

/// Three panels over simulated time, one line per strategy (contiguous ones dashed): KV
/// utilization (live / reserved; gaps where nothing is reserved), running requests, waiting
/// requests.
[[nodiscard]] std::vector<SvgPanel> replay_panels(std::span<const ReplayResult> results,
                                                  const std::string& title);

}  // namespace pagedkv::sim
