// Decode attention kernels: one query token per sequence against its cached K/V, paged or
// contiguous, one-pass or split-K (flash-decoding) with a log-sum-exp merge.
//
// Three levels (FlashInfer's structure): __global__ shells (decode_kernel, merge_kernel), the
// reusable __device__ body (decode_body, templated on the K/V addressing so the paged and the
// contiguous kernels run the same code), and host launchers templated on the compile-time
// sizes (dtype, head_dim) and dispatched from the one list in supported_configs.hpp.
// Inputs were validated by src/core/cuda_decode_attention.cpp: kernels trust them.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/launch.hpp"
#include "device_math.cuh"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/supported_configs.hpp"

namespace pagedkv::cuda::detail {
namespace {

/// Compile-time shape of the decode kernel for storage type T and head dimension D.
/// A "chunk" is 16 bytes of one K or V row (kVec elements); kLanes lanes share one token row
/// (each owning kChunksPerLane chunks), so a CTA works on kTokenGroups tokens at a time.
/// Worked example (fp16, D 128): kVec 8, 16 chunks per row, kLanes 16, 1 chunk per lane,
/// 8 token groups, tiles of 32 tokens (8 KiB of K), 4 tokens per group per tile.
template <typename T, int D>
struct DecodeTraits {
  static constexpr int kThreads = kDecodeThreads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kHeads = kHeadsPerCta;
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static constexpr int kChunksPerRow = D / kVec;
  static constexpr int kLanes = kChunksPerRow < 32 ? kChunksPerRow : 32;
  static constexpr int kChunksPerLane = kChunksPerRow / kLanes;
  static constexpr int kElemsPerLane = kChunksPerLane * kVec;
  static constexpr int kTokenGroups = kThreads / kLanes;
  // Pipeline: kStages tiles of kTileBytes of K (and as much V) in shared memory; kStages - 1
  // are in flight while one is computed (docs/cuda.md has the measured choice).
  static constexpr int kStages = kDecodeStages;
  static constexpr int kTileBytes = kDecodeTileBytes;
  static constexpr int kTileTokens = kTileBytes / (D * static_cast<int>(sizeof(T)));
  static constexpr int kTokensPerGroup = kTileTokens / kTokenGroups;
  static constexpr int kLoadsPerThread = kTileTokens * kChunksPerRow / kThreads;
  // Shared memory: kStages x (K tile + V tile), reused at the end for the cross-group sum.
  static constexpr int kTileBufferBytes = kStages * 2 * kTileBytes;
  static constexpr int kReduceBytes = kTokenGroups * kHeads * D * 4;
  static constexpr int kScoreFloats = kTileTokens * kHeads;  // [token][head]
  static constexpr int kSmemBytes = kTileBufferBytes + (kScoreFloats + 3 * kHeads) * 4;

  static_assert(D % kVec == 0 && kChunksPerRow % kLanes == 0);
  static_assert(kLanes >= kHeads, "reduce_scatter needs a lane per head");
  static_assert(kTileTokens >= kTokenGroups && kTileTokens % kTokenGroups == 0);
  static_assert(kTileTokens * kChunksPerRow % kThreads == 0);
  static_assert(kTileTokens <= kSplitGranularity && kSplitGranularity % kTileTokens == 0,
                "split chunks must hold whole tiles");
  static_assert(kReduceBytes <= kTileBufferBytes, "the final reduction reuses the tile buffers");
  static_assert(kHeads % kWarps == 0 && kHeads % 4 == 0);
  static_assert(kStages >= 2, "one tile computed while the next lands");
  static_assert(kSmemBytes <= 163 * 1024, "dynamic shared memory per CTA: 163 KiB on sm_80");
};

/// The decode body: CTA (kv head chunk, seq, split) computes, for its up to kHeads query heads,
/// softmax(q K^T) V over the visible positions of its split.
/// Per tile: (1) wait for the tile's cp.async group, issue tile it + kStages - 1's into the
/// buffer tile it - 1 used;
/// (2) scores: each token group takes tokens t = group, group + kTokenGroups, ..., each lane
/// dots its chunks with all heads' q (fp32, pre-scaled by scale * log2 e), reduce_scatter
/// leaves one head's score per lane, written to smem [token][head]; (3) online softmax per head
/// (warp w owns heads w, w + kWarps, ...): tile max, rescale factor alpha, p = exp2(s - m);
/// (4) P.V: each lane accumulates p[h] * v for its chunks, all heads, after scaling by alpha.
/// The kTokenGroups partial accumulators are summed through smem at the end.
template <typename T, int D, typename KV>
__device__ __forceinline__ void decode_body(const DecodeProblem& p, const KV& kv,
                                            unsigned char* smem) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kHeads = Tr::kHeads;
  constexpr int kVec = Tr::kVec;
  constexpr int kLanes = Tr::kLanes;
  constexpr int kChunksPerLane = Tr::kChunksPerLane;
  constexpr int kElems = Tr::kElemsPerLane;
  constexpr int kGroups = Tr::kTokenGroups;
  constexpr int kTile = Tr::kTileTokens;
  constexpr int kTileElems = kTile * D;
  constexpr int kDup = kLanes / kHeads;  // lanes holding the same head's score
  constexpr int kHeadsPerWarp = kHeads / Tr::kWarps;

