#pragma once
/// @file kv_layer_view.hpp
/// Non-owning view of one layer's K and V pools: what attention and cache-write kernels take.
/// Header usable from host C++ and CUDA (no CUDA headers included).

#include <cstdint>
#include <span>

#include "pagedkv/attention_params.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Memory layout of a layer's K (and V) pool.
enum class KVLayout : uint8_t {
  /// [num_blocks, num_kv_heads, block_size, head_dim]: each head's tokens contiguous (default;
  /// best for decode, one head streams a contiguous block_size x head_dim tile).
  kHND,
  /// [num_blocks, block_size, num_kv_heads, head_dim]: each token's heads contiguous.
  kNHD,
};

/// One layer's K and V pools. Strides are in elements and int64 (a pool can exceed 2^31
/// elements). Element (block b, kv head h, token-in-block t, dim d) of K is at
/// k[b * block_stride + h * head_stride + t * token_stride + d]; V alike.
/// Non-owning: valid while the memory it points to lives (a HostKVCache, a cuda::DeviceKVCache,
/// a contiguous buffer). Built by layer_view() or contiguous_paged_view().
struct KVLayerView {
  /// First element of block 0's K: [num_blocks, ...] per layout, addressed by the strides.
  void* k = nullptr;
  /// First element of block 0's V; same strides as k (for KVPlacement::kInterleaved it is k
  /// plus one block's elements, within the same pool).
  void* v = nullptr;
  DType dtype = DType::kF32;  ///< element type of both pools
  int32_t num_blocks = 0;     ///< blocks in the pool: valid block ids are [0, num_blocks)
  int32_t block_size = 0;     ///< tokens per block
  int32_t num_kv_heads = 0;   ///< K/V heads (query heads read them through GQA groups)
  int32_t head_dim = 0;       ///< elements per head vector
  /// Elements from one block to the next: block_size * num_kv_heads * head_dim, doubled for
  /// KVPlacement::kInterleaved (V of the block sits between two K blocks).
  int64_t block_stride = 0;
  /// Elements from one kv head to the next within a block: HND block_size * head_dim, NHD
  /// head_dim.
  int64_t head_stride = 0;
  /// Elements from one token to the next within a block and head: HND head_dim, NHD
  /// num_kv_heads * head_dim.
  int64_t token_stride = 0;
  /// Quantized dtypes (dtype_is_quantized): the scales of K and of V, [num_kv_heads] fp32 each
  /// (a per-tensor scale repeated per head): x = stored * k_scale[kv_head]. Required (non-null,
  /// finite, > 0) for those dtypes; ignored (and may be null) for fp32 / fp16 / bf16. In the
  /// memory of the pools: host for the CPU kernels, device for the CUDA ones (a
  /// cuda::DeviceKVCache view; its values are checked when set, the launchers check only the
  /// pointers).
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;  ///< see k_scale

  /// Element offset of (block, kv head, token in block, dim 0) from k (or v), in int64.
  /// Nothing is checked: kernels call it on ids validated at the public boundary.
  PAGEDKV_HOST_DEVICE int64_t offset(int64_t block, int64_t head, int64_t token) const {
    return block * block_stride + head * head_stride + token * token_stride;
  }
  /// The factor that turns kv head `head`'s stored K into values: k_scale[head] for a
  /// quantized dtype, 1 otherwise (kernels fold it into the scores rather than the loads).
  PAGEDKV_HOST_DEVICE float key_scale(int64_t head) const {
    return dtype_is_quantized(dtype) ? k_scale[head] : 1.0f;
  }
  /// As key_scale, for V (kernels fold it into the output).
  PAGEDKV_HOST_DEVICE float value_scale(int64_t head) const {
    return dtype_is_quantized(dtype) ? v_scale[head] : 1.0f;
  }
  /// Element offset of (slot, kv head, dim 0): slot = block * block_size + token.
  /// Precondition: slot >= 0 (padding slots are skipped by the caller; nothing is checked).
  PAGEDKV_HOST_DEVICE int64_t slot_offset(int64_t slot, int64_t head) const {
    return offset(slot / block_size, head, slot % block_size);
  }
};

