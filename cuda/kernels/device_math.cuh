#pragma once
// Small device helpers shared by the kernels of cuda/: storage types, chunk loads converted to
// fp32 (8-bit ones widened in registers), the quantizing stores, cp.async, warp reductions.
// Private to cuda/.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/quantize.hpp"
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
/// The 8-bit formats' storage types: one byte each, distinct types so that a kernel template
/// instantiated on them knows its format (x = stored * scale, dtype.hpp).
struct E4M3Byte {
  uint8_t bits;
};
struct E5M2Byte {
  uint8_t bits;
};
struct Int8Byte {
  int8_t bits;
};
template <>
struct StorageType<DType::kFP8E4M3> {
  using type = E4M3Byte;
};
template <>
struct StorageType<DType::kFP8E5M2> {
  using type = E5M2Byte;
};
template <>
struct StorageType<DType::kInt8> {
  using type = Int8Byte;
};
/// True for the 8-bit storage types (scaled, dtype_is_quantized).
template <typename T>
inline constexpr bool kQuantized = sizeof(T) == 1;

/// fp32 -> 8-bit code, the rules of dtype.hpp (RNE, saturation, NaN), the same byte as the
/// host's encoder for every input. `x` is already divided by the scale. sm_89+ converts with
/// cvt.rn.satfinite (e4m3x2 / e5m2x2), NaN handled first so its code keeps the sign as on the
/// host; sm_80 has no fp8 conversion and runs the integer codec of cuda/quantize.hpp.
template <typename T>
__device__ __forceinline__ T quantize(float x) {
  if constexpr (std::is_same_v<T, Int8Byte>) {
    return T{f32_to_int8_bits(x)};
  } else {
    constexpr bool kE4M3 = std::is_same_v<T, E4M3Byte>;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if (isnan(x))
      return T{static_cast<uint8_t>((signbit(x) ? 0x80u : 0u) | (kE4M3 ? 0x7Fu : 0x7Eu))};
    return T{static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(x, __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2))};
#else
    return T{kE4M3 ? f32_to_e4m3_bits(x) : f32_to_e5m2_bits(x)};
#endif
  }
}

/// The factor the decode kernel multiplies the K and V scales of storage type T by: 256 for
/// e4m3 where it is widened by bit moves (value x 2^-8, sm_80), 1 otherwise (sm_89+ widens
/// e4m3 with cvt; e5m2 and int8 widen exactly everywhere).
template <typename T>
__device__ __forceinline__ float widen_factor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return 1.0f;
#else
  return std::is_same_v<T, E4M3Byte> ? kE4M3WidenFactor : 1.0f;
#endif
}

/// Four 8-bit codes (one 32-bit word, byte 0 first) -> four floats, each the stored value
/// times widen_factor<T>()^-1: two half2 built by byte moves (cuda/quantize.hpp's formulas,
/// two lanes at a time), then half2 -> float2.
template <typename T>
__device__ __forceinline__ void widen4(uint32_t w, float* dst) {
  uint32_t lo;
  uint32_t hi;
  if constexpr (std::is_same_v<T, Int8Byte>) {
    // 0x64 | (b ^ 0x80) per half: 1024 + (b + 128); minus 1152 below.
    lo = __byte_perm(w ^ 0x80808080u, 0x64646464u, 0x4140);
    hi = __byte_perm(w ^ 0x80808080u, 0x64646464u, 0x4342);
  } else {
    // b << 8 per half: e5m2 as fp16 (and where the e4m3 bit move below starts).
    lo = __byte_perm(w, 0u, 0x1404);
    hi = __byte_perm(w, 0u, 0x3424);
    if constexpr (std::is_same_v<T, E4M3Byte>) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
      const __half2_raw a =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w), __NV_E4M3);
      const __half2_raw b =
          __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
      lo = static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(a.y) << 16);
      hi = static_cast<uint32_t>(b.x) | (static_cast<uint32_t>(b.y) << 16);
