#pragma once
/// @file generate.hpp
/// Autoregressive generation for a batch of prompts with one cache mode, with the timings and
/// memory figures `pagedkv generate` reports, and the cross-mode agreement check.
///
/// Counting follows the llama2.c reference runtime (run.c generate()): `steps` is the number of
/// positions forwarded per sequence, prompt included. Position p's logits predict token p + 1;
/// for p < prompt_len - 1 that token is forced from the prompt, afterwards it is sampled. A
/// sequence stops when it samples BOS (id 1, not appended) or after `steps` positions, so it
/// ends with at most steps + 1 tokens. The prompt is prefilled in one forward pass (all
/// sequences together), then every unfinished sequence advances one token per decode step.

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "model/kv_backend.hpp"
#include "model/kv_shadow.hpp"
#include "model/llama.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv::model {

/// What the cache holds before the measured pass (docs/tiers.md, "Measured"). kPool: the same
/// prompts run once first on the same cache (the whole generation, then freed), so the measured
/// pass's prompts hit the blocks that pass published in the pool. kTiers: the same, then the
/// pool's prefix cache is dropped (KVBackend::drop_prefix_cache: every cached block written
/// down to the tiers, the stores finished), so the hits come from the nearest tier instead.
enum class WarmPass : uint8_t { kNone, kPool, kTiers };

/// "none", "pool", "tiers".
[[nodiscard]] const char* warm_pass_name(WarmPass w);
/// Inverse of warm_pass_name; empty for anything else.
[[nodiscard]] std::optional<WarmPass> parse_warm_pass(std::string_view name);

struct GenerateOptions {
  int32_t steps = 256;         ///< positions per sequence, prompt included; >= prompt length
  float temperature = 0.0f;    ///< 0 = greedy argmax (first maximum); > 0 samples softmax(l / T)
  uint64_t seed = 42;          ///< sampling seed (sequence i draws from its own stream)
  int32_t block_size = 16;     ///< paged / none modes, tokens per block
  bool record_logits = false;  ///< keep the logits of every forwarded position
  /// Where the cache lives; Device::kCuda only with the paged mode (make_kv_backend).
  Device device = Device::kCpu;
  /// Storage dtype of the paged mode's KV (the contiguous and none modes stay fp32, so a run of
  /// all three measures what an 8-bit or 16-bit paged cache changes).
  DType kv_dtype = DType::kF32;
  /// Calibration headroom of 8-bit pools (KVCacheConfig::calibration_headroom), shadows included.
  float kv_scale_headroom = 1.0f;
  /// Paged mode on the CPU: automatic prefix caching across the run's prompts.
  bool prefix_caching = false;
  /// Paged mode on the CPU: tiers below the pool and KV events (docs/tiers.md); implies
  /// prefix caching. The paged run's cached prompt positions are not forwarded (no logits).
  TieringOptions tiering;
  /// Paged mode with prefix caching: a first, unmeasured pass of the same prompts (WarmPass).
  /// RunStats and the outputs are the measured pass's; the tiers' counters cover both.
  WarmPass warm_pass = WarmPass::kNone;
  /// Teacher-forced storage error (kv_shadow.hpp): with the paged mode on the CPU, one shadow
  /// paged cache per dtype here is fed the same q/k/v as the run's cache, and the NMSE of its
  /// attention outputs is reported in GenerateResult::shadow_errors. Empty: none.
  std::vector<DType> shadow_kv_dtypes;
  /// [n_layers] each layer's attention (layer_attention_from_pattern), or empty: all full.
  /// Every mode applies the layers' masks (the contiguous mode is then the reference with the
  /// same per-layer masks); the paged mode runs the hybrid paged cache (KV cache groups over
  /// one pool, KVBackendConfig::layer_attention); not with prefix caching or tiers.
  std::vector<KVCacheGroupSpec> layer_attention;
};

struct SequenceOutput {
  std::vector<TokenId> prompt_ids;  ///< as given (normally BOS first)
  std::vector<TokenId> ids;         ///< prompt then generated tokens (a final BOS is not kept)
  int64_t positions_run = 0;        ///< positions forwarded (<= steps)
  int64_t num_generated = 0;        ///< sampled tokens kept: ids.size() - prompt_ids.size()
  bool stopped_on_bos = false;
  /// [positions_run, vocab] when GenerateOptions::record_logits; row p = logits at position p.
  std::vector<float> logits;
};

