// Tensor-core decode attention (DecodeLaunch::use_tensor_cores): fp16 / bf16 K/V, head_dim 64,
// 128, 256, paged or contiguous, the masks, split-K partials and merge of the CUDA-core kernel
// (decode_attention.cu). The query heads of a kv head (up to 16 per CTA) are the M dimension of
// mma.sync m16n8k16 (row.col, fp32 accumulators), as FlashInfer's decode with use_tensor_cores
// and FlashAttention-2's inner loop do: q K^T is one mma per 8 keys and 16 dims, P V one per
// 16 keys and 8 dims, so a GQA group of 8 costs the tensor cores what one head does.
//
// Arithmetic: q and P are rounded to the K/V dtype for the products (products exact, sums in
// fp32); the softmax (max, exp2, row sums) is fp32 on the unrounded scores. Error against exact
// attention on the same stored K/V: one rounding of q and one of each p to the K/V dtype.
//
// Work of a CTA (kv head, chunk of 16 query heads, sequence, split), 4 warps: warp w takes the
// 16-key steps w, w + 4, w + 8, ... of the split, each with its own cp.async pipeline in its own
// shared memory (kStages steps of K and V, rows padded by 16 bytes so that ldmatrix reads are
// free of bank conflicts) and its own online-softmax state; no barrier inside the loop. At the
// end the four warps' (m, l, O) are combined through shared memory, exactly as split-K merges.
// Fragment layouts are the PTX ISA's for m16n8k16 (groupID = lane / 4, tig = lane % 4):
//   A (16 x 16, row): a0 (g, 2tig..+1), a1 (g+8, 2tig..), a2 (g, 2tig+8..), a3 (g+8, 2tig+8..)
//   B (16 x 8, col):  b0 (k 2tig..+1, n g), b1 (k 2tig+8..+9, n g)
//   C (16 x 8, fp32): c0 c1 (g, 2tig..+1), c2 c3 (g+8, 2tig..+1)
// The C fragments of S for keys 0-7 and 8-15 are the A fragments of P (FlashAttention-2's
// register reuse); K's B fragments come from ldmatrix, V's from ldmatrix.trans.
// Not yet run on a GPU (docs/cuda.md).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "decode_mma.cuh"
#include "decode_range.cuh"
#include "device_math.cuh"
#include "dispatch.cuh"
#include "pagedkv/cuda/supported_configs.hpp"

namespace pagedkv::cuda::detail {
namespace {

constexpr int kMmaThreads = 128;
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kStepKeys = 16;  // keys per warp step: the K dimension of the P V mma
constexpr unsigned kFull = 0xFFFFFFFFu;

/// Compile-time shape for storage type T (__half or __nv_bfloat16) and head_dim D.
template <typename T, int D>
struct MmaTraits {
  static constexpr int kStages = D <= 128 ? 3 : 2;
  static constexpr int kPitch = D + 8;  // elements per shared row: 16 bytes of padding
  static constexpr int kStepElems = kStepKeys * kPitch;          // K (or V) of one step
  static constexpr int kWarpElems = 2 * kStages * kStepElems;    // a warp's K and V stages
  static constexpr int kTileBytes = kMmaWarps * kWarpElems * 2;  // 2 bytes per element
  static constexpr int kReduceFloats = kMmaWarps * kDecodeMmaRows * (D + 2);  // O, m, l
  static constexpr int kSmemBytes = kTileBytes > kReduceFloats * 4 ? kTileBytes : kReduceFloats * 4;
  static constexpr int kChunks = D / 8;   // 16-byte chunks per row
  static constexpr int kKSteps = D / 16;  // mma k-steps of q K^T
  static constexpr int kNTiles = D / 8;   // mma n-tiles of P V
  static constexpr int kCopiesPerLane = kStepKeys * kChunks / 32;

  static_assert(sizeof(T) == 2 && D % 16 == 0 && kNTiles % 2 == 0);
  static_assert((kPitch * 2) % 16 == 0, "cp.async and ldmatrix rows are 16-byte aligned");
  static_assert(kStepKeys * kChunks % 32 == 0);
  static_assert(kSmemBytes <= 163 * 1024, "dynamic shared memory per CTA: 163 KiB on sm_80");
};

/// Two fp32 values as one 32-bit register of T (lo in the low half), rounded to nearest even.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&r, &h, 4);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &h, 4);
  }
  return r;
}

