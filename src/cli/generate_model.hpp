#pragma once
/// @file generate_model.hpp
/// The model `pagedkv generate` runs and its prompts: --model random (seeded weights of a chosen
/// shape, byte-level tokenizer), --model FILE --tokenizer FILE (llama2.c), or the default
/// stories260K found beside the installed binary or in models/ of the source tree.

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "model/llama.hpp"
#include "model/tokenizer.hpp"

namespace pagedkv::cli {

/// `--model random`: seeded random weights instead of a checkpoint file.
inline constexpr const char* kRandomModel = "random";

/// What the model flags chose.
struct ModelChoice {
  std::string model_path;  ///< empty: the default model; kRandomModel: random weights
  std::string tokenizer_path;
  /// Shape of `--model random` (its flags only count with it).
  model::LlamaConfig random_shape = model::builtin_config();
  std::vector<const CLI::Option*> shape_flags;  ///< the shape flags, to reject them otherwise
};

/// A model ready to run, with its tokenizer and how the output names it.
struct LoadedModel {
  model::LlamaModel llama;
  model::Tokenizer tok;
  std::string source;       ///< JSON "model.source": "random" or the checkpoint path
  std::string description;  ///< the text output's "model:" line
};

/// The model the flags name: --model random, --model FILE --tokenizer FILE, or the default.
/// Errors: throws pagedkv::Error for a shape flag without --model random, --model FILE without
/// --tokenizer (or the other way round), --model random with --tokenizer or an invalid or too
/// large shape (over 2^32 weights), no default model found, and the loaders' errors (a missing
/// or corrupt file).
[[nodiscard]] LoadedModel load_model(const ModelChoice& choice);

/// One prompt per non-blank line of `path` (a trailing CR dropped).
/// Errors: throws pagedkv::Error if the file cannot be opened or read, holds no prompt, or more
/// than 1024.
[[nodiscard]] std::vector<std::string> read_prompts(const std::string& path);

}  // namespace pagedkv::cli