/// Timing and memory of one run. Units: ms, bytes, tokens.
struct RunStats {
  CacheMode mode = CacheMode::kPaged;
  Device device = Device::kCpu;  ///< where the cache was
  double ttft_ms = 0;            ///< the prefill step, first tokens sampled
  std::vector<double> tpot_ms;   ///< one entry per decode step (one token per active sequence)
  double total_ms = 0;
  int64_t tokens_generated = 0;  ///< sampled tokens kept, all sequences
  int64_t kv_bytes_in_use = 0;   ///< what the cache holds at the end (before freeing)
  int64_t kv_tokens_in_use = 0;  ///< positions cached at the end, all sequences
  /// What a contiguous cache reserving seq_len positions per sequence up front would take.
  int64_t contiguous_reservation_bytes = 0;
  int64_t pool_bytes = 0;     ///< paged/none: the page pool allocated; contiguous: 0
  int64_t prompt_tokens = 0;  ///< prompt tokens of every sequence
  /// Of those, tokens not prefilled: prefix hits in the pool plus blocks onboarded from tiers.
  int64_t prompt_tokens_cached = 0;
  TieringReport tiering;  ///< what the tiers did (paged mode with tiers)
  /// Hybrid paged mode (a layer pattern): KV per group at the end ([num_groups]); else empty.
  std::vector<GroupKVUsage> kv_groups;
  /// What an all-full paged cache of the same block size would hold for the tokens cached at
  /// the end: sum over sequences of ceil(tokens / block_size) blocks x every layer's block
  /// bytes, in the paged mode's dtype. Units: bytes. Set by the paged and none modes.
  int64_t kv_bytes_all_full = 0;

  [[nodiscard]] double tokens_per_s() const;
  /// Share of the max-length reservation not holding a token: 1 - kv_bytes_in_use / reservation.
  [[nodiscard]] double wasted_share() const;
};

/// mean, p50, p99 (nearest rank) of a sample; zeros when empty.
struct Summary {
  double mean = 0, p50 = 0, p99 = 0;
};
[[nodiscard]] Summary summarize(std::vector<double> values);

struct GenerateResult {
  std::vector<SequenceOutput> seqs;
  RunStats stats;
  /// One per GenerateOptions::shadow_kv_dtypes, in that order.
  std::vector<ShadowError> shadow_errors;
};

/// Generates for every prompt, as one batch, with cache `mode`.
/// Errors: throws pagedkv::Error if prompts is empty, a prompt is empty or longer than steps,
/// steps < 1, block_size < 1, temperature < 0 or not finite, a token id is out of range, or the
/// page pool (sequences x ceil(steps / block_size) blocks, paged and none) would exceed 8 GiB;
/// a warm pass without the paged mode and prefix caching, without a tier (kTiers) or with
/// shadow dtypes; with options.device == Device::kCuda, as make_kv_backend (no device, another
/// mode, a geometry the CUDA kernels do not support); with shadow_kv_dtypes, if the mode is not
/// paged or the device not the CPU, and as ShadowKVBackend.
[[nodiscard]] GenerateResult generate(LlamaModel& model,
                                      const std::vector<std::vector<TokenId>>& prompts,
                                      CacheMode mode, const GenerateOptions& options);

/// How two runs of the same prompts agree.
struct Agreement {
  bool same_tokens = true;  ///< every sequence's ids and stop reason are equal
  /// First (sequence, index in ids) where they differ; -1 when same_tokens. A different number
  /// of sequences diverges at (the smaller count, 0).
  int64_t diverge_seq = -1;
  int64_t diverge_index = -1;
  /// False when the runs end differently with no sampled token to explain it: a different
  /// number of sequences; a sequence whose ids are a strict prefix of the other's although it
  /// did not stop on BOS (it was cut short); a sequence with equal ids whose positions run
  /// differ; or logits whose rows or vocabulary differ from positions_run and the other run's.
  /// A disagreement even when every compared logit agrees.
  bool same_lengths = true;
  int64_t length_seq = -1;  ///< first sequence with a length mismatch; -1 when same_lengths
  /// Largest |logit_a - logit_b| over positions both runs forwarded with identical inputs;
  /// NaN against a number (or +inf against -inf) counts as +infinity, NaN against NaN and equal
  /// infinities as 0. -1 when either run did not record logits.
  double max_abs_logit_diff = -1;
  /// Mean |logit_a - logit_b| over the same logits (every vocabulary entry of every compared
  /// position), the same NaN and infinity rules; -1 when either run did not record logits, 0
  /// when no position was comparable.
  double mean_abs_logit_diff = -1;
  int64_t positions_compared = 0;
};
[[nodiscard]] Agreement compare_runs(const GenerateResult& a, const GenerateResult& b);

}  // namespace pagedkv::model
