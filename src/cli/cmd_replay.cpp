// `pagedkv replay`: replays a production request trace (Azure CSV or Mooncake JSONL) through the
// continuous-batching simulation on the real KVCacheManager, for every memory strategy side by
// side under one KV budget, and reports utilization, concurrency, preemptions, throughput and
// queueing delay (table, --json, SVG). docs/memory.md explains the output.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.hpp"
#include "cli/model_flags.hpp"
#include "cli/replay_sharing.hpp"
#include "pagedkv/error.hpp"
#include "sim/hardware_preset.hpp"
#include "sim/hybrid_layout.hpp"
#include "sim/model_preset.hpp"
#include "sim/replay.hpp"
#include "sim/report.hpp"
#include "sim/svg.hpp"
#include "sim/sweep.hpp"
#include "sim/trace.hpp"
#include "sim/units.hpp"

namespace pagedkv::cli {

namespace {

/// More than 1% of the trace rejected for its length: say so on stderr, with how long the
/// longest request is and which presets hold it, so that a wrong preset cannot pass unnoticed.
void warn_rejected(const sim::Trace& trace, const sim::ModelPreset& model, int64_t rejected,
                   int64_t max_context) {
  const auto total = static_cast<int64_t>(trace.requests.size());
  if (total == 0 || rejected * 100 <= total) return;
  int64_t longest = 0;
  for (const sim::TraceRequest& r : trace.requests) {
    longest = std::max(longest, r.prompt_tokens + r.output_tokens);
  }
  std::string fits;
  for (const sim::ModelPreset& p : sim::model_presets()) {
    if (p.max_context >= longest) fits += (fits.empty() ? "" : ", ") + p.name;
  }
  fmt::print(
      stderr,
      "pagedkv replay: warning: {} of {} requests ({:.1f}%) have prompt + output > the "
      "max context {} of {} and are rejected; the longest needs {} positions ({})\n",
      rejected, total, 100.0 * static_cast<double>(rejected) / static_cast<double>(total),
      max_context, model.name, longest,
      fits.empty() ? "no preset holds it: raise --max-context" : "presets that hold it: " + fits);
}

struct Options {
  std::string trace_path;
  ModelFlags model;  // --preset and the overrides
  std::string kv_memory = "40GiB";
  std::vector<std::string> strategies;
  double step_ms = 25.0;
  std::string hardware;  // roofline step-time model when set
  double bw_efficiency = sim::kDefaultBandwidthEfficiency;
  double flops_efficiency = sim::kDefaultFlopsEfficiency;
  double step_overhead_ms = sim::kDefaultStepOverheadMs;
  std::string preemption = "recompute";
  std::string host_link;  // default: the hardware preset's, else pcie4
  int64_t max_batch_tokens = 8192;
  int32_t max_seqs = 256;
  double watermark = 0.01;
  double rate_scale = 1.0;
  std::vector<double> rates;  // a sweep when non-empty
  std::optional<double> slo_norm_latency_s, slo_ttft_p99_ms, slo_tpot_p99_ms;
  int threads = 0;  // sweep threads; 0 = the machine's
  int64_t limit = 0;
  std::vector<int32_t> parallel_samples;  // sharing workloads (replay_sharing.hpp)
  std::vector<int32_t> beam_widths;
  uint64_t beam_seed = 1;
  std::string sharing;               // timed replay of sharing groups: parallel-N or beam-N
  std::string tier_host, tier_disk;  // tiers below the pool (sizes), none when empty
  double tier_disk_gbps = 5.0;
  std::string tier_write = "on-eviction";
  bool strict = false;
  bool json = false;
  std::string svg_path;
  bool no_progress = false;
};

/// Progress on stderr, only when stderr is a terminal (logs and pipes stay clean).
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled && isatty(STDERR_FILENO) != 0) {}
  sim::ProgressFn callback(std::string label) {
    if (!enabled_) return {};
    return [this, label = std::move(label)](int64_t done, int64_t total) {
      constexpr int kWidth = 30;
      const double f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
      const int filled = static_cast<int>(f * kWidth);
      fmt::print(stderr, "\r{:<18} [{}{}] {:5.1f}% ({}/{})", label, std::string(filled, '#'),
                 std::string(kWidth - filled, '.'), 100.0 * f, done, total);
      std::fflush(stderr);
      drawn_ = true;
    };
  }
  void clear() {
    if (drawn_) fmt::print(stderr, "\r{:80}\r", "");
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool drawn_ = false;
};

/// Sweep progress on stderr, one report per finished run: on a terminal a bar redrawn in place
/// (cleared at the end), otherwise a plain line per run (logs keep a record of the runs).
class SweepProgress {
 public:
  SweepProgress(bool enabled, std::chrono::steady_clock::time_point start)
      : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), start_(start) {}
  [[nodiscard]] bool enabled() const { return enabled_; }
  void operator()(int done, int total, const sim::SweepPoint& p) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const std::string run =
        fmt::format("{} x{} ({:.2f} s)", p.result.strategy, p.rate_scale, p.result.wall_seconds);
    if (!tty_) {
      fmt::print(stderr, "pagedkv replay: sweep {}/{} runs, {:.1f} s: {} done\n", done, total,
                 elapsed, run);
      return;
    }
    constexpr int kWidth = 30;
    const int filled = total > 0 ? done * kWidth / total : kWidth;
    fmt::print(stderr, "\rsweep [{}{}] {}/{} runs, {:.1f} s, last {}\x1b[K",
               std::string(filled, '#'), std::string(kWidth - filled, '.'), done, total, elapsed,
               run);
    std::fflush(stderr);
    drawn_ = true;
  }
  void clear() {
    if (drawn_) fmt::print(stderr, "\r\x1b[K");
    drawn_ = false;
  }

 private:
  bool enabled_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  bool drawn_ = false;
};

