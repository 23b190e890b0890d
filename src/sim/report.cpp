#include "sim/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "sim/units.hpp"

namespace pagedkv::sim {

std::string format_trace_summary(const Trace& t) {
  double prompt = 0, output = 0;
  for (const TraceRequest& r : t.requests) {
    prompt += static_cast<double>(r.prompt_tokens);
    output += static_cast<double>(r.output_tokens);
  }
  const double n = static_cast<double>(std::max<size_t>(t.requests.size(), 1));
  const double span_s = t.requests.empty() ? 0.0 : t.requests.back().arrival_ms / 1000.0;
  std::string out = fmt::format(
      "trace {} ({}): {} rows read, {} requests, {} skipped; span {:.1f} s; mean prompt {:.1f}, "
      "mean output {:.1f} tokens",
      t.source, trace_format_name(t.format), t.rows_read, t.requests.size(), t.rows_skipped, span_s,
      prompt / n, output / n);
  if (!t.skipped_by_reason.empty()) {
    out += " (skipped:";
    bool first = true;
    for (const auto& [reason, count] : t.skipped_by_reason) {
      out += fmt::format("{} {} {}", first ? "" : ",", count, reason);
      first = false;
    }
    out += ")";
  }
  return out;
}

std::string format_replay_table(std::span<const ReplayResult> results) {
  std::string out =
      "| strategy | util mean | util p5 | need util | frag | peak conc | mean conc | preempt | "
      "tok/step | "
      "gen/step | queue mean | queue p99 | prefix hit | done | rejected | steps | wall s | "
      "TTFT p50 ms | TPOT p50 ms | norm lat s/tok | req/s |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
      "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const ReplayResult& r : results) {
    out += fmt::format(
        "| {} | {:.3f} | {:.3f} | {} | {:.3f} | {} | {:.1f} | {} | {:.1f} | {:.2f} | {:.1f} | "
        "{:.0f} | "
        "{:.3f} | {} | {} | {} | {:.2f} | {:.0f} | {:.1f} | {:.3f} | {:.2f} |\n",
        r.strategy, r.util_mean, r.util_p5,
        r.need_util_mean < 0 ? std::string("n/a") : fmt::format("{:.3f}", r.need_util_mean),
        r.frag_mean, r.peak_concurrency, r.mean_concurrency, r.preemptions, r.tokens_per_step,
        r.generated_per_step, r.queue_mean_steps, r.queue_p99_steps, r.prefix_hit_rate, r.completed,
        r.rejected_too_long + r.rejected_too_large, r.steps, r.wall_seconds, r.ttft_p50_ms,
        r.tpot_p50_ms, r.normalized_latency_s, r.throughput_rps);
  }
  return out;
}

std::string format_tier_table(std::span<const ReplayResult> results) {
  std::string out;
  for (const ReplayResult& r : results) {
    if (r.tiers.empty()) continue;
    if (out.empty()) {
      out =
          "| strategy | tier | capacity blocks | hit tokens | share of looked-up tokens | stored "
          "blocks | evicted blocks | load s |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
    }
    const double looked_up = static_cast<double>(std::max<int64_t>(r.prefix_query_tokens, 1));
    int64_t saved = r.prefix_hit_tokens;
    out += fmt::format("| {} | pool | {} | {} | {:.3f} | | {} | |\n", r.strategy, r.num_blocks,
                       r.prefix_hit_tokens, static_cast<double>(r.prefix_hit_tokens) / looked_up,
                       r.prefix_evictions);
    for (const ReplayTierResult& t : r.tiers) {
      saved += t.hit_tokens;
      out += fmt::format("| {} | {} | {} | {} | {:.3f} | {} | {} | {:.2f} |\n", r.strategy, t.name,
                         t.capacity_blocks, t.hit_tokens,
                         static_cast<double>(t.hit_tokens) / looked_up, t.stored_blocks,
                         t.evicted_blocks, t.load_seconds);
    }
    out += fmt::format("| {} | all | | {} | {:.3f} | | | |\n", r.strategy, saved,
                       static_cast<double>(saved) / looked_up);
  }
  return out;
}

