#pragma once
/// @file decode_attention.hpp
/// CUDA paged decode attention (and the same kernel over a contiguous cache), with split-K
/// "flash-decoding" for long contexts. Host declarations only; no CUDA headers.
///
/// Kernel (cuda/kernels/decode_attention.cu): one CTA of 128 threads serves up to kHeadsPerCta
/// query heads that share one kv head (GQA: the K/V tile is read once for the whole group), one
/// sequence, and one split of its context. K/V tiles (8 KiB of K + 8 KiB of V) stream into
/// shared memory with cp.async, three deep (two in flight while one is computed); scores,
/// online softmax and P.V accumulate in fp32. Supported configurations:
/// pagedkv/cuda/supported_configs.hpp (head sizes outside the fast list run a generic kernel).
/// DecodeLaunch::use_tensor_cores selects the tensor-core kernel (cuda/kernels/decode_mma.cu)
/// for fp16 / bf16 K/V.
///
/// Split-K (flash-decoding, Dao et al. 2023, "Flash-Decoding for long-context inference"): the
/// context is cut into num_splits chunks processed by separate CTAs; each writes its normalized
/// partial output o_s and log-sum-exp lse_s; a merge kernel combines them exactly:
///   out = sum_s w_s o_s / sum_s w_s,  w_s = exp(lse_s - max_s lse_s).
/// The choice one-pass vs split-K, and the split count, is made by plan_decode() (below).
///
/// CUDA graphs: a launch reads everything that changes between decode steps (context_lens,
/// block tables, q) through device pointers, and its grid depends only on the DecodePlan and
/// on num_seqs. Plan once for the capacity (max batch, max context), keep the metadata in the
/// fixed buffers of DeviceBatchMetadata, capture once, replay after refreshing the buffers. A
/// plan made for a smaller max_context_len is still correct for longer contexts (the last split
/// takes the rest), only slower. See docs/cuda.md.

#include <cstdint>

#include "pagedkv/attention_params.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/supported_configs.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/storage/contiguous_paged_view.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv::cuda {

#ifndef PAGEDKV_DECODE_HEADS_PER_CTA
/// Build-wide override of kHeadsPerCta (default 4). Set only by scripts/gpu_tune.sh's builds,
/// for the whole build (library and includers alike): a program that defines it differently
/// from its library gets launches that disagree with plan_decode.
#define PAGEDKV_DECODE_HEADS_PER_CTA 4
#endif
/// Query heads served by one CTA (all heads of a GQA group up to this many; a larger group is
/// served by ceil(group / kHeadsPerCta) CTAs per kv head).
inline constexpr int32_t kHeadsPerCta = PAGEDKV_DECODE_HEADS_PER_CTA;
/// Upper bound of DecodePlan::num_splits (grid z).
inline constexpr int32_t kMaxSplits = 256;
/// Heuristic: a split is never shorter than this many tokens (below it, the partial-output
/// traffic and merge cost a noticeable fraction of the K/V reads).
inline constexpr int32_t kMinSplitTokens = 256;
/// Heuristic: chunk_tokens is a multiple of this (the largest tile of any configuration).
inline constexpr int32_t kSplitGranularity = 64;
/// Heuristic cost model constant, in "tokens of K/V streamed by one CTA" units: the fixed cost
/// of one CTA (q load, final reduction, output write).
inline constexpr int32_t kCtaOverheadTokens = 64;
/// Heuristic cost model constant, in the same units: the fixed cost of the merge pass of a
/// split-K launch (one more launch plus the partial outputs' round trip).
inline constexpr int32_t kMergeOverheadTokens = 128;

/// How a decode launch divides the context. num_splits == 1 is the one-pass kernel (writes out
/// directly, no workspace, no merge). Otherwise split s of a sequence covers tokens
/// [s * chunk_tokens, (s + 1) * chunk_tokens), and the last split also everything beyond, so
/// any plan is correct for any context length; the plan only decides speed.
struct DecodePlan {
  int32_t num_splits = 1;    ///< in [1, kMaxSplits]
  int32_t chunk_tokens = 0;  ///< tokens per split (> 0 when num_splits > 1)

  /// True when the plan has more than one split: the launch needs a workspace and a merge pass.
  [[nodiscard]] bool split_k() const { return num_splits > 1; }
  /// Field-wise equality (num_splits and chunk_tokens).
  friend bool operator==(const DecodePlan&, const DecodePlan&) = default;
};

