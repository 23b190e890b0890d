#pragma once
// Small device helpers shared by the kernels of cuda/: storage types, 16-byte chunk loads
// converted to fp32, cp.async, warp reductions. Private to cuda/.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "pagedkv/dtype.hpp"

namespace pagedkv::cuda::detail {

/// C++ storage type of a DType.
template <DType kDType>
struct StorageType;
template <>
struct StorageType<DType::kF32> {
  using type = float;
};
template <>
struct StorageType<DType::kF16> {
  using type = __half;
};
template <>
struct StorageType<DType::kBF16> {
  using type = __nv_bfloat16;
};

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

/// fp32 -> storage type, round to nearest even (the host's f32_to_f16 / f32_to_bf16 bits for
/// finite values).
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// Loads one 16-byte chunk (4 floats or 8 halves) from 16-byte aligned memory as fp32.
/// Shapes: src [16 / sizeof(T)], dst [16 / sizeof(T)].
template <typename T>
__device__ __forceinline__ void load_chunk_f32(const T* src, float* dst) {
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  if constexpr (sizeof(T) == 4) {
    dst[0] = __uint_as_float(raw.x);
    dst[1] = __uint_as_float(raw.y);
    dst[2] = __uint_as_float(raw.z);
    dst[3] = __uint_as_float(raw.w);
  } else {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f;
      if constexpr (std::is_same_v<T, __half>) {
        __half2 h;
        memcpy(&h, &words[i], 4);
        f = __half22float2(h);
      } else {
        __nv_bfloat162 b;
        memcpy(&b, &words[i], 4);
        f = __bfloat1622float2(b);
      }
      dst[2 * i] = f.x;
      dst[2 * i + 1] = f.y;
    }
  }
}

/// Asynchronous 16-byte global -> shared copy (sm_80+: cp.async.cg, cached in L2 only, which
/// suits K/V read once). With fill == false the 16 shared bytes are zeroed and global memory is
/// not read (src-size 0), which is how masked or out-of-range positions are skipped: no traffic,
/// and a NaN-poisoned unused slot can never reach the softmax.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool fill) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes)
               : "memory");
#else
  *static_cast<uint4*>(smem) = fill ? *static_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

/// Waits until at most kPending of this thread's most recent cp.async groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// Reduce-scatter over an aligned group of kLanes lanes (a power of two, <= 32): on entry each
/// lane holds kN partial sums v[0..kN); on exit lane `tx` (its index in the group) returns the
/// group total of value tx / (kLanes / kN). Each halving stage exchanges half of the values a
/// lane still holds, so kN values cost kN - 1 + log2(kLanes / kN) shuffles instead of
/// kN * log2(kLanes) for kN separate butterflies.
/// Worked example (kLanes 16, kN 8): stages at offsets 8, 4, 2 split the values 4+4, 2+2, 1+1
/// (lanes with the offset bit set keep the upper half), then offset 1 is a plain butterfly;
/// lanes 2j and 2j+1 end with the total of value j.
template <int kLanes, int kN>
__device__ __forceinline__ float reduce_scatter(float (&v)[kN], int tx) {
  static_assert(kN >= 1 && kN <= kLanes && (kN & (kN - 1)) == 0, "kN: power of two <= kLanes");
  static_assert(kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "kLanes: power of two <= 32");
#pragma unroll
  for (int half = kN / 2, offset = kLanes / 2; half >= 1; half /= 2, offset /= 2) {
    const bool upper = (tx & offset) != 0;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float send = upper ? v[i] : v[i + half];
      const float keep = upper ? v[i + half] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
#pragma unroll
  for (int offset = kLanes / (2 * kN); offset >= 1; offset /= 2) {
    v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
  }
  return v[0];
}

}  // namespace pagedkv::cuda::detail
