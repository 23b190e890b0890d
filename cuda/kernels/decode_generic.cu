// Decode attention for any head_dim in [1, kDecodeMaxHeadDim] (run-time head_dim, every storage
// dtype, paged or contiguous, the same masks and split-K partial outputs as the fast kernel of
// decode_attention.cu): the path of the head sizes without a compile-time instantiation
// (stories260K's 8, 80, 96, ...). Correct and simple, not fast: one warp per (query head,
// sequence, split), so a GQA group reads its K/V once per query head, and element-wise loads.
//
// Per tile of 32 positions: lane j computes the score of position t0 + j (a dot over head_dim
// with q from shared memory), the warp updates the online softmax (max, rescale, sum), then
// P.V: for each visible position of the tile, its probability is broadcast and every lane adds
// p * v for its dimensions d = lane, lane + 32, ... Positions the query does not see are never
// read (a NaN-poisoned unused slot cannot reach the output).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "decode_generic.cuh"
#include "decode_range.cuh"
#include "device_math.cuh"
#include "dispatch.cuh"
#include "pagedkv/cuda/supported_configs.hpp"

namespace pagedkv::cuda::detail {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxDimsPerLane = (kDecodeMaxHeadDim + kWarp - 1) / kWarp;

/// Element i of a K or V row of storage type T as fp32 (8-bit codes: the stored value times
/// 1 / widen_factor<T>(), exactly as load_chunk_f32 widens them).
template <typename T>
__device__ __forceinline__ float load_element(const T* row, int i) {
  if constexpr (kQuantized<T>) {
    float f[4];
    widen4<T>(static_cast<uint32_t>(reinterpret_cast<const uint8_t*>(row)[i]), f);
    return f[0];
  } else {
    return to_f32<T>(row[i]);
  }
}

// grid: (num_heads, num_seqs, num_splits); block: one warp
template <typename T, typename KV>
__global__ void __launch_bounds__(kWarp)
    decode_generic_kernel(DecodeProblem p, KV kv, int head_dim) {
  __shared__ float q_s[kDecodeMaxHeadDim];
  const int lane = static_cast<int>(threadIdx.x);
  const int head = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const int split = static_cast<int>(blockIdx.z);
  const int kv_head = head / p.group;
  const DecodeRange r = decode_range(p, seq, split);

  // x = stored * scale: the K scale folds into q, the V scale into the output (as the fast
  // kernel does; widen_factor undoes e4m3's power-of-two widening on sm_80).
  float qscale = p.scale_log2;
  float vscale = 1.f;
  if constexpr (kQuantized<T>) {
    qscale *= p.k_scale[kv_head] * widen_factor<T>();
    vscale = p.v_scale[kv_head] * widen_factor<T>();
  }
  const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head;
  for (int d = lane; d < head_dim; d += kWarp) {
    q_s[d] = load_activation(p.q, p.q_dtype, row * head_dim + d) * qscale;
  }
  __syncwarp();

  const T* k_gmem = static_cast<const T*>(kv.k);
  const T* v_gmem = static_cast<const T*>(kv.v);
  float m = -INFINITY;  // running max (log2 domain), identical in every lane
  float l = 0.f;        // running sum of 2^(s - m)
  float acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] = 0.f;

  for (int64_t t0 = r.begin; t0 < r.end; t0 += kWarp) {
    const int64_t pos = t0 + lane;
    const bool vis = r.visible(pos);
    float s = -INFINITY;
    if (vis) {
      const T* k = k_gmem + kv.row(seq, kv_head, pos);
      float dot = 0.f;
      for (int d = 0; d < head_dim; ++d) dot = fmaf(q_s[d], load_element(k, d), dot);
      s = dot;
    }
    const float m_new = fmaxf(m, warp_max(s));
    if (m_new == -INFINITY) continue;      // nothing visible yet (the same in every lane)
    const float alpha = exp2f(m - m_new);  // 0 while the state is empty (m = -inf)
    const float pr = vis ? exp2f(s - m_new) : 0.f;
    l = l * alpha + warp_sum(pr);
    m = m_new;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) acc[i] *= alpha;
    const unsigned visible_lanes = __ballot_sync(0xFFFFFFFFu, vis);
    for (int j = 0; j < kWarp; ++j) {
      const float pj = __shfl_sync(0xFFFFFFFFu, pr, j);
      if (((visible_lanes >> j) & 1u) == 0) continue;
      const T* v = v_gmem + kv.row(seq, kv_head, t0 + j);
#pragma unroll
      for (int i = 0; i < kMaxDimsPerLane; ++i) {
        const int d = lane + i * kWarp;
        if (d < head_dim) acc[i] = fmaf(pj, load_element(v, d), acc[i]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d >= head_dim) break;
    const float o = l > 0.f ? acc[i] / l * vscale : 0.f;
    if (p.num_splits == 1) {
      store_activation(p.out, p.out_dtype, row * head_dim + d, o);
    } else {
      p.partial_o[(row * p.num_splits + split) * head_dim + d] = o;
    }
  }
  if (p.num_splits > 1 && lane == 0) {
    p.partial_lse[row * p.num_splits + split] = l > 0.f ? m + log2f(l) : -INFINITY;
  }
}

}  // namespace

template <typename KV>
void launch_generic_decode(DType dtype, int32_t head_dim, const DecodeProblem& p, const KV& kv,
                           cudaStream_t stream) {
  dispatch_storage_type(dtype, /*with_quantized=*/true, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs),
                    static_cast<unsigned>(p.num_splits));
    decode_generic_kernel<T, KV><<<grid, kWarp, 0, stream>>>(p, kv, head_dim);
  });
  check_launch("decode_generic_kernel launch");
}
template void launch_generic_decode<PagedKV>(DType, int32_t, const DecodeProblem&, const PagedKV&,
                                             cudaStream_t);
template void launch_generic_decode<ContiguousKV>(DType, int32_t, const DecodeProblem&,
                                                  const ContiguousKV&, cudaStream_t);

int32_t generic_decode_ctas_per_sm(DType dtype) {
  int ctas = 0;
  dispatch_storage_type(dtype, /*with_quantized=*/true, [&](auto tag) {
    using T = typename decltype(tag)::type;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                   &ctas, decode_generic_kernel<T, PagedKV>, kWarp, 0),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  });
  return ctas > 0 ? ctas : 1;
}

}  // namespace pagedkv::cuda::detail
