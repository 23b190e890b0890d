#pragma once
/// @file replay.hpp
/// Continuous-batching scheduler simulation over a request trace, on the real KVCacheManager
/// (metadata only: no K/V data, no attention math), under a KV memory budget.
///
/// Time: with the constant model (ReplayConfig::roofline unset) every scheduler step lasts
/// step_ms and a request arriving at t ms becomes visible at step floor(t / step_ms). With the
/// roofline model (step_time.hpp) each step lasts what its work costs on the hardware preset,
/// and a request is visible to the first step that starts at or after its arrival. Swap copies
/// (below) lengthen the step that makes them, under either model. One step:
///  1. arrivals join the tail of the waiting queue (trace order); a request with
///     P + O > max_context is rejected (all strategies alike);
///  2. running requests, oldest admission first, each take their next tokens from the step's
///     token budget (chunked prefill, vLLM max_num_batched_tokens): the next prefill chunk
///     min(remaining, budget), or one decode position. A decode that gets no memory preempts the
///     newest running request, repeatedly, possibly itself (vLLM's policy): its memory is
///     released and it rejoins the FRONT of the waiting queue. Recompute (the default) prefills
///     prompt + generated tokens again on re-admission; swap (Kwon et al., SOSP 2023, sec. 4.5)
///     copies its positions to host memory now and back at re-admission, each copy taking
///     positions x kv_bytes_per_token / host_link_bytes_per_s (host memory is unlimited);
///  3. waiting requests are admitted first-come-first-served while the budget, max_seqs and the
///     memory strategy allow (head-of-line blocking: a request that does not fit stops
///     admission; one that can never fit is rejected); admission assigns the request its whole
///     prefill target, as KVCacheManager::add_sequence does, and runs its first chunk;
///  4. the step's forward pass has run: each running request's computed positions are
///     committed (KVCacheManager::commit), and only their full blocks become shareable with
///     later prompts (not with a prompt admitted in the same step, whose K/V were not written);
///  5. memory is sampled (live positions, reserved positions, running count), then requests
///     that have produced all their output tokens are released.
/// Token accounting: prefill assigns the prompt's P positions, and each decode step adds one
/// position and yields one output token, so a finished request holds exactly P + O positions.
/// "Live" positions are those assigned to a token (prompt positions count from admission, even
/// while their chunked prefill is still running). Idle stretches (nothing running or waiting)
/// are skipped in O(1) but still count as time.
///
/// Memory strategies (all under the same budget):
///  - contiguous-max: reserves max_context positions per request at admission (static-batching
///    servers such as FasterTransformer pre-allocate the maximum length);
///  - contiguous-exact: reserves exactly P + O positions (an oracle that knows the output length);
///  - paged-<bs>: KVCacheManager with block_size bs and the configured watermark; admission
///    (can_add_sequence / add_sequence), decode growth (append_slots) and recompute preemption
///    (preempt) all through the manager's API;
///  - prefix-<bs>: the same with prefix caching on: prompts carry synthesized token ids (see
///    synthesize_tokens), decode appends record theirs (append_tokens), and cached blocks are
///    evicted LRU by the manager when the pool runs short;
///  - hybrid-<bs>: HybridKVCacheManager over the KV cache groups of ReplayConfig::model
///    (hybrid_layout.hpp: pages of G layers, budget / page bytes pages, the null block not
///    charged), so local layers release what left their window or chunk. The manager has no
///    admission query or watermark, so the pool adds them as paged-<bs> has them (kOk when the
///    free pages after the prompt stay >= floor(watermark x pages); kNever when the request's
///    peak alone exceeds pages - that). The prompt is appended at admission in pieces of
///    max_batch_tokens (the remainder first), so a local group holds what the largest prefill
///    chunk reads (window or chunk + one chunk), as vLLM's per-chunk allocation does, not the
///    whole prompt. Recompute preemption only (free_sequence; swap and prefix caching are not
///    in the manager yet, issue 17); no sharing groups.
/// Contiguous strategies are modelled as an ideal allocator (no external fragmentation), which
/// favours them. No attention is computed and batch_metadata() is not built (the replay only
/// needs the block accounting).
///
/// Memory use is O(active requests) besides the trace itself: percentiles come from fixed
/// histograms and the time series from a fixed number of buckets that merge as time grows.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/types.hpp"
#include "sim/model_preset.hpp"
#include "sim/sharing.hpp"
#include "sim/step_time.hpp"
#include "sim/strategy.hpp"
#include "sim/tier_sim.hpp"
#include "sim/trace.hpp"

