#include "pagedkv/storage/kv_write.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "core/activations.hpp"
#include "core/check.hpp"
#include "core/dtype_dispatch.hpp"
#include "storage/host_kv_cache_ops.hpp"

namespace pagedkv {

namespace {

/// The stores of a checked write; kT folds the dtype switch out of the element loop.
template <DType kT>
void store_tokens(const KVLayerView& c, std::span<const Slot> slots, const float* k,
                  const float* v) {
  const int64_t token_elems = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;  // padding token
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      const int64_t dst = c.slot_offset(slots[t], h);
      const int64_t src = static_cast<int64_t>(t) * token_elems + int64_t{h} * c.head_dim;
      // 1 / scale once per head: the quantized store multiplies (the kernels multiply back).
      const float ik = dtype_is_quantized(kT) ? 1.0f / c.k_scale[h] : 1.0f;
      const float iv = dtype_is_quantized(kT) ? 1.0f / c.v_scale[h] : 1.0f;
      for (int32_t d = 0; d < c.head_dim; ++d) {
        store_from_f32(c.k, kT, dst + d, dtype_is_quantized(kT) ? k[src + d] * ik : k[src + d]);
        store_from_f32(c.v, kT, dst + d, dtype_is_quantized(kT) ? v[src + d] * iv : v[src + d]);
      }
    }
  }
}

}  // namespace

void reshape_and_cache(const KVLayerView& cache, std::span<const Slot> slot_mapping,
                       std::span<const float> k, std::span<const float> v) {
  constexpr const char* kFn = "reshape_and_cache";
  detail::check_view_pools(kFn, cache);  // even for no tokens: a broken view is a bad argument
  const int64_t num_tokens = static_cast<int64_t>(slot_mapping.size());
  const int64_t token_elems = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  const int64_t expected = num_tokens * token_elems;
  PAGEDKV_CHECK(static_cast<int64_t>(k.size()) == expected,
                "{}: k has {} elements, expected {} ({} tokens x {} kv heads x {} dims)", kFn,
                k.size(), expected, num_tokens, cache.num_kv_heads, cache.head_dim);
  PAGEDKV_CHECK(static_cast<int64_t>(v.size()) == expected,
                "{}: v has {} elements, expected {} ({} tokens x {} kv heads x {} dims)", kFn,
                v.size(), expected, num_tokens, cache.num_kv_heads, cache.head_dim);
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    PAGEDKV_CHECK(slot_mapping[t] < num_slots, "{}: slot {} of token {} out of range [0, {})", kFn,
                  slot_mapping[t], t, num_slots);
  }
  if (num_tokens == 0) return;
  if (dtype_is_quantized(cache.dtype)) detail::check_view_scales(kFn, cache);
  detail::write_slots(cache, slot_mapping, k, v);
}

void reshape_and_cache(const KVLayerView& cache, std::span<const Slot> slot_mapping,
                       ActivationView k, ActivationView v) {
  constexpr const char* kFn = "reshape_and_cache";
  detail::check_activation(kFn, "k", k.dtype, k.data, k.size);
  detail::check_activation(kFn, "v", v.dtype, v.data, v.size);
  // Widened in full before the fp32 overload runs its checks: a failed write still stores
  // nothing, and the stores see exactly the fp32 values an fp32 caller would pass.
  std::vector<float> k_buffer;
  std::vector<float> v_buffer;
  reshape_and_cache(cache, slot_mapping, detail::widened(k, k_buffer),
                    detail::widened(v, v_buffer));
}

void detail::write_slots(const KVLayerView& cache, std::span<const Slot> slot_mapping,
                         std::span<const float> k, std::span<const float> v) {
  dispatch_dtype(cache.dtype, [&](auto tag) {
    store_tokens<decltype(tag)::value>(cache, slot_mapping, k.data(), v.data());
  });
}

