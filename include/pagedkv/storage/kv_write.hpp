#pragma once
/// @file kv_write.hpp
/// The host cache write over any KVLayerView (pagedkv's own pools or memory the caller owns),
/// and the calibration of 8-bit scales.

#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// reshape_and_cache (vLLM's name) on host memory: writes the K and V of new tokens to their
/// slots of `cache`, converting fp32 to cache.dtype with round to nearest even; for a quantized
/// dtype stored = Q(x / scale[kv_head]) with saturation (dtype.hpp). fp16 / bf16 K/V: the
/// ActivationView overload below.
/// Shapes: slot_mapping [num_tokens] int64 (negative = padding, skipped);
///         k, v [num_tokens, num_kv_heads, head_dim] fp32, rows contiguous.
/// Errors: throws pagedkv::Error if the view has a null pool or a size < 1 (even with no
/// tokens), k / v sizes differ from num_tokens * num_kv_heads * head_dim (naming both), a slot
/// is >= cache.num_blocks * cache.block_size (naming the slot and the token), or (quantized) a
/// scale is null or not finite and > 0 (naming it); all checked before anything is written, so
/// a failed write changes nothing.
/// Worked example: a pool of 2 blocks of 4 tokens, 1 head of 2 dims, NHD:
/// reshape_and_cache(view, {5}, {1, 2}, {3, 4}) puts K {1, 2} at element offset 5 * 2 = 10 of
/// view.k (block 1, token 1).
void reshape_and_cache(const KVLayerView& cache, std::span<const Slot> slot_mapping,
                       std::span<const float> k, std::span<const float> v);

/// reshape_and_cache with K and V in an engine's activation dtype (fp32, fp16 or bf16, the same
/// or not): each element is widened exactly to fp32 (f16_to_f32 / bf16_to_f32) and stored as the
/// fp32 overload stores it (round to nearest even to cache.dtype; 8-bit: x * (1 / scale), then
/// saturated), so the pool holds, bit for bit, what the fp32 write of the widened values puts
/// there. An fp32 view is read in place; fp16 / bf16 K and V are widened into a buffer first
/// (num_tokens * num_kv_heads * head_dim floats each).
/// Shapes: slot_mapping [num_tokens] int64 (negative = padding, skipped);
///         k, v [num_tokens, num_kv_heads, head_dim] of k.dtype / v.dtype, rows contiguous;
///         k.size, v.size in elements.
/// Errors: throws pagedkv::Error naming the dtype if k.dtype or v.dtype is not fp32, fp16 or bf16
/// (an 8-bit format is a storage format, not an activation), naming the argument if its data is
/// null with size > 0, and otherwise as the fp32 overload; all checked before anything is
/// written, so a failed write changes nothing.
/// Worked example: with `k16` [1, 1, 2] bf16 {0x3FC0, 0x4000} (1.5, 2.0), an fp32 NHD view of 1
/// head of 2 dims: reshape_and_cache(view, {5}, {k16, 2, DType::kBF16}, {v16, 2, DType::kBF16})
/// puts K {1.5f, 2.0f} at element offset 10 of view.k. With both overloads, `{}` for k and v
/// is ambiguous: an empty write passes typed empty spans or views.
void reshape_and_cache(const KVLayerView& cache, std::span<const Slot> slot_mapping,
                       ActivationView k, ActivationView v);

/// Scales of one layer (K and V), [num_kv_heads] each.
struct KVScales {
  std::vector<float> k;  ///< K scales, [num_kv_heads]
  std::vector<float> v;  ///< V scales, [num_kv_heads]
};

/// Calibrates the scales of a quantized `dtype` from a batch of K/V (the first prefill, as
/// vLLM's calculate_kv_scales does): scale = headroom * max |x| / dtype_max_finite(dtype), over
/// the whole batch (kPerTensor, then repeated per head) or per kv head (kPerHead). Non-finite
/// elements are left out of the max; a max of 0 (or no finite element) gives scale 1.
/// headroom (>= 1): 1 maps the batch's max to the format's max; 2 leaves room for values twice
/// as large before they saturate (KVCacheConfig::calibration_headroom).
/// Shapes: k, v [num_tokens, num_kv_heads, head_dim] fp32; returns [num_kv_heads] each.
/// Errors: throws pagedkv::Error if dtype is not quantized, num_kv_heads or head_dim < 1, the
/// sizes are not a multiple of num_kv_heads * head_dim or differ from each other, or headroom
/// is not finite and >= 1.
[[nodiscard]] KVScales calibrate_kv_scales(DType dtype, KVScaleGranularity granularity,
                                           int32_t num_kv_heads, int32_t head_dim,
                                           std::span<const float> k, std::span<const float> v,
                                           float headroom = 1.0f);

/// The scales a quantized layer of `config` keeps for set_scales' arguments: one value each
/// for K and V (per tensor, repeated per head), or num_kv_heads values each (kPerHead only);
/// the check and expansion of HostKVCache::set_scales and cuda::DeviceKVCache::set_scales.
/// `fn` names the caller in messages. Shapes: k_scale, v_scale [1] or [num_kv_heads]; returns
/// [num_kv_heads] each.
/// Errors: throws pagedkv::Error if config.dtype is not quantized, a count is neither 1 nor
/// (per head) num_kv_heads, or a scale is not finite and > 0 (naming it, its index and value).
[[nodiscard]] KVScales expand_kv_scales(const char* fn, const KVCacheConfig& config,
                                        std::span<const float> k_scale,
                                        std::span<const float> v_scale);

}  // namespace pagedkv
