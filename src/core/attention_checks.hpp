#pragma once
// Contract checks shared by every attention entry point that takes host spans (the CPU kernels
// of src/cpu and the device runner of cuda/host), so both reject a call with the same message.
// Private; not installed.

#include <cstddef>
#include <cstdint>

#include "core/check.hpp"
#include "pagedkv/attention_params.hpp"

namespace pagedkv::detail {

/// Checks that a q or out buffer holds `rows` query rows: rows * num_heads * head_dim elements.
/// Errors: throws pagedkv::Error "<fn>: <what> has N elements, expected M (R rows x H heads x
/// D dims)".
inline void check_attention_rows(const char* fn, const char* what, size_t size, int64_t rows,
                                 const AttentionParams& params) {
  const int64_t expected = rows * params.num_heads * params.head_dim;
  PAGEDKV_CHECK(static_cast<int64_t>(size) == expected,
                "{}: {} has {} elements, expected {} ({} rows x {} heads x {} dims)", fn, what,
                size, expected, rows, params.num_heads, params.head_dim);
}

}  // namespace pagedkv::detail
