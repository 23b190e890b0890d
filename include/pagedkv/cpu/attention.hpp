#pragma once
/// @file attention.hpp
/// CPU attention through block tables: paged decode and chunked paged prefill.
/// Query/output activations are fp32 spans, or (ActivationView overloads) fp32, fp16 or bf16
/// buffers; K/V are read in place in the pool's dtype and converted to fp32; accumulation in fp32
/// with online softmax.

#include <cstdint>
#include <span>

#include "pagedkv/attention_params.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv {

/// Paged decode attention: one query token per sequence attends to its whole cached context
/// (its own K/V must already be written). Sequences of different lengths in one batch.
/// Shapes: q, out [num_seqs, num_heads, head_dim] fp32; tables: see BlockTableView.
/// Units: context_lens in tokens; a padding row (context 0) outputs zeros.
/// GQA: query head h reads kv head h / (num_heads / num_kv_heads).
/// Mask: params.visible (causal; sliding window, chunked local and sinks as AttentionParams
/// documents). A key the mask hides is never read, so a local group's released table entries
/// (HybridKVCacheManager's null block) may point anywhere.
/// Errors: throws pagedkv::Error on a params/view mismatch, tables built for another geometry
/// (tables.block_size != cache.block_size, or tables.num_blocks > cache.num_blocks; see
/// check_table_geometry), q/out size != num_seqs * num_heads * head_dim, a context longer than
/// max_blocks_per_seq * block_size, or a block id outside [0, num_blocks) among the blocks in
/// use.
/// Source: PagedAttention (Kwon et al., SOSP 2023); online softmax (Milakov & Gimelshein 2018).
void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, std::span<const float> q,
                            std::span<float> out);

/// Chunked paged prefill: sequence i has n_i = query_start[i+1] - query_start[i] new query
/// tokens, at positions context_lens[i] - n_i through context_lens[i] - 1 (their K/V already
/// written); query token at position p attends causally to positions 0..p (cached prefix +
/// chunk).
/// Shapes: query_start [num_seqs + 1] (query_start[0] = 0); q, out [query_start[num_seqs],
/// num_heads, head_dim] fp32. Decode is the case n_i = 1.
/// Errors: as paged_decode_attention, plus n_i < 0 or n_i > context_lens[i].
void paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                             const BlockTableView& tables, std::span<const int32_t> query_start,
                             std::span<const float> q, std::span<float> out);

/// paged_decode_attention with q and out in fp32, fp16 or bf16 (any combination): computed in
/// fp32 (each q element widened exactly, each output rounded to nearest even into out.dtype as
/// f32_to_f16 / f32_to_bf16 do), so the result is the fp32 overload's on the widened q, rounded.
/// Shapes, contract and errors as the fp32 overload (sizes in elements), plus: throws
/// pagedkv::Error naming the dtype if q.dtype or out.dtype is not fp32, fp16 or bf16, and
/// naming the argument if its data is null with size > 0. out is written only once the whole
/// call has succeeded (a failed call leaves it as it was).
void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, ActivationView q,
                            MutableActivationView out);

/// paged_prefill_attention with q and out in fp32, fp16 or bf16: as the paged_decode_attention
/// overload above (fp32 compute, RNE on store, the same extra errors).
void paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                             const BlockTableView& tables, std::span<const int32_t> query_start,
                             ActivationView q, MutableActivationView out);

/// Attention over explicit key lists (sparse kept sets such as heavy hitters; see
/// metadata/eviction_policy.hpp): query row i attends to exactly the keys at
/// slots[indptr[i] .. indptr[i+1]), in any order, with no causal or window mask (the list IS the
/// mask). Optionally reports each listed key's softmax probability, the per-position weight
/// that H2O accumulates.
/// Shapes: keys.indptr [num_rows + 1] int32, indptr[0] = 0, non-decreasing; keys.slots
/// [indptr[num_rows]] int64, each in [0, num_blocks * block_size); q, out [num_rows, num_heads,
/// head_dim] fp32; probs: empty, or [indptr[num_rows]] fp32 = the key's probability summed over
/// the query heads (so a row with >= 1 key sums to num_heads). A row with no key outputs zeros.
/// Worked example: `KeptTokens kept = manager.kept_tokens(seqs);` then
/// `paged_attention_over_slots(params, layer, {kept.indptr, kept.slots, bs}, q, out, probs)`
/// with bs the manager's block_size.
/// Errors: throws pagedkv::Error on a params/view mismatch, slots computed for another geometry
/// (keys.block_size != cache.block_size, keys.num_blocks > cache.num_blocks), params.window_left
/// != -1, sink_tokens != 0 or chunk_size != 0 (a mask has no meaning for an explicit list), a
/// bad indptr, a slot
/// out of range, or q/out/probs of the wrong size.
/// Source: H2O (Zhang et al., NeurIPS 2023) needs per-key attention weights; online softmax is
/// not used here because the probabilities themselves are an output.
void paged_attention_over_slots(const AttentionParams& params, const KVLayerView& cache,
                                const SlotListView& keys, std::span<const float> q,
                                std::span<float> out, std::span<float> probs = {});

}  // namespace pagedkv
