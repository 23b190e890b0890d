// Decode attention kernels: one query token per sequence against its cached K/V, paged or
// contiguous, one-pass or split-K (flash-decoding) with a log-sum-exp merge. The head sizes of
// kDecodeHeadDims run the kernel below; any other head_dim up to kDecodeMaxHeadDim runs the
// generic kernel of decode_generic.cu; DecodeLaunch::use_tensor_cores runs decode_mma.cu's
// (same problem, same merge).
//
// Three levels (FlashInfer's structure): __global__ shells (decode_kernel, merge_kernel), the
// reusable __device__ body (decode_body, templated on the K/V addressing so the paged and the
// contiguous kernels run the same code), and host launchers templated on the compile-time
// sizes (dtype, head_dim) and dispatched by dispatch_decode_config (dispatch.cuh) from the one
// list in supported_configs.hpp. Inputs were validated by cuda/host/decode_attention.cpp:
// kernels trust them.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "cuda/launch.hpp"
#include "decode_generic.cuh"
#include "decode_mma.cuh"
#include "decode_range.cuh"
#include "device_math.cuh"
#include "dispatch.cuh"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/supported_configs.hpp"

namespace pagedkv::cuda::detail {
namespace {

/// Compile-time shape of the decode kernel for storage type T and head dimension D.
/// A "chunk" is kVec elements of one K or V row (16 bytes; 8 for the 8-bit formats, so their
/// registers per lane are fp16's); kLanes lanes share one token row (each owning
/// kChunksPerLane chunks), so a CTA works on kTokenGroups tokens at a time. cp.async copies
/// 16 bytes (kCopyVec elements) whatever the type.
/// Worked example (fp16, D 128): kVec 8, 16 chunks per row, kLanes 16, 1 chunk per lane,
/// 8 token groups, tiles of 32 tokens (8 KiB of K), 4 tokens per group per tile.
/// The 8-bit formats keep fp16's lanes and tile tokens, so a tile holds half the bytes (4 KiB
/// of K at D 128), and twice the stages (6): the same shared memory and the same bytes in
/// flight per CTA as fp16 (a choice by that argument, not yet measured on a GPU).
template <typename T, int D>
struct DecodeTraits {
  static constexpr int kThreads = kDecodeThreads;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kHeads = kHeadsPerCta;
  static constexpr int kElemBytes = static_cast<int>(sizeof(T));
  static constexpr int kVec = kChunkElems<T>;
  static constexpr int kCopyVec = 16 / kElemBytes;
  static constexpr int kCopyChunksPerRow = D / kCopyVec;
  static constexpr int kChunksPerRow = D / kVec;
  static constexpr int kLanes = kChunksPerRow < 32 ? kChunksPerRow : 32;
  static constexpr int kChunksPerLane = kChunksPerRow / kLanes;
  static constexpr int kElemsPerLane = kChunksPerLane * kVec;
  static constexpr int kTokenGroups = kThreads / kLanes;
  // Pipeline: kStages tiles of kTileBytes of K (and as much V) in shared memory; kStages - 1
  // are in flight while one is computed (docs/cuda.md has the measured choice).
  static constexpr int kStages = kQuantized<T> ? 2 * kDecodeStages : kDecodeStages;
  static constexpr int kTileTokens = kDecodeTileBytes / (D * (kElemBytes < 2 ? 2 : kElemBytes));
  static constexpr int kTileBytes = kTileTokens * D * kElemBytes;
  static constexpr int kTokensPerGroup = kTileTokens / kTokenGroups;
  static constexpr int kLoadsPerThread = kTileTokens * kCopyChunksPerRow / kThreads;
  // Shared memory: kStages x (K tile + V tile), reused at the end for the cross-group sum.
  static constexpr int kTileBufferBytes = kStages * 2 * kTileBytes;
  static constexpr int kReduceBytes = kTokenGroups * kHeads * D * 4;
  static constexpr int kScoreFloats = kTileTokens * kHeads;  // [token][head]
  static constexpr int kSmemBytes = kTileBufferBytes + (kScoreFloats + 3 * kHeads) * 4;

