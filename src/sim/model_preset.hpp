#pragma once
/// @file model_preset.hpp
/// KV-cache geometry of published model architectures, for memory arithmetic and trace replay.
/// Only the numbers that size the KV cache are kept (layers, KV heads, head_dim, dtype, context);
/// weights are never needed (only their count, for the step-time model).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "pagedkv/dtype.hpp"

namespace pagedkv::sim {

/// The KV-relevant architecture of one model.
/// Units: context and window in tokens; bytes from kv_bytes_per_token() in bytes.
struct ModelPreset {
  std::string name;           ///< CLI key, lowercase, e.g. "llama-3-8b"
  std::string display;        ///< human name, e.g. "Llama-3-8B"
  int32_t num_layers = 0;     ///< L
  int32_t num_heads = 0;      ///< query heads (informational: KV size does not depend on it)
  int32_t num_kv_heads = 0;   ///< H_kv (== num_heads for MHA, fewer for GQA)
  int32_t head_dim = 0;       ///< D
  DType dtype = DType::kF16;  ///< default KV storage dtype of the released checkpoint
  int64_t max_context = 0;    ///< maximum positions per sequence, tokens
  /// Attention window of the local layers, tokens; 0 = none. A query at position t sees
  /// positions (t - W, t].
  int64_t sliding_window = 0;
  /// Chunked local attention of the local layers (Llama 4), tokens; 0 = none. A query at
  /// position t sees positions [floor(t / C) x C, t]. At most one of sliding_window and
  /// attention_chunk is set.
  int64_t attention_chunk = 0;
  /// Layers with local attention (the window or the chunk), in [0, L]; the other L - this
  /// layers attend to every position. 0 when neither sliding_window nor attention_chunk is set;
  /// >= 1 when one is (L: every layer local, as Mistral-7B v0.1). The KV cache groups of the
  /// hybrid cache (docs/memory.md, "Hybrid models"): a full group of L - local layers and a local
  /// group.
  int32_t num_local_layers = 0;
  std::string source;  ///< where the numbers come from
  /// Total parameters N of the checkpoint (Hugging Face's count), for the roofline step-time
  /// model's weight bytes and 2N FLOPs per token (step_time.hpp); 0 = unknown.
  int64_t num_params = 0;
};

/// Every built-in preset, in a fixed order: gpt2, llama-2-7b, llama-3-8b, llama-3.1-8b,
/// llama-3.1-70b, mistral-7b, qwen2.5-7b, opt-13b, gemma-3-27b, gpt-oss-20b, gpt-oss-120b,
/// llama-4-scout, builtin, stories260k.
[[nodiscard]] std::span<const ModelPreset> model_presets();

/// The preset called `name` (case-insensitive; "_" and "-" are interchangeable).
/// Errors: throws pagedkv::Error naming `name` and listing the known presets.
[[nodiscard]] const ModelPreset& find_preset(std::string_view name);

/// Comma-separated preset names, for help texts and error messages.
[[nodiscard]] std::string preset_names();

/// Checks that every size is >= 1 (max_context >= 1, sliding_window >= 0, attention_chunk >= 0,
/// not both set) and num_local_layers in [1, L] with a window or chunk, 0 without.
/// Errors: throws pagedkv::Error naming the field and value.
void validate(const ModelPreset& preset);

/// KV-cache bytes of one token position in every layer: 2 x L x H_kv x D x sizeof(dtype)
/// (kv_bytes_for_tokens with T = 1; source: Kwon et al., SOSP 2023, sec. 2).
/// Example: Llama-2-7B fp16: 2 x 32 x 32 x 128 x 2 = 524,288 bytes (0.5 MiB).
[[nodiscard]] int64_t kv_bytes_per_token(const ModelPreset& preset);

/// Positions a LOCAL layer of a sequence of `num_tokens` tokens must keep cached, those the
/// query at num_tokens - 1 sees: num_tokens without a window or chunk; min(num_tokens,
/// sliding_window) with a window (a rolling buffer; Mistral 7B, Jiang et al. 2023, sec. 2
/// "Rolling Buffer Cache"); ((num_tokens - 1) mod C) + 1 with a chunk C (0 for 0 tokens).
/// Precondition: num_tokens >= 0. Example: W = 8, T = 20 -> 8; C = 8, T = 20 -> 4.
[[nodiscard]] int64_t cached_positions(const ModelPreset& preset, int64_t num_tokens);

/// Bytes the whole model must keep for a `num_tokens`-token sequence when each layer keeps only
/// what its attention sees: 2 x H_kv x D x sizeof(dtype) x ((L - L_local) x T + L_local x
/// cached_positions(T)). Equals kv_bytes_for_tokens(T) without local layers.
/// Precondition: num_tokens >= 0.
[[nodiscard]] int64_t hybrid_kv_bytes(const ModelPreset& preset, int64_t num_tokens);

/// Logical blocks of `block_size` tokens a local layer of a `num_tokens`-token sequence must
/// hold: those that cover a position cached_positions() keeps, i.e. ceil(T / bs) - floor(first
/// kept position / bs); blocks wholly before the first kept position are released. Equals
/// ceil(T / bs) without a window or chunk. Precondition: num_tokens >= 0, block_size >= 1.
/// Example: W = 8, bs = 4, T = 13 -> keeps positions 5..12, blocks 1..3 -> 3.
[[nodiscard]] int64_t local_blocks_held(const ModelPreset& preset, int64_t num_tokens,
                                        int32_t block_size);

/// Bytes of whole blocks the hybrid cache holds for one sequence: full group ceil(T / bs)
/// blocks of L - L_local layers, local group local_blocks_held() blocks of L_local layers, each
/// block bs x 2 x H_kv x D x sizeof(dtype) bytes per layer (one page size for both groups).
/// Precondition: num_tokens >= 0, block_size >= 1.
[[nodiscard]] int64_t hybrid_paged_bytes(const ModelPreset& preset, int64_t num_tokens,
                                         int32_t block_size);

/// Explicit architecture numbers that replace a preset's (command-line --layers, --kv-heads,
/// --head-dim, --dtype, --max-context, --sliding-window).
struct ModelOverrides {
  std::optional<int32_t> num_layers;
  std::optional<int32_t> num_kv_heads;
  std::optional<int32_t> head_dim;
  std::optional<DType> dtype;
  std::optional<int64_t> max_context;
  std::optional<int64_t> sliding_window;
  /// Layers with local attention; with sliding_window set on a preset without local layers,
  /// every layer becomes local.
  std::optional<int32_t> num_local_layers;
};

/// `base` with every set override applied; the name becomes "custom" and the source notes the
/// overrides when any is set. Errors: throws pagedkv::Error if the result is invalid.
[[nodiscard]] ModelPreset apply_overrides(const ModelPreset& base, const ModelOverrides& o);

}  // namespace pagedkv::sim