  constexpr int kStages = Tr::kStages;
  T* k_tiles = reinterpret_cast<T*>(smem);         // [kStages][kTile][D]
  T* v_tiles = k_tiles + kStages * kTileElems;     // [kStages][kTile][D]
  float* reduce = reinterpret_cast<float*>(smem);  // [kGroups][kHeads][D], after the loop
  float* scores = reinterpret_cast<float*>(smem + Tr::kTileBufferBytes);  // [kTile][kHeads]
  float* alpha_s = scores + Tr::kScoreFloats;                             // [kHeads]
  float* m_s = alpha_s + kHeads;                                          // [kHeads]
  float* l_s = m_s + kHeads;                                              // [kHeads]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int tx = tid % kLanes;  // lane within the token row
  const int tg = tid / kLanes;  // token group
  const int kv_head = static_cast<int>(blockIdx.x) / p.head_chunks;
  const int head_chunk = static_cast<int>(blockIdx.x) % p.head_chunks;
  const int seq = static_cast<int>(blockIdx.y);
  const int split = static_cast<int>(blockIdx.z);
  const int head0 = kv_head * p.group + head_chunk * kHeads;
  const int n_heads = min(kHeads, p.group - head_chunk * kHeads);

  // This CTA's positions [begin, end): the whole context, or one split (the last split takes
  // everything past the planned chunks, so any plan is correct).
  const int64_t ctx = p.context_lens[seq];
  int64_t begin = 0;
  int64_t end = ctx;
  if (p.num_splits > 1) {
    const int64_t first = static_cast<int64_t>(split) * p.chunk_tokens;
    begin = first < ctx ? first : ctx;
    if (split != p.num_splits - 1 && first + p.chunk_tokens < ctx) end = first + p.chunk_tokens;
  }
  // Visibility of the query at position ctx - 1 (AttentionParams: window and sinks).
  const int64_t qpos = ctx - 1;
  const int64_t lo =
      p.window_left < 0 ? 0 : (qpos - p.window_left + 1 > 0 ? qpos - p.window_left + 1 : 0);
  const int64_t sink_end = p.window_left < 0 ? 0 : (p.sink_tokens < lo ? p.sink_tokens : lo);
  auto visible = [&](int64_t pos) {
    return pos < end && (pos < sink_end || (pos >= lo && pos <= qpos));
  };