  static_assert(D % kVec == 0 && D % kCopyVec == 0 && kChunksPerRow % kLanes == 0);
  static_assert(kLanes >= kHeads, "reduce_scatter needs a lane per head");
  static_assert(kTileTokens >= kTokenGroups && kTileTokens % kTokenGroups == 0);
  static_assert(kTileTokens * kCopyChunksPerRow % kThreads == 0);
  static_assert(kTileTokens <= kSplitGranularity && kSplitGranularity % kTileTokens == 0,
                "split chunks must hold whole tiles");
  static_assert(kReduceBytes <= kTileBufferBytes, "the final reduction reuses the tile buffers");
  static_assert(kHeads % kWarps == 0 && kHeads % 4 == 0);
  static_assert(kStages >= 2, "one tile computed while the next lands");
  static_assert(kSmemBytes <= 163 * 1024, "dynamic shared memory per CTA: 163 KiB on sm_80");
};

/// Shared memory of a decode CTA (DecodeTraits::kSmemBytes bytes): kStages K and V tiles, then
/// the scores and the per-head softmax scalars; after the loop the tiles are reused as `reduce`.
template <typename T, int D>
struct DecodeSmem {
  T* k_tiles;      // [kStages][kTile][D]
  T* v_tiles;      // [kStages][kTile][D]
  float* reduce;   // [kGroups][kHeads][D], after the loop
  float* scores;   // [kTile][kHeads]
  float* alpha_s;  // [kHeads]
  float* m_s;      // [kHeads]
  float* l_s;      // [kHeads]
};

template <typename T, int D>
__device__ __forceinline__ DecodeSmem<T, D> carve_smem(unsigned char* smem) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kTileElems = Tr::kTileTokens * D;
  DecodeSmem<T, D> s;
  s.k_tiles = reinterpret_cast<T*>(smem);
  s.v_tiles = s.k_tiles + Tr::kStages * kTileElems;
  s.reduce = reinterpret_cast<float*>(smem);
  s.scores = reinterpret_cast<float*>(smem + Tr::kTileBufferBytes);
  s.alpha_s = s.scores + Tr::kScoreFloats;
  s.m_s = s.alpha_s + Tr::kHeads;
  s.l_s = s.m_s + Tr::kHeads;
  return s;
}

/// Who this thread is in its CTA (kv head chunk, seq, split), which query heads the CTA
/// serves, and which positions it reads.
struct DecodeCta {
  int tid;
  int warp;
  int lane;
  int tx;  // lane within the token row
  int tg;  // token group
  int kv_head;
  int seq;
  int split;
  int head0;    // first query head of the CTA
  int n_heads;  // query heads served, <= kHeads
  // The split's positions and the query's mask (decode_range.cuh). Last, as the five int64
  // fields it replaced were: the field order decides an operand order in the SASS.
  DecodeRange r;

  __device__ __forceinline__ bool visible(int64_t pos) const { return r.visible(pos); }
};

template <typename T, int D>
__device__ __forceinline__ DecodeCta locate_cta(const DecodeProblem& p) {
  using Tr = DecodeTraits<T, D>;
  DecodeCta c;
  c.tid = static_cast<int>(threadIdx.x);
  c.warp = c.tid / 32;
  c.lane = c.tid % 32;
  c.tx = c.tid % Tr::kLanes;
  c.tg = c.tid / Tr::kLanes;
  c.kv_head = static_cast<int>(blockIdx.x) / p.head_chunks;
  const int head_chunk = static_cast<int>(blockIdx.x) % p.head_chunks;
  c.seq = static_cast<int>(blockIdx.y);
  c.split = static_cast<int>(blockIdx.z);
  c.head0 = c.kv_head * p.group + head_chunk * Tr::kHeads;
  c.n_heads = min(Tr::kHeads, p.group - head_chunk * Tr::kHeads);

  c.r = decode_range(p, c.seq, c.split);
  return c;
}

/// q of the CTA's heads, this lane's chunks, pre-scaled by `qscale` (the softmax scale in the
/// log2 domain, times the kv head's K scale for an 8-bit cache); zeros for heads past the group.
template <typename T, int D>
__device__ __forceinline__ void load_q(
    const DecodeProblem& p, const DecodeCta& c, float qscale,
    float (&q)[DecodeTraits<T, D>::kHeads][DecodeTraits<T, D>::kElemsPerLane]) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kVec = Tr::kVec;
  const int64_t q_base = (static_cast<int64_t>(c.seq) * p.num_heads + c.head0) * D;
#pragma unroll
  for (int h = 0; h < Tr::kHeads; ++h) {
#pragma unroll
    for (int ch = 0; ch < Tr::kChunksPerLane; ++ch) {
      const int d0 = (c.tx + ch * Tr::kLanes) * kVec;
#pragma unroll
      for (int e = 0; e < kVec; e += 4) {
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (h < c.n_heads) x = load_activation4(p.q, p.q_dtype, q_base + h * D + d0 + e);
        q[h][ch * kVec + e + 0] = x.x * qscale;
        q[h][ch * kVec + e + 1] = x.y * qscale;
        q[h][ch * kVec + e + 2] = x.z * qscale;
        q[h][ch * kVec + e + 3] = x.w * qscale;
      }
    }
  }
}

