// `pagedkv generate`: the main job. Runs a Llama model (by default the real stories260K from
// models/, or a llama2.c checkpoint + tokenizer, or seeded random weights of a chosen shape)
// with the paged cache, the contiguous reference cache and no cache, checks that they agree and
// reports time and memory per mode. With --device cuda the paged mode runs on the GPU (the
// contiguous and none modes stay on the CPU as its checks). docs/cli.md documents the flags and
// the output.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.hpp"
#include "cli/generate_layers.hpp"
#include "cli/generate_model.hpp"
#include "cli/generate_tiers.hpp"
#include "model/generate.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cli {

namespace {

using model::CacheMode;
using model::Device;

/// Logits are kept for the agreement check while they fit in this many bytes per mode.
constexpr int64_t kMaxLogitBytes = int64_t{256} << 20;
/// Largest |logit difference| between two caches fed identical tokens that still counts as
/// agreement. fp32 with different summation orders differs by ~1e-6 relative; a real cache bug
/// (a wrong slot, a stale block) moves logits by far more than this.
constexpr double kLogitTolerance = 1e-3;

struct Options {
  ModelChoice model;  ///< --model, --tokenizer and the random model's shape flags
  std::string prompt = "Once upon a time";
  std::string prompts_path;
  int32_t steps = 256;
  float temperature = 0.0f;
  uint64_t seed = 42;
  std::string cache = "all";
  std::string device = "cpu";
  int32_t block_size = 16;
  std::string kv_dtype = "fp32";
  float kv_scale_headroom = 1.0f;
  bool kv_nmse = false;
  bool json = false;
  TierFlags tiers;    ///< --prefix-caching, --tier-*, --kv-events*
  LayerFlags layers;  ///< --layer-pattern, --window, --sinks, --chunk
};

std::string human_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

struct ModeRun {
  CacheMode mode;
  model::GenerateResult result;
};

/// A run's name in the output: the cache mode, "-cuda" appended when it ran on the device.
std::string run_label(const ModeRun& r) {
  std::string s(model::cache_mode_name(r.mode));
  const Device device = r.result.stats.device;
  if (device != Device::kCpu) s += fmt::format("-{}", model::device_name(device));
  return s;
}

struct Check {
  std::string label;  ///< run_label of the run compared against runs[0]
  model::Agreement agreement;
  /// Tokens and logits agree, or tokens differ only after logits that agree within the
  /// tolerance (a near-tie that a different summation order may break the other way).
  bool ok;
};

void print_human(const Options& o, const std::string& model_desc, const std::string& device_desc,
                 int32_t steps, const std::vector<std::string>& prompts,
                 const model::Tokenizer& tok, const std::vector<ModeRun>& runs,
                 const std::vector<Check>& checks) {
  const std::string first = run_label(runs.front());
  fmt::print("model: {}\n", model_desc);
  fmt::print(
      "run:   {} prompt{}, {} positions per sequence (prompt included), {}, block size "
      "{}, {} paged KV{}\n\n",
      prompts.size(), prompts.size() == 1 ? "" : "s", steps,
      o.temperature == 0.0f ? std::string("greedy (temperature 0)")
                            : fmt::format("temperature {} seed {}", o.temperature, o.seed),
      o.block_size, dtype_name(parse_dtype(o.kv_dtype)),
      device_desc.empty() ? "" : fmt::format("; paged cache on {}", device_desc));

  const auto& seqs = runs.front().result.seqs;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    if (seqs.size() > 1) {
      fmt::print("--- sequence {}: {} prompt tokens, {} generated{}\n", i, s.prompt_ids.size(),
                 s.num_generated, s.stopped_on_bos ? ", stopped on BOS" : "");
    }
    const std::string text = tok.render(s.ids);
    std::fwrite(text.data(), 1, text.size(), stdout);
    fmt::print("\n");
  }
  if (runs.size() > 1) fmt::print("(text of the {} run)\n", first);
  fmt::print("\n");