/// --hardware (roofline), --preemption and --host-link into the config.
void set_time_model(const Options& o, const sim::ModelPreset& model, sim::ReplayConfig& config) {
  const sim::HardwarePreset* hw = o.hardware.empty() ? nullptr : &sim::find_hardware(o.hardware);
  if (hw != nullptr) {
    config.roofline = sim::make_roofline(model, config.kv_bytes_per_token, *hw, o.bw_efficiency,
                                         o.flops_efficiency, o.step_overhead_ms);
  }
  if (o.preemption == "swap") {
    config.preemption = sim::Preemption::kSwap;
  } else if (o.preemption != "recompute") {
    throw Error(fmt::format("--preemption must be recompute or swap, got '{}'", o.preemption));
  }
  config.host_link_bytes_per_s = !o.host_link.empty() ? sim::host_link_bandwidth(o.host_link)
                                 : hw != nullptr      ? hw->host_link_bytes_per_s
                                                      : sim::host_link_bandwidth("pcie4");
}

/// --tier-host / --tier-disk / --tier-write into the config (after set_time_model: host-tier
/// loads cross the host link). Prefix strategies use them; without one they change nothing.
void set_tiers(const Options& o, sim::ReplayConfig& config) {
  if (!o.tier_host.empty()) {
    config.tiers.push_back({.name = "host",
                            .bytes = sim::parse_bytes(o.tier_host),
                            .load_bytes_per_s = config.host_link_bytes_per_s});
  }
  if (!o.tier_disk.empty()) {
    config.tiers.push_back({.name = "disk",
                            .bytes = sim::parse_bytes(o.tier_disk),
                            .load_bytes_per_s = o.tier_disk_gbps * 1e9});
  }
  config.tier_write =
      o.tier_write == "write-through" ? sim::TierWrite::kWriteThrough : sim::TierWrite::kOnEviction;
}

/// "step 25 ms (constant)" or "roofline step time on NVIDIA H200 SXM 141GB (...)".
std::string time_model_text(const Options& o, const sim::ReplayConfig& config) {
  std::string text =
      !config.roofline
          ? fmt::format("step {} ms (constant)", config.step_ms)
          : fmt::format("roofline step time on {} (bandwidth x{}, FLOP/s x{}, +{} ms per step)",
                        sim::find_hardware(o.hardware).display, o.bw_efficiency, o.flops_efficiency,
                        o.step_overhead_ms);
  if (config.preemption == sim::Preemption::kSwap) {
    text += fmt::format("; swap preemption over {:.0f} GB/s", config.host_link_bytes_per_s / 1e9);
  }
  for (const sim::ReplayTier& t : config.tiers) {
    text += fmt::format("; {} tier {} ({:.0f} GB/s loads, {})", t.name,
                        sim::format_bytes(static_cast<double>(t.bytes)), t.load_bytes_per_s / 1e9,
                        o.tier_write);
  }
  if (config.group_width > 1) {
    text += fmt::format("; every request {} {}", config.group_width,
                        config.group_mode == sim::SharingMode::kBeamSearch ? "beams" : "samples");
  }
  return text;
}

