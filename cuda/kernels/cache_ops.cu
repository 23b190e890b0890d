// Cache-write (reshape_and_cache) and block-copy (copy-on-write) kernels.
// Inputs were validated by cuda/host/cache_ops.cpp: kernels trust them.

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch.hpp"
#include "device_math.cuh"
#include "dispatch.cuh"

namespace pagedkv::cuda::detail {
namespace {

/// Writes token `token`'s K and V rows into their slot; a negative slot is padding.
template <typename Src, typename Dst>
__device__ __forceinline__ void write_token(const CacheWrite& a, int64_t token) {
  const int64_t slot = a.slot_mapping[token];
  if (slot < 0) return;
  const int64_t block = slot / a.block_size;
  const int64_t in_block = slot % a.block_size;
  const int64_t row = static_cast<int64_t>(a.num_kv_heads) * a.head_dim;
  const Src* k = static_cast<const Src*>(a.k) + token * row;
  const Src* v = static_cast<const Src*>(a.v) + token * row;
  Dst* k_cache = static_cast<Dst*>(a.k_cache);
  Dst* v_cache = static_cast<Dst*>(a.v_cache);
  const int64_t base = block * a.block_stride + in_block * a.token_stride;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    const int64_t h = i / a.head_dim;
    const int64_t d = i % a.head_dim;
    const int64_t dst = base + h * a.head_stride + d;
    if constexpr (kQuantized<Dst>) {
      // x * (1 / scale), both rounded to nearest (__frcp_rn, __fmul_rn: no contraction), as
      // the host's write computes it: the same bytes.
      k_cache[dst] = quantize<Dst>(__fmul_rn(to_f32(k[i]), __frcp_rn(a.k_scale[h])));
      v_cache[dst] = quantize<Dst>(__fmul_rn(to_f32(v[i]), __frcp_rn(a.v_scale[h])));
    } else if constexpr (std::is_same_v<Src, Dst>) {  // bit copy: no conversion, NaN kept
      k_cache[dst] = k[i];
      v_cache[dst] = v[i];
    } else {
      k_cache[dst] = from_f32<Dst>(to_f32(k[i]));
      v_cache[dst] = from_f32<Dst>(to_f32(v[i]));
    }
  }
}

// k, v:         [num_tokens, num_kv_heads, head_dim] of Src
// slot_mapping: [num_tokens] int64, negative = skip
// k/v_cache:    [num_blocks, num_kv_heads, block_size, head_dim] (HND) or
//               [num_blocks, block_size, num_kv_heads, head_dim] (NHD), by strides
// k/v_scale:    [num_kv_heads] fp32, 8-bit Dst only: stored = Q(x / scale)
// grid: (num_tokens); block: 128 threads striding over num_kv_heads * head_dim
template <typename Src, typename Dst>
__global__ void reshape_and_cache_kernel(CacheWrite args) {
  write_token<Src, Dst>(args, static_cast<int64_t>(blockIdx.x));
}

// pools: [num_pools] device pointers, each [num_blocks, block_bytes]
// pairs: [num_pairs] (src, dst) block ids
// grid: (num_pairs, num_pools); block: 256 threads, 16 bytes per thread per step
__global__ void copy_blocks_kernel(void* const* __restrict__ pools,
                                   const BlockCopy* __restrict__ pairs, int64_t block_bytes) {
  auto* pool = static_cast<unsigned char*>(pools[blockIdx.y]);
  const BlockCopy pair = pairs[blockIdx.x];
  const unsigned char* src = pool + static_cast<int64_t>(pair.src) * block_bytes;
  unsigned char* dst = pool + static_cast<int64_t>(pair.dst) * block_bytes;
  const bool aligned = ((reinterpret_cast<uintptr_t>(pool) | block_bytes) & 15) == 0;
  if (aligned) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    for (int64_t i = threadIdx.x; i < block_bytes / 16; i += blockDim.x) d[i] = s[i];
  } else {
    for (int64_t i = threadIdx.x; i < block_bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

void launch_reshape_and_cache(const CacheWrite& args, void* stream) {
  if (args.num_tokens == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>(args.num_tokens));
  dispatch_storage_type(args.src_dtype, [&](auto src) {
    dispatch_storage_type(args.dtype, /*with_quantized=*/true, [&](auto dst) {
      using Src = typename decltype(src)::type;
      using Dst = typename decltype(dst)::type;
      reshape_and_cache_kernel<Src, Dst><<<grid, 128, 0, s>>>(args);
    });
  });
  check_launch("reshape_and_cache_kernel launch");
}

void launch_copy_blocks(void* const* pools, int32_t num_pools, int64_t block_bytes,
                        const BlockCopy* pairs, int32_t num_pairs, void* stream) {
  if (num_pairs == 0 || num_pools == 0) return;
  const dim3 grid(static_cast<unsigned>(num_pairs), static_cast<unsigned>(num_pools));
  copy_blocks_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(pools, pairs,
                                                                          block_bytes);
  check_launch("copy_blocks_kernel launch");
}

}  // namespace pagedkv::cuda::detail
