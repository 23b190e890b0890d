#include "cli/generate_model.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include "model/checkpoint.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cli {

namespace {

/// Seed of the random model's weights (the sampling seed is --seed).
constexpr uint64_t kRandomWeightSeed = 20240229;
/// The default model's files, in models/ of the source tree and <prefix>/share/pagedkv/models.
constexpr const char* kDefaultModelFile = "stories260K.bin";
constexpr const char* kDefaultTokenizerFile = "tok512.bin";
/// Largest random model, in floats (16 GiB of fp32): a typo in a shape flag should be an
/// error message, not an out-of-memory kill while the weights are filled.
constexpr int64_t kMaxRandomFloats = int64_t{1} << 32;
/// At most this many prompts from --prompts (each gets a full-length paged pool share).
constexpr size_t kMaxPrompts = 1024;

/// The folders searched for the default model, in order: the installed copy beside this
/// executable (<prefix>/bin/pagedkv -> <prefix>/share/pagedkv/models), then models/ of the source
/// tree it was built from (in a build tree, build/src/cli/pagedkv has no share/ beside it).
std::vector<std::filesystem::path> default_model_dirs() {
  namespace fs = std::filesystem;
  std::vector<fs::path> dirs;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path() / PAGEDKV_INSTALLED_MODELS_DIR).lexically_normal());
  dirs.emplace_back(PAGEDKV_SOURCE_MODELS_DIR);
  return dirs;
}

/// The default model's checkpoint and tokenizer: the first folder of default_model_dirs that
/// holds both. Errors: none does (the message lists where it looked and the alternatives).
std::pair<std::string, std::string> find_default_model() {
  std::string looked;
  for (const auto& dir : default_model_dirs()) {
    const auto model = dir / kDefaultModelFile, tok = dir / kDefaultTokenizerFile;
    std::error_code ec;
    if (std::filesystem::is_regular_file(model, ec) && std::filesystem::is_regular_file(tok, ec)) {
      return {model.string(), tok.string()};
    }
    looked += (looked.empty() ? "" : ", ") + dir.string();
  }
  throw Error(fmt::format(
      "no default model: {} and {} are in none of {}; give --model FILE --tokenizer FILE, or "
      "--model random",
      kDefaultModelFile, kDefaultTokenizerFile, looked));
}

LoadedModel load_random_model(const ModelChoice& o) {
  if (!o.tokenizer_path.empty()) {
    throw Error("--model random brings its own byte-level tokenizer: drop --tokenizer");
  }
  const model::LlamaConfig& cfg = o.random_shape;
  model::validate_config(cfg, "--model random");
  if (model::weights_floats(cfg) > kMaxRandomFloats) {
    throw Error(fmt::format("--model random: {} floats of weights, more than the {} allowed",
                            model::weights_floats(cfg), kMaxRandomFloats));
  }
  model::Tokenizer tok = model::Tokenizer::builtin(cfg.vocab_size);
  model::LlamaModel llama(model::random_weights(cfg, kRandomWeightSeed));
  std::string desc = fmt::format("random Llama (weight seed {}, byte-level tokenizer): {}",
                                 kRandomWeightSeed, cfg.describe());
  return {std::move(llama), std::move(tok), kRandomModel, std::move(desc)};
}

}  // namespace

LoadedModel load_model(const ModelChoice& o) {
  if (o.model_path == kRandomModel) return load_random_model(o);
  for (const CLI::Option* flag : o.shape_flags) {
    if (flag->count() > 0) {
      throw Error(fmt::format("{} needs --model random (a checkpoint's shape is in its header)",
                              flag->get_name()));
    }
  }
  if (o.model_path.empty() != o.tokenizer_path.empty()) {
    throw Error(o.model_path.empty() ? "--tokenizer needs --model (the vocabulary comes from it)"
                                     : "--model needs --tokenizer (a llama2.c tokenizer file)");
  }
  const auto [model_path, tok_path] =
      o.model_path.empty() ? find_default_model() : std::pair{o.model_path, o.tokenizer_path};
  model::LlamaModel llama(model::load_checkpoint(model_path));
  model::Tokenizer tok = model::Tokenizer::load(tok_path, llama.config().vocab_size);
  std::string desc = fmt::format("{} ({} parameters): {}", model_path,
                                 llama.config().num_parameters(), llama.config().describe());
  return {std::move(llama), std::move(tok), model_path, std::move(desc)};
}

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("prompts file {}: cannot open", path));
  std::vector<std::string> prompts;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines
    if (prompts.size() == kMaxPrompts) {
      throw Error(fmt::format("prompts file {}: more than {} prompts", path, kMaxPrompts));
    }
    prompts.push_back(line);
  }
  if (in.bad()) throw Error(fmt::format("prompts file {}: read error", path));
  if (prompts.empty())
    throw Error(fmt::format("prompts file {}: no prompt (only blank lines)", path));
  return prompts;
}

}  // namespace pagedkv::cli