/// --rates: every (rate, strategy) run, the sweep table, the highest rate meeting the SLO per
/// strategy, and the two sweep plots.
void run_sweep(const Options& o, const sim::ModelPreset& model, const sim::ReplayConfig& config,
               const std::vector<sim::Strategy>& strategies, const sim::Trace& trace) {
  const sim::Slo slo{o.slo_norm_latency_s, o.slo_ttft_p99_ms, o.slo_tpot_p99_ms};
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const auto t0 = std::chrono::steady_clock::now();
  SweepProgress progress(!o.no_progress, t0);
  const auto points = sim::sweep(
      trace, config, strategies, o.rates, threads,
      progress.enabled() ? sim::SweepProgressFn(std::ref(progress)) : sim::SweepProgressFn());
  progress.clear();
  warn_rejected(trace, model, points.front().result.rejected_too_long, config.max_context);
  const double span_s = trace.requests.back().arrival_ms / 1000.0;
  const double base_rps = span_s > 0 ? static_cast<double>(trace.requests.size()) / span_s : 0.0;
  if (!o.svg_path.empty()) {
    const std::string title =
        fmt::format("{}, {}, {}, {}", model.display,
                    o.hardware.empty() ? fmt::format("{} ms steps", config.step_ms) : o.hardware,
                    std::filesystem::path(o.trace_path).filename().string(),
                    sim::format_bytes(static_cast<double>(config.kv_memory_bytes)));
    sim::write_text_file(o.svg_path,
                         sim::render_svg(sim::sweep_panels(points, base_rps, title, slo)));
  }
  const auto best = sim::max_rate_at_slo(points, slo);
  if (o.json) {
    nlohmann::json j;
    j["trace_rps"] = base_rps;
    j["slo"] = slo.describe();
    for (const sim::SweepPoint& p : points) {
      nlohmann::json r = sim::replay_to_json(trace, model, config, std::span(&p.result, 1), false);
      j["points"].push_back({{"rate_scale", p.rate_scale}, {"result", r["strategies"][0]}});
    }
    for (const auto& [name, rate] : best) j["max_rate_at_slo"][name] = rate;
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("model: {}; KV budget {}; {}; trace {} ({} requests, {:.2f} requests/s at rate x1)\n",
             model.display, sim::format_bytes(static_cast<double>(config.kv_memory_bytes)),
             time_model_text(o, config), trace.source, trace.requests.size(), base_rps);
  fmt::print("SLO: {}\n\n{}\n", slo.describe(), sim::format_sweep_table(points, slo));
  for (const auto& [name, rate] : best) {
    if (rate > 0) {
      fmt::print("max rate meeting the SLO: {}: x{} ({:.2f} requests/s)\n", name, rate,
                 rate * base_rps);
    } else {
      fmt::print("max rate meeting the SLO: {}: none of the swept rates\n", name);
    }
  }
  if (!o.svg_path.empty()) fmt::print("\nplot: {}\n", o.svg_path);
}

/// One line per hybrid strategy: its KV cache groups, padding and pages.
void print_hybrid_layouts(const std::vector<sim::ReplayResult>& results,
                          const sim::ModelPreset& model) {
  for (const sim::ReplayResult& r : results) {
    if (r.layers_per_group == 0) continue;
    fmt::print(
        "{}: {} KV cache groups of {} layers ({} padded layer slots, {:.1f}% of {}), pages of {} "
        "tokens x {} layers = {}, {} pages\n",
        r.strategy, r.kv_groups, r.layers_per_group, r.padded_layers,
        100.0 * r.padded_layers / model.num_layers, model.num_layers, r.block_size,
        r.layers_per_group,
        sim::format_bytes(static_cast<double>(sim::hybrid_layout(model, r.block_size).page_bytes)),
        r.num_blocks);
  }
}

/// --strategies, or the defaults: hybrid-16 joins them for a model with local layers when the
/// options allow it (sim::validate(config, strategy)), else a notice says it was left out.
std::vector<sim::Strategy> strategies_for(const Options& o, const sim::ModelPreset& model,
                                          const sim::ReplayConfig& config) {
  std::vector<sim::Strategy> strategies;
  if (o.strategies.empty()) {
    strategies = sim::default_strategies();
    // The hybrid allocation is only a different strategy when some layers are local, and it
    // runs recompute preemption without sharing groups only (sim::validate(config, strategy)).
    if (model.num_local_layers > 0) {
      if (config.preemption == sim::Preemption::kRecompute && config.group_width == 1) {
        strategies.push_back({sim::StrategyKind::kHybrid, 16});
      } else {
        fmt::print(stderr,
                   "pagedkv replay: notice: hybrid-16 left out of the default strategies: it "
                   "runs recompute preemption without --sharing only\n");
      }
    }
  } else {
    for (const std::string& s : o.strategies) strategies.push_back(sim::parse_strategy(s));
  }
  return strategies;
}

void run_replay(const Options& o) {
  const sim::ModelPreset model = resolve_model(o.model);

  sim::ReplayConfig config;
  config.kv_memory_bytes = sim::parse_bytes(o.kv_memory);
  config.kv_bytes_per_token = sim::kv_bytes_per_token(model);
  config.model = model;
  config.max_context = model.max_context;
  config.step_ms = o.step_ms;
  config.max_batch_tokens = o.max_batch_tokens;
  config.max_seqs = o.max_seqs;
  config.watermark = o.watermark;
  config.rate_scale = o.rate_scale;
  set_time_model(o, model, config);
  set_tiers(o, config);
  if (!o.sharing.empty()) apply_sharing(o.sharing, config);
  config.beam_seed = o.beam_seed;
  sim::validate(config);

  const std::vector<sim::Strategy> strategies = strategies_for(o, model, config);
  // Before any run: a strategy the options do not support fails now, not after the others ran.
  for (const sim::Strategy& s : strategies) sim::validate(config, s);

  sim::Trace trace = sim::read_trace(o.trace_path, {.strict = o.strict});
  for (const std::string& w : trace.warnings)
    fmt::print(stderr, "pagedkv replay: warning: {}\n", w);
  for (const sim::TraceProblem& p : trace.problems) {
    fmt::print(stderr, "pagedkv replay: skipped {}\n", p.message);
  }
  if (trace.rows_skipped > static_cast<int64_t>(trace.problems.size())) {
    fmt::print(stderr, "pagedkv replay: ... and {} more skipped rows\n",
               trace.rows_skipped - static_cast<int64_t>(trace.problems.size()));
  }
  if (o.limit > 0 && static_cast<int64_t>(trace.requests.size()) > o.limit) {
    trace.requests.resize(static_cast<size_t>(o.limit));
  }
  if (trace.requests.empty()) {
    throw Error(fmt::format("trace '{}' has no valid request ({} rows read, {} skipped)",
                            o.trace_path, trace.rows_read, trace.rows_skipped));
  }

  if (!o.parallel_samples.empty() || !o.beam_widths.empty()) {
    // The block size of the first paged strategy given, else vLLM's default 16.
    int32_t block_size = 16;
    if (!o.strategies.empty()) {
      for (const sim::Strategy& s : strategies) {
        if (s.block_size >= 1) {
          block_size = s.block_size;
          break;
        }
      }
    }
    run_sharing(trace, o.parallel_samples, o.beam_widths, block_size, o.beam_seed, o.json);
    return;
  }
  if (!o.rates.empty()) {
    run_sweep(o, model, config, strategies, trace);
    return;
  }
  ProgressBar bar(!o.no_progress && !o.json);
  std::vector<sim::ReplayResult> results;
  for (const sim::Strategy& s : strategies) {
    results.push_back(sim::replay(trace, config, s, bar.callback(s.name())));
    bar.clear();
  }

  if (!o.svg_path.empty()) {
    const std::string title = fmt::format(
        "{}, {}, {}", model.display, std::filesystem::path(o.trace_path).filename().string(),
        sim::format_bytes(static_cast<double>(config.kv_memory_bytes)));
    sim::write_text_file(o.svg_path, sim::render_svg(sim::replay_panels(results, title)));
  }
  if (o.json) {
    fmt::print("{}\n", sim::replay_to_json(trace, model, config, results, true).dump(2));
    return;
  }
  fmt::print(
      "model: {} ({} layers, {} kv heads, head_dim {}, {}): {} per token (2 x L x H_kv x "
      "D x bytes; Kwon et al., SOSP 2023)\n",
      model.display, model.num_layers, model.num_kv_heads, model.head_dim, dtype_name(model.dtype),
      sim::format_bytes(static_cast<double>(config.kv_bytes_per_token)));
  fmt::print(
      "KV budget: {} = {} token positions; max context {} tokens; {}, {} tokens/"
      "step, {} seqs max, watermark {}{}\n",
      sim::format_bytes(static_cast<double>(config.kv_memory_bytes)),
      config.kv_memory_bytes / config.kv_bytes_per_token, config.max_context,
      time_model_text(o, config), config.max_batch_tokens, config.max_seqs, config.watermark,
      config.rate_scale == 1.0
          ? std::string()
          : fmt::format("; request rate x{} (--rate-scale)", config.rate_scale));
  print_hybrid_layouts(results, model);
  fmt::print("{}\n", sim::format_trace_summary(trace));
  if (o.limit > 0 && trace.requests.size() == static_cast<size_t>(o.limit)) {
    fmt::print("replaying the first {} requests (--limit)\n", o.limit);
  }
  if (!results.empty()) {
    const sim::ReplayResult& r0 = results.front();
    warn_rejected(trace, model, r0.rejected_too_long, config.max_context);
    if (r0.rejected_too_long > 0) {
      fmt::print(
          "{} requests have prompt + output > max context {} and are rejected by every "
          "strategy\n",
          r0.rejected_too_long, config.max_context);
    }
  }
  fmt::print("\n{}", sim::format_replay_table(results));
  if (const std::string tiers = sim::format_tier_table(results); !tiers.empty()) {
    fmt::print("\nprompt tokens found per tier (prefix strategies):\n\n{}", tiers);
  }
  if (!o.svg_path.empty()) fmt::print("\nplot: {}\n", o.svg_path);
}

/// --tier-host, --tier-disk, --tier-disk-gbps, --tier-write (set_tiers reads them).
void add_tier_flags(CLI::App& sub, Options& o) {
  sub.add_option("--tier-host", o.tier_host,
                 "prefix strategies: a host-memory tier below the pool of this size (e.g. "
                 "64GiB); evicted cached blocks go there and are loaded back over the host link "
                 "instead of prefilled (docs/tiers.md)");
  sub.add_option("--tier-disk", o.tier_disk,
                 "prefix strategies: a local-disk tier of this size (e.g. 1TiB), after the "
                 "host tier");
  sub.add_option("--tier-disk-gbps", o.tier_disk_gbps, "disk tier read bandwidth, GB/s")
      ->capture_default_str()
      ->check(CLI::Range(1e-3, 1e4));
  sub.add_option("--tier-write", o.tier_write,
                 "when cached blocks go down to the tiers: on-eviction or write-through")
      ->capture_default_str()
      ->check(CLI::IsMember({"on-eviction", "write-through"}));
}

}  // namespace