/// What plan_decode() needs to know. Pure numbers, so the heuristic is testable without a GPU.
struct DecodePlanInput {
  int32_t num_seqs = 1;         ///< sequences (decode rows) of the launch, >= 1
  int32_t num_heads = 1;        ///< query heads, >= 1 and a multiple of num_kv_heads
  int32_t num_kv_heads = 1;     ///< K/V heads, >= 1
  int64_t max_context_len = 0;  ///< tokens; the longest context of the batch (or the capacity)
  int32_t sm_count = 1;         ///< multiprocessors of the device
  int32_t ctas_per_sm = 1;      ///< resident decode CTAs per multiprocessor (occupancy)
};

/// The split-K heuristic. Let ctas = num_seqs * num_kv_heads * ceil(group / kHeadsPerCta) be
/// the CTAs of a one-pass launch and slots = sm_count * ctas_per_sm the CTAs the device runs at
/// once. If ctas >= slots the one-pass kernel already fills the device: num_splits = 1.
/// Otherwise every split count s in [1, min(kMaxSplits, ceil(max_ctx / kMinSplitTokens))] is
/// scored with a wave model of a memory-bound kernel whose CTAs stream at equal rates:
///   chunk(s) = round_up(ceil(max_ctx / s), kSplitGranularity),  s' = ceil(max_ctx / chunk(s)),
///   cost(s)  = ceil(ctas * s' / slots) * (chunk(s) + kCtaOverheadTokens)
///              + (s' > 1 ? kMergeOverheadTokens : 0),
/// and the cheapest wins (ties: fewer splits). Example (132 SMs x 3 CTAs per SM, 8 kv heads,
/// GQA 4; the current kernel gets 4 CTAs per SM on an H200, docs/cuda.md has that case):
/// batch 1 at 32k tokens -> 47 splits of 704 tokens (one wave of 376 CTAs); batch 32 at 4k ->
/// 3 splits of 1408; batch 64 at 4k (512 CTAs >= 396) -> one pass.
/// Errors: throws pagedkv::Error if a field is out of range (sizes < 1, max_context_len < 0,
/// num_heads not a multiple of num_kv_heads).
[[nodiscard]] DecodePlan plan_decode(const DecodePlanInput& input);

/// A plan with exactly `num_splits` splits covering max_context_len (tests force split-K with
/// it). Errors: throws if num_splits is outside [1, kMaxSplits] or max_context_len < 0.
[[nodiscard]] DecodePlan make_split_plan(int64_t max_context_len, int32_t num_splits);

/// Device workspace a launch with this plan needs: partial outputs [num_seqs, num_heads,
/// num_splits, head_dim] fp32 and log-sum-exps [num_seqs, num_heads, num_splits] fp32, each
/// 256-byte aligned. 0 for a one-pass plan. Units: bytes.
[[nodiscard]] int64_t decode_workspace_bytes(int32_t num_seqs, int32_t num_heads, int32_t head_dim,
                                             const DecodePlan& plan);

/// Everything of a launch that is not the problem itself.
struct DecodeLaunch {
  DecodePlan plan;            ///< one-pass by default
  void* workspace = nullptr;  ///< device; >= decode_workspace_bytes(...) when split_k()
  /// Size of `workspace` in bytes; checked against decode_workspace_bytes() for this plan
  /// (ignored, like workspace, for a one-pass plan).
  int64_t workspace_bytes = 0;
  /// Stream every kernel of the launch is queued on (the attention kernel and, for split-K, the
  /// merge kernel); nullptr is the legacy default stream.
  Stream stream = nullptr;
  /// Run the tensor-core kernel (cuda/kernels/decode_mma.cu; FlashInfer's use_tensor_cores):
  /// the query heads of a kv head, up to 16 per CTA, are the M dimension of mma.sync m16n8k16.
  /// q and the softmax probabilities P are rounded to the K/V dtype for the products (sums in
  /// fp32), so the error against exact attention on the stored K/V is one rounding of q and of
  /// each p (2^-8 relative for bf16, 2^-11 for fp16) instead of the fp32 kernel's ~1e-6.
  /// fp16 / bf16 K/V and head_dim 64, 128, 256 only (pagedkv::Error naming the dtype or
  /// head_dim otherwise). Off by default: compiled, not yet run on a GPU (docs/cuda.md).
  bool use_tensor_cores = false;
};