/// Strides of a pool with the given geometry and layout, elements, written to the three
/// outputs (for separate pools; layer_view() doubles block_stride for interleaved ones).
/// Worked example (HND, block_size 16, 4 kv heads, head_dim 128): token_stride 128,
/// head_stride 2048, block_stride 8192.
PAGEDKV_HOST_DEVICE constexpr void layout_strides(KVLayout layout, int64_t block_size,
                                                  int64_t num_kv_heads, int64_t head_dim,
                                                  int64_t* block_stride, int64_t* head_stride,
                                                  int64_t* token_stride) {
  *block_stride = block_size * num_kv_heads * head_dim;
  if (layout == KVLayout::kHND) {
    *head_stride = block_size * head_dim;
    *token_stride = head_dim;
  } else {
    *head_stride = head_dim;
    *token_stride = num_kv_heads * head_dim;
  }
}

/// Block copies between two layer views of one geometry (copy-on-write within one pool: src and
/// dst the same view; swap between a device-side and a host-side pool: two views), over memory
/// the caller owns: every (src, dst) pair copies K and V of block src of `src` to block dst of
/// `dst`, in order (so {1, 3} then {3, 4} leaves block 1's data in 4); a pair with src == dst
/// within one view is a no-op. Strides may differ between the views (e.g. HND and NHD): each
/// (head, token) row of head_dim elements is copied on its own.
/// Shapes: pairs [n]. Errors: throws pagedkv::Error if a view has a null pool or a size < 1,
/// the views differ in dtype, block_size, num_kv_heads or head_dim (names both), or an id is
/// outside [0, num_blocks) of its view (names the pair); all checked before anything is copied.
void copy_blocks(const KVLayerView& src, const KVLayerView& dst, std::span<const BlockCopy> pairs);

/// Validates params against a cache view; every paged attention entry point (CPU and CUDA) runs
/// it before anything else reads the view.
/// Errors: throws pagedkv::Error if a size (num_heads, num_kv_heads, head_dim, the view's
/// block_size and num_blocks) is < 1, num_heads is not a multiple of num_kv_heads, num_kv_heads
/// or head_dim differ from the view's (the message names both values), window_left < -1,
/// sink_tokens < 0, chunk_size < 0, scale is not finite, the view's k or v is null, or (quantized
/// dtype) its k_scale or v_scale is null or holds a scale that is not finite and > 0 (naming it).
void check_attention_params(const AttentionParams& params, const KVLayerView& cache);

/// check_attention_params without reading the scales: every check but the scale values and
/// pointers. For views whose scales live where the host cannot read them (device memory: the
/// CUDA entry points check the pointers and DeviceKVCache::set_scales the values).
/// Errors: as check_attention_params, less the scale checks.
void check_attention_shape(const AttentionParams& params, const KVLayerView& cache);

/// Checks that block tables (or slot lists) built for blocks of `block_size` tokens in a pool of
/// `num_blocks` blocks (0 = not stated) can be read through `cache`: the geometry a
/// BlockTableView or SlotListView carries, checked where it meets the cache by every attention
/// entry point (CPU and CUDA), before any id is read. `fn` names the entry point in messages.
/// Errors: throws pagedkv::Error naming both values if block_size != cache.block_size (an unset
/// 0 included), or num_blocks > cache.num_blocks (the tables index blocks the cache lacks).
/// Worked example: tables of a manager with block_size 4 against a cache of block_size 16 ->
/// "paged_decode_attention: block tables built for block_size 4 but the cache has block_size
/// 16 ...".
void check_table_geometry(const char* fn, const KVLayerView& cache, int32_t block_size,
                          int32_t num_blocks);

}  // namespace pagedkv