  fmt::print("{:<11}{:>9}{:>10}{:>9}{:>9}{:>11}{:>10}{:>12}{:>14}{:>8}\n", "cache", "TTFT ms",
             "TPOT mean", "p50", "p99", "total ms", "tokens/s", "KV in use", "max-len resv",
             "wasted");
  for (const auto& r : runs) {
    const auto& st = r.result.stats;
    const auto tpot = model::summarize(st.tpot_ms);
    fmt::print("{:<11}{:>9.2f}{:>10.3f}{:>9.3f}{:>9.3f}{:>11.1f}{:>10.1f}{:>12}{:>14}{:>7.1f}%\n",
               run_label(r), st.ttft_ms, tpot.mean, tpot.p50, tpot.p99, st.total_ms,
               st.tokens_per_s(), human_bytes(st.kv_bytes_in_use),
               human_bytes(st.contiguous_reservation_bytes), 100.0 * st.wasted_share());
  }
  fmt::print(
      "(TPOT ms per decode step: one token for every unfinished sequence. KV in use: what "
      "the cache holds at the end; none keeps nothing between steps. max-len resv: a "
      "contiguous cache reserving seq_len positions per sequence; wasted: its share not "
      "holding a token.)\n");

  const bool measured = parse_dtype(o.kv_dtype) != DType::kF32;
  for (const auto& c : checks) {
    const auto& g = c.agreement;
    const std::string diff =
        g.max_abs_logit_diff < 0
            ? std::string("logits not compared")
            : fmt::format("max |logit diff| {:.3g} (mean {:.3g}) over {} positions",
                          g.max_abs_logit_diff, g.mean_abs_logit_diff, g.positions_compared);
    if (!g.same_lengths) {
      fmt::print(
          "agreement: {} vs {}: lengths DIFFER (sequence {}) with no token to explain it, {}\n",
          c.label, first, g.length_seq, diff);
    } else if (g.same_tokens) {
      fmt::print("agreement: {} vs {}: same tokens, {}\n", c.label, first, diff);
    } else {
      fmt::print("agreement: {} vs {}: tokens DIFFER (sequence {}, token {}), {}{}\n", c.label,
                 first, g.diverge_seq, g.diverge_index, diff,
                 c.ok && measured ? ""
                 : c.ok           ? " (within tolerance before the split: a near-tie)"
                                  : "");
    }
  }
  if (o.kv_nmse) {
    fmt::print(
        "KV storage error, teacher-forced on this run's K/V (attention outputs of a shadow paged "
        "cache per dtype vs the fp32 paged cache, all layers and steps):\n");
    for (const auto& e : runs.front().result.shadow_errors) {
      fmt::print("  {:<9} NMSE {:.3g}  max |error| {:.3g}  over {} outputs\n", dtype_name(e.dtype),
                 e.nmse(), e.max_abs_error, e.elements);
    }
  }
  if (measured && !checks.empty()) {
    fmt::print(
        "(the paged cache stores {} K/V, the others fp32: the agreement lines measure its "
        "error, they are not a correctness check)\n",
        dtype_name(parse_dtype(o.kv_dtype)));
  }

  const ModeRun* none = nullptr;
  for (const auto& r : runs) {
    if (r.mode == CacheMode::kNone) none = &r;
  }
  if (none != nullptr && runs.size() > 1) {
    const auto& ns = none->result.stats;
    const double none_tpot = model::summarize(ns.tpot_ms).mean;
    std::string line = "speedup vs none:";
    for (const auto& r : runs) {
      if (r.mode == CacheMode::kNone) continue;
      const auto& st = r.result.stats;
      const double tpot = model::summarize(st.tpot_ms).mean;
      line += fmt::format(" {} {:.2f}x total", run_label(r),
                          st.total_ms > 0 ? ns.total_ms / st.total_ms : 0.0);
      if (tpot > 0) line += fmt::format(" ({:.2f}x per decode step)", none_tpot / tpot);
      line += ";";
    }
    line.back() = '\n';
    fmt::print("{}", line);
  }
}

