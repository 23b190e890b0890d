// The CPU attention entry points for q / out in fp32, fp16 or bf16 (an engine's activations):
// fp16/bf16 q is widened once into an fp32 buffer (exact), the fp32 entry point runs (all its
// checks included) into an fp32 buffer, and the result is rounded to nearest even into out.
// q is a few KiB per row against the K/V the kernel streams, so the extra pass costs little.

#include <cstdint>
#include <span>
#include <vector>

#include "core/activations.hpp"
#include "pagedkv/cpu/attention.hpp"

namespace pagedkv {

namespace {

/// Where the fp32 kernel writes: out itself for fp32, else `buffer` (rounded by store_rounded).
std::span<float> fp32_target(MutableActivationView out, std::vector<float>& buffer) {
  if (out.dtype == DType::kF32) return {static_cast<float*>(out.data), out.size};
  buffer.resize(out.size);
  return buffer;
}

void store_rounded(std::span<const float> result, MutableActivationView out) {
  if (out.dtype == DType::kF32) return;  // written in place
  for (size_t i = 0; i < result.size(); ++i)
    store_from_f32(out.data, out.dtype, int64_t(i), result[i]);
}

/// Runs `kernel(q fp32, out fp32)` between the widening and the rounding. For an fp32 out the
/// fp32 kernel writes it directly, which also happens only after every check passed.
template <class Kernel>
void with_fp32(const char* fn, ActivationView q, MutableActivationView out, Kernel&& kernel) {
  detail::check_activation(fn, "q", q.dtype, q.data, q.size);
  detail::check_activation(fn, "out", out.dtype, out.data, out.size);
  std::vector<float> q_buffer;
  std::vector<float> out_buffer;
  const std::span<const float> qf = detail::widened(q, q_buffer);
  const std::span<float> of = fp32_target(out, out_buffer);
  kernel(qf, of);
  store_rounded(of, out);
}

}  // namespace

void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, ActivationView q,
                            MutableActivationView out) {
  with_fp32("paged_decode_attention", q, out, [&](std::span<const float> qf, std::span<float> of) {
    paged_decode_attention(params, cache, tables, qf, of);
  });
}

void paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                             const BlockTableView& tables, std::span<const int32_t> query_start,
                             ActivationView q, MutableActivationView out) {
  with_fp32("paged_prefill_attention", q, out, [&](std::span<const float> qf, std::span<float> of) {
    paged_prefill_attention(params, cache, tables, query_start, qf, of);
  });
}

}  // namespace pagedkv
