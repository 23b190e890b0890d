#pragma once
// The two data movements of HostKVCache, over a layer view rather than the cache that owns the
// memory: the cache write (reshape_and_cache) and the block copy. HostKVCache::write and
// HostKVCache::copy_blocks check their arguments and then call these, so a test can run the very
// same code on memory it maps itself (a sparse mapping of more than 2^32 elements, only the
// touched pages backed: tests/integration/test_large_offsets.cpp). write_slots is defined in
// kv_write.cpp (behind the checked public reshape_and_cache), copy_block in host_kv_cache.cpp.

#include <span>

#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv::detail {

/// Writes token t's K and V (fp32, rounded to cache.dtype; an 8-bit dtype divides by the view's
/// k_scale / v_scale first) to slot slot_mapping[t] of `cache`, every kv head; negative slots
/// (padding) are skipped. Element offsets are int64 throughout.
/// Shapes: slot_mapping [num_tokens]; k, v [num_tokens, num_kv_heads, head_dim] fp32.
/// Preconditions (checked by the caller, not here): k and v have num_tokens * num_kv_heads *
/// head_dim elements, every slot is < num_blocks * block_size, an 8-bit view has valid scales.
void write_slots(const KVLayerView& cache, std::span<const Slot> slot_mapping,
                 std::span<const float> k, std::span<const float> v);

/// Copies block src's K and V to block dst within `cache` (block_size x num_kv_heads x head_dim
/// elements of each: a block is contiguous in every layout). Precondition: src != dst, both in
/// [0, num_blocks) (checked by the caller).
void copy_block(const KVLayerView& cache, int64_t src, int64_t dst);

/// The checks every data movement over a caller's view runs first, whatever it moves: K and V
/// pools non-null, num_blocks, block_size, num_kv_heads and head_dim >= 1. `fn` names the entry
/// point in the message. Errors: throws pagedkv::Error naming the values. Defined in
/// kv_layer_view.cpp.
void check_view_pools(const char* fn, const KVLayerView& view);

/// The scales of an 8-bit view: k_scale and v_scale non-null, each of the num_kv_heads values
/// finite and > 0. Errors: throws pagedkv::Error naming the pointer, or the scale, its head and
/// value. Defined in kv_layer_view.cpp; run by check_attention_params and reshape_and_cache.
void check_view_scales(const char* fn, const KVLayerView& view);

}  // namespace pagedkv::detail
