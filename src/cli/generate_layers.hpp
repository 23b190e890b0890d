#pragma once
// `pagedkv generate`'s layer-pattern flags (hybrid models: per-layer full, sliding-window or
// chunked attention; docs/model.md "Hybrid layer patterns") and their report: the paged run's
// KV per KV cache group against an all-full cache of the same tokens.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/generate.hpp"

namespace pagedkv::cli {

/// The flags, as parsed.
struct LayerFlags {
  std::string pattern;  ///< empty: every layer full
  int32_t window = 0;
  int32_t sinks = 0;
  int32_t chunk = 0;
};

/// Adds --layer-pattern, --window, --sinks and --chunk to `sub`.
void add_layer_flags(CLI::App& sub, LayerFlags& flags);

/// [num_layers] each layer's attention (model::layer_attention_from_pattern), or empty without
/// --layer-pattern. Errors: throws pagedkv::Error as layer_attention_from_pattern, and when
/// --window, --sinks or --chunk is given without --layer-pattern.
[[nodiscard]] std::vector<KVCacheGroupSpec> layer_attention(const LayerFlags& flags,
                                                            int32_t num_layers);

/// "SSSSSF x 12 layers: 2 KV cache groups (...)": the text report of a hybrid paged run,
/// per group its attention, layers, blocks and bytes, and the total vs all-full (nothing
/// without a layer pattern).
void print_layer_groups(const LayerFlags& flags, const model::RunStats& stats);

/// The same as JSON: {"layer_pattern", "window", "sinks", "chunk", "groups": [{"attention",
/// "window", "sink_tokens", "chunk", "layers", "blocks", "bytes"}], "kv_bytes_in_use",
/// "kv_bytes_all_full", "all_full_over_hybrid"}.
[[nodiscard]] nlohmann::ordered_json layer_groups_json(const LayerFlags& flags,
                                                       const model::RunStats& stats);

}  // namespace pagedkv::cli
