#pragma once
// Private: the plain (scalar, one query x one head at a time) paged attention kernel. It is the
// oracle that faster CPU kernels are tested against, so it stays simple and trusts its inputs:
// every check happens in the public functions of attention.cpp.

#include <cstdint>
#include <span>

#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv::detail {

/// Chunked paged prefill, same contract as pagedkv::paged_prefill_attention but unchecked.
/// Preconditions (checked by the caller): params match the view; every block id that covers a
/// position < context_lens[i] is in [0, num_blocks); q/out hold query_start[num_seqs] rows.
/// Query t of sequence i sits at position p = context_lens[i] - n_i + t and sees keys
/// 0..p under the window/sink mask. A query that sees no key (p < 0, as in a decode padding row
/// with context 0, or window_left 0 without sinks) outputs zeros.
/// Shapes: q, out [query_start[num_seqs], num_heads, head_dim] fp32.
void plain_paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                                   const BlockTableView& tables,
                                   std::span<const int32_t> query_start, std::span<const float> q,
                                   std::span<float> out);

}  // namespace pagedkv::detail
