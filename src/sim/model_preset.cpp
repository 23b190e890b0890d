#include "sim/model_preset.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "core/check.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv::sim {

namespace {

// Numbers from each model's released config.json (Hugging Face) or paper, as cited in `source`.
// head_dim = hidden_size / num_attention_heads in every case here. The last field, the parameter
// count, is the checkpoint's total as its Hugging Face page reports it (0 for the built-in model).
const std::array<ModelPreset, 14>& table() {
  static const std::array<ModelPreset, 14> presets = {{
      {"gpt2", "GPT-2 small (124M)", 12, 12, 12, 64, DType::kF32, 1024, 0, 0, 0,
       "Radford et al. 2019; HF openai-community/gpt2 config.json: n_layer 12, n_head 12, "
       "n_embd 768, n_positions 1024 (fp32 checkpoint)",
       124439808},
      {"llama-2-7b", "Llama-2-7B", 32, 32, 32, 128, DType::kF16, 4096, 0, 0, 0,
       "Touvron et al. 2023 (Llama 2), Table 1; HF meta-llama/Llama-2-7b-hf config.json: "
       "32 layers, 32 heads, no GQA, hidden 4096, max_position_embeddings 4096, float16",
       6738415616},
      {"llama-3-8b", "Llama-3-8B", 32, 32, 8, 128, DType::kBF16, 8192, 0, 0, 0,
       "Meta Llama 3 model card; HF meta-llama/Meta-Llama-3-8B config.json: 32 layers, "
       "32 heads, 8 kv heads, hidden 4096, max_position_embeddings 8192, bfloat16",
       8030261248},
      {"llama-3.1-8b", "Llama-3.1-8B", 32, 32, 8, 128, DType::kBF16, 131072, 0, 0, 0,
       "Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3: 32 layers, model dim 4096, "
       "32 heads, 8 kv heads, context 128K; HF meta-llama/Llama-3.1-8B config.json: "
       "max_position_embeddings 131072, bfloat16",
       8030261248},
      {"llama-3.1-70b", "Llama-3.1-70B", 80, 64, 8, 128, DType::kBF16, 131072, 0, 0, 0,
       "Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3: 80 layers, model dim 8192, "
       "64 heads, 8 kv heads, context 128K; HF meta-llama/Llama-3.1-70B config.json: "
       "max_position_embeddings 131072, bfloat16",
       70553706496},
      {"mistral-7b", "Mistral-7B v0.1", 32, 32, 8, 128, DType::kBF16, 8192, 4096, 0, 32,
       "Jiang et al. 2023 (Mistral 7B), Table 1: 32 layers, 32 heads, 8 kv heads, head_dim "
       "128, window_size 4096, context_len 8192; bfloat16 checkpoint",
       7241732096},
      {"qwen2.5-7b", "Qwen2.5-7B", 28, 28, 4, 128, DType::kBF16, 32768, 0, 0, 0,
       "Qwen2.5 Technical Report (2024), Table 1; HF Qwen/Qwen2.5-7B-Instruct config.json: "
       "28 layers, 28 heads, 4 kv heads, hidden 3584, max_position_embeddings 32768 "
       "(131072 with YaRN), bfloat16",
       7615616512},
      {"opt-13b", "OPT-13B", 40, 40, 40, 128, DType::kF16, 2048, 0, 0, 0,
       "Zhang et al. 2022 (OPT), Table 1: 40 layers, 40 heads, d_model 5120, context 2048; "
       "fp16 checkpoint; 12.85B parameters (HF facebook/opt-13b); the vLLM paper's one-A100-40GB "
       "model (Kwon et al., SOSP 2023, sec. 6.1)",
       12853473280},
      {"gemma-3-27b", "Gemma-3-27B", 62, 32, 16, 128, DType::kBF16, 131072, 1024, 0, 52,
       "Gemma 3 Technical Report (2025), sec. 2 (5 local layers per global one, local span "
       "1024); HF google/gemma-3-27b-it config.json text_config: num_hidden_layers 62, "
       "num_attention_heads 32, num_key_value_heads 16, head_dim 128, sliding_window 1024, "
       "sliding_window_pattern 6 (layer i global when (i + 1) mod 6 == 0: 10 global, 52 local), "
       "max_position_embeddings 131072, bfloat16; 27.4B parameters (HF page)",
       27400000000},
      {"gpt-oss-20b", "gpt-oss-20b", 24, 64, 8, 64, DType::kBF16, 131072, 128, 0, 12,
       "OpenAI gpt-oss model card (2025), Table 1 and sec. 2.3 (alternating banded window of "
       "128 tokens and dense layers); HF openai/gpt-oss-20b config.json: num_hidden_layers 24, "
       "num_attention_heads 64, num_key_value_heads 8, head_dim 64, sliding_window 128, "
       "layer_types alternating sliding_attention / full_attention (12 each), "
       "max_position_embeddings 131072; bf16 KV; 20.9B parameters (model card)",
       20900000000},
      {"gpt-oss-120b", "gpt-oss-120b", 36, 64, 8, 64, DType::kBF16, 131072, 128, 0, 18,
       "OpenAI gpt-oss model card (2025), Table 1 and sec. 2.3; HF openai/gpt-oss-120b "
       "config.json: num_hidden_layers 36, num_attention_heads 64, num_key_value_heads 8, "
       "head_dim 64, sliding_window 128, layer_types alternating sliding_attention / "
       "full_attention (18 each), max_position_embeddings 131072; bf16 KV; 116.8B parameters "
       "(model card)",
       116800000000},
      {"llama-4-scout", "Llama-4-Scout-17B-16E", 48, 40, 8, 128, DType::kBF16, 10485760, 0, 8192,
       36,
       "HF meta-llama/Llama-4-Scout-17B-16E config.json text_config: num_hidden_layers 48, "
       "num_attention_heads 40, num_key_value_heads 8, head_dim 128, attention_chunk_size 8192, "
       "no_rope_layers: every 4th layer global (NoPE, full attention), the other 36 chunked "
       "local; max_position_embeddings 10485760 (10M); bfloat16; 109B total parameters (model "
       "card)",
       109000000000},
      {"builtin", "pagedkv built-in model", 4, 8, 4, 64, DType::kF32, 512, 0, 0, 0,
       "src/model/checkpoint.hpp builtin_config(): dim 512, 4 layers, 8 heads, 4 kv heads, "
       "seq_len 512; fp32 cache",
       0},
      {"stories260k", "stories260K (llama2.c)", 5, 8, 4, 8, DType::kF32, 512, 0, 0, 0,
       "karpathy/tinyllamas stories260K checkpoint header: dim 64, 5 layers, 8 heads, "
       "4 kv heads, seq_len 512 (shared/models/SOURCES.md); fp32 cache",
       260000},
  }};
  return presets;
}

std::string normalize(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (char c : name) {
    out.push_back(c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

}  // namespace

std::span<const ModelPreset> model_presets() { return table(); }

std::string preset_names() {
  std::string names;
  for (const ModelPreset& p : table()) {
    if (!names.empty()) names += ", ";
    names += p.name;
  }
  return names;
}

const ModelPreset& find_preset(std::string_view name) {
  const std::string key = normalize(name);
  for (const ModelPreset& p : table()) {
    if (p.name == key) return p;
  }
  detail::fail("unknown model preset '{}' (known: {})", name, preset_names());
}

void validate(const ModelPreset& p) {
  PAGEDKV_CHECK(p.num_layers >= 1, "model '{}': layers must be >= 1, got {}", p.name, p.num_layers);
  PAGEDKV_CHECK(p.num_kv_heads >= 1, "model '{}': kv heads must be >= 1, got {}", p.name,
                p.num_kv_heads);
  PAGEDKV_CHECK(p.head_dim >= 1, "model '{}': head_dim must be >= 1, got {}", p.name, p.head_dim);
  PAGEDKV_CHECK(p.max_context >= 1, "model '{}': max context must be >= 1, got {}", p.name,
                p.max_context);
  PAGEDKV_CHECK(p.sliding_window >= 0, "model '{}': sliding window must be >= 0, got {}", p.name,
                p.sliding_window);
  PAGEDKV_CHECK(p.attention_chunk >= 0, "model '{}': attention chunk must be >= 0, got {}", p.name,
                p.attention_chunk);
  PAGEDKV_CHECK(p.sliding_window == 0 || p.attention_chunk == 0,
                "model '{}': sliding window {} and attention chunk {} cannot both be set", p.name,
                p.sliding_window, p.attention_chunk);
  const bool local = p.sliding_window > 0 || p.attention_chunk > 0;
  PAGEDKV_CHECK(local ? p.num_local_layers >= 1 && p.num_local_layers <= p.num_layers
                      : p.num_local_layers == 0,
                "model '{}': local layers must be in [{}, {}] ({}), got {}", p.name, local ? 1 : 0,
                local ? p.num_layers : 0,
                local ? "a window or chunk is set" : "no window or chunk is set",
                p.num_local_layers);
}

ModelPreset apply_overrides(const ModelPreset& base, const ModelOverrides& o) {
  ModelPreset p = base;
  std::string changed;
  auto note = [&](const char* what, auto value) {
    changed += fmt::format("{}{} {}", changed.empty() ? "" : ", ", what, value);
  };
  if (o.num_layers) p.num_layers = *o.num_layers, note("layers", *o.num_layers);
  if (o.num_kv_heads) p.num_kv_heads = *o.num_kv_heads, note("kv heads", *o.num_kv_heads);
  if (o.head_dim) p.head_dim = *o.head_dim, note("head_dim", *o.head_dim);
  if (o.dtype) p.dtype = *o.dtype, note("dtype", dtype_name(*o.dtype));
  if (o.max_context) p.max_context = *o.max_context, note("max context", *o.max_context);
  if (o.sliding_window) {
    p.sliding_window = *o.sliding_window, note("window", *o.sliding_window);
    // A window given to a model without local layers applies to every layer (Mistral-style);
    // a window of 0 makes every layer full.
    if (p.sliding_window == 0 && p.attention_chunk == 0) p.num_local_layers = 0;
    if (p.sliding_window > 0 && p.num_local_layers == 0) p.num_local_layers = p.num_layers;
  }
  if (o.num_local_layers)
    p.num_local_layers = *o.num_local_layers, note("local layers", *o.num_local_layers);
  if (!changed.empty()) {
    // Architecture changes make a different model; a context or dtype change alone does not.
    const bool arch = o.num_layers || o.num_kv_heads || o.head_dim || o.num_local_layers;
    if (arch) {
      p.name = "custom";
      p.display = fmt::format("custom (from {})", base.display);
    }
    p.source = fmt::format("{}; overridden: {}", base.source, changed);
  }
  validate(p);
  return p;
}

int64_t kv_bytes_per_token(const ModelPreset& p) {
  return kv_bytes_for_tokens(p.num_layers, p.num_kv_heads, p.head_dim, p.dtype, 1);
}

int64_t cached_positions(const ModelPreset& p, int64_t num_tokens) {
  if (p.sliding_window > 0) return std::min(num_tokens, p.sliding_window);
  if (p.attention_chunk > 0) return num_tokens == 0 ? 0 : (num_tokens - 1) % p.attention_chunk + 1;
  return num_tokens;
}

int64_t hybrid_kv_bytes(const ModelPreset& p, int64_t num_tokens) {
  const int32_t full = p.num_layers - p.num_local_layers;
  return kv_bytes_for_tokens(full, p.num_kv_heads, p.head_dim, p.dtype, num_tokens) +
         kv_bytes_for_tokens(p.num_local_layers, p.num_kv_heads, p.head_dim, p.dtype,
                             cached_positions(p, num_tokens));
}

int64_t local_blocks_held(const ModelPreset& p, int64_t num_tokens, int32_t block_size) {
  const int64_t first_kept = num_tokens - cached_positions(p, num_tokens);
  return blocks_for_tokens(num_tokens, block_size) - first_kept / block_size;
}

int64_t hybrid_paged_bytes(const ModelPreset& p, int64_t num_tokens, int32_t block_size) {
  const int32_t full = p.num_layers - p.num_local_layers;
  const int64_t full_blocks = blocks_for_tokens(num_tokens, block_size);
  const int64_t local_blocks = local_blocks_held(p, num_tokens, block_size);
  return kv_bytes_for_tokens(full, p.num_kv_heads, p.head_dim, p.dtype, full_blocks * block_size) +
         kv_bytes_for_tokens(p.num_local_layers, p.num_kv_heads, p.head_dim, p.dtype,
                             local_blocks * block_size);
}

}  // namespace pagedkv::sim
