// Host-only parts of the CUDA backend, compiled in every build (with or without CUDA): the
// supported-configuration checks, the split-K heuristic, workspace sizing, and the device
// queries' stand-ins for builds without CUDA. No CUDA header here.

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/check.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/supported_configs.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::cuda {

namespace {

template <typename T, size_t N>
bool contains(const std::array<T, N>& list, T value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

template <size_t N>
std::string join(const std::array<int32_t, N>& list) {
  std::string s;
  for (int32_t x : list) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

std::string join_dtypes() {
  std::string s;
  for (DType d : kDecodeDTypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// "1..256; fast kernel: 64, 128, 256"
std::string head_dims_text() {
  return "1.." + std::to_string(kDecodeMaxHeadDim) + "; fast kernel: " + join(kDecodeHeadDims);
}

}  // namespace

bool is_supported_decode_config(DType dtype, int32_t head_dim) noexcept {
  return contains(kDecodeDTypes, dtype) && head_dim >= 1 && head_dim <= kDecodeMaxHeadDim;
}

bool is_supported_decode_config(DType dtype, int32_t head_dim, int32_t block_size) noexcept {
  return is_supported_decode_config(dtype, head_dim) && contains(kDecodeBlockSizes, block_size);
}

void check_decode_config(DType dtype, int32_t head_dim) {
  PAGEDKV_CHECK(contains(kDecodeDTypes, dtype),
                "CUDA decode attention: dtype {} is not supported (supported: {})",
                static_cast<int>(dtype), join_dtypes());
  PAGEDKV_CHECK(head_dim >= 1 && head_dim <= kDecodeMaxHeadDim,
                "CUDA decode attention: head_dim {} is not supported (supported: {})", head_dim,
                head_dims_text());
}

void check_decode_config(DType dtype, int32_t head_dim, int32_t block_size) {
  check_decode_config(dtype, head_dim);
  PAGEDKV_CHECK(contains(kDecodeBlockSizes, block_size),
                "CUDA decode attention: block_size {} is not supported (supported: {})", block_size,
                join(kDecodeBlockSizes));
}

std::string supported_decode_configs() {
  return "dtype {" + join_dtypes() + "} x head_dim {" + head_dims_text() + "} x block_size {" +
         join(kDecodeBlockSizes) + "}";
}

DecodePlan plan_decode(const DecodePlanInput& in) {
  PAGEDKV_CHECK(in.num_seqs >= 1, "plan_decode: num_seqs must be >= 1, got {}", in.num_seqs);
  PAGEDKV_CHECK(in.num_kv_heads >= 1, "plan_decode: num_kv_heads must be >= 1, got {}",
                in.num_kv_heads);
  PAGEDKV_CHECK(in.num_heads >= 1 && in.num_heads % in.num_kv_heads == 0,
                "plan_decode: num_heads {} is not a positive multiple of num_kv_heads {}",
                in.num_heads, in.num_kv_heads);
  PAGEDKV_CHECK(in.max_context_len >= 0, "plan_decode: max_context_len must be >= 0, got {}",
                in.max_context_len);
  PAGEDKV_CHECK(in.sm_count >= 1, "plan_decode: sm_count must be >= 1, got {}", in.sm_count);
  PAGEDKV_CHECK(in.ctas_per_sm >= 1, "plan_decode: ctas_per_sm must be >= 1, got {}",
                in.ctas_per_sm);

  const int64_t group = in.num_heads / in.num_kv_heads;
  const int64_t ctas = int64_t{in.num_seqs} * in.num_kv_heads * ceil_div(group, kHeadsPerCta);
  const int64_t slots = int64_t{in.sm_count} * in.ctas_per_sm;
  const int64_t max_ctx = in.max_context_len;
  const int64_t max_splits =
      std::min<int64_t>(kMaxSplits, ceil_div(std::max<int64_t>(max_ctx, 1), kMinSplitTokens));
  if (ctas >= slots || max_splits <= 1) return {};

  // Wave model (see the header): cost(1) is the one-pass kernel, no merge.
  DecodePlan best;
  int64_t best_cost = ceil_div(ctas, slots) * (max_ctx + kCtaOverheadTokens);
  for (int64_t s = 2; s <= max_splits; ++s) {
    const int64_t chunk = ceil_div(ceil_div(max_ctx, s), kSplitGranularity) * kSplitGranularity;
    const int64_t splits = ceil_div(max_ctx, chunk);
    if (splits <= 1) continue;
    const int64_t cost =
        ceil_div(ctas * splits, slots) * (chunk + kCtaOverheadTokens) + kMergeOverheadTokens;
    if (cost < best_cost) {
      best_cost = cost;
      best = {static_cast<int32_t>(splits), static_cast<int32_t>(chunk)};
    }
  }
  return best;
}

DecodePlan make_split_plan(int64_t max_context_len, int32_t num_splits) {
  PAGEDKV_CHECK(num_splits >= 1 && num_splits <= kMaxSplits,
                "make_split_plan: num_splits {} outside [1, {}]", num_splits, kMaxSplits);
  PAGEDKV_CHECK(max_context_len >= 0, "make_split_plan: max_context_len must be >= 0, got {}",
                max_context_len);
  if (num_splits == 1) return {};
  const int64_t chunk = std::max<int64_t>(1, ceil_div(max_context_len, num_splits));
  PAGEDKV_CHECK(chunk <= INT32_MAX, "make_split_plan: chunk of {} tokens exceeds int32", chunk);
  return {num_splits, static_cast<int32_t>(chunk)};
}

int64_t decode_workspace_bytes(int32_t num_seqs, int32_t num_heads, int32_t head_dim,
                               const DecodePlan& plan) {
  if (plan.num_splits <= 1) return 0;
  const int64_t rows = int64_t{num_seqs} * num_heads * plan.num_splits;
  const int64_t o_bytes = ceil_div(rows * head_dim * 4, 256) * 256;
  const int64_t lse_bytes = ceil_div(rows * 4, 256) * 256;
  return o_bytes + lse_bytes;
}

#if !PAGEDKV_WITH_CUDA
// Built without the CUDA backend: the device queries answer "no device", with the reason.

bool device_available() noexcept { return false; }

void require_device() {
  ::pagedkv::detail::fail("no CUDA device: pagedkv was built without CUDA (PAGEDKV_WITH_CUDA=0)");
}

DeviceInfo device_info() {
  require_device();
  return {};
}
#endif

}  // namespace pagedkv::cuda