void add_replay_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "replay",
      "Replay a request trace (Azure LLM inference CSV or Mooncake JSONL) through a "
      "continuous-batching scheduler simulation on the block manager, comparing contiguous "
      "reservation with paging (and prefix caching) under one KV memory budget.");
  sub->add_option("--trace", opts->trace_path,
                  "trace file: .csv (TIMESTAMP,ContextTokens,GeneratedTokens) or .jsonl "
                  "(timestamp, input_length, output_length, hash_ids)")
      ->required();
  add_model_flags(
      *sub, opts->model,
      {.formula_symbols = false,
       .max_context = "override: max positions per request (contiguous-max reserves this many)"});
  sub->add_option("--kv-memory", opts->kv_memory, "KV cache budget, e.g. 40GiB, 80GB, 512MiB")
      ->capture_default_str();
  sub->add_option("--strategies", opts->strategies,
                  "comma-separated subset of contiguous-max, contiguous-exact, paged-<bs>, "
                  "prefix-<bs>, hybrid-<bs> (default: contiguous-max, contiguous-exact, "
                  "paged-1/8/16/32/128, prefix-16, and hybrid-16 for a model with local layers)")
      ->delimiter(',');
  CLI::Option* step = sub->add_option("--step-ms", opts->step_ms,
                                      "constant step-time model: every scheduler step lasts MS")
                          ->capture_default_str()
                          ->check(CLI::Range(1e-3, 1e6));
  sub->add_option("--hardware", opts->hardware,
                  "roofline step-time model on this GPU (" + sim::hardware_names() +
                      "): each step lasts max(bytes / bandwidth, FLOPs / FLOP/s) + overhead")
      ->excludes(step);
  sub->add_option("--bw-efficiency", opts->bw_efficiency,
                  "roofline: fraction of peak HBM bandwidth reached")
      ->capture_default_str()
      ->check(CLI::Range(1e-3, 1.0));
  sub->add_option("--flops-efficiency", opts->flops_efficiency,
                  "roofline: fraction of peak FLOP/s reached")
      ->capture_default_str()
      ->check(CLI::Range(1e-3, 1.0));
  sub->add_option("--step-overhead-ms", opts->step_overhead_ms, "roofline: fixed cost per step, ms")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--preemption", opts->preemption,
                  "what a decode short of memory does to its victim: recompute or swap")
      ->capture_default_str()
      ->check(CLI::IsMember({"recompute", "swap"}));
  sub->add_option("--host-link", opts->host_link,
                  "swap bandwidth: pcie4 (25 GB/s) or pcie5 (50 GB/s); default the "
                  "--hardware preset's, else pcie4")
      ->check(CLI::IsMember({"pcie4", "pcie5"}));
  add_tier_flags(*sub, *opts);
  sub->add_option("--max-batch-tokens", opts->max_batch_tokens,
                  "tokens (prefill chunks + decodes) per step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  sub->add_option("--max-seqs", opts->max_seqs, "running requests at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--watermark", opts->watermark, "fraction of blocks paged admission keeps free")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  sub->add_option("--rate-scale", opts->rate_scale,
                  "request-rate multiplier: arrival times are divided by it (2 = twice the "
                  "trace's rate)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber & CLI::Range(1e-6, 1e6));
  CLI::Option* rates =
      sub->add_option("--rates", opts->rates,
                      "sweep: replay at each of these rate multipliers (e.g. 0.5,1,2,4) per "
                      "strategy, in parallel, and report latency, throughput and the highest rate "
                      "meeting the SLO")
          ->delimiter(',')
          ->check(CLI::PositiveNumber & CLI::Range(1e-6, 1e6));
  sub->add_option("--slo-norm-latency", opts->slo_norm_latency_s,
                  "sweep SLO: mean normalized latency (end-to-end / output tokens) <= S s/token")
      ->check(CLI::PositiveNumber);
  sub->add_option("--slo-ttft-p99-ms", opts->slo_ttft_p99_ms, "sweep SLO: TTFT p99 <= MS")
      ->check(CLI::PositiveNumber);
  sub->add_option("--slo-tpot-p99-ms", opts->slo_tpot_p99_ms, "sweep SLO: TPOT p99 <= MS")
      ->check(CLI::PositiveNumber);
  sub->add_option("--threads", opts->threads, "sweep threads (0 = one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  CLI::Option* samples =
      sub->add_option(
             "--parallel-samples", opts->parallel_samples,
             "sharing: n samples per prompt with copy-on-write forks (e.g. 2,4,6); reports "
             "the memory saved vs n independent copies instead of replaying")
          ->delimiter(',')
          ->check(CLI::Range(1, 64));
  CLI::Option* beams =
      sub->add_option("--beam-width", opts->beam_widths,
                      "sharing: beam search of width W per prompt (e.g. 2,4,6), W of the W x W "
                      "candidates surviving each step at random; reports the memory saved")
          ->delimiter(',')
          ->check(CLI::Range(1, 64));
  CLI::Option* group = sub->add_option(
      "--sharing", opts->sharing,
      "timed replay (and sweeps) with every request a group: parallel-N samples or beam-N "
      "beams, forked copy-on-write by paged strategies, N independent copies reserved by "
      "contiguous ones");
  sub->add_option("--beam-seed", opts->beam_seed, "sharing: seed of the beam survivor choice")
      ->check(uint64_digits())
      ->capture_default_str();
  sub->add_option("--limit", opts->limit, "replay only the first N requests (0 = all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--strict", opts->strict,
                "fail (exit 2) on the first bad row or unknown column instead of skipping it");
  sub->add_flag("--json", opts->json, "print one JSON object (with time series) instead of text");
  CLI::Option* svg = sub->add_option(
      "--svg", opts->svg_path, "write utilization and concurrency over time to this SVG file");
  // The sharing workloads run instead of the timed replay: a sweep or a plot would be ignored.
  for (CLI::Option* o : {samples, beams}) o->excludes(rates)->excludes(svg)->excludes(group);
  sub->add_flag("--no-progress", opts->no_progress, "no progress bar on stderr");
  sub->callback([opts] { run_replay(*opts); });
}

}  // namespace pagedkv::cli