/// (1) Issues the cp.async copies of the tile at tile_start into buffer `stage`; positions the
/// query does not see are zero-filled without reading global memory.
template <typename T, int D, typename KV>
__device__ __forceinline__ void issue_tile(const KV& kv, const T* k_gmem, const T* v_gmem,
                                           const DecodeCta& c, const DecodeSmem<T, D>& s,
                                           int64_t tile_start, int stage) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kTileElems = Tr::kTileTokens * D;
  T* ks = s.k_tiles + stage * kTileElems;
  T* vs = s.v_tiles + stage * kTileElems;
#pragma unroll
  for (int j = 0; j < Tr::kLoadsPerThread; ++j) {
    const int ci = c.tid + j * Tr::kThreads;
    const int t = ci / Tr::kCopyChunksPerRow;
    const int chunk = ci % Tr::kCopyChunksPerRow;
    const int64_t pos = tile_start + t;
    const bool fill = c.visible(pos);
    const int64_t off = fill ? kv.row(c.seq, c.kv_head, pos) + chunk * Tr::kCopyVec : 0;
    cp_async_16(ks + t * D + chunk * Tr::kCopyVec, k_gmem + off, fill);
    cp_async_16(vs + t * D + chunk * Tr::kCopyVec, v_gmem + off, fill);
  }
}

/// (2) Scores of the tile in buffer `stage`: each token group takes tokens t = tg,
/// tg + kTokenGroups, ...; each lane dots its chunks with all heads' q, reduce_scatter leaves
/// one head's score per lane, written to scores [token][head] (-inf where not visible).
template <typename T, int D>
__device__ __forceinline__ void tile_scores(
    const DecodeCta& c, const DecodeSmem<T, D>& s,
    const float (&q)[DecodeTraits<T, D>::kHeads][DecodeTraits<T, D>::kElemsPerLane], int stage,
    int64_t tile_start) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kHeads = Tr::kHeads;
  constexpr int kVec = Tr::kVec;
  constexpr int kLanes = Tr::kLanes;
  constexpr int kDup = kLanes / kHeads;  // lanes holding the same head's score
  const T* ks = s.k_tiles + stage * (Tr::kTileTokens * D);
#pragma unroll
  for (int i = 0; i < Tr::kTokensPerGroup; ++i) {
    const int t = c.tg + i * Tr::kTokenGroups;
    float part[kHeads];
#pragma unroll
    for (int h = 0; h < kHeads; ++h) part[h] = 0.f;
#pragma unroll
    for (int ch = 0; ch < Tr::kChunksPerLane; ++ch) {
      float kf[kVec];
      load_chunk_f32(ks + t * D + (c.tx + ch * kLanes) * kVec, kf);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        if (h < c.n_heads) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) part[h] = fmaf(q[h][ch * kVec + e], kf[e], part[h]);
        }
      }
    }
    const float sc = reduce_scatter<kLanes, kHeads>(part, c.tx);
    if (c.tx % kDup == 0) {
      s.scores[t * kHeads + c.tx / kDup] = c.visible(tile_start + t) ? sc : -INFINITY;
    }
  }
}

