// Public CUDA decode-attention entry points: every contract check happens here, on the host,
// before any CUDA call; then cuda/kernels/decode_attention.cu launches kernels that trust their
// inputs.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/check.hpp"
#include "cuda/host/cuda_check.hpp"
#include "cuda/launch.hpp"
#include "pagedkv/cuda/decode_attention.hpp"

namespace pagedkv::cuda {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int32_t kMaxGridY = 65535;

void check_device_ptr(const char* fn, const char* what, const void* p) {
  PAGEDKV_CHECK(p != nullptr, "{}: {} is null", fn, what);
  PAGEDKV_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "{}: {} ({}) is not 16-byte aligned", fn,
                what, p);
}

void check_stride(const char* fn, const char* what, int64_t stride, DType dtype) {
  PAGEDKV_CHECK(stride >= 0 && (stride * dtype_size(dtype)) % 16 == 0,
                "{}: {} {} ({} bytes) is not a non-negative multiple of 16 bytes", fn, what, stride,
                stride * dtype_size(dtype));
}

/// The pools of a device layer view: aligned, non-null, 16-byte strides (cp.async chunks).
void check_device_view(const char* fn, const KVLayerView& cache) {
  check_device_ptr(fn, "cache.k", cache.k);
  check_device_ptr(fn, "cache.v", cache.v);
  check_stride(fn, "block_stride", cache.block_stride, cache.dtype);
  check_stride(fn, "head_stride", cache.head_stride, cache.dtype);
  check_stride(fn, "token_stride", cache.token_stride, cache.dtype);
}

/// q or out of a launch: fp32, fp16 or bf16 with num_seqs x num_heads x head_dim elements.
void check_activations(const char* fn, const char* what, const void* data, size_t size, DType dtype,
                       int32_t num_seqs, const AttentionParams& params) {
  PAGEDKV_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16,
                "{}: {} dtype {} is not an activation dtype (fp32, fp16 or bf16)", fn, what,
                dtype_name(dtype));
  const int64_t want = int64_t{num_seqs} * params.num_heads * params.head_dim;
  PAGEDKV_CHECK(static_cast<int64_t>(size) == want,
                "{}: {} has {} elements, expected {} ({} sequences x {} heads x {} dims)", fn, what,
                size, want, num_seqs, params.num_heads, params.head_dim);
  check_device_ptr(fn, what, data);
}

/// DecodeLaunch::use_tensor_cores needs fp16 / bf16 K/V and a fast head_dim.
void check_tensor_cores(const char* fn, const DecodeLaunch& launch, DType dtype, int32_t head_dim) {
  if (!launch.use_tensor_cores) return;
  PAGEDKV_CHECK(dtype == DType::kF16 || dtype == DType::kBF16,
                "{}: use_tensor_cores needs fp16 or bf16 K/V, got {}", fn, dtype_name(dtype));
  PAGEDKV_CHECK(
      std::find(kDecodeHeadDims.begin(), kDecodeHeadDims.end(), head_dim) != kDecodeHeadDims.end(),
      "{}: use_tensor_cores needs head_dim 64, 128 or 256, got {}", fn, head_dim);
}

/// The part of the launch common to both layouts. `num_seqs` > 0.
detail::DecodeProblem make_problem(const char* fn, const AttentionParams& params, int32_t num_seqs,
                                   const int32_t* context_lens, ActivationView q,
                                   MutableActivationView out, const DecodeLaunch& launch) {
  PAGEDKV_CHECK(num_seqs <= kMaxGridY, "{}: num_seqs {} exceeds the grid limit {}", fn, num_seqs,
                kMaxGridY);
  PAGEDKV_CHECK(context_lens != nullptr, "{}: context_lens is null for {} sequences", fn, num_seqs);
  check_activations(fn, "q", q.data, q.size, q.dtype, num_seqs, params);
  check_activations(fn, "out", out.data, out.size, out.dtype, num_seqs, params);
  const DecodePlan& plan = launch.plan;
  PAGEDKV_CHECK(plan.num_splits >= 1 && plan.num_splits <= kMaxSplits,
                "{}: plan.num_splits {} outside [1, {}]", fn, plan.num_splits, kMaxSplits);
  PAGEDKV_CHECK(!plan.split_k() || plan.chunk_tokens >= 1,
                "{}: plan.chunk_tokens must be >= 1 with {} splits, got {}", fn, plan.num_splits,
                plan.chunk_tokens);
  const int64_t need = decode_workspace_bytes(num_seqs, params.num_heads, params.head_dim, plan);
  if (need > 0) {
    check_device_ptr(fn, "workspace", launch.workspace);
    PAGEDKV_CHECK(launch.workspace_bytes >= need,
                  "{}: workspace of {} bytes is smaller than the {} bytes this plan needs "
                  "({} splits; see decode_workspace_bytes)",
                  fn, launch.workspace_bytes, need, plan.num_splits);
  }

  detail::DecodeProblem p;
  p.q = q.data;
  p.out = out.data;
  p.q_dtype = q.dtype;
  p.out_dtype = out.dtype;
  p.context_lens = context_lens;
  p.num_seqs = num_seqs;
  p.num_heads = params.num_heads;
  p.num_kv_heads = params.num_kv_heads;
  p.group = params.num_heads / params.num_kv_heads;
  p.head_chunks = (p.group + kHeadsPerCta - 1) / kHeadsPerCta;
  p.num_splits = plan.num_splits;
  p.chunk_tokens = plan.split_k() ? plan.chunk_tokens : 0;
  p.scale_log2 = params.softmax_scale() * kLog2e;
  p.window_left = params.window_left;
  p.sink_tokens = params.sink_tokens;
  p.chunk_size = params.chunk_size;
  p.tensor_cores = launch.use_tensor_cores;
  if (plan.split_k()) {
    // Same carving as decode_workspace_bytes: partial outputs, then 256-byte aligned lse.
    const int64_t rows = int64_t{num_seqs} * params.num_heads * plan.num_splits;
    const int64_t o_bytes = (rows * params.head_dim * 4 + 255) / 256 * 256;
    p.partial_o = static_cast<float*>(launch.workspace);
    p.partial_lse = reinterpret_cast<float*>(static_cast<std::byte*>(launch.workspace) + o_bytes);
  }
  PAGEDKV_CHECK(int64_t{p.num_kv_heads} * p.head_chunks <= INT32_MAX,
                "{}: {} kv heads x {} head chunks exceed the grid", fn, p.num_kv_heads,
                p.head_chunks);
  return p;
}

}  // namespace

