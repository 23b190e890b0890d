#pragma once
// The positions one decode work item (a CTA of the fast kernel, a warp of the generic one)
// reads, and which of them its query sees: shared by every decode kernel so that the split
// and mask rules exist once on the device. Private to cuda/kernels; nvcc only.

#include <cstdint>

#include "cuda/launch.hpp"
#include "pagedkv/attention_params.hpp"

namespace pagedkv::cuda::detail {

/// Positions [begin, end) of split `split` of sequence `seq` (the whole context when
/// num_splits == 1; the last split takes everything past the planned chunks, so any plan is
/// correct); of those, the query at qpos = context - 1 sees [lo, qpos] and the sinks
/// [0, sink_end) (AttentionParams: window, chunk and sinks).
struct DecodeRange {
  int64_t end;
  int64_t begin;
  int64_t qpos;
  int64_t lo;
  int64_t sink_end;

  __device__ __forceinline__ bool visible(int64_t pos) const {
    return pos < end && (pos < sink_end || (pos >= lo && pos <= qpos));
  }
};

__device__ __forceinline__ DecodeRange decode_range(const DecodeProblem& p, int seq, int split) {
  DecodeRange r;
  const int64_t ctx = p.context_lens[seq];
  r.begin = 0;
  r.end = ctx;
  if (p.num_splits > 1) {
    const int64_t first = static_cast<int64_t>(split) * p.chunk_tokens;
    r.begin = first < ctx ? first : ctx;
    if (split != p.num_splits - 1 && first + p.chunk_tokens < ctx) r.end = first + p.chunk_tokens;
  }
  r.qpos = ctx - 1;
  // The host's rule itself (constexpr, callable here with --expt-relaxed-constexpr).
  r.lo = AttentionParams::mask_first_visible(r.qpos, p.window_left, p.chunk_size);
  r.sink_end = AttentionParams::mask_sink_end(r.lo, p.window_left, p.chunk_size, p.sink_tokens);
  return r;
}

}  // namespace pagedkv::cuda::detail