  // q of this CTA's heads, this lane's chunks, pre-scaled; zeros for heads past the group.
  float q[kHeads][kElems];
  const float* q_base = p.q + (static_cast<int64_t>(seq) * p.num_heads + head0) * D;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int c = 0; c < kChunksPerLane; ++c) {
      const int d0 = (tx + c * kLanes) * kVec;
#pragma unroll
      for (int e = 0; e < kVec; e += 4) {
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (h < n_heads) x = *reinterpret_cast<const float4*>(q_base + h * D + d0 + e);
        q[h][c * kVec + e + 0] = x.x * p.scale_log2;
        q[h][c * kVec + e + 1] = x.y * p.scale_log2;
        q[h][c * kVec + e + 2] = x.z * p.scale_log2;
        q[h][c * kVec + e + 3] = x.w * p.scale_log2;
      }
    }
  }

  float acc[kHeads][kElems];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[h][e] = 0.f;
  }
  // Online-softmax state of the heads this warp owns (identical in all its lanes).
  float m_run[kHeadsPerWarp];
  float l_run[kHeadsPerWarp];
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    m_run[i] = -INFINITY;
    l_run[i] = 0.f;
  }

  const T* k_gmem = static_cast<const T*>(kv.k);
  const T* v_gmem = static_cast<const T*>(kv.v);
  auto issue_tile = [&](int64_t tile_start, int stage) {
    T* ks = k_tiles + stage * kTileElems;
    T* vs = v_tiles + stage * kTileElems;
#pragma unroll
    for (int j = 0; j < Tr::kLoadsPerThread; ++j) {
      const int c = tid + j * Tr::kThreads;
      const int t = c / Tr::kChunksPerRow;
      const int chunk = c % Tr::kChunksPerRow;
      const int64_t pos = tile_start + t;
      const bool fill = visible(pos);
      const int64_t off = fill ? kv.row(seq, kv_head, pos) + chunk * kVec : 0;
      cp_async_16(ks + t * D + chunk * kVec, k_gmem + off, fill);
      cp_async_16(vs + t * D + chunk * kVec, v_gmem + off, fill);
    }
  };

  // One cp.async group per tile (empty past the end), so wait_group<kStages - 2> means "the
  // oldest tile has landed".
  const int64_t num_tiles = (end - begin + kTile - 1) / kTile;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) issue_tile(begin + int64_t{s} * kTile, s);
    cp_async_commit();
  }
  for (int64_t it = 0; it < num_tiles; ++it) {
    const int stage = static_cast<int>(it % kStages);
    const int64_t tile_start = begin + it * kTile;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` landed for everyone; tile it-1's buffers and scores are free
    const int64_t next = it + kStages - 1;
    if (next < num_tiles) issue_tile(begin + next * kTile, static_cast<int>(next % kStages));
    cp_async_commit();

    // (2) scores
    const T* ks = k_tiles + stage * kTileElems;
#pragma unroll
    for (int i = 0; i < Tr::kTokensPerGroup; ++i) {
      const int t = tg + i * kGroups;
      float part[kHeads];
#pragma unroll
      for (int h = 0; h < kHeads; ++h) part[h] = 0.f;
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        float kf[kVec];
        load_chunk_f32(ks + t * D + (tx + c * kLanes) * kVec, kf);
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
          if (h < n_heads) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) part[h] = fmaf(q[h][c * kVec + e], kf[e], part[h]);
          }
        }
      }
      const float s = reduce_scatter<kLanes, kHeads>(part, tx);
      if (tx % kDup == 0) scores[t * kHeads + tx / kDup] = visible(tile_start + t) ? s : -INFINITY;
    }
    __syncthreads();

    // (3) online softmax, one warp per head
#pragma unroll
    for (int i = 0; i < kHeadsPerWarp; ++i) {
      const int h = warp + i * Tr::kWarps;
      if (h < n_heads) {
        float mx = -INFINITY;
        for (int t = lane; t < kTile; t += 32) mx = fmaxf(mx, scores[t * kHeads + h]);
        mx = warp_max(mx);
        const float m_new = fmaxf(m_run[i], mx);
        float alpha = 1.f;
        float sum = 0.f;
        if (m_new == -INFINITY) {  // nothing visible yet: keep the state, p = 0
          for (int t = lane; t < kTile; t += 32) scores[t * kHeads + h] = 0.f;
        } else {
          alpha = exp2f(m_run[i] - m_new);  // 0 when m_run is -inf (empty state)
          for (int t = lane; t < kTile; t += 32) {
            const float e = exp2f(scores[t * kHeads + h] - m_new);
            scores[t * kHeads + h] = e;
            sum += e;
          }
        }
        sum = warp_sum(sum);
        l_run[i] = l_run[i] * alpha + sum;
        m_run[i] = m_new;
        if (lane == 0) alpha_s[h] = alpha;
      }
    }
    __syncthreads();

    // (4) P.V
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      if (h < n_heads) {
        const float a = alpha_s[h];
        if (a != 1.f) {
#pragma unroll
          for (int e = 0; e < kElems; ++e) acc[h][e] *= a;
        }
      }
    }
    const T* vs = v_tiles + stage * kTileElems;
#pragma unroll
    for (int i = 0; i < Tr::kTokensPerGroup; ++i) {
      const int t = tg + i * kGroups;
      float pr[kHeads];
#pragma unroll
      for (int j = 0; j < kHeads; j += 4) {
        const float4 x = *reinterpret_cast<const float4*>(scores + t * kHeads + j);
        pr[j] = x.x;
        pr[j + 1] = x.y;
        pr[j + 2] = x.z;
        pr[j + 3] = x.w;
      }
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        float vf[kVec];
        load_chunk_f32(vs + t * D + (tx + c * kLanes) * kVec, vf);
#pragma unroll
        for (int h = 0; h < kHeads; ++h) {
          if (h < n_heads) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) {
              acc[h][c * kVec + e] = fmaf(pr[h], vf[e], acc[h][c * kVec + e]);
            }
          }
        }
      }
    }
  }

  // Sum the token groups' accumulators (same softmax frame: m is per head, CTA-wide).
  cp_async_wait_all();
  __syncthreads();  // every thread is done with the tiles: reuse them as `reduce`
#pragma unroll
  for (int i = 0; i < kHeadsPerWarp; ++i) {
    const int h = warp + i * Tr::kWarps;
    if (h < n_heads && lane == 0) {
      m_s[h] = m_run[i];
      l_s[h] = l_run[i];
    }
  }
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < n_heads) {
#pragma unroll
      for (int c = 0; c < kChunksPerLane; ++c) {
        const int d0 = (tx + c * kLanes) * kVec;
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          reduce[(tg * kHeads + h) * D + d0 + e] = acc[h][c * kVec + e];
      }
    }
  }
  __syncthreads();
  for (int idx = tid; idx < n_heads * D; idx += Tr::kThreads) {
    const int h = idx / D;
    const int d = idx % D;
    float sum = 0.f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) sum += reduce[(g * kHeads + h) * D + d];
    const float l = l_s[h];
    const float o = l > 0.f ? sum / l : 0.f;
    const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head0 + h;
    if (p.num_splits == 1) {
      p.out[row * D + d] = o;
    } else {
      p.partial_o[(row * p.num_splits + split) * D + d] = o;
      if (d == 0)
        p.partial_lse[row * p.num_splits + split] = l > 0.f ? m_s[h] + log2f(l) : -INFINITY;
    }
  }
}

// grid: (num_kv_heads * head_chunks, num_seqs, num_splits); block: kDecodeThreads;
// dynamic shared memory: DecodeTraits<T, D>::kSmemBytes
template <typename T, int D, typename KV>
__global__ void __launch_bounds__(kDecodeThreads, kDecodeMinCtasPerSm)
    decode_kernel(DecodeProblem p, KV kv) {
  extern __shared__ __align__(16) unsigned char decode_smem[];
  decode_body<T, D, KV>(p, kv, decode_smem);
}

/// Raises the kernel's dynamic shared-memory limit past the default 48 KiB when its traits need
/// more (a per-device setting, so it is applied before every launch and occupancy query).
template <typename T, int D, typename KV>
void allow_decode_smem() {
  constexpr int kBytes = DecodeTraits<T, D>::kSmemBytes;
  if constexpr (kBytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        decode_kernel<T, D, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    if (err != cudaSuccess) {
      throw_cuda_error(static_cast<int>(err), "cudaFuncSetAttribute(decode_kernel)", __FILE__,
                       __LINE__);
    }
  }
}

// Split-K merge: out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max lse) (log2 domain).
// A row whose splits all saw nothing (lse -inf everywhere) outputs zeros.
// grid: (num_heads, num_seqs); block: 128 threads striding over head_dim
__global__ void merge_kernel(
    const float* __restrict__ partial_o,    // [num_seqs, num_heads, num_splits, head_dim]
    const float* __restrict__ partial_lse,  // [num_seqs, num_heads, num_splits]
    float* __restrict__ out,                // [num_seqs, num_heads, head_dim]
    int32_t num_splits, int32_t head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const float* lse = partial_lse + row * num_splits;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, lse[s]);
  for (int d = static_cast<int>(threadIdx.x); d < head_dim; d += static_cast<int>(blockDim.x)) {
    float num = 0.f;
    float den = 0.f;
    if (m != -INFINITY) {
      for (int s = 0; s < num_splits; ++s) {
        const float w = exp2f(lse[s] - m);
        den += w;
        num += w * partial_o[(row * num_splits + s) * head_dim + d];
      }
    }
    out[row * head_dim + d] = den > 0.f ? num / den : 0.f;
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

/// Calls f(TypeTag<T>{}, std::integral_constant<int, D>{}) for the (dtype, head_dim) of the
/// supported list; every instantiation of the kernels comes from here.
template <size_t kI = 0, typename F>
void dispatch_head_dim(int32_t head_dim, F&& f) {
  if constexpr (kI < kDecodeHeadDims.size()) {
    constexpr int kD = kDecodeHeadDims[kI];
    if (head_dim == kD) {
      f(std::integral_constant<int, kD>{});
      return;
    }
    dispatch_head_dim<kI + 1>(head_dim, std::forward<F>(f));
  } else {
    throw_cuda_error(static_cast<int>(cudaErrorInvalidValue), "decode: unsupported head_dim",
                     __FILE__, __LINE__);
  }
}

template <size_t kI = 0, typename F>
void dispatch_decode(DType dtype, int32_t head_dim, F&& f) {
  if constexpr (kI < kDecodeDTypes.size()) {
    constexpr DType kT = kDecodeDTypes[kI];
    if (dtype == kT) {
      dispatch_head_dim(head_dim, [&](auto d) { f(TypeTag<typename StorageType<kT>::type>{}, d); });
      return;
    }
    dispatch_decode<kI + 1>(dtype, head_dim, std::forward<F>(f));
  } else {
    throw_cuda_error(static_cast<int>(cudaErrorInvalidValue), "decode: unsupported dtype", __FILE__,
                     __LINE__);
  }
}

constexpr bool all_powers_of_two() {
  for (int32_t bs : kDecodeBlockSizes) {
    if (bs < 1 || (bs & (bs - 1)) != 0) return false;
  }
  return true;
}
static_assert(all_powers_of_two(), "PagedKV::row maps positions to blocks with a shift");

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda_error(static_cast<int>(err), what, __FILE__, __LINE__);
}

template <typename KV>
void launch_decode(DType dtype, int32_t head_dim, const DecodeProblem& p, const KV& kv,
                   void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  dispatch_decode(dtype, head_dim, [&](auto type, auto dim) {
    using T = typename decltype(type)::type;
    constexpr int kD = decltype(dim)::value;
    const dim3 grid(static_cast<unsigned>(p.num_kv_heads * p.head_chunks),
                    static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.num_splits));
    allow_decode_smem<T, kD, KV>();
    decode_kernel<T, kD, KV><<<grid, kDecodeThreads, DecodeTraits<T, kD>::kSmemBytes, s>>>(p, kv);
  });
  check_launch("decode_kernel launch");
  if (p.num_splits > 1) {
    const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs));
    merge_kernel<<<grid, 128, 0, s>>>(p.partial_o, p.partial_lse, p.out, p.num_splits, head_dim);
    check_launch("merge_kernel launch");
  }
}

}  // namespace

void launch_paged_decode(DType dtype, int32_t head_dim, const DecodeProblem& problem,
                         const PagedKV& kv, void* stream) {
  launch_decode(dtype, head_dim, problem, kv, stream);
}

void launch_contiguous_decode(DType dtype, int32_t head_dim, const DecodeProblem& problem,
                              const ContiguousKV& kv, void* stream) {
  launch_decode(dtype, head_dim, problem, kv, stream);
}

int32_t decode_ctas_per_sm(DType dtype, int32_t head_dim) {
  int ctas = 0;
  cudaError_t err = cudaSuccess;
  dispatch_decode(dtype, head_dim, [&](auto type, auto dim) {
    using T = typename decltype(type)::type;
    constexpr int kD = decltype(dim)::value;
    allow_decode_smem<T, kD, PagedKV>();
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &ctas, decode_kernel<T, kD, PagedKV>, kDecodeThreads, DecodeTraits<T, kD>::kSmemBytes);
  });
  if (err != cudaSuccess) {
    throw_cuda_error(static_cast<int>(err), "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                     __FILE__, __LINE__);
  }
  return ctas > 0 ? ctas : 1;
}

}  // namespace pagedkv::cuda::detail
