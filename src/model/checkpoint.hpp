#pragma once
/// @file checkpoint.hpp
/// Llama weights: the llama2.c checkpoint reader and the seeded random model
/// (`pagedkv generate --model random`).
///
/// File format (llama2.c "legacy" export, version 0; source: karpathy/llama2.c run.c,
/// read_checkpoint / memory_map_weights):
///   header: 7 x int32 little-endian: dim, hidden_dim, n_layers, n_heads, n_kv_heads,
///           vocab_size (negative = the classifier is stored separately, not shared with the
///           token embedding), seq_len;
///   then fp32 arrays, in this order (shapes row-major, [out, in] for projections):
///     token_embedding [vocab, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
///     wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim],
///     w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim],
///     legacy RoPE tables freq_cis_real/imag [seq_len, head_size / 2] each (skipped: positions
///     are computed), and wcls [vocab, dim] only when the classifier is not shared.
///   kv_dim = dim * n_kv_heads / n_heads, head_size = dim / n_heads.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pagedkv::model {

/// Llama hyper-parameters, as the checkpoint header stores them.
struct LlamaConfig {
  int32_t dim = 0;         ///< d_model
  int32_t hidden_dim = 0;  ///< SwiGLU inner width
  int32_t n_layers = 0;
  int32_t n_heads = 0;            ///< query heads
  int32_t n_kv_heads = 0;         ///< K/V heads (GQA: n_heads is a multiple of it)
  int32_t vocab_size = 0;         ///< always positive here; see shared_classifier
  int32_t seq_len = 0;            ///< maximum context, tokens
  bool shared_classifier = true;  ///< logits use the token embedding (header vocab_size > 0)

  [[nodiscard]] int32_t head_size() const { return dim / n_heads; }
  [[nodiscard]] int32_t kv_dim() const { return head_size() * n_kv_heads; }
  /// Parameters of the model (the legacy RoPE tables are not counted).
  [[nodiscard]] int64_t num_parameters() const;
  /// One line, e.g. "dim 64, hidden 172, 5 layers, 8 heads / 4 kv heads, vocab 512, seq_len 512".
  [[nodiscard]] std::string describe() const;
};

/// Checks the hyper-parameters: every size >= 1, n_heads % n_kv_heads == 0, dim % n_heads == 0,
/// head_size even (RoPE rotates pairs), sizes small enough that every array is addressable.
/// Errors: throws pagedkv::Error "<what>: <problem>" naming the field and value.
void validate_config(const LlamaConfig& config, const std::string& what);

/// All weights of a Llama model in one fp32 buffer, with typed views into it.
/// Movable, not copyable (the views point into the buffer).
/// Shapes: see the file comment; per-layer arrays are [n_layers, ...] back to back.
class LlamaWeights {
 public:
  /// Takes `config` (validated) and a buffer with exactly weights_floats(config) floats laid
  /// out in file order (legacy RoPE tables included, so a checkpoint is read in one piece).
  /// Errors: throws pagedkv::Error on an invalid config or a buffer of the wrong size.
  LlamaWeights(const LlamaConfig& config, std::vector<float> data);
  LlamaWeights(LlamaWeights&&) = default;
  LlamaWeights& operator=(LlamaWeights&&) = default;
  LlamaWeights(const LlamaWeights&) = delete;
  LlamaWeights& operator=(const LlamaWeights&) = delete;

  [[nodiscard]] const LlamaConfig& config() const { return config_; }
  /// Every float of the checkpoint body, in file order (weights_floats(config) of them).
  [[nodiscard]] std::span<const float> data() const { return data_; }
  /// XXH3-64 of data()'s bytes: the weights' identity (the tiers' KVFingerprint::model_id),
  /// equal for the same checkpoint or the same random seed and shape.
  [[nodiscard]] uint64_t content_hash() const;

  const float* token_embedding = nullptr;  ///< [vocab, dim]
  const float* rms_att = nullptr;          ///< [L, dim]
  const float* wq = nullptr;               ///< [L, dim, dim]
  const float* wk = nullptr;               ///< [L, kv_dim, dim]
  const float* wv = nullptr;               ///< [L, kv_dim, dim]
  const float* wo = nullptr;               ///< [L, dim, dim]
  const float* rms_ffn = nullptr;          ///< [L, dim]
  const float* w1 = nullptr;               ///< [L, hidden, dim]
  const float* w2 = nullptr;               ///< [L, dim, hidden]
  const float* w3 = nullptr;               ///< [L, hidden, dim]
  const float* rms_final = nullptr;        ///< [dim]
  const float* wcls = nullptr;             ///< [vocab, dim] (== token_embedding when shared)

 private:
  LlamaConfig config_;
  std::vector<float> data_;
};

/// Floats after the header in a checkpoint with this config (file bytes = 28 + 4 x this).
/// Precondition: validate_config passed.
[[nodiscard]] int64_t weights_floats(const LlamaConfig& config);

/// Reads a llama2.c checkpoint. The header is validated and the expected file length computed
/// before anything large is allocated, so a corrupt header cannot cause a huge allocation.
/// Errors: throws pagedkv::Error "model file <path>: <problem>" (one line) when the file is
/// missing or unreadable, shorter than the 28-byte header, has a zero/negative dimension,
/// n_heads not a multiple of n_kv_heads, or a length different from what the header implies.
[[nodiscard]] LlamaWeights load_checkpoint(const std::string& path);

/// Writes a checkpoint in the same format (tests use it to make good and bad files).
/// Errors: throws pagedkv::Error naming the path if it cannot be written.
void save_checkpoint(const LlamaWeights& weights, const std::string& path);

/// The random model's default configuration (`pagedkv generate --model random` without shape
/// flags): dim 512, hidden 1376, 4 layers, 8 heads, 4 kv heads
/// (head_size 64, GQA group 2), vocab 1024 (byte-level tokenizer, see Tokenizer::builtin),
/// seq_len 512, separate classifier. 12.65 M parameters; see docs/model.md for the sizing.
[[nodiscard]] LlamaConfig builtin_config();

/// Seeded random weights for `config`: every projection uniform in +-1/sqrt(fan_in) (so
/// activations keep their scale through the layers), embeddings uniform in [-1, 1], norm
/// weights 1. Deterministic across platforms (splitmix64, no std distributions).
/// Errors: throws pagedkv::Error on an invalid config.
[[nodiscard]] LlamaWeights random_weights(const LlamaConfig& config, uint64_t seed);

}  // namespace pagedkv::model
