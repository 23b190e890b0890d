#pragma once
// Test helper: the one bound of every attention kernel comparison (CPU kernels against the
// textbook reference, CUDA kernels against the CPU kernel), checked row by row.
//
// Why one absolute bound for every storage dtype: the comparison is always made on the same
// stored K/V (the reference reads the rounded fp16/bf16 values back from the cache, the GPU test
// runs the CPU kernel on the cache it uploaded), and q and the output are fp32 in every kernel
// (AttentionParams q/out are float spans or pointers; no kernel rounds them to the storage
// dtype). So the storage rounding is the same on both sides and cancels; what is left is the
// order of fp32 operations: scores (head_dim products), exp/exp2, the online-softmax rescaling,
// and the sums over the context. With |q|, |k|, |v| <= 1 (the scenarios draw from [-1, 1]) an
// output element is a convex combination of values in [-1, 1], and its fp32 error measured on
// the CPU at context 32768 is ~1e-7 (tests/cpu/test_attention_bound.cpp records it), ~100x
// below kAttentionMaxAbs; the GPU sums the same terms in shorter runs (a token group per lane,
// splits merged by log-sum-exp), so its error is of the same order or smaller.
// No kernel writes fp16/bf16 outputs; one that did would need the reference rounded to that
// dtype and a bound of an ulp or two of the output instead.
//
// Why absolute and per element, not relative to the batch's largest output: a long-context row
// has outputs of ~1e-2 (an average over many values) next to short rows of ~1, so a bound
// scaled by the batch maximum (the old 2e-2 relative, ~8e-3 absolute) is wider than anything a
// long row can show. One dropped key moves a row by p_j |v_j - o|, p_j ~ 1/context: ~3e-5 at
// context 32768, which the old bounds (2e-2 relative, 1e-4 absolute) let pass and this one
// catches (test_attention_bound.cpp shows both).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>

namespace pagedkv::testing {

/// Largest |out - ref| allowed for any element of an attention output (fp32 out, inputs in
/// [-1, 1]), whatever the storage dtype, when the reference saw the same stored K/V.
inline constexpr double kAttentionMaxAbs = 1e-5;

/// Passes when out and ref have the same size and every element of out is within `bound` of ref
/// (NaN fails). Elements are grouped in rows of `row_elems` (num_heads x head_dim of one query
/// token, or head_dim of one head) only to say where it fails: the message names the worst row,
/// element, both values and how many rows exceed the bound.
/// Use: EXPECT_TRUE(attention_within(out, ref, num_heads * head_dim)).
inline ::testing::AssertionResult attention_within(std::span<const float> out,
                                                   std::span<const float> ref, int64_t row_elems,
                                                   double bound = kAttentionMaxAbs) {
  if (out.size() != ref.size() || row_elems < 1) {
    return ::testing::AssertionFailure() << "out has " << out.size() << " elements, ref "
                                         << ref.size() << ", row_elems " << row_elems;
  }
  const auto n = static_cast<int64_t>(out.size());
  int64_t worst = -1;
  double worst_err = 0.0;
  int64_t bad_rows = 0;
  for (int64_t r = 0; r * row_elems < n; ++r) {
    bool bad = false;
    for (int64_t i = r * row_elems; i < std::min(n, (r + 1) * row_elems); ++i) {
      const double err = std::abs(static_cast<double>(out[i]) - ref[i]);
      // !(err <= bound) so that NaN counts as a failure.
      if (!(err <= bound)) {
        bad = true;
        if (worst < 0 || !(err <= worst_err)) {
          worst = i;
          worst_err = err;
        }
      }
    }
    bad_rows += bad ? 1 : 0;
  }
  if (worst < 0) return ::testing::AssertionSuccess();
  std::ostringstream msg;
  msg.precision(9);
  msg << bad_rows << " of " << (n + row_elems - 1) / row_elems << " rows exceed " << bound
      << "; worst: row " << worst / row_elems << " element " << worst % row_elems << ": out "
      << out[worst] << " ref " << ref[worst] << " |diff| " << worst_err;
  return ::testing::AssertionFailure() << msg.str();
}

}  // namespace pagedkv::testing