/// c += a b, one m16n8k16 tensor-core product with fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// Four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of matrix
/// l / 8. Without kTrans lane T receives M[T / 4][2 (T % 4) .. +1] of each; with kTrans,
/// M[2 (T % 4) .. +1][T / 4] (the pair along the rows, lower row in the low half).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
}

/// Who this thread is: its warp's place in the CTA, its fragment coordinates, and the CTA's
/// query heads and positions.
struct MmaCta {
  int warp;
  int lane;
  int g;    // groupID: fragment row (and row + 8)
  int tig;  // thread in group: fragment column pair
  int kv_head;
  int seq;
  int split;
  int head0;    // first query head of the CTA
  int n_heads;  // query heads served, <= kDecodeMmaRows
  DecodeRange r;
};

__device__ __forceinline__ MmaCta locate_mma_cta(const DecodeProblem& p) {
  MmaCta c;
  c.warp = static_cast<int>(threadIdx.x) / 32;
  c.lane = static_cast<int>(threadIdx.x) % 32;
  c.g = c.lane / 4;
  c.tig = c.lane % 4;
  const int chunks = (p.group + kDecodeMmaRows - 1) / kDecodeMmaRows;
  c.kv_head = static_cast<int>(blockIdx.x) / chunks;
  const int chunk = static_cast<int>(blockIdx.x) % chunks;
  c.seq = static_cast<int>(blockIdx.y);
  c.split = static_cast<int>(blockIdx.z);
  c.head0 = c.kv_head * p.group + chunk * kDecodeMmaRows;
  c.n_heads = min(kDecodeMmaRows, p.group - chunk * kDecodeMmaRows);
  c.r = decode_range(p, c.seq, c.split);
  return c;
}

/// The A fragments of q (rows = the CTA's heads, zero past n_heads), rounded to T.
template <typename T, int D>
__device__ __forceinline__ void load_q_fragments(const DecodeProblem& p, const MmaCta& c,
                                                 uint32_t (&qa)[MmaTraits<T, D>::kKSteps][4]) {
  const int64_t base = (static_cast<int64_t>(c.seq) * p.num_heads + c.head0) * D;
  const auto q_at = [&](int row, int col) {
    return row < c.n_heads ? load_activation(p.q, p.q_dtype, base + int64_t{row} * D + col) : 0.f;
  };
#pragma unroll
  for (int kk = 0; kk < MmaTraits<T, D>::kKSteps; ++kk) {
    const int col = 16 * kk + 2 * c.tig;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = c.g + 8 * (i % 2);
      const int col_i = col + 8 * (i / 2);
      qa[kk][i] = pack2<T>(q_at(row, col_i), q_at(row, col_i + 1));
    }
  }
}

/// Issues the cp.async copies of the 16 keys from `start` into the warp's stage buffers; keys
/// the query does not see are zero-filled without reading global memory.
template <typename T, int D, typename KV>
__device__ __forceinline__ void issue_step(const KV& kv, const MmaCta& c, T* ks, T* vs,
                                           int64_t start) {
  using Tr = MmaTraits<T, D>;
  const T* k_gmem = static_cast<const T*>(kv.k);
  const T* v_gmem = static_cast<const T*>(kv.v);
#pragma unroll
  for (int j = 0; j < Tr::kCopiesPerLane; ++j) {
    const int idx = c.lane + 32 * j;
    const int key = idx / Tr::kChunks;
    const int chunk = idx % Tr::kChunks;
    const int64_t pos = start + key;
    const bool fill = c.r.visible(pos);
    const int64_t off = fill ? kv.row(c.seq, c.kv_head, pos) + chunk * 8 : 0;
    cp_async_16(ks + key * Tr::kPitch + chunk * 8, k_gmem + off, fill);
    cp_async_16(vs + key * Tr::kPitch + chunk * 8, v_gmem + off, fill);
  }
}

/// The online-softmax state of the thread's two fragment rows (g and g + 8) and its share of O.
template <int D>
struct MmaState {
  float o[D / 8][4];  // C fragments of O [16 rows x D]
  float m[2];         // running max (log2 domain), the same in the 4 lanes of a row
  float l[2];         // this lane's part of the running sum
};

/// One warp step: S = q K^T for 16 keys, online softmax, O += P V.
template <typename T, int D>
__device__ __forceinline__ void compute_step(const DecodeProblem& p, const MmaCta& c,
                                             const uint32_t (&qa)[MmaTraits<T, D>::kKSteps][4],
                                             const T* ks, const T* vs, int64_t start,
                                             MmaState<D>& st) {
  using Tr = MmaTraits<T, D>;
  const int mi = c.lane / 8;  // the ldmatrix matrix this lane addresses
  const int mr = c.lane % 8;  // and its row
  float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};  // keys 0-7, 8-15