void detail::check_device_attention_params(const char* fn, const AttentionParams& params,
                                           const KVLayerView& cache) {
  check_attention_shape(params, cache);
  if (!dtype_is_quantized(cache.dtype)) return;
  for (const auto& [name, s] : {std::pair{"k_scale", cache.k_scale}, {"v_scale", cache.v_scale}}) {
    PAGEDKV_CHECK(s != nullptr && reinterpret_cast<uintptr_t>(s) % alignof(float) == 0,
                  "{}: a {} cache needs a device {} of {} floats, got {}", fn,
                  dtype_name(cache.dtype), name, cache.num_kv_heads, static_cast<const void*>(s));
  }
}

DecodePlan make_decode_plan(const AttentionParams& params, DType dtype, int32_t num_seqs,
                            int64_t max_context_len) {
  check_decode_config(dtype, params.head_dim);
  int device = 0;
  PAGEDKV_CUDA_CHECK(cudaGetDevice(&device));
  int sm_count = 0;
  PAGEDKV_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  DecodePlanInput in;
  in.num_seqs = num_seqs;
  in.num_heads = params.num_heads;
  in.num_kv_heads = params.num_kv_heads;
  in.max_context_len = max_context_len;
  in.sm_count = sm_count;
  in.ctas_per_sm = detail::decode_ctas_per_sm(dtype, params.head_dim);
  return plan_decode(in);
}

void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, const float* q, float* out,
                            const DecodeLaunch& launch) {
  const auto n = static_cast<size_t>(std::max(tables.num_seqs, 0)) *
                 static_cast<size_t>(std::max(params.num_heads, 0)) *
                 static_cast<size_t>(std::max(params.head_dim, 0));
  paged_decode_attention(params, cache, tables, ActivationView{q, n, DType::kF32},
                         MutableActivationView{out, n, DType::kF32}, launch);
}

void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, ActivationView q,
                            MutableActivationView out, const DecodeLaunch& launch) {
  constexpr const char* kFn = "cuda::paged_decode_attention";
  check_decode_config(cache.dtype, cache.head_dim, cache.block_size);
  check_tensor_cores(kFn, launch, cache.dtype, cache.head_dim);
  detail::check_device_attention_params(kFn, params, cache);
  check_table_geometry(kFn, cache, tables.block_size, tables.num_blocks);
  PAGEDKV_CHECK(tables.num_seqs >= 0, "{}: num_seqs must be >= 0, got {}", kFn, tables.num_seqs);
  if (tables.num_seqs == 0) return;
  PAGEDKV_CHECK(tables.max_blocks_per_seq >= 1, "{}: max_blocks_per_seq must be >= 1, got {}", kFn,
                tables.max_blocks_per_seq);
  PAGEDKV_CHECK(tables.block_tables != nullptr, "{}: block_tables is null", kFn);
  check_device_view(kFn, cache);
  detail::DecodeProblem p =
      make_problem(kFn, params, tables.num_seqs, tables.context_lens, q, out, launch);
  p.k_scale = cache.k_scale;
  p.v_scale = cache.v_scale;

  detail::PagedKV kv;
  kv.k = cache.k;
  kv.v = cache.v;
  kv.block_tables = tables.block_tables;
  kv.block_stride = cache.block_stride;
  kv.head_stride = cache.head_stride;
  kv.token_stride = cache.token_stride;
  kv.max_blocks_per_seq = tables.max_blocks_per_seq;
  while ((int32_t{1} << kv.log2_block_size) < cache.block_size) ++kv.log2_block_size;
  detail::launch_paged_decode(cache.dtype, cache.head_dim, p, kv, launch.stream);
}

void contiguous_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                                 const int32_t* context_lens, const float* q, float* out,
                                 const DecodeLaunch& launch) {
  constexpr const char* kFn = "cuda::contiguous_decode_attention";
  check_decode_config(cache.dtype, cache.head_dim);
  check_tensor_cores(kFn, launch, cache.dtype, cache.head_dim);
  detail::check_device_attention_params(kFn, params, cache);
  check_device_view(kFn, cache);
  // Sequence i is block i (contiguous_paged_view).
  const auto n = static_cast<size_t>(std::max(cache.num_blocks, 0)) *
                 static_cast<size_t>(std::max(params.num_heads, 0)) *
                 static_cast<size_t>(std::max(params.head_dim, 0));
  detail::DecodeProblem p =
      make_problem(kFn, params, cache.num_blocks, context_lens, ActivationView{q, n, DType::kF32},
                   MutableActivationView{out, n, DType::kF32}, launch);
  p.k_scale = cache.k_scale;
  p.v_scale = cache.v_scale;
  detail::launch_contiguous_decode(cache.dtype, cache.head_dim, p, detail::contiguous_kv(cache),
                                   launch.stream);
}

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
