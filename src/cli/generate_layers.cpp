#include "cli/generate_layers.hpp"

#include <fmt/format.h>

#include "model/layer_pattern.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cli {

namespace {

std::string group_desc(const KVCacheGroupSpec& g) {
  switch (g.kind) {
    case GroupAttention::kSlidingWindow:
      return g.sink_tokens > 0 ? fmt::format("window {} + {} sinks", g.window, g.sink_tokens)
                               : fmt::format("window {}", g.window);
    case GroupAttention::kChunkedLocal:
      return fmt::format("chunk {}", g.chunk);
    case GroupAttention::kFull:
      break;
  }
  return "full";
}

double ratio(int64_t a, int64_t b) {
  return b > 0 ? static_cast<double>(a) / static_cast<double>(b) : 0.0;
}

}  // namespace

void add_layer_flags(CLI::App& sub, LayerFlags& flags) {
  const char* group = "Hybrid layers (a layer pattern)";
  sub.add_option("--layer-pattern", flags.pattern,
                 "attention per layer, one letter each, repeated over the layers: F full, S "
                 "sliding window (--window, --sinks), C chunked local (--chunk); e.g. SSSSSF "
                 "(Gemma 3). The paged cache then keeps KV cache groups over one pool and "
                 "releases what a local layer no longer sees")
      ->group(group);
  sub.add_option("--window", flags.window, "sliding window of the S layers, tokens")->group(group);
  sub.add_option("--sinks", flags.sinks, "attention sinks of the S layers, tokens")->group(group);
  sub.add_option("--chunk", flags.chunk, "chunk of the C layers, tokens")->group(group);
}

std::vector<KVCacheGroupSpec> layer_attention(const LayerFlags& flags, int32_t num_layers) {
  if (flags.pattern.empty()) {
    if (flags.window != 0 || flags.sinks != 0 || flags.chunk != 0) {
      throw Error(fmt::format(
          "--window {} / --sinks {} / --chunk {} apply to the layers of a --layer-pattern: give "
          "one (e.g. --layer-pattern SSSSSF)",
          flags.window, flags.sinks, flags.chunk));
    }
    return {};
  }
  if (flags.pattern.size() > static_cast<size_t>(num_layers)) {
    fmt::print(stderr,
               "pagedkv generate: notice: --layer-pattern has {} letters, the model {} layers: "
               "only the first {} are used\n",
               flags.pattern.size(), num_layers, num_layers);
  }
  return model::layer_attention_from_pattern(flags.pattern, num_layers, flags.window, flags.sinks,
                                             flags.chunk);
}

void print_layer_groups(const LayerFlags& flags, const model::RunStats& stats) {
  if (flags.pattern.empty() || stats.kv_groups.empty()) return;
  fmt::print("KV cache groups of the paged run (layer pattern {}, one pool, {} groups):\n",
             flags.pattern, stats.kv_groups.size());
  for (size_t g = 0; g < stats.kv_groups.size(); ++g) {
    const model::GroupKVUsage& u = stats.kv_groups[g];
    fmt::print("  group {}: {:<20} {:>3} {:<6} {:>7} {:<6} {:>12} B\n", g, group_desc(u.spec),
               u.spec.num_layers, u.spec.num_layers == 1 ? "layer" : "layers", u.blocks,
               u.blocks == 1 ? "block" : "blocks", u.bytes);
  }
  // Padded layer slots can make the hybrid pool the larger one (e.g. SF with a window longer
  // than the run): say "more" then, not "0.83x less".
  const bool less = stats.kv_bytes_in_use <= stats.kv_bytes_all_full;
  const std::string verdict =
      stats.kv_bytes_in_use == stats.kv_bytes_all_full
          ? std::string("the same")
          : fmt::format("{:.2f}x {}",
                        less ? ratio(stats.kv_bytes_all_full, stats.kv_bytes_in_use)
                             : ratio(stats.kv_bytes_in_use, stats.kv_bytes_all_full),
                        less ? "less" : "more (padded layer slots)");
  fmt::print("  KV in use {} B vs {} B all-full (same tokens, every layer full): {}\n",
             stats.kv_bytes_in_use, stats.kv_bytes_all_full, verdict);
}

nlohmann::ordered_json layer_groups_json(const LayerFlags& flags, const model::RunStats& stats) {
  nlohmann::ordered_json groups = nlohmann::ordered_json::array();
  for (const model::GroupKVUsage& u : stats.kv_groups) {
    groups.push_back({{"attention", group_attention_name(u.spec.kind)},
                      {"window", u.spec.window},
                      {"sink_tokens", u.spec.sink_tokens},
                      {"chunk", u.spec.chunk},
                      {"layers", u.spec.num_layers},
                      {"blocks", u.blocks},
                      {"bytes", u.bytes}});
  }
  return {{"layer_pattern", flags.pattern},
          {"window", flags.window},
          {"sinks", flags.sinks},
          {"chunk", flags.chunk},
          {"groups", groups},
          {"kv_bytes_in_use", stats.kv_bytes_in_use},
          {"kv_bytes_all_full", stats.kv_bytes_all_full},
          {"all_full_over_hybrid", ratio(stats.kv_bytes_all_full, stats.kv_bytes_in_use)}};
}

}  // namespace pagedkv::cli