#pragma unroll
  for (int kk = 0; kk < Tr::kKSteps; ++kk) {
    // matrices: (keys 0-7, dims 16kk..+7), (keys 0-7, +8..), (keys 8-15, ..), (keys 8-15, +8..)
    uint32_t b[4];
    ldmatrix_x4<false>(b, ks + (mr + 8 * (mi / 2)) * Tr::kPitch + 16 * kk + 8 * (mi % 2));
    mma16816<T>(s[0], qa[kk], b[0], b[1]);
    mma16816<T>(s[1], qa[kk], b[2], b[3]);
  }
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t pos = start + 8 * t + 2 * c.tig + (e & 1);
      s[t][e] = c.r.visible(pos) ? s[t][e] * p.scale_log2 : -INFINITY;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // row g (elements 0, 1), row g + 8 (elements 2, 3)
    float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
    const float m_new = fmaxf(st.m[h], mx);
    float alpha = 1.f;
    float sum = 0.f;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        // Nothing visible yet in this row: p = 0 (and the state stays empty).
        s[t][e] = m_new == -INFINITY ? 0.f : exp2f(s[t][e] - m_new);
        sum += s[t][e];
      }
    }
    if (m_new != -INFINITY) alpha = exp2f(st.m[h] - m_new);  // 0 while the state is empty
    st.l[h] = st.l[h] * alpha + sum;
    st.m[h] = m_new;
#pragma unroll
    for (int nd = 0; nd < Tr::kNTiles; ++nd) {
      st.o[nd][2 * h] *= alpha;
      st.o[nd][2 * h + 1] *= alpha;
    }
  }
  const uint32_t pa[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]),
                          pack2<T>(s[1][0], s[1][1]), pack2<T>(s[1][2], s[1][3])};
#pragma unroll
  for (int nd = 0; nd < Tr::kNTiles; nd += 2) {
    // matrices: (keys 0-7, dims 8nd..), (keys 8-15, 8nd..), (keys 0-7, 8nd+8..), (keys 8-15, ..)
    uint32_t b[4];
    ldmatrix_x4<true>(b, vs + (mr + 8 * (mi % 2)) * Tr::kPitch + 8 * (nd + mi / 2));
    mma16816<T>(st.o[nd], pa, b[0], b[1]);
    mma16816<T>(st.o[nd + 1], pa, b[2], b[3]);
  }
}

/// Combines the four warps' (m, l, O) through shared memory (the tiles are free by now) and
/// writes o = O / l: to out (one pass) or to the split's partial output and log-sum-exp.
template <typename T, int D>
__device__ __forceinline__ void combine_and_store(const DecodeProblem& p, const MmaCta& c,
                                                  MmaState<D>& st, unsigned char* smem) {
  constexpr int kRowFloats = D + 2;  // O row, then m and l
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.l[h] += __shfl_xor_sync(kFull, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(kFull, st.l[h], 2);
  }
  cp_async_wait_all();
  __syncthreads();  // every warp is done with its tiles
  float* red = reinterpret_cast<float*>(smem) + c.warp * kDecodeMmaRows * kRowFloats;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* row = red + (c.g + 8 * h) * kRowFloats;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      row[8 * nd + 2 * c.tig] = st.o[nd][2 * h];
      row[8 * nd + 2 * c.tig + 1] = st.o[nd][2 * h + 1];
    }
    if (c.tig == 0) {
      row[D] = st.m[h];
      row[D + 1] = st.l[h];
    }
  }
  __syncthreads();
  const float* all = reinterpret_cast<const float*>(smem);
  for (int idx = static_cast<int>(threadIdx.x); idx < c.n_heads * D; idx += kMmaThreads) {
    const int h = idx / D;
    const int d = idx % D;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w)
      m = fmaxf(m, all[(w * kDecodeMmaRows + h) * kRowFloats + D]);
    float l = 0.f;
    float o = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) {
        const float* row = all + (w * kDecodeMmaRows + h) * kRowFloats;
        const float f = exp2f(row[D] - m);  // 0 for a warp that saw nothing (m_w = -inf)
        l += row[D + 1] * f;
        o += row[d] * f;
      }
    }
    const float out = l > 0.f ? o / l : 0.f;
    const int64_t qrow = static_cast<int64_t>(c.seq) * p.num_heads + c.head0 + h;
    if (p.num_splits == 1) {
      store_activation(p.out, p.out_dtype, qrow * D + d, out);
    } else {
      p.partial_o[(qrow * p.num_splits + c.split) * D + d] = out;
      if (d == 0) p.partial_lse[qrow * p.num_splits + c.split] = l > 0.f ? m + log2f(l) : -INFINITY;
    }
  }
}

