#pragma once
// The one switch from a run-time DType to compile-time code, shared by every backend (CPU
// kernels, CUDA launchers, storage): f receives a tag whose ::value is the DType, and maps it to
// its own element type (the CPU uses Highway's float16_t / bfloat16_t, CUDA __half /
// __nv_bfloat16). A new storage dtype is added here once. Private; usable from nvcc (no CUDA or
// Highway header).
//
// Worked example:
//   dispatch_dtype(cache.dtype, [&](auto tag) {
//     constexpr DType kT = decltype(tag)::value;
//     run<StorageType<kT>>(...);
//   });

#include <type_traits>
#include <utility>

#include "pagedkv/dtype.hpp"

namespace pagedkv::detail {

template <DType kT>
using DTypeTag = std::integral_constant<DType, kT>;

/// Calls f(DTypeTag<dtype>{}) and returns what it returns (every branch must return the same
/// type). Precondition: dtype is a DType enumerator, which the public boundary checks; a value
/// outside the enum takes the fp32 branch.
template <typename F>
constexpr decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF16:
      return std::forward<F>(f)(DTypeTag<DType::kF16>{});
    case DType::kBF16:
      return std::forward<F>(f)(DTypeTag<DType::kBF16>{});
    case DType::kF32:
      break;
  }
  return std::forward<F>(f)(DTypeTag<DType::kF32>{});
}

}  // namespace pagedkv::detail
