#pragma once
/// @file model_flags.hpp
/// The model flags `pagedkv memory` and `pagedkv replay` share: --preset and the architecture
/// overrides (--layers, --kv-heads, --head-dim, --dtype, --max-context), registered and turned
/// into a sim::ModelPreset in one place.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "sim/model_preset.hpp"

namespace pagedkv::cli {

/// Values of the model flags; unset overrides keep the preset's numbers.
struct ModelFlags {
  std::string preset = "llama-3-8b";
  std::optional<int32_t> layers, kv_heads, head_dim;
  std::optional<std::string> dtype;
  std::optional<int64_t> max_context;
  std::optional<int64_t> sliding_window;  ///< registered by the commands that offer it
  std::optional<int32_t> local_layers;    ///< registered by the commands that offer it
};

/// Help texts of the flags that differ between the commands.
struct ModelFlagsHelp {
  /// Appended to the layers / kv-heads / head-dim help: the formula's symbols, or nothing.
  bool formula_symbols = false;
  std::string max_context;  ///< help of --max-context
};

/// Registers --preset, --layers, --kv-heads, --head-dim, --dtype and --max-context on `sub`,
/// in that order, writing into `flags` (which must outlive the parse).
void add_model_flags(CLI::App& sub, ModelFlags& flags, const ModelFlagsHelp& help);

/// The preset named by --preset with every given override applied.
/// Errors: throws pagedkv::Error for an unknown dtype (checked first), an unknown preset, or
/// an invalid result (sim::apply_overrides).
[[nodiscard]] sim::ModelPreset resolve_model(const ModelFlags& flags);

}  // namespace pagedkv::cli