/// (3) Online softmax over the tile's scores, one warp per head (warp w owns heads w,
/// w + kWarps, ...): tile max, rescale factor alpha (to alpha_s), p = exp2(s - m) in place.
template <typename T, int D>
__device__ __forceinline__ void tile_softmax(
    const DecodeCta& c, const DecodeSmem<T, D>& s,
    float (&m_run)[DecodeTraits<T, D>::kHeads / DecodeTraits<T, D>::kWarps],
    float (&l_run)[DecodeTraits<T, D>::kHeads / DecodeTraits<T, D>::kWarps]) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kHeads = Tr::kHeads;
  constexpr int kTile = Tr::kTileTokens;
#pragma unroll
  for (int i = 0; i < kHeads / Tr::kWarps; ++i) {
    const int h = c.warp + i * Tr::kWarps;
    if (h < c.n_heads) {
      float mx = -INFINITY;
      for (int t = c.lane; t < kTile; t += 32) mx = fmaxf(mx, s.scores[t * kHeads + h]);
      mx = warp_max(mx);
      const float m_new = fmaxf(m_run[i], mx);
      float alpha = 1.f;
      float sum = 0.f;
      if (m_new == -INFINITY) {  // nothing visible yet: keep the state, p = 0
        for (int t = c.lane; t < kTile; t += 32) s.scores[t * kHeads + h] = 0.f;
      } else {
        alpha = exp2f(m_run[i] - m_new);  // 0 when m_run is -inf (empty state)
        for (int t = c.lane; t < kTile; t += 32) {
          const float e = exp2f(s.scores[t * kHeads + h] - m_new);
          s.scores[t * kHeads + h] = e;
          sum += e;
        }
      }
      sum = warp_sum(sum);
      l_run[i] = l_run[i] * alpha + sum;
      m_run[i] = m_new;
      if (c.lane == 0) s.alpha_s[h] = alpha;
    }
  }
}

/// (4) P.V: each lane scales its accumulators by alpha, then adds p[h] * v for its chunks of
/// the tile in buffer `stage`, all heads.
template <typename T, int D>
__device__ __forceinline__ void tile_pv(
    const DecodeCta& c, const DecodeSmem<T, D>& s,
    float (&acc)[DecodeTraits<T, D>::kHeads][DecodeTraits<T, D>::kElemsPerLane], int stage) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kHeads = Tr::kHeads;
  constexpr int kVec = Tr::kVec;
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < c.n_heads) {
      const float a = s.alpha_s[h];
      if (a != 1.f) {
#pragma unroll
        for (int e = 0; e < Tr::kElemsPerLane; ++e) acc[h][e] *= a;
      }
    }
  }
  const T* vs = s.v_tiles + stage * (Tr::kTileTokens * D);
#pragma unroll
  for (int i = 0; i < Tr::kTokensPerGroup; ++i) {
    const int t = c.tg + i * Tr::kTokenGroups;
    float pr[kHeads];
#pragma unroll
    for (int j = 0; j < kHeads; j += 4) {
      const float4 x = *reinterpret_cast<const float4*>(s.scores + t * kHeads + j);
      pr[j] = x.x;
      pr[j + 1] = x.y;
      pr[j + 2] = x.z;
      pr[j + 3] = x.w;
    }
#pragma unroll
    for (int ch = 0; ch < Tr::kChunksPerLane; ++ch) {
      float vf[kVec];
      load_chunk_f32(vs + t * D + (c.tx + ch * Tr::kLanes) * kVec, vf);
#pragma unroll
      for (int h = 0; h < kHeads; ++h) {
        if (h < c.n_heads) {
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            acc[h][ch * kVec + e] = fmaf(pr[h], vf[e], acc[h][ch * kVec + e]);
          }
        }
      }
    }
  }
}

/// Sums the token groups' accumulators through shared memory (same softmax frame: m is per
/// head, CTA-wide) and writes o = acc / l * vscale (vscale: the kv head's V scale for an 8-bit
/// cache, else 1): to out (one pass) or to the split's partial output and log-sum-exp
/// (split-K; the merge is linear in o, so the scale may come before it).
template <typename T, int D>
__device__ __forceinline__ void reduce_and_store(
    const DecodeProblem& p, const DecodeCta& c, const DecodeSmem<T, D>& s,
    const float (&acc)[DecodeTraits<T, D>::kHeads][DecodeTraits<T, D>::kElemsPerLane],
    const float (&m_run)[DecodeTraits<T, D>::kHeads / DecodeTraits<T, D>::kWarps],
    const float (&l_run)[DecodeTraits<T, D>::kHeads / DecodeTraits<T, D>::kWarps], float vscale) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kHeads = Tr::kHeads;
  constexpr int kVec = Tr::kVec;
  cp_async_wait_all();
  __syncthreads();  // every thread is done with the tiles: reuse them as `reduce`
