// `pagedkv memory`: KV-cache bytes per token and their growth with context length for a model
// preset (or explicit --layers/--kv-heads/--head-dim/--dtype), from the formula
//   bytes = 2 x L x B x T x H_kv x D x sizeof(dtype)   (Kwon et al., SOSP 2023);
// then a real tiny model runs through the contiguous and the paged cache step by step and the
// bytes each holds are printed next to the formula: contiguous must equal it, paged must equal
// it rounded up to whole blocks. Table, --csv, --svg. docs/memory.md explains the output.

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/model_flags.hpp"
#include "model/checkpoint.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "sim/memory_growth.hpp"
#include "sim/model_memory.hpp"
#include "sim/model_preset.hpp"
#include "sim/svg.hpp"
#include "sim/units.hpp"

namespace pagedkv::cli {

namespace {

/// Weight seed of the built-in model (any seed gives the same memory figures; this is the one
/// `pagedkv generate` uses, so the two commands run the same model).
constexpr uint64_t kBuiltinWeightSeed = 20240229;
/// Measured run prompt: BOS then the byte tokens of this text (ids 3 + byte exist in both the
/// llama2.c and the built-in vocabularies). 17 tokens, so the prefill already crosses a
/// 16-token block boundary.
constexpr std::string_view kPromptText = "Once upon a time";

struct Options {
  ModelFlags model;  // --preset, the overrides, --sliding-window
  int64_t batch = 1;
  int32_t block_size = 16;
  std::string kv_memory;
  std::string model_path;
  int64_t measure_tokens = 0;
  bool no_measure = false;
  bool csv = false;
  std::string svg_path;
};

std::string mib(int64_t bytes) { return sim::format_bytes(static_cast<double>(bytes)); }

/// Rows of the measured table worth reading: the prefill, both sides of the first block
/// boundaries, powers of two, and the last step (the CSV has every step).
bool interesting(const sim::MeasuredStep& m, int32_t bs, bool last) {
  const int64_t t = m.tokens;
  const bool pow2 = (t & (t - 1)) == 0;
  const bool boundary = t <= 4 * static_cast<int64_t>(bs) && (t % bs == 0 || t % bs == 1);
  return m.step == 0 || last || pow2 || boundary;
}

/// The real model's run through both caches, and the steps where a cache disagrees with the
/// formula.
struct Measured {
  std::vector<sim::MeasuredStep> steps;
  std::string desc;  ///< the model, for titles
  int64_t contiguous_bad = 0;
  int64_t paged_bad = 0;
};

Measured measure(const Options& o) {
  Measured out;
  if (o.no_measure) return out;
  std::optional<model::LlamaModel> llama;
  if (o.model_path.empty()) {
    llama.emplace(model::random_weights(model::builtin_config(), kBuiltinWeightSeed));
    out.desc = fmt::format("built-in model ({})", llama->config().describe());
  } else {
    llama.emplace(model::load_checkpoint(o.model_path));
    out.desc = fmt::format("{} ({})", std::filesystem::path(o.model_path).filename().string(),
                           llama->config().describe());
  }
  std::vector<TokenId> prompt = {model::kBos};
  for (char c : kPromptText) prompt.push_back(3 + static_cast<unsigned char>(c));
  const int64_t positions = o.measure_tokens > 0 ? o.measure_tokens : llama->config().seq_len;
  if (positions > llama->config().seq_len || positions < static_cast<int64_t>(prompt.size())) {
    throw Error(fmt::format("--measure-tokens {} must be in [{}, the model's seq_len {}]",
                            positions, prompt.size(), llama->config().seq_len));
  }
  out.steps = sim::measure_model_growth(*llama, prompt, positions, o.block_size);
  for (const sim::MeasuredStep& m : out.steps) {
    out.contiguous_bad += m.contiguous_bytes != m.formula_bytes;
    out.paged_bad += m.paged_bytes != m.paged_expected_bytes;
  }
  return out;
}

/// --csv: one header, the growth rows, then every measured step.
void print_csv(const std::vector<sim::GrowthRow>& rows, const Measured& measured) {
  fmt::print(
      "table,step,tokens,formula_bytes,window_bytes,paged_bytes,contiguous_max_bytes,"
      "paged_fit,contiguous_fit,contiguous_measured_bytes,paged_measured_bytes,"
      "window_paged_bytes\n");
  for (const sim::GrowthRow& r : rows) {
    fmt::print("growth,,{},{},{},{},{},{},{},,,{}\n", r.tokens, r.formula_bytes, r.window_bytes,
               r.paged_bytes, r.contiguous_max_bytes, r.paged_fit, r.contiguous_fit,
               r.window_paged_bytes);
  }
  for (const sim::MeasuredStep& m : measured.steps) {
    fmt::print("measured,{},{},{},,{},,,,{},{},\n", m.step, m.tokens, m.formula_bytes,
               m.paged_expected_bytes, m.contiguous_bytes, m.paged_bytes);
  }
}

/// "sliding window 1024" or "chunked local 8192".
std::string local_kind(const sim::ModelPreset& model) {
  return model.sliding_window > 0 ? fmt::format("sliding window {}", model.sliding_window)
                                  : fmt::format("chunked local {}", model.attention_chunk);
}

/// The KV cache groups of a hybrid model, bytes per token of each, and the saving at the
/// longest context (docs/memory.md, "Hybrid models").
void print_groups(const Options& o, const sim::ModelPreset& model,
                  const std::vector<sim::GrowthRow>& rows) {
  const int32_t local = model.num_local_layers;
  const int32_t full = model.num_layers - local;
  const int64_t per_layer =
      kv_bytes_for_tokens(1, model.num_kv_heads, model.head_dim, model.dtype, 1);
  fmt::print("KV cache groups (one block pool, one {}-token page):\n", o.block_size);
  fmt::print("  full attention: {} layers x {} bytes = {} bytes per token, every position\n", full,
             per_layer, full * per_layer);
  fmt::print("  {}: {} layers x {} bytes = {} bytes per token, only the positions it sees\n",
             local_kind(model), local, per_layer, local * per_layer);
  const sim::GrowthRow& last = rows.back();
  fmt::print(
      "at {} tokens, B = {}: all-full paged {} vs hybrid paged {}, {:.2f}x less (hybrid = "
      "full layers x T + local layers x the positions they see)\n\n",
      last.tokens, o.batch, mib(last.paged_bytes), mib(last.window_paged_bytes),
      last.window_paged_bytes > 0
          ? static_cast<double>(last.paged_bytes) / static_cast<double>(last.window_paged_bytes)
          : 0.0);
}

/// The model, its bytes per token and the formula, then the growth table.
void print_growth(const Options& o, const sim::ModelPreset& model, int64_t budget,
                  const std::vector<sim::GrowthRow>& rows) {
  const bool hybrid = model.num_local_layers > 0;
  fmt::print("model: {} - {} layers, {} kv heads, head_dim {}, {}, max context {}{}\n",
             model.display, model.num_layers, model.num_kv_heads, model.head_dim,
             dtype_name(model.dtype), model.max_context,
             hybrid ? fmt::format(", {} on {} layers", local_kind(model), model.num_local_layers)
                    : std::string());
  fmt::print("source: {}\n", model.source);
  const int64_t per_token = sim::kv_bytes_per_token(model);
  fmt::print(
      "KV bytes per token = 2 x L x H_kv x D x sizeof(dtype) = 2 x {} x {} x {} x {} = "
      "{} bytes ({})\n",
      model.num_layers, model.num_kv_heads, model.head_dim, dtype_size(model.dtype), per_token,
      mib(per_token));
  fmt::print(
      "formula: bytes = 2 (K and V) x L x B x T x H_kv x D x sizeof(dtype) "
      "(Kwon et al., \"Efficient Memory Management for Large Language Model Serving "
      "with PagedAttention\", SOSP 2023)\n\n");
  if (hybrid) print_groups(o, model, rows);
  fmt::print(
      "Growth for B = {} sequence(s); paged = whole {}-token blocks; contiguous-max = "
      "{} positions reserved per sequence{}\n\n",
      o.batch, o.block_size, model.max_context,
      budget > 0 ? fmt::format("; fits = sequences in {}", mib(budget)) : std::string());
  fmt::print("| tokens | formula | paged bs={} | contiguous-max |{}{}\n", o.block_size,
             hybrid ? " hybrid | hybrid paged | all-full / hybrid |" : "",
             budget > 0 ? " fits paged | fits contiguous-max |" : "");
  fmt::print("| ---: | ---: | ---: | ---: |{}{}\n", hybrid ? " ---: | ---: | ---: |" : "",
             budget > 0 ? " ---: | ---: |" : "");
  for (const sim::GrowthRow& r : rows) {
    fmt::print("| {} | {} | {} | {} |", r.tokens, mib(r.formula_bytes), mib(r.paged_bytes),
               mib(r.contiguous_max_bytes));
    if (hybrid) {
      fmt::print(" {} | {} | {:.2f}x |", mib(r.window_bytes), mib(r.window_paged_bytes),
                 r.window_paged_bytes > 0 ? static_cast<double>(r.paged_bytes) /
                                                static_cast<double>(r.window_paged_bytes)
                                          : 1.0);
    }
    if (budget > 0) fmt::print(" {} | {} |", r.paged_fit, r.contiguous_fit);
    fmt::print("\n");
  }
}

/// The measured table (interesting rows only) and the check line.
void print_measured(const Measured& measured, int32_t block_size) {
  const std::vector<sim::MeasuredStep>& steps = measured.steps;
  if (steps.empty()) return;
  fmt::print(
      "\nMeasured: {}; prompt of {} tokens prefilled in one step, then greedy decode; "
      "fp32 caches, paged block size {} (every step in --csv)\n\n",
      measured.desc, steps.front().tokens, block_size);
  fmt::print(
      "| step | tokens | formula | contiguous measured | paged measured | formula "
      "rounded up to blocks |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < steps.size(); ++i) {
    const sim::MeasuredStep& m = steps[i];
    if (!interesting(m, block_size, i + 1 == steps.size())) continue;
    fmt::print("| {} | {} | {} | {} | {} | {} |\n", m.step, m.tokens, m.formula_bytes,
               m.contiguous_bytes, m.paged_bytes, m.paged_expected_bytes);
  }
  fmt::print(
      "\ncheck: contiguous == formula at {}/{} steps; paged == formula rounded up to "
      "{}-token blocks at {}/{} steps\n",
      steps.size() - measured.contiguous_bad, steps.size(), block_size,
      steps.size() - measured.paged_bad, steps.size());
}

/// --svg: the growth panel (MiB vs context length) and, after a measured run, its panel (KiB).
std::vector<sim::SvgPanel> memory_panels(const Options& o, const sim::ModelPreset& model,
                                         const std::vector<sim::GrowthRow>& rows,
                                         const Measured& measured) {
  std::vector<sim::SvgPanel> panels;
  sim::SvgPanel growth{
      fmt::format("{}: KV cache bytes for B = {} vs context length", model.display, o.batch),
      "tokens per sequence",
      "KV cache (MiB)",
      {},
      true,
      0.0};
  sim::SvgSeries formula{"formula (exact)", {}, false, false};
  sim::SvgSeries paged{fmt::format("paged, {}-token blocks", o.block_size), {}, true, false};
  sim::SvgSeries cmax{"contiguous-max reservation", {}, true, false};
  sim::SvgSeries window{"hybrid (each layer keeps what it sees)", {}, false, false};
  sim::SvgSeries window_paged{
      fmt::format("hybrid paged, {}-token blocks", o.block_size), {}, true, false};
  for (const sim::GrowthRow& r : rows) {
    const double t = static_cast<double>(r.tokens);
    formula.points.emplace_back(t, static_cast<double>(r.formula_bytes) / (1 << 20));
    paged.points.emplace_back(t, static_cast<double>(r.paged_bytes) / (1 << 20));
    cmax.points.emplace_back(t, static_cast<double>(r.contiguous_max_bytes) / (1 << 20));
    window.points.emplace_back(t, static_cast<double>(r.window_bytes) / (1 << 20));
    window_paged.points.emplace_back(t, static_cast<double>(r.window_paged_bytes) / (1 << 20));
  }
  growth.series = {formula, paged, cmax};
  if (model.num_local_layers > 0) {
    growth.series.push_back(window);
    growth.series.push_back(window_paged);
  }
  panels.push_back(std::move(growth));
  if (measured.steps.empty()) return panels;
  sim::SvgPanel m{"Measured: " + measured.desc, "tokens cached", "KV cache (KiB)", {}, true, 0.0};
  sim::SvgSeries f{"formula", {}, true, false};
  sim::SvgSeries c{"contiguous, measured", {}, false, false};
  sim::SvgSeries p{fmt::format("paged bs={}, measured", o.block_size), {}, false, false};
  for (const sim::MeasuredStep& s : measured.steps) {
    const double t = static_cast<double>(s.tokens);
    f.points.emplace_back(t, static_cast<double>(s.formula_bytes) / 1024.0);
    c.points.emplace_back(t, static_cast<double>(s.contiguous_bytes) / 1024.0);
    p.points.emplace_back(t, static_cast<double>(s.paged_bytes) / 1024.0);
  }
  m.series = {c, p, f};
  panels.push_back(std::move(m));
  return panels;
}

void run_memory(const Options& o) {
  const sim::ModelPreset model = resolve_model(o.model);
  const int64_t budget = o.kv_memory.empty() ? 0 : sim::parse_bytes(o.kv_memory);
  const std::vector<int64_t> lengths = sim::growth_lengths(model.max_context);
  const std::vector<sim::GrowthRow> rows =
      sim::growth_table(model, o.batch, o.block_size, lengths, budget);
  const Measured measured = measure(o);

  if (o.csv) {
    print_csv(rows, measured);
  } else {
    print_growth(o, model, budget, rows);
    print_measured(measured, o.block_size);
  }
  if (!o.svg_path.empty()) {
    sim::write_text_file(o.svg_path, sim::render_svg(memory_panels(o, model, rows, measured)));
    if (!o.csv) fmt::print("plot: {}\n", o.svg_path);
  }
  if (measured.contiguous_bad > 0 || measured.paged_bad > 0) {
    fmt::print(stderr,
               "pagedkv memory: measured bytes differ from the formula (contiguous at {} steps, "
               "paged at {} steps)\n",
               measured.contiguous_bad, measured.paged_bad);
    throw ExitStatus{1};
  }
}

}  // namespace

void add_memory_command(CLI::App& app) {
  auto opts = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "memory",
      "KV-cache bytes per token and growth with context length for a model preset, and the "
      "bytes a real tiny model's contiguous and paged caches hold step by step vs the formula.");
  add_model_flags(*sub, opts->model,
                  {.formula_symbols = true, .max_context = "override: max positions per sequence"});
  sub->add_option("--sliding-window", opts->model.sliding_window,
                  "override: attention window in tokens (0 = full attention)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 32));
  sub->add_option("--local-layers", opts->model.local_layers,
                  "override: layers with the window or chunk (the rest attend to every position; "
                  "with --sliding-window on a full-attention preset: every layer)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--batch", opts->batch, "sequences B in the growth table")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--block-size", opts->block_size, "tokens per KV block (paged)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--kv-memory", opts->kv_memory,
                  "KV budget (e.g. 40GiB): adds how many sequences of each length fit");
  sub->add_option("--model", opts->model_path,
                  "llama2.c checkpoint for the measured run (e.g. "
                  "models/stories260K.bin, the vendored copy); default: the built-in model")
      ->check(CLI::ExistingFile);
  sub->add_option("--measure-tokens", opts->measure_tokens,
                  "positions of the measured run (default: the model's seq_len)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_flag("--no-measure", opts->no_measure, "skip the measured model run");
  sub->add_flag("--csv", opts->csv,
                "print one CSV (growth rows and every measured step) instead of tables");
  sub->add_option("--svg", opts->svg_path, "write the growth and measured plots to this SVG");
  sub->callback([opts] { run_memory(*opts); });
}

}  // namespace pagedkv::cli