namespace pagedkv::sim {

/// Preemption mode (vLLM's preemption_mode): discard and recompute, or swap to host memory.
enum class Preemption { kRecompute, kSwap };

/// Scheduler and memory parameters shared by every strategy of a run.
struct ReplayConfig {
  /// The model's layers: the KV cache groups of hybrid-<bs> and the need-utilization metric
  /// (ReplayResult::need_util_mean). Unset: hybrid strategies throw, need util is -1. When set,
  /// kv_bytes_per_token must equal kv_bytes_per_token(*model).
  std::optional<ModelPreset> model;
  int64_t kv_memory_bytes = 0;      ///< KV budget, bytes (>= one token)
  int64_t kv_bytes_per_token = 0;   ///< 2 x L x H_kv x D x sizeof(dtype), bytes (>= 1)
  int64_t max_context = 0;          ///< positions per request; longer requests are rejected
  double step_ms = 25.0;            ///< simulated duration of one scheduler step, ms (> 0)
  int64_t max_batch_tokens = 8192;  ///< tokens (prefill + decode) per step (vLLM
                                    ///< max_num_batched_tokens), >= 1
  int32_t max_seqs = 256;           ///< running requests at most (vLLM max_num_seqs), >= 1
  double watermark = 0.01;          ///< paged admission keeps this fraction of blocks free
  int32_t series_points = 400;      ///< time-series resolution of the plots (buckets, >= 2)
  int32_t vocab_size = 32000;       ///< synthesized token ids lie in [3, vocab_size)
  /// Request-rate multiplier: arrival times are divided by it (2 = the trace's requests arrive
  /// twice as fast, 0.5 = half as fast); > 0 and finite.
  double rate_scale = 1.0;
  /// Step-time model: unset = every step lasts step_ms; set = each step's time from the
  /// roofline of its work (step_time.hpp; step_ms is then only the unit of the time series).
  std::optional<RooflineModel> roofline;
  /// What a decode that finds no memory does to its victim (see above).
  Preemption preemption = Preemption::kRecompute;
  /// Swap copies' bandwidth, bytes/s one way (> 0); default PCIe 4 x16 (hardware_preset.hpp).
  double host_link_bytes_per_s = 25e9;
  /// Sharing workload (sharing.hpp): every request becomes a group of group_width sequences
  /// (parallel samples or beams) from its first decode step on; 1 = one sequence per request.
  /// Paged strategies fork the prompt sequence (copy-on-write), contiguous ones reserve
  /// group_width independent copies. Each decode step computes group_width tokens.
  int32_t group_width = 1;
  SharingMode group_mode = SharingMode::kParallelSampling;
  uint64_t beam_seed = 1;  ///< beam search: the survivor choice (seeded_beam_chooser)
  /// Tiers below the pool, nearest first (tier_sim.hpp), for prefix-<bs> strategies only (the
  /// others ignore them): cached blocks are written down per `tier_write`, and a prompt's
  /// blocks that miss in the pool but are found in a tier are loaded (onboarded) instead of
  /// prefilled. Loads are asynchronous: they queue on one load link (each block takes block
  /// bytes / the tier's load bandwidth), the request holds its blocks meanwhile and computes,
  /// and publishes its blocks, only once its load completed; the batch runs on.
  std::vector<ReplayTier> tiers;
  TierWrite tier_write = TierWrite::kOnEviction;
};

/// Checks every field. Errors: throws pagedkv::Error naming the field and value.
void validate(const ReplayConfig& config);

/// Checks that `strategy` can run under `config` (validate(config) first): hybrid-<bs> needs
/// config.model, recompute preemption and group_width 1. replay() calls it; a caller running
/// several strategies can call it for each before running any.
/// Errors: throws pagedkv::Error naming the strategy and what it does not support.
void validate(const ReplayConfig& config, const Strategy& strategy);

/// One bucket of the time series: means over the steps it covers.
struct SeriesPoint {
  double time_s = 0;             ///< bucket centre, simulated seconds
  double utilization = 0;        ///< mean live / reserved over steps with reservations; -1 if none
  double concurrency = 0;        ///< mean running requests
  double waiting = 0;            ///< mean queued requests
  double reserved_fraction = 0;  ///< mean reserved bytes / budget
};

/// What one strategy did with the trace. Invariants: completed + rejected_too_long +
/// rejected_too_large == requests; 0 <= util_p5 <= util_mean <= 1 (up to histogram resolution).
struct ReplayResult {
  std::string strategy;
  int32_t block_size = 0;  ///< 0 for contiguous strategies
  /// Positions the budget holds (whole blocks for paged); hybrid: the positions of every layer
  /// its pages' bytes would hold, pages x block_size x G / L (rounded down).
  int64_t capacity_tokens = 0;
  int32_t num_blocks = 0;  ///< paged and hybrid: pool size (hybrid: without the null block)
  /// hybrid-<bs> (hybrid_layout.hpp): layers per group and page G, KV cache groups, and padded
  /// layer slots (their pages cost memory and hold nothing); 0 for other strategies.
  int32_t layers_per_group = 0;
  int32_t kv_groups = 0;
  int32_t padded_layers = 0;
  int64_t requests = 0;  ///< in the trace
  int64_t completed = 0;
  int64_t rejected_too_long = 0;   ///< P + O > max_context
  int64_t rejected_too_large = 0;  ///< can never fit in the budget under this strategy
  double util_mean = 0;            ///< time-weighted mean of live / reserved bytes (steps with any)
  double util_p5 = 0;              ///< 5th percentile of the same per-step ratio (resolution 1e-4)
  /// KV need utilization: time-weighted mean, over steps with reservations, of needed bytes /
  /// reserved bytes, where needed = for each request, each real layer the positions its
  /// attention sees (needed_layer_positions(model, T) x 2 x H_kv x D x sizeof(dtype); full
  /// layers T, window layers min(T, W), chunked ((T - 1) mod C) + 1) and reserved = the bytes
  /// the strategy holds (hybrid: its pages, padded layers included). For hybrid-<bs> it equals
  /// util_mean (its live bytes are the needed ones); for an all-full strategy on a hybrid model
  /// it shows the local layers' bytes no attention reads. -1 without ReplayConfig::model and
  /// where blocks are shared (prefix-<bs>, group_width > 1: needed per request would count
  /// shared K/V twice).
  double need_util_mean = -1;
  double frag_mean = 0;  ///< time-weighted mean of (reserved - live) / reserved = 1 - util_mean
  double waste_mean_bytes = 0;     ///< time-weighted mean of reserved - live bytes (all steps)
  double reserved_mean_bytes = 0;  ///< time-weighted mean of reserved bytes (all steps)
  int32_t peak_concurrency = 0;    ///< most requests running in one step
  double mean_concurrency = 0;     ///< running requests, time-weighted over all steps
  int64_t preemptions = 0;         ///< preemptions (recompute or swap)
  int64_t recomputed_tokens = 0;   ///< computed positions discarded by recompute preemptions
  int64_t swapped_tokens = 0;      ///< positions copied to host by swap preemptions
  double swap_seconds = 0;         ///< simulated time of all swap copies (out and in), s
  int64_t steps = 0;        ///< simulated steps until the last request finished (the constant model
                            ///< counts idle steps too, the roofline model only steps that ran)
  double mean_step_ms = 0;  ///< mean length of the steps that ran something, ms
  int64_t processed_tokens = 0;   ///< prefill + decode positions written (recompute included)
  int64_t generated_tokens = 0;   ///< output tokens
  double tokens_per_step = 0;     ///< processed_tokens / steps
  double generated_per_step = 0;  ///< generated_tokens / steps
  double queue_mean_steps = 0;    ///< first admission step - arrival step, over admitted
  double queue_p99_steps = 0;     ///< nearest-rank 99th percentile of the same
  int64_t prompt_tokens = 0;      ///< prompt positions of admitted requests (first admission)
  /// Prefix caching (manager stats): prompt positions looked up (re-admissions after a
  /// preemption included), served from the cache, their ratio, and cached blocks evicted.
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  double prefix_hit_rate = 0;
  int64_t prefix_evictions = 0;
  /// Tiers (ReplayConfig::tiers; empty without): per tier, nearest first. Prompt tokens served
  /// from the pool are prefix_hit_tokens, from the tiers the sum of their hit_tokens.
  std::vector<ReplayTierResult> tiers;
  /// Latency and throughput in simulated time (a token is delivered at the end of the step
  /// that computed it). TTFT: arrival to the first output token (to the end of
  /// the prefill for output 0); TPOT: (end-to-end - TTFT) / (output - 1), requests with output
  /// >= 2; normalized latency: end-to-end / output tokens, mean over requests with output >= 1,
  /// in s per token (the metric of Kwon et al., SOSP 2023, sec. 6.2). Percentiles nearest-rank
  /// over completed requests; 0 when none qualifies.
  double ttft_p50_ms = 0;
  double ttft_p99_ms = 0;
  double tpot_p50_ms = 0;
  double tpot_p99_ms = 0;
  double normalized_latency_s = 0;
  double throughput_rps = 0;       ///< completed requests / simulated seconds (all steps)
  double output_tokens_per_s = 0;  ///< generated tokens / simulated seconds
  double wall_seconds = 0;         ///< host time the simulation took
  std::vector<SeriesPoint> series;
};

/// Called now and then with (requests finished or rejected, requests in the trace).
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

/// Replays `trace` under one strategy. Deterministic: same inputs, same result (wall time aside).
/// Errors: throws pagedkv::Error if the config is invalid or the budget holds no block of a
/// paged strategy; running out of memory is never an error.
[[nodiscard]] ReplayResult replay(const Trace& trace, const ReplayConfig& config,
                                  const Strategy& strategy, const ProgressFn& progress = {});

/// Synthesized token ids for positions [begin, end) of request `index`: positions inside the
/// prompt covered by hash ids take their ids from the hash of their 512-token block (equal hash
/// ids -> equal tokens, so a prefix cache can share them), every other position is unique to
/// the request. Ids lie in [3, vocab_size) (0-2 are <unk>/BOS/EOS).
/// Errors: throws pagedkv::Error if begin > end or index is out of range.
[[nodiscard]] std::vector<TokenId> synthesize_tokens(const Trace& trace, size_t index,
                                                     int64_t begin, int64_t end,
                                                     int32_t vocab_size);

}  // namespace pagedkv::sim