namespace {

/// ReplayConfig::tiers as JSON.
nlohmann::json tiers_json(const std::vector<ReplayTier>& tiers) {
  nlohmann::json out = nlohmann::json::array();
  for (const ReplayTier& t : tiers) {
    out.push_back({{"name", t.name}, {"bytes", t.bytes}, {"load_bytes_per_s", t.load_bytes_per_s}});
  }
  return out;
}

/// ReplayResult::tiers as JSON.
nlohmann::json tiers_json(const std::vector<ReplayTierResult>& tiers) {
  nlohmann::json out = nlohmann::json::array();
  for (const ReplayTierResult& t : tiers) {
    out.push_back({{"name", t.name},
                   {"capacity_blocks", t.capacity_blocks},
                   {"stored_blocks", t.stored_blocks},
                   {"evicted_blocks", t.evicted_blocks},
                   {"hit_blocks", t.hit_blocks},
                   {"hit_tokens", t.hit_tokens},
                   {"load_seconds", t.load_seconds}});
  }
  return out;
}

}  // namespace

nlohmann::json replay_to_json(const Trace& trace, const ModelPreset& model,
                              const ReplayConfig& config, std::span<const ReplayResult> results,
                              bool with_series) {
  using nlohmann::json;
  json j;
  j["model"] = {{"name", model.name},
                {"layers", model.num_layers},
                {"kv_heads", model.num_kv_heads},
                {"head_dim", model.head_dim},
                {"dtype", std::string(dtype_name(model.dtype))},
                {"local_layers", model.num_local_layers},
                {"sliding_window", model.sliding_window},
                {"attention_chunk", model.attention_chunk},
                {"max_context", config.max_context},
                {"kv_bytes_per_token", config.kv_bytes_per_token}};
  j["config"] = {
      {"kv_memory_bytes", config.kv_memory_bytes},
      {"step_ms", config.step_ms},
      {"max_batch_tokens", config.max_batch_tokens},
      {"max_seqs", config.max_seqs},
      {"watermark", config.watermark},
      {"rate_scale", config.rate_scale},
      {"step_model", config.roofline ? "roofline" : "constant"},
      {"preemption", config.preemption == Preemption::kSwap ? "swap" : "recompute"},
      {"host_link_bytes_per_s", config.host_link_bytes_per_s},
      {"group_width", config.group_width},
      {"group_mode", config.group_mode == SharingMode::kBeamSearch ? "beam" : "parallel"}};
  if (!config.tiers.empty()) {
    j["config"]["tiers"] = tiers_json(config.tiers);
    j["config"]["tier_write"] =
        config.tier_write == TierWrite::kWriteThrough ? "write-through" : "on-eviction";
  }
  if (config.roofline) {
    const RooflineModel& m = *config.roofline;
    j["config"]["roofline"] = {{"weight_bytes", m.weight_bytes},
                               {"bandwidth_bytes_per_s", m.bandwidth_bytes_per_s},
                               {"flops_per_s", m.flops_per_s},
                               {"bandwidth_efficiency", m.bandwidth_efficiency},
                               {"flops_efficiency", m.flops_efficiency},
                               {"overhead_ms", m.overhead_ms}};
  }
  json problems = json::array();
  for (const TraceProblem& p : trace.problems) problems.push_back(p.message);
  j["trace"] = {{"source", trace.source},
                {"format", std::string(trace_format_name(trace.format))},
                {"rows_read", trace.rows_read},
                {"requests", trace.requests.size()},
                {"rows_skipped", trace.rows_skipped},
                {"skipped_by_reason", trace.skipped_by_reason},
                {"problems", problems},
                {"warnings", trace.warnings}};
  json strategies = json::array();
  for (const ReplayResult& r : results) {
    json s = {
        {"strategy", r.strategy},
        {"block_size", r.block_size},
        {"capacity_tokens", r.capacity_tokens},
        {"num_blocks", r.num_blocks},
        {"requests", r.requests},
        {"completed", r.completed},
        {"rejected_too_long", r.rejected_too_long},
        {"rejected_too_large", r.rejected_too_large},
        {"utilization_mean", r.util_mean},
        {"utilization_p5", r.util_p5},
        {"need_utilization_mean", r.need_util_mean < 0 ? json(nullptr) : json(r.need_util_mean)},
        {"layers_per_group", r.layers_per_group},
        {"kv_groups", r.kv_groups},
        {"padded_layers", r.padded_layers},
        {"fragmentation_mean", r.frag_mean},
        {"waste_mean_bytes", r.waste_mean_bytes},
        {"reserved_mean_bytes", r.reserved_mean_bytes},
        {"peak_concurrency", r.peak_concurrency},
        {"mean_concurrency", r.mean_concurrency},
        {"preemptions", r.preemptions},
        {"recomputed_tokens", r.recomputed_tokens},
        {"swapped_tokens", r.swapped_tokens},
        {"swap_seconds", r.swap_seconds},
        {"steps", r.steps},
        {"mean_step_ms", r.mean_step_ms},
        {"processed_tokens", r.processed_tokens},
        {"generated_tokens", r.generated_tokens},
        {"tokens_per_step", r.tokens_per_step},
        {"generated_per_step", r.generated_per_step},
        {"queue_mean_steps", r.queue_mean_steps},
        {"queue_p99_steps", r.queue_p99_steps},
        {"prompt_tokens", r.prompt_tokens},
        {"prefix_query_tokens", r.prefix_query_tokens},
        {"prefix_hit_tokens", r.prefix_hit_tokens},
        {"prefix_evictions", r.prefix_evictions},
        {"prefix_hit_rate", r.prefix_hit_rate},
        {"ttft_p50_ms", r.ttft_p50_ms},
        {"ttft_p99_ms", r.ttft_p99_ms},
        {"tpot_p50_ms", r.tpot_p50_ms},
        {"tpot_p99_ms", r.tpot_p99_ms},
        {"normalized_latency_s", r.normalized_latency_s},
        {"throughput_rps", r.throughput_rps},
        {"output_tokens_per_s", r.output_tokens_per_s},
        {"wall_seconds", r.wall_seconds}};
    if (!r.tiers.empty()) s["tiers"] = tiers_json(r.tiers);
    if (with_series) {
      json series = json::array();
      for (const SeriesPoint& p : r.series) {
        series.push_back({{"time_s", p.time_s},
                          {"utilization", p.utilization < 0 ? json(nullptr) : json(p.utilization)},
                          {"concurrency", p.concurrency},
                          {"waiting", p.waiting},
                          {"reserved_fraction", p.reserved_fraction}});
      }
      s["series"] = std::move(series);
    }
    strategies.push_back(std::move(s));
  }
  j["strategies"] = std::move(strategies);
  return j;
}