KVScales calibrate_kv_scales(DType dtype, KVScaleGranularity granularity, int32_t num_kv_heads,
                             int32_t head_dim, std::span<const float> k, std::span<const float> v,
                             float headroom) {
  constexpr const char* kFn = "calibrate_kv_scales";
  PAGEDKV_CHECK(dtype_is_quantized(dtype), "{}: dtype {} has no scales (8-bit dtypes only)", kFn,
                dtype_name(dtype));
  PAGEDKV_CHECK(num_kv_heads >= 1 && head_dim >= 1,
                "{}: num_kv_heads {} and head_dim {} must be >= 1", kFn, num_kv_heads, head_dim);
  PAGEDKV_CHECK(std::isfinite(headroom) && headroom >= 1.0f,
                "{}: headroom must be finite and >= 1, got {}", kFn, headroom);
  const int64_t token_elems = int64_t{num_kv_heads} * head_dim;
  PAGEDKV_CHECK(k.size() == v.size() && static_cast<int64_t>(k.size()) % token_elems == 0,
                "{}: k has {} and v {} elements; both must be the same multiple of {} (kv heads "
                "x head_dim)",
                kFn, k.size(), v.size(), token_elems);
  const auto max_abs = [&](std::span<const float> x, int32_t head) {
    float m = 0.0f;
    for (size_t i = static_cast<size_t>(head) * head_dim; i < x.size();
         i += static_cast<size_t>(token_elems)) {
      for (int32_t d = 0; d < head_dim; ++d) {
        const float a = std::fabs(x[i + d]);
        if (std::isfinite(a)) m = std::max(m, a);
      }
    }
    return m;
  };
  KVScales s;
  for (int kv = 0; kv < 2; ++kv) {
    const std::span<const float> x = kv == 0 ? k : v;
    std::vector<float> maxes;
    for (int32_t h = 0; h < num_kv_heads; ++h) maxes.push_back(max_abs(x, h));
    if (granularity == KVScaleGranularity::kPerTensor) {
      std::fill(maxes.begin(), maxes.end(), *std::max_element(maxes.begin(), maxes.end()));
    }
    // A subnormal max would divide to 0: the smallest normal float keeps the scale valid.
    for (float& m : maxes) {
      // Clamped to the largest float: a huge max times the headroom must stay a valid scale.
      m = m > 0.0f
              ? std::clamp(m / dtype_max_finite(dtype) * headroom,
                           std::numeric_limits<float>::min(), std::numeric_limits<float>::max())
              : 1.0f;
    }
    (kv == 0 ? s.k : s.v) = std::move(maxes);
  }
  return s;
}

KVScales expand_kv_scales(const char* fn, const KVCacheConfig& config,
                          std::span<const float> k_scale, std::span<const float> v_scale) {
  PAGEDKV_CHECK(dtype_is_quantized(config.dtype), "{}: dtype {} has no scales (8-bit only)", fn,
                dtype_name(config.dtype));
  const bool per_head = config.scale_granularity == KVScaleGranularity::kPerHead;
  const auto heads = static_cast<size_t>(config.num_kv_heads);
  for (const auto& [name, s] : {std::pair{"k_scale", k_scale}, std::pair{"v_scale", v_scale}}) {
    PAGEDKV_CHECK(
        s.size() == 1 || (per_head && s.size() == heads), "{}: {} has {} values, expected 1{}", fn,
        name, s.size(),
        per_head ? " or " + std::to_string(heads) + " (one per kv head)" : " (per-tensor scales)");
    for (size_t i = 0; i < s.size(); ++i) {
      PAGEDKV_CHECK(std::isfinite(s[i]) && s[i] > 0.0f,
                    "{}: {}[{}] is {}: a scale must be finite and > 0", fn, name, i, s[i]);
    }
  }
  KVScales out;
  for (size_t h = 0; h < heads; ++h) {
    out.k.push_back(k_scale[k_scale.size() == 1 ? 0 : h]);
    out.v.push_back(v_scale[v_scale.size() == 1 ? 0 : h]);
  }
  return out;
}

}  // namespace pagedkv