void print_json(const Options& o, const model::LlamaConfig& cfg, const std::string& model_src,
                const std::string& device_desc, int32_t steps,
                const std::vector<std::string>& notices, const std::vector<std::string>& prompts,
                const model::Tokenizer& tok, const std::vector<ModeRun>& runs,
                const std::vector<Check>& checks) {
  using json = nlohmann::ordered_json;
  json j;
  j["model"] = {{"source", model_src},
                {"dim", cfg.dim},
                {"hidden_dim", cfg.hidden_dim},
                {"n_layers", cfg.n_layers},
                {"n_heads", cfg.n_heads},
                {"n_kv_heads", cfg.n_kv_heads},
                {"vocab_size", cfg.vocab_size},
                {"seq_len", cfg.seq_len},
                {"shared_classifier", cfg.shared_classifier},
                {"parameters", cfg.num_parameters()}};
  j["steps"] = steps;
  j["temperature"] = o.temperature;
  j["seed"] = o.seed;
  j["block_size"] = o.block_size;
  j["kv_dtype"] = std::string(dtype_name(parse_dtype(o.kv_dtype)));
  j["device"] = o.device;
  if (!device_desc.empty()) j["device_name"] = device_desc;
  j["notices"] = notices;
  json seqs = json::array();
  const auto& first = runs.front().result.seqs;
  for (size_t i = 0; i < first.size(); ++i) {
    const auto& s = first[i];
    seqs.push_back(
        {{"prompt", prompts[i]},
         {"prompt_token_ids", s.prompt_ids},
         {"generated_ids", std::vector<TokenId>(s.ids.begin() + s.prompt_ids.size(), s.ids.end())},
         {"positions_run", s.positions_run},
         {"stopped_on_bos", s.stopped_on_bos},
         {"text", tok.render(s.ids)}});
  }
  j["sequences"] = seqs;
  j["text_from"] = run_label(runs.front());
  json modes = json::array();
  for (const auto& r : runs) {
    const auto& st = r.result.stats;
    const auto tpot = model::summarize(st.tpot_ms);
    modes.push_back({{"cache", model::cache_mode_name(r.mode)},
                     {"device", model::device_name(st.device)},
                     {"ttft_ms", st.ttft_ms},
                     {"tpot_ms", {{"mean", tpot.mean}, {"p50", tpot.p50}, {"p99", tpot.p99}}},
                     {"decode_steps", st.tpot_ms.size()},
                     {"total_ms", st.total_ms},
                     {"tokens_generated", st.tokens_generated},
                     {"tokens_per_s", st.tokens_per_s()},
                     {"kv_bytes_in_use", st.kv_bytes_in_use},
                     {"kv_tokens_in_use", st.kv_tokens_in_use},
                     {"contiguous_reservation_bytes", st.contiguous_reservation_bytes},
                     {"wasted_share", st.wasted_share()},
                     {"pool_bytes", st.pool_bytes}});
    if (r.mode == CacheMode::kPaged && (o.tiers.prefix_caching || !o.tiers.redis.empty() ||
                                        o.tiers.host_mib > 0 || !o.tiers.disk_path.empty())) {
      modes.back()["prefix_cache"] = tiering_json(o.tiers, st);
    }
    if (r.mode == CacheMode::kPaged && !o.layers.pattern.empty()) {
      modes.back()["kv_cache_groups"] = layer_groups_json(o.layers, st);
    }
  }
  j["modes"] = modes;
  json agree = json::array();
  for (const auto& c : checks) {
    const auto& g = c.agreement;
    agree.push_back({{"cache", c.label},
                     {"versus", run_label(runs.front())},
                     {"same_tokens", g.same_tokens},
                     {"diverge_sequence", g.diverge_seq},
                     {"diverge_index", g.diverge_index},
                     {"same_lengths", g.same_lengths},
                     {"length_sequence", g.length_seq},
                     {"max_abs_logit_diff", g.max_abs_logit_diff},
                     {"mean_abs_logit_diff", g.mean_abs_logit_diff},
                     {"positions_compared", g.positions_compared},
                     {"ok", c.ok}});
  }
  j["agreement"] = agree;
  json speedup = json::object();
  for (const auto& none : runs) {
    if (none.mode != CacheMode::kNone) continue;
    for (const auto& r : runs) {
      if (r.mode == CacheMode::kNone || r.result.stats.total_ms <= 0) continue;
      speedup[run_label(r)] = none.result.stats.total_ms / r.result.stats.total_ms;
    }
  }
  j["speedup_vs_none_total"] = speedup;
  if (o.kv_nmse) {
    json nmse = json::array();
    for (const auto& e : runs.front().result.shadow_errors) {
      nmse.push_back({{"dtype", std::string(dtype_name(e.dtype))},
                      {"nmse", e.nmse()},
                      {"max_abs_error", e.max_abs_error},
                      {"elements", e.elements}});
    }
    j["kv_nmse"] = nmse;
  }
  // Generated text may hold invalid UTF-8 (byte tokens): replace it rather than throw.
  const std::string out = j.dump(2, ' ', false, json::error_handler_t::replace);
  fmt::print("{}\n", out);
}