#pragma unroll
  for (int i = 0; i < kHeads / Tr::kWarps; ++i) {
    const int h = c.warp + i * Tr::kWarps;
    if (h < c.n_heads && c.lane == 0) {
      s.m_s[h] = m_run[i];
      s.l_s[h] = l_run[i];
    }
  }
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    if (h < c.n_heads) {
#pragma unroll
      for (int ch = 0; ch < Tr::kChunksPerLane; ++ch) {
        const int d0 = (c.tx + ch * Tr::kLanes) * kVec;
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          s.reduce[(c.tg * kHeads + h) * D + d0 + e] = acc[h][ch * kVec + e];
      }
    }
  }
  __syncthreads();
  for (int idx = c.tid; idx < c.n_heads * D; idx += Tr::kThreads) {
    const int h = idx / D;
    const int d = idx % D;
    float sum = 0.f;
#pragma unroll
    for (int g = 0; g < Tr::kTokenGroups; ++g) sum += s.reduce[(g * kHeads + h) * D + d];
    const float l = s.l_s[h];
    const float o = l > 0.f ? sum / l * vscale : 0.f;
    const int64_t row = static_cast<int64_t>(c.seq) * p.num_heads + c.head0 + h;
    if (p.num_splits == 1) {
      store_activation(p.out, p.out_dtype, row * D + d, o);
    } else {
      p.partial_o[(row * p.num_splits + c.split) * D + d] = o;
      if (d == 0)
        p.partial_lse[row * p.num_splits + c.split] = l > 0.f ? s.m_s[h] + log2f(l) : -INFINITY;
    }
  }
}

/// The decode body: CTA (kv head chunk, seq, split) computes, for its up to kHeads query heads,
/// softmax(q K^T) V over the visible positions of its split, one tile at a time: (1) wait for
/// the tile's cp.async group and issue tile it + kStages - 1's into the buffer tile it - 1
/// used, (2) tile_scores, (3) tile_softmax, (4) tile_pv; then reduce_and_store. The stages are
/// force-inlined: the generated code is that of one function (docs/cuda.md).
template <typename T, int D, typename KV>
__device__ __forceinline__ void decode_body(const DecodeProblem& p, const KV& kv,
                                            unsigned char* smem) {
  using Tr = DecodeTraits<T, D>;
  constexpr int kHeads = Tr::kHeads;
  constexpr int kTile = Tr::kTileTokens;
  constexpr int kStages = Tr::kStages;
  const DecodeSmem<T, D> s = carve_smem<T, D>(smem);
  const DecodeCta c = locate_cta<T, D>(p);

  // x = stored * scale: the K scale folds into q (scores = (q k_scale) . stored), the V scale
  // into the output (sum p v = v_scale sum p stored); widen_factor undoes a widening that
  // leaves out a power of two (e4m3 on sm_80).
  float qscale = p.scale_log2;
  float vscale = 1.f;
  if constexpr (kQuantized<T>) {
    qscale *= p.k_scale[c.kv_head] * widen_factor<T>();
    vscale = p.v_scale[c.kv_head] * widen_factor<T>();
  }
  float q[kHeads][Tr::kElemsPerLane];
  load_q<T, D>(p, c, qscale, q);
  float acc[kHeads][Tr::kElemsPerLane];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
#pragma unroll
    for (int e = 0; e < Tr::kElemsPerLane; ++e) acc[h][e] = 0.f;
  }
  // Online-softmax state of the heads this warp owns (identical in all its lanes).
  float m_run[kHeads / Tr::kWarps];
  float l_run[kHeads / Tr::kWarps];
