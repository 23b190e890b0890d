#pragma once
/// @file kv_cache_config.hpp
/// Geometry of a paged KV cache and its memory formula. Shared by host and device storage.

#include <cstddef>
#include <cstdint>

#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv {

/// Where a block's K and V live in a layer's storage, host or device (the view's strides
/// express either; kernels do not care). Default: kInterleaved (KVCacheConfig::placement).
enum class KVPlacement : uint8_t {
  /// Per layer a K pool and a V pool, each [num_blocks, ...layout] (vLLM's caches).
  kSeparate,
  /// Per layer one pool [num_blocks, 2 (K then V), ...layout]: a block's K and V are adjacent,
  /// so a scattered block is one run twice as long (FlashInfer's paged kv_cache). Measured
  /// (bench_attention_cpu, bf16 d128, block_size 16-32, 8 kv heads, shuffled block tables):
  /// CPU paged decode 1-7% faster than with separate pools (docs/benchmarks.md).
  kInterleaved,
};

/// How many scales a quantized (8-bit) layer has for K and for V (dtype.hpp: x = stored *
/// scale). Ignored by the float dtypes.
enum class KVScaleGranularity : uint8_t {
  kPerTensor,  ///< one K scale and one V scale per layer (vLLM's k_scale / v_scale)
  kPerHead,    ///< one per kv head and layer (vLLM's per-head fp8 scales)
};

/// Geometry of a paged KV cache: num_layers x {K, V} pools of num_blocks blocks.
/// Every size must be >= 1 (validate()); num_blocks has no usable default and must be set.
/// Memory: kv_cache_bytes(config).
struct KVCacheConfig {
  int32_t num_layers = 1;            ///< transformer layers; every block id indexes all of them
  int32_t num_blocks = 0;            ///< blocks per pool (= KVCacheManagerConfig::num_blocks), >= 1
  int32_t block_size = 16;           ///< tokens per block (= KVCacheManagerConfig::block_size)
  int32_t num_kv_heads = 1;          ///< K/V heads per layer (GQA: num_heads / group)
  int32_t head_dim = 64;             ///< elements per head vector
  DType dtype = DType::kF32;         ///< storage element type (compute is fp32)
  KVLayout layout = KVLayout::kHND;  ///< order of (kv head, token) inside a block
  /// Where a block's K and V live: interleaved (default) or separate pools.
  KVPlacement placement = KVPlacement::kInterleaved;
  /// Scales of a quantized dtype: per tensor (default) or per kv head.
  KVScaleGranularity scale_granularity = KVScaleGranularity::kPerTensor;
  /// Factor (>= 1, finite) on the scales a quantized cache calibrates on its first write
  /// (HostKVCache::write): room for later tokens beyond the first prefill's range, which would
  /// otherwise saturate. 1 is vLLM's calculate_kv_scales (max |x| / format max); on stories260K
  /// with 5- and 8-token prompts 2 cut int8's attention-output NMSE from 0.33 to 0.027
  /// (docs/quantization.md). Unused by scales set with set_scales.
  float calibration_headroom = 1.0f;
};

/// Checks every field: sizes >= 1, dtype / layout / placement a known enumerator, and the
/// elements of a pool and the total bytes representable in int64.
/// Errors: throws pagedkv::Error naming the field and value.
void validate(const KVCacheConfig& config);

/// The geometry of one layer of a cache with this config, over K and V data at `k` and `v`:
/// dtype, block counts and sizes, and the strides (elements) of config.layout, with the
/// block_stride doubled for KVPlacement::kInterleaved (K and V alternate block by block).
/// Shared by HostKVCache and cuda::DeviceKVCache, so both give identical views.
[[nodiscard]] KVLayerView layer_view(const KVCacheConfig& c, void* k, void* v);

/// Elements in one pool (K or V) of one layer: num_blocks * block_size * num_kv_heads * head_dim.
[[nodiscard]] constexpr int64_t pool_elements(const KVCacheConfig& c) {
  return static_cast<int64_t>(c.num_blocks) * c.block_size * c.num_kv_heads * c.head_dim;
}

/// KV-cache bytes for `num_tokens` token positions:
///   bytes = 2 (K and V) x L layers x T tokens x H_kv x D x sizeof(dtype)
/// (the formula of DESIGN.md with B sequences folded into T; source: Kwon et al., "Efficient
/// Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023, sec. 2).
[[nodiscard]] constexpr int64_t kv_bytes_for_tokens(int64_t num_layers, int64_t num_kv_heads,
                                                    int64_t head_dim, DType dtype,
                                                    int64_t num_tokens) {
  return 2 * num_layers * num_tokens * num_kv_heads * head_dim * dtype_size(dtype);
}

/// Bytes of the scales of a quantized dtype, 0 for the float ones: 2 (K, V) x L layers x H_kv
/// x 4 (fp32), as stored (a per-tensor scale is kept once per kv head, the form the kernels
/// read: KVLayerView::k_scale).
[[nodiscard]] constexpr int64_t kv_scale_bytes(const KVCacheConfig& c) {
  return dtype_is_quantized(c.dtype) ? 2 * int64_t{c.num_layers} * c.num_kv_heads * 4 : 0;
}

/// Where the scales of (layer, K or V) start in a quantized cache's scale array, which holds
/// [num_layers, 2 (K, V), num_kv_heads] floats (kv_scale_bytes): (2 layer + value) x num_kv_heads.
/// Shared by HostKVCache and cuda::DeviceKVCache. Units: floats.
[[nodiscard]] constexpr ptrdiff_t scale_offset(const KVCacheConfig& c, int32_t layer, bool value) {
  return (2 * static_cast<ptrdiff_t>(layer) + (value ? 1 : 0)) * c.num_kv_heads;
}

/// Total bytes of the cache: the pools, kv_bytes_for_tokens(..., num_blocks * block_size),
/// plus kv_scale_bytes(c).
[[nodiscard]] constexpr int64_t kv_cache_bytes(const KVCacheConfig& c) {
  return kv_bytes_for_tokens(c.num_layers, c.num_kv_heads, c.head_dim, c.dtype,
                             static_cast<int64_t>(c.num_blocks) * c.block_size) +
         kv_scale_bytes(c);
}

}  // namespace pagedkv