/// The storage dtypes --kv-nmse compares with fp32.
constexpr DType kShadowDTypes[] = {DType::kF16, DType::kBF16, DType::kInt8, DType::kFP8E4M3,
                                   DType::kFP8E5M2};

/// `g` for the paged run: with --kv-nmse, a shadow cache per kShadowDTypes entry.
/// Errors: --kv-nmse with a paged cache that is not fp32 on the CPU, or without a paged run.
model::GenerateOptions with_shadows(const Options& o, const model::GenerateOptions& g) {
  model::GenerateOptions out = g;
  if (!o.kv_nmse) return out;
  if (o.cache != "paged" && o.cache != "all") {
    throw Error(fmt::format("--kv-nmse measures the paged cache: --cache {} has none", o.cache));
  }
  if (g.kv_dtype != DType::kF32 || o.device != "cpu") {
    // Name only what the user changed from fp32 / cpu.
    std::string drop;
    if (g.kv_dtype != DType::kF32) drop = fmt::format("--kv-dtype {}", dtype_name(g.kv_dtype));
    if (o.device != "cpu") drop += (drop.empty() ? "" : " and ") + ("--device " + o.device);
    throw Error(fmt::format(
        "--kv-nmse compares each storage dtype with an fp32 paged cache on the cpu: drop {}",
        drop));
  }
  out.shadow_kv_dtypes.assign(std::begin(kShadowDTypes), std::end(kShadowDTypes));
  return out;
}

/// Each prompt's token ids (with BOS). Errors: a prompt of more than `steps` tokens, refused
/// first by a bound (encode is O(n^2) in the text, and no token covers more than
/// max_piece_bytes of it), then by its exact count.
std::vector<std::vector<TokenId>> encode_prompts(const model::Tokenizer& tok,
                                                 const std::vector<std::string>& prompts,
                                                 int32_t steps, int32_t seq_len) {
  std::vector<std::vector<TokenId>> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto bytes = static_cast<int64_t>(prompts[i].size());
    const int64_t at_least = 1 + (bytes + tok.max_piece_bytes() - 1) / tok.max_piece_bytes();
    if (at_least > steps) {
      throw Error(
          fmt::format("prompt {} is at least {} tokens ({} bytes, at most {} a token), "
                      "more than the {} positions to run (--steps counts the prompt; "
                      "the model's seq_len is {})",
                      i, at_least, bytes, tok.max_piece_bytes(), steps, seq_len));
    }
    ids.push_back(tok.encode(prompts[i], /*bos=*/true, /*eos=*/false));
    if (static_cast<int64_t>(ids.back().size()) > steps) {
      throw Error(
          fmt::format("prompt {} is {} tokens, more than the {} positions to run "
                      "(--steps counts the prompt; the model's seq_len is {})",
                      i, ids.back().size(), steps, seq_len));
    }
  }
  return ids;
}