// grid: (num_kv_heads * ceil(group / kDecodeMmaRows), num_seqs, num_splits); block: 128;
// dynamic shared memory: MmaTraits<T, D>::kSmemBytes
template <typename T, int D, typename KV>
__global__ void __launch_bounds__(kMmaThreads) decode_mma_kernel(DecodeProblem p, KV kv) {
  using Tr = MmaTraits<T, D>;
  extern __shared__ __align__(16) unsigned char mma_smem[];
  const MmaCta c = locate_mma_cta(p);
  uint32_t qa[Tr::kKSteps][4];
  load_q_fragments<T, D>(p, c, qa);
  MmaState<D> st;
#pragma unroll
  for (int nd = 0; nd < Tr::kNTiles; ++nd) {
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[nd][e] = 0.f;
  }
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;

  // This warp's steps: i = 0, 1, ... cover keys begin + (i * kMmaWarps + warp) * kStepKeys.
  T* mine = reinterpret_cast<T*>(mma_smem) + c.warp * Tr::kWarpElems;
  const auto k_stage = [&](int64_t i) { return mine + (i % Tr::kStages) * 2 * Tr::kStepElems; };
  const auto step_start = [&](int64_t i) {
    return c.r.begin + (i * kMmaWarps + c.warp) * kStepKeys;
  };
  const int64_t total = (c.r.end - c.r.begin + kStepKeys - 1) / kStepKeys;
  const int64_t steps = total > c.warp ? (total - c.warp + kMmaWarps - 1) / kMmaWarps : 0;
#pragma unroll
  for (int i = 0; i < Tr::kStages - 1; ++i) {
    if (i < steps) {
      issue_step<T, D>(kv, c, k_stage(i), k_stage(i) + Tr::kStepElems, step_start(i));
    }
    cp_async_commit();
  }
  for (int64_t i = 0; i < steps; ++i) {
    cp_async_wait<Tr::kStages - 2>();
    __syncwarp();  // step i landed for the whole warp; step i - 1's buffers are free
    const int64_t next = i + Tr::kStages - 1;
    if (next < steps) {
      issue_step<T, D>(kv, c, k_stage(next), k_stage(next) + Tr::kStepElems, step_start(next));
    }
    cp_async_commit();
    compute_step<T, D>(p, c, qa, k_stage(i), k_stage(i) + Tr::kStepElems, step_start(i), st);
  }
  combine_and_store<T, D>(p, c, st, mma_smem);
}

}  // namespace

template <typename KV>
void launch_mma_decode(DType dtype, int32_t head_dim, const DecodeProblem& p, const KV& kv,
                       cudaStream_t stream) {
  dispatch_decode_config(dtype, head_dim, [&](auto type, auto dim) {
    using T = typename decltype(type)::type;
    constexpr int kD = decltype(dim)::value;
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      const int chunks = (p.group + kDecodeMmaRows - 1) / kDecodeMmaRows;
      const dim3 grid(static_cast<unsigned>(p.num_kv_heads * chunks),
                      static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.num_splits));
      allow_dynamic_smem<MmaTraits<T, kD>::kSmemBytes>(decode_mma_kernel<T, kD, KV>,
                                                       "cudaFuncSetAttribute(decode_mma_kernel)");
      decode_mma_kernel<T, kD, KV>
          <<<grid, kMmaThreads, MmaTraits<T, kD>::kSmemBytes, stream>>>(p, kv);
    } else {
      check_cuda(cudaErrorInvalidValue, "tensor-core decode: fp16 or bf16 K/V only");
    }
  });
  check_launch("decode_mma_kernel launch");
}
template void launch_mma_decode<PagedKV>(DType, int32_t, const DecodeProblem&, const PagedKV&,
                                         cudaStream_t);
template void launch_mma_decode<ContiguousKV>(DType, int32_t, const DecodeProblem&,
                                              const ContiguousKV&, cudaStream_t);

}  // namespace pagedkv::cuda::detail
