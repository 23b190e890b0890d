#pragma once
// The one widening of an engine's activations (ActivationView, dtype.hpp) to fp32, shared by the
// CPU attention overloads (src/cpu) and the host cache write (src/storage), so both accept the
// same dtypes with the same message and compute from the same exact fp32 values. Private; not
// installed.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/check.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::detail {

/// True for the activation dtypes: fp32, fp16 and bf16.
inline bool is_activation_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

/// Checks an activation buffer of `fn`'s argument `what`.
/// Errors: throws pagedkv::Error "<fn>: <what> dtype <name> is not fp32, fp16 or bf16", or
/// "<fn>: <what> is null with N elements".
inline void check_activation(const char* fn, const char* what, DType dtype, const void* data,
                             size_t size) {
  PAGEDKV_CHECK(is_activation_dtype(dtype), "{}: {} dtype {} is not fp32, fp16 or bf16", fn, what,
                dtype_name(dtype));
  PAGEDKV_CHECK(data != nullptr || size == 0, "{}: {} is null with {} elements", fn, what, size);
}

/// `a` as fp32: the caller's memory for fp32, else each element widened exactly (f16_to_f32,
/// bf16_to_f32) into `buffer`, which the result then points into.
/// Precondition: check_activation passed.
inline std::span<const float> widened(ActivationView a, std::vector<float>& buffer) {
  if (a.dtype == DType::kF32) return {static_cast<const float*>(a.data), a.size};
  buffer.resize(a.size);
  for (size_t i = 0; i < a.size; ++i) buffer[i] = load_as_f32(a.data, a.dtype, int64_t(i));
  return buffer;
}

}  // namespace pagedkv::detail