#else
      // Sign stays, exponent and mantissa shift right by one: the value x 2^-8; the NaN codes
      // (0x3F80 after the move) become fp16 NaN 0x7F80.
      const auto move = [](uint32_t h) {
        const uint32_t m = (h & 0x80008000u) | ((h & 0x7F007F00u) >> 1);
        return m | (__vcmpeq2(m & 0x7FFF7FFFu, 0x3F803F80u) & 0x7E007E00u);
      };
      lo = move(lo);
      hi = move(hi);
#endif
    }
  }
  __half2 h0;
  __half2 h1;
  memcpy(&h0, &lo, 4);
  memcpy(&h1, &hi, 4);
  if constexpr (std::is_same_v<T, Int8Byte>) {
    const __half2 bias = __float2half2_rn(kInt8WidenBias);
    h0 = __hsub2(h0, bias);
    h1 = __hsub2(h1, bias);
  }
  const float2 f0 = __half22float2(h0);
  const float2 f1 = __half22float2(h1);
  dst[0] = f0.x;
  dst[1] = f0.y;
  dst[2] = f1.x;
  dst[3] = f1.y;
}

/// Four activations (q) at element i of `base`, of `dtype` (kF32, kF16 or kBF16), widened to
/// fp32. i is a multiple of 4: 16-byte loads for fp32, two 4-byte pairs for the 16-bit types.
__device__ __forceinline__ float4 load_activation4(const void* base, DType dtype, int64_t i) {
  if (dtype == DType::kF16) {
    const __half2* h = reinterpret_cast<const __half2*>(static_cast<const __half*>(base) + i);
    const float2 a = __half22float2(h[0]);
    const float2 b = __half22float2(h[1]);
    return make_float4(a.x, a.y, b.x, b.y);
  }
  if (dtype == DType::kBF16) {
    const __nv_bfloat162* h =
        reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(base) + i);
    const float2 a = __bfloat1622float2(h[0]);
    const float2 b = __bfloat1622float2(h[1]);
    return make_float4(a.x, a.y, b.x, b.y);
  }
  return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + i);
}

/// One activation at element i of `base`, of `dtype` (kF32, kF16 or kBF16), widened to fp32; no
/// alignment beyond the element's own.
__device__ __forceinline__ float load_activation(const void* base, DType dtype, int64_t i) {
  if (dtype == DType::kF16) return __half2float(static_cast<const __half*>(base)[i]);
  if (dtype == DType::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  return static_cast<const float*>(base)[i];
}

/// Stores x at element i of `base` as `dtype` (kF32, kF16 or kBF16), rounded to nearest even.
__device__ __forceinline__ void store_activation(void* base, DType dtype, int64_t i, float x) {
  if (dtype == DType::kF16) {
    static_cast<__half*>(base)[i] = __float2half_rn(x);
  } else if (dtype == DType::kBF16) {
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
  } else {
    static_cast<float*>(base)[i] = x;
  }
}

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

/// Elements of one compute chunk of storage type T: 16 bytes of fp32 / fp16 / bf16 (4 or 8
/// elements), 8 bytes of an 8-bit format (8 elements: the registers of an fp16 chunk).
template <typename T>
inline constexpr int kChunkElems = sizeof(T) == 1 ? 8 : 16 / static_cast<int>(sizeof(T));

/// Loads one compute chunk (kChunkElems<T> elements: 16 bytes, or 8 for the 8-bit formats) from
/// memory aligned to its size, as fp32; 8-bit codes are widened in registers (widen4: the
/// stored value, times 1 / widen_factor<T>()). Shapes: src, dst [kChunkElems<T>].
template <typename T>
__device__ __forceinline__ void load_chunk_f32(const T* src, float* dst) {
  if constexpr (sizeof(T) == 1) {
    const uint2 raw8 = *reinterpret_cast<const uint2*>(src);
    widen4<T>(raw8.x, dst);
    widen4<T>(raw8.y, dst + 4);
    return;
  }
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