void run_generate(const Options& o) {
  // The cores go to the matrix products big enough to split, one thread to attention, unless
  // the user chose: see model::set_threads and model::MatmulThreads.
  const bool choose_threads =
      std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr;
  if (choose_threads) model::set_threads(0, 1);
  const Device device = *model::parse_device(o.device);  // IsMember validated the name
  std::string device_desc;
  if (device == Device::kCuda) {
    if (o.cache != "paged" && o.cache != "all") {
      throw Error(fmt::format(
          "--device cuda runs the paged cache on the GPU; --cache {} runs on the CPU only (use "
          "--cache paged or all)",
          o.cache));
    }
    cuda::require_device();  // "no CUDA device: ..." -> exit 2, before any work
    device_desc = cuda::device_info().name;
  }
  LoadedModel m = load_model(o.model);
  const model::LlamaConfig& cfg = m.llama.config();
  if (choose_threads) m.llama.set_matmul_threads({.max_threads = model::blas_threads()});

  std::vector<std::string> notices;
  int32_t steps = o.steps;
  if (steps > cfg.seq_len) {
    notices.push_back(fmt::format("--steps {} exceeds the model's seq_len {}: capped at {}", steps,
                                  cfg.seq_len, cfg.seq_len));
    steps = cfg.seq_len;
    fmt::print(stderr, "pagedkv generate: notice: {}\n", notices.back());
  }

  const std::vector<std::string> prompts =
      o.prompts_path.empty() ? std::vector<std::string>{o.prompt} : read_prompts(o.prompts_path);
  const std::vector<std::vector<TokenId>> ids = encode_prompts(m.tok, prompts, steps, cfg.seq_len);

  std::vector<CacheMode> modes;
  if (o.cache == "all") {
    modes = {CacheMode::kPaged, CacheMode::kContiguous, CacheMode::kNone};
  } else {
    modes = {*model::parse_cache_mode(o.cache)};  // IsMember validated the name
  }

  model::GenerateOptions g;
  g.steps = steps;
  g.temperature = o.temperature;
  g.seed = o.seed;
  g.block_size = o.block_size;
  g.kv_dtype = parse_dtype(o.kv_dtype);  // validated by the option's check
  g.kv_scale_headroom = o.kv_scale_headroom;
  g.layer_attention = layer_attention(o.layers, cfg.n_layers);
  const int64_t logit_bytes = static_cast<int64_t>(prompts.size()) * steps * cfg.vocab_size * 4;
  g.record_logits = modes.size() > 1 && logit_bytes <= kMaxLogitBytes;
  model::GenerateOptions paged_options = with_shadows(o, g);  // after every field of g
  paged_options.prefix_caching = o.tiers.prefix_caching;
  paged_options.tiering = tiering_options(o.tiers, m.llama.weights().content_hash());
  paged_options.warm_pass = warm_pass(o.tiers);
  if (!paged_options.tiering.enabled()) paged_options.tiering.model_id.clear();
  if (paged_options.prefix_caching || paged_options.tiering.enabled()) {
    // Cached prompt positions are not forwarded, so the paged run has no logits for them:
    // it is checked against the others token for token.
    paged_options.record_logits = false;
  }

  std::vector<ModeRun> runs;
  for (const CacheMode mode : modes) {
    // Only the paged mode has a device version; the others stay on the CPU as its checks.
    g.device = mode == CacheMode::kPaged ? device : Device::kCpu;
    runs.push_back(
        {mode, model::generate(m.llama, ids, mode, mode == CacheMode::kPaged ? paged_options : g)});
  }

  std::vector<Check> checks;
  bool all_ok = true;
  for (size_t i = 1; i < runs.size(); ++i) {
    Check c{run_label(runs[i]), model::compare_runs(runs[i].result, runs[0].result), true};
    // A paged cache in another dtype than the fp32 references differs by its rounding: the
    // agreement then measures that error (docs/quantization.md) and is not a correctness check;
    // a length mismatch no token explains still fails.
    const bool logits_ok =
        g.kv_dtype != DType::kF32 || c.agreement.max_abs_logit_diff <= kLogitTolerance;
    // A length mismatch that no sampled token explains fails however well the logits agree.
    c.ok = logits_ok && c.agreement.same_lengths &&
           (c.agreement.same_tokens || c.agreement.max_abs_logit_diff >= 0);
    all_ok = all_ok && c.ok;
    checks.push_back(c);
  }

  if (o.json) {
    print_json(o, cfg, m.source, device_desc, steps, notices, prompts, m.tok, runs, checks);
  } else {
    print_human(o, m.description, device_desc, steps, prompts, m.tok, runs, checks);
    for (const auto& r : runs) {
      if (r.mode == CacheMode::kPaged) {
        print_tiering(o.tiers, r.result.stats);
        print_layer_groups(o.layers, r.result.stats);
      }
    }
  }
  std::fflush(stdout);
  if (!all_ok) {
    fmt::print(stderr,
               "pagedkv generate: internal error: the cache modes disagree (logits beyond the "
               "tolerance {}, or lengths that no token explains)\n",
               kLogitTolerance);
    throw ExitStatus{1};
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "generate",
      "Generate text with a Llama model through the paged KV cache, side by side with the "
      "contiguous cache and with no cache; report time and memory per mode.");
  // A file, or the word `random`: CLI::ExistingFile's message for anything else.
  const CLI::Validator model_file(
      [](std::string& value) {
        return value == kRandomModel ? std::string() : CLI::ExistingFile(value);
      },
      "FILE|random");
  sub->add_option("--model", opts->model.model_path,
                  "llama2.c checkpoint FILE (with --tokenizer), or `random`: seeded random "
                  "weights of the shape below, byte-level tokenizer; default: stories260K.bin "
                  "from share/pagedkv/models beside the installed binary, or models/ of the "
                  "source tree")
      ->check(model_file);
  sub->add_option("--tokenizer", opts->model.tokenizer_path,
                  "llama2.c tokenizer FILE for --model FILE (e.g. models/tok512.bin)")
      ->check(CLI::ExistingFile);
  struct ShapeFlag {
    const char* name;
    int32_t* field;
    const char* what;
  };
  model::LlamaConfig& r = opts->model.random_shape;
  const ShapeFlag shape_flags[] = {
      {"--dim", &r.dim, "d_model"},
      {"--hidden-dim", &r.hidden_dim, "SwiGLU inner width"},
      {"--layers", &r.n_layers, "transformer layers"},
      {"--heads", &r.n_heads, "query heads (head_dim = dim / heads, even)"},
      {"--kv-heads", &r.n_kv_heads, "K/V heads, dividing --heads (GQA)"},
      {"--vocab", &r.vocab_size, "vocabulary (259 .. 1056: the byte-level tokenizer)"},
      {"--seq-len", &r.seq_len, "maximum context, tokens (caps --steps)"}};
  for (const ShapeFlag& f : shape_flags) {
    opts->model.shape_flags.push_back(sub->add_option(f.name, *f.field, f.what)
                                          ->capture_default_str()
                                          ->check(CLI::Range(1, 1 << 24))
                                          ->group("Random model shape (with --model random)"));
  }
  auto* prompt = sub->add_option("--prompt", opts->prompt, "prompt text")->capture_default_str();
  sub->add_option("--prompts", opts->prompts_path,
                  "file with one prompt per line (blank lines skipped), generated together as "
                  "one batch")
      ->check(CLI::ExistingFile)
      ->excludes(prompt);
  sub->add_option("--steps", opts->steps,
                  "positions per sequence, prompt included (capped at the model's seq_len)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--temperature", opts->temperature, "0 = greedy argmax; > 0 samples")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1e6f));
  sub->add_option("--seed", opts->seed, "sampling seed (used when temperature > 0)")
      ->check(uint64_digits())
      ->capture_default_str();
  sub->add_option("--cache", opts->cache,
                  "KV cache: paged, contiguous, none, or all (run each, check agreement)")
      ->capture_default_str()
      ->check(CLI::IsMember({"paged", "contiguous", "none", "all"}));
  sub->add_option("--device", opts->device,
                  "where the paged cache runs: cpu, or cuda (the GPU; needs a CUDA build and "
                  "device, and a head_dim and block size the CUDA kernels support); contiguous "
                  "and none always run on the CPU")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--block-size", opts->block_size, "tokens per KV block (paged mode)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--kv-dtype", opts->kv_dtype,
                  "storage dtype of the paged cache: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2 or int8 "
                  "(8-bit: per-tensor scales calibrated on the prefill); contiguous and "
                  "none stay fp32, so --cache all shows where the paged run departs from them")
      ->capture_default_str()
      ->check([](const std::string& s) {
        try {
          (void)parse_dtype(s);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      });
  sub->add_option("--kv-scale-headroom", opts->kv_scale_headroom,
                  "8-bit caches: calibrate scales as H x max |x| / format max on the prefill, "
                  "leaving room for later tokens (1 = vLLM's calculate_kv_scales)")
      ->capture_default_str()
      ->check(CLI::Range(1.0f, 65536.0f));
  sub->add_flag("--kv-nmse", opts->kv_nmse,
                "measure each storage dtype's error on this run's real K/V: fp16, bf16, int8, "
                "fp8_e4m3 and fp8_e5m2 shadow paged caches fed the same q/k/v as the fp32 paged "
                "cache, reporting the NMSE of their attention outputs (teacher-forced)");
  sub->add_flag("--json", opts->json, "print one JSON object instead of text and tables");
  add_tier_flags(*sub, opts->tiers);
  add_layer_flags(*sub, opts->layers);
  sub->callback([opts] { run_generate(*opts); });
}

}  // namespace pagedkv::cli
