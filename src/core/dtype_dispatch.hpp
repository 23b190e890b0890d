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

/// A set of dtypes a backend compiles code for (its kernels are instantiated for these only).
template <DType... kTs>
struct DTypeSet {};
/// Every storage dtype (the CPU kernels and storage).
inline constexpr DTypeSet<DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2,
                          DType::kInt8>
    kAllDTypes{};
/// The 16- and 32-bit float dtypes (the CUDA kernels, which reject the 8-bit ones at their
/// boundary: cuda/supported_configs.hpp).
inline constexpr DTypeSet<DType::kF32, DType::kF16, DType::kBF16> kFloatDTypes{};

/// Calls f(DTypeTag<dtype>{}) for the member of `set` equal to dtype and returns what it
/// returns (every branch must return the same type). Precondition: dtype is in `set`, which the
/// public boundary checks; any other value takes the first member's branch.
template <DType kFirst, DType... kRest, typename F>
constexpr decltype(auto) dispatch_dtype(DTypeSet<kFirst, kRest...>, DType dtype, F&& f) {
  if constexpr (sizeof...(kRest) > 0) {
    if (dtype != kFirst && ((dtype == kRest) || ...)) {
      return dispatch_dtype(DTypeSet<kRest...>{}, dtype, std::forward<F>(f));
    }
  }
  return std::forward<F>(f)(DTypeTag<kFirst>{});
}

/// dispatch_dtype over every storage dtype.
template <typename F>
constexpr decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  return dispatch_dtype(kAllDTypes, dtype, std::forward<F>(f));
}

}  // namespace pagedkv::detail