// ---- launchers (defined only when PAGEDKV_WITH_CUDA is 1) -------------------------------------

/// Occupancy-aware plan for this device: plan_decode() with sm_count from the device and
/// ctas_per_sm from cudaOccupancyMaxActiveBlocksPerMultiprocessor for the kernel that
/// (dtype, head_dim) selects. Errors: as check_decode_config and plan_decode; CUDA errors.
[[nodiscard]] DecodePlan make_decode_plan(const AttentionParams& params, DType dtype,
                                          int32_t num_seqs, int64_t max_context_len);

/// Paged decode attention on the device: out = softmax(q K^T * scale + mask) V for one query
/// per sequence over its context, positions [0, context_len) with window and sinks as in
/// AttentionParams. Asynchronous on launch.stream.
/// Shapes: q, out [tables.num_seqs, params.num_heads, params.head_dim] fp32, device;
/// `tables` holds DEVICE pointers (block_tables [num_seqs, max_blocks_per_seq] int32,
/// context_lens [num_seqs] int32); `cache` views device pools (HND or NHD).
/// Units: context_lens in tokens; a row with context 0 outputs zeros.
/// Preconditions (not checked: they live in device memory): context_lens[i] <=
/// max_blocks_per_seq * block_size, and the block ids covering visible positions are in
/// [0, num_blocks).
/// Errors: throws pagedkv::Error, before any CUDA call, if (cache.dtype, head_dim, block_size)
/// is unsupported, params disagree with the view (check_attention_params), a pointer is null
/// or not 16-byte aligned, a stride is not a multiple of 16 bytes, num_seqs > 65535, the plan
/// is invalid, or the workspace is too small; CUDA launch errors after.
/// Source: PagedAttention (Kwon et al., SOSP 2023); online softmax (Milakov & Gimelshein
/// 2018); split-K merge by log-sum-exp (flash-decoding, Dao et al. 2023).
void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, const float* q, float* out,
                            const DecodeLaunch& launch = {});

/// paged_decode_attention with q and out of an engine's activation dtype: each fp32, fp16 or
/// bf16 (independently), DEVICE pointers. q is widened to fp32 as it is loaded, the kernel
/// computes in fp32 (scores, softmax, P . V) and out is rounded to nearest even once, as the
/// CPU overloads of pagedkv/cpu/attention.hpp do; the same result as the fp32 call on the
/// widened q, up to that final rounding. Asynchronous on launch.stream.
/// Shapes: q, out [tables.num_seqs, params.num_heads, params.head_dim] (q.size and out.size
/// in elements); the rest as the fp32 overload.
/// Errors: as the fp32 overload, plus (before any CUDA call) a q or out dtype that is not fp32,
/// fp16 or bf16, or a size other than num_seqs x num_heads x head_dim (naming both).
/// Call it qualified (cuda::paged_decode_attention): the CPU overload of pagedkv/cpu/attention.hpp
/// takes the same argument types, so an unqualified call inside namespace pagedkv is ambiguous.
void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, ActivationView q,
                            MutableActivationView out, const DecodeLaunch& launch = {});

/// The same kernel body over a contiguous cache, described as storage describes one: `cache` is
/// contiguous_paged_view(shape, k, v) of device buffers (storage/contiguous_paged_view.hpp), so
/// sequence i owns block i (num_seqs = cache.num_blocks) and block_size = max_len. The result
/// equals paged_decode_attention over that view with identity_block_tables; only the address
/// of a position differs (no block-table read), which makes this the paged kernel's fair speed
/// peer. Asynchronous on launch.stream.
/// Shapes: context_lens [cache.num_blocks] int32 (device); q, out [cache.num_blocks, num_heads,
/// head_dim] fp32 (device); K, V per cache's layout (HND [num_seqs, num_kv_heads, max_len,
/// head_dim] or NHD [num_seqs, max_len, num_kv_heads, head_dim]).
/// Preconditions (device data, not checked): context_lens[i] <= cache.block_size (max_len).
/// Errors: as paged_decode_attention, except that block_size (max_len) may be any size >= 1.
void contiguous_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                                 const int32_t* context_lens, const float* q, float* out,
                                 const DecodeLaunch& launch = {});

}  // namespace pagedkv::cuda