#pragma unroll
  for (int i = 0; i < kHeads / Tr::kWarps; ++i) {
    m_run[i] = -INFINITY;
    l_run[i] = 0.f;
  }

  const T* k_gmem = static_cast<const T*>(kv.k);
  const T* v_gmem = static_cast<const T*>(kv.v);
  // One cp.async group per tile (empty past the end), so wait_group<kStages - 2> means "the
  // oldest tile has landed".
  const int64_t num_tiles = (c.r.end - c.r.begin + kTile - 1) / kTile;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < num_tiles)
      issue_tile<T, D>(kv, k_gmem, v_gmem, c, s, c.r.begin + int64_t{st} * kTile, st);
    cp_async_commit();
  }
  for (int64_t it = 0; it < num_tiles; ++it) {
    const int stage = static_cast<int>(it % kStages);
    const int64_t tile_start = c.r.begin + it * kTile;
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` landed for everyone; tile it-1's buffers and scores are free
    const int64_t next = it + kStages - 1;
    if (next < num_tiles) {
      issue_tile<T, D>(kv, k_gmem, v_gmem, c, s, c.r.begin + next * kTile,
                       static_cast<int>(next % kStages));
    }
    cp_async_commit();
    tile_scores<T, D>(c, s, q, stage, tile_start);
    __syncthreads();
    tile_softmax<T, D>(c, s, m_run, l_run);
    __syncthreads();
    tile_pv<T, D>(c, s, acc, stage);
  }
  reduce_and_store<T, D>(p, c, s, acc, m_run, l_run, vscale);
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
  allow_dynamic_smem<DecodeTraits<T, D>::kSmemBytes>(decode_kernel<T, D, KV>,
                                                     "cudaFuncSetAttribute(decode_kernel)");
}

// Split-K merge: out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max lse) (log2 domain).
// A row whose splits all saw nothing (lse -inf everywhere) outputs zeros.
// grid: (num_heads, num_seqs); block: 128 threads striding over head_dim
__global__ void merge_kernel(
    const float* __restrict__ partial_o,    // [num_seqs, num_heads, num_splits, head_dim]
    const float* __restrict__ partial_lse,  // [num_seqs, num_heads, num_splits]
    void* __restrict__ out,                 // [num_seqs, num_heads, head_dim] of out_dtype
    DType out_dtype, int32_t num_splits, int32_t head_dim) {
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
    store_activation(out, out_dtype, row * head_dim + d, den > 0.f ? num / den : 0.f);
  }
}

constexpr bool all_powers_of_two() {
  for (int32_t bs : kDecodeBlockSizes) {
    if (bs < 1 || (bs & (bs - 1)) != 0) return false;
  }
  return true;
}
static_assert(all_powers_of_two(), "PagedKV::row maps positions to blocks with a shift");

template <typename KV>
void launch_decode(DType dtype, int32_t head_dim, const DecodeProblem& p, const KV& kv,
                   void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (p.tensor_cores) {
    launch_mma_decode(dtype, head_dim, p, kv, s);  // decode_mma.cu
  } else if (listed(kDecodeHeadDims, head_dim)) {
    dispatch_decode_config(dtype, head_dim, [&](auto type, auto dim) {
      using T = typename decltype(type)::type;
      constexpr int kD = decltype(dim)::value;
      const dim3 grid(static_cast<unsigned>(p.num_kv_heads * p.head_chunks),
                      static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.num_splits));
      allow_decode_smem<T, kD, KV>();
      decode_kernel<T, kD, KV><<<grid, kDecodeThreads, DecodeTraits<T, kD>::kSmemBytes, s>>>(p, kv);
    });
    check_launch("decode_kernel launch");
  } else {
    launch_generic_decode(dtype, head_dim, p, kv, s);  // any other head_dim (decode_generic.cu)
  }
  if (p.num_splits > 1) {
    const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.num_seqs));
    merge_kernel<<<grid, 128, 0, s>>>(p.partial_o, p.partial_lse, p.out, p.out_dtype, p.num_splits,
                                      head_dim);
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
  if (!listed(kDecodeHeadDims, head_dim)) return generic_decode_ctas_per_sm(dtype);
  int ctas = 0;
  dispatch_decode_config(dtype, head_dim, [&](auto type, auto dim) {
    using T = typename decltype(type)::type;
    constexpr int kD = decltype(dim)::value;
    allow_decode_smem<T, kD, PagedKV>();
    check_cuda(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &ctas, decode_kernel<T, kD, PagedKV>, kDecodeThreads, DecodeTraits<T, kD>::kSmemBytes),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  });
  return ctas > 0 ? ctas : 1;
}

}  // namespace pagedkv::cuda::detail
