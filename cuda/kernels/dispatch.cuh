#pragma once
// What every .cu file of cuda/ shares on its host side: the one run-time -> compile-time
// dispatch of a DType (and, for decode, of a head_dim) and the one CUDA error check. Private
// to cuda/ (and the CUDA benchmark); nvcc only.
//
// The DType switch is core/dtype_dispatch.hpp's (the project's one), mapped to the device
// storage types of device_math.cuh; the decode lists are supported_configs.hpp's, so no .cu
// file names a dtype, a head size or a block size.
//
// Worked example (cache_ops.cu):
//   dispatch_storage_type(args.dtype, [&](auto dst) {
//     using Dst = typename decltype(dst)::type;  // float, __half or __nv_bfloat16
//     kernel<Dst><<<grid, block, 0, stream>>>(args);
//   });
//   check_launch("kernel launch");

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <type_traits>
#include <utility>

#include "core/dtype_dispatch.hpp"
#include "cuda/launch.hpp"
#include "device_math.cuh"
#include "pagedkv/cuda/supported_configs.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::cuda::detail {

/// Carries a type through a generic lambda's argument.
template <typename T>
struct TypeTag {
  using type = T;
};

/// The one CUDA error check of cuda/kernels: unless `err` is cudaSuccess, throws
/// pagedkv::Error "CUDA error <name> (<code>): <string> in <what> at <file>:<line>", naming the
/// caller's line.
inline void check_cuda(cudaError_t err, const char* what,
                       std::source_location where = std::source_location::current()) {
  if (err != cudaSuccess) {
    throw_cuda_error(static_cast<int>(err), what, where.file_name(),
                     static_cast<int>(where.line()));
  }
}

/// check_cuda of cudaGetLastError(), right after a <<<...>>> launch (`what` names the kernel).
inline void check_launch(const char* what,
                         std::source_location where = std::source_location::current()) {
  check_cuda(cudaGetLastError(), what, where);
}

/// Raises `kernel`'s dynamic shared-memory limit to kBytes when that is past the default 48 KiB
/// (a per-device setting, so callers apply it before every launch and occupancy query).
template <int kBytes, typename Kernel>
void allow_dynamic_smem(Kernel kernel, const char* what,
                        std::source_location where = std::source_location::current()) {
  if constexpr (kBytes > 48 * 1024) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes),
               what, where);
  } else {
    (void)kernel;
    (void)what;
    (void)where;
  }
}

/// Calls f(TypeTag<T>{}) with T the device storage type of `dtype` (float, __half or
/// __nv_bfloat16). Precondition: dtype is fp32, fp16 or bf16 (the inputs of a cache write).
template <typename F>
void dispatch_storage_type(DType dtype, F&& f) {
  ::pagedkv::detail::dispatch_dtype(::pagedkv::detail::kFloatDTypes, dtype, [&](auto tag) {
    f(TypeTag<typename StorageType<decltype(tag)::value>::type>{});
  });
}

/// As above over every DType, the 8-bit storage types (E4M3Byte, E5M2Byte, Int8Byte) included:
/// the pools of a cache write. The bool only names the overload at the call site.
template <typename F>
void dispatch_storage_type(DType dtype, bool /*with_quantized*/, F&& f) {
  ::pagedkv::detail::dispatch_dtype(::pagedkv::detail::kAllDTypes, dtype, [&](auto tag) {
    f(TypeTag<typename StorageType<decltype(tag)::value>::type>{});
  });
}

template <typename T, size_t N>
constexpr bool listed(const std::array<T, N>& list, T value) {
  for (const T& x : list) {
    if (x == value) return true;
  }
  return false;
}

/// Calls f(std::integral_constant<int, D>{}) for the D of kDecodeHeadDims equal to head_dim.
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
    check_cuda(cudaErrorInvalidValue, "decode: unsupported head_dim");
  }
}

/// THE dtype x head_dim dispatch of the decode kernels: calls
/// f(TypeTag<T>{}, std::integral_constant<int, D>{}) for the storage type T of `dtype` and
/// D == head_dim, over kDecodeDTypes x kDecodeHeadDims only; every decode kernel instantiation
/// comes from here. A pair outside the lists (the public boundary rejects those first) throws
/// a CUDA "invalid value" error.
template <typename F>
void dispatch_decode_config(DType dtype, int32_t head_dim, F&& f) {
  ::pagedkv::detail::dispatch_dtype(dtype, [&](auto tag) {
    constexpr DType kT = decltype(tag)::value;
    if constexpr (listed(kDecodeDTypes, kT)) {
      using T = typename StorageType<kT>::type;
      dispatch_head_dim(head_dim, [&](auto dim) { f(TypeTag<T>{}, dim); });
    } else {
      check_cuda(cudaErrorInvalidValue, "decode: unsupported dtype");
    }
  });
}

}  // namespace pagedkv::cuda::detail
