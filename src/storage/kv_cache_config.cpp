#include "pagedkv/storage/kv_cache_config.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/check.hpp"

namespace pagedkv {

namespace {

/// Stores a * b and returns true when the product fits in int64 (operands are >= 1 here).
bool mul_fits(int64_t a, int64_t b, int64_t* result) {
  if (a > std::numeric_limits<int64_t>::max() / b) return false;
  *result = a * b;
  return true;
}

}  // namespace

void validate(const KVCacheConfig& c) {
  PAGEDKV_CHECK(c.num_layers >= 1, "KVCacheConfig: num_layers must be >= 1, got {}", c.num_layers);
  PAGEDKV_CHECK(c.num_blocks >= 1, "KVCacheConfig: num_blocks must be >= 1, got {}", c.num_blocks);
  PAGEDKV_CHECK(c.block_size >= 1, "KVCacheConfig: block_size must be >= 1, got {}", c.block_size);
  PAGEDKV_CHECK(c.num_kv_heads >= 1, "KVCacheConfig: num_kv_heads must be >= 1, got {}",
                c.num_kv_heads);
  PAGEDKV_CHECK(c.head_dim >= 1, "KVCacheConfig: head_dim must be >= 1, got {}", c.head_dim);
  const auto dtype_raw = static_cast<int>(c.dtype);
  PAGEDKV_CHECK(dtype_raw >= 0 && dtype_raw <= static_cast<int>(DType::kInt8),
                "KVCacheConfig: unknown dtype value {}", dtype_raw);
  const auto layout_raw = static_cast<int>(c.layout);
  PAGEDKV_CHECK(layout_raw >= 0 && layout_raw <= static_cast<int>(KVLayout::kNHD),
                "KVCacheConfig: unknown layout value {}", layout_raw);
  const auto placement_raw = static_cast<int>(c.placement);
  PAGEDKV_CHECK(placement_raw >= 0 && placement_raw <= static_cast<int>(KVPlacement::kInterleaved),
                "KVCacheConfig: unknown placement value {}", placement_raw);
  const auto granularity_raw = static_cast<int>(c.scale_granularity);
  PAGEDKV_CHECK(
      granularity_raw >= 0 && granularity_raw <= static_cast<int>(KVScaleGranularity::kPerHead),
      "KVCacheConfig: unknown scale_granularity value {}", granularity_raw);
  PAGEDKV_CHECK(std::isfinite(c.calibration_headroom) && c.calibration_headroom >= 1.0f,
                "KVCacheConfig: calibration_headroom must be finite and >= 1, got {}",
                c.calibration_headroom);
  // Four int32 factors can reach 2^124: check every partial product so that pool_elements() and
  // kv_cache_bytes() (which multiply without checks, being constexpr helpers) cannot overflow.
  int64_t n = c.num_blocks;
  bool ok = mul_fits(n, c.block_size, &n) && mul_fits(n, c.num_kv_heads, &n) &&
            mul_fits(n, c.head_dim, &n);
  PAGEDKV_CHECK(ok,
                "KVCacheConfig: pool of {} blocks x {} tokens x {} kv heads x {} dims overflows "
                "int64 elements",
                c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim);
  int64_t bytes = n;
  ok = mul_fits(bytes, dtype_size(c.dtype), &bytes) && mul_fits(bytes, 2, &bytes) &&
       mul_fits(bytes, c.num_layers, &bytes) &&
       bytes <= std::numeric_limits<int64_t>::max() - kv_scale_bytes(c);
  PAGEDKV_CHECK(ok, "KVCacheConfig: {} layers x 2 pools x {} elements of {} overflows int64 bytes",
                c.num_layers, n, dtype_name(c.dtype));
}

KVLayerView layer_view(const KVCacheConfig& c, void* k, void* v) {
  KVLayerView view;
  view.k = k;
  view.v = v;
  view.dtype = c.dtype;
  view.num_blocks = c.num_blocks;
  view.block_size = c.block_size;
  view.num_kv_heads = c.num_kv_heads;
  view.head_dim = c.head_dim;
  layout_strides(c.layout, c.block_size, c.num_kv_heads, c.head_dim, &view.block_stride,
                 &view.head_stride, &view.token_stride);
  if (c.placement == KVPlacement::kInterleaved) view.block_stride *= 2;  // K, V, K, V, ...
  return view;
}

}  // namespace pagedkv
