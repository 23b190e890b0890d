#pragma once
/// @file kv_layer_view.hpp
/// Non-owning view of one layer's K and V pools: what attention and cache-write kernels take.
/// Header usable from host C++ and CUDA (no CUDA headers included).

#include <cstdint>

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
struct KVLayerView {
  void* k = nullptr;  // [num_blocks, ...] per layout
  void* v = nullptr;  // same shape as k
  DType dtype = DType::kF32;
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t block_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;

  /// Element offset of (block, kv head, token in block, dim 0), in int64.
  PAGEDKV_HOST_DEVICE int64_t offset(int64_t block, int64_t head, int64_t token) const {
    return block * block_stride + head * head_stride + token * token_stride;
  }
  /// Element offset of (slot, kv head): slot = block * block_size + token.
  PAGEDKV_HOST_DEVICE int64_t slot_offset(int64_t slot, int64_t head) const {
    return offset(slot / block_size, head, slot % block_size);
  }
};

/// Strides of a pool with the given geometry and layout, elements.
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

/// Validates params against a cache view.
/// Errors: throws pagedkv::Error if a size is < 1, num_heads % num_kv_heads != 0, or num_kv_heads
/// / head_dim differ from the view's (the message names both values).
void check_attention_params(const AttentionParams& params, const KVLayerView& cache);

}  // namespace pagedkv