std::vector<SvgPanel> replay_panels(std::span<const ReplayResult> results,
                                    const std::string& title) {
  SvgPanel util{title + ": KV utilization (live / reserved)",
                "simulated time (s)",
                "utilization",
                {},
                true,
                1.0};
  SvgPanel conc{
      title + ": running requests", "simulated time (s)", "concurrent requests", {}, true, 0.0};
  SvgPanel wait{
      title + ": waiting requests", "simulated time (s)", "queued requests", {}, true, 0.0};
  for (const ReplayResult& r : results) {
    SvgSeries u{r.strategy, {}, r.block_size == 0, false};
    SvgSeries c{r.strategy, {}, r.block_size == 0, false};
    SvgSeries w{r.strategy, {}, r.block_size == 0, false};
    for (const SeriesPoint& p : r.series) {
      u.points.emplace_back(
          p.time_s, p.utilization < 0 ? std::numeric_limits<double>::quiet_NaN() : p.utilization);
      c.points.emplace_back(p.time_s, p.concurrency);
      w.points.emplace_back(p.time_s, p.waiting);
    }
    util.series.push_back(std::move(u));
    conc.series.push_back(std::move(c));
    wait.series.push_back(std::move(w));
  }
  return {util, conc, wait};
}

}  // namespace pagedkv::sim
