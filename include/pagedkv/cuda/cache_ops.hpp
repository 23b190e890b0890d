#pragma once
/// @file cache_ops.hpp
/// CUDA cache-write (reshape_and_cache) and block-copy (copy-on-write) launchers over device
/// pools. Host declarations only; no CUDA headers. Defined only when PAGEDKV_WITH_CUDA is 1.

#include <cstdint>

#include "pagedkv/cuda/device.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv::cuda {

/// New K/V of a step, in device memory.
/// Shapes: k, v [num_tokens, num_kv_heads, head_dim] of `dtype` (fp32 like HostKVCache::write,
/// or fp16/bf16 as a model running in that precision produces them); slot_mapping
/// [num_tokens] int64 (negative = padding, skipped).
/// Non-owning: the caller keeps the arrays alive until the launch that reads them is done.
struct NewKV {
  /// Device keys [num_tokens, num_kv_heads, head_dim] of `dtype`, rows contiguous.
  const void* k = nullptr;
  /// Device values, same shape and dtype as k.
  const void* v = nullptr;
  /// Element type of k and v: kF32, kF16 or kBF16 (need not be the pool dtype, which may also
  /// be 8-bit).
  DType dtype = DType::kF32;
  /// Device [num_tokens] int64: slot = block * block_size + token in block; negative = padding.
  const int64_t* slot_mapping = nullptr;
  /// Tokens (rows of k, v and slot_mapping), in [0, 2^31 - 1]; 0 launches nothing.
  int64_t num_tokens = 0;
};

/// reshape_and_cache: writes each token's K and V into its slot of the layer viewed by `cache`
/// (device pools, any layout), converting to the pool dtype with round-to-nearest-even (the
/// same bits as HostKVCache::write for finite values). An 8-bit pool (fp8_e4m3, fp8_e5m2,
/// int8) stores Q(x * (1 / scale[kv_head])) with the saturation and NaN rules of dtype.hpp:
/// for fp32 inputs the bytes of the host's reshape_and_cache (pagedkv/storage/kv_write.hpp).
/// Its scales are cache.k_scale / cache.v_scale, DEVICE arrays [num_kv_heads] fp32 (a
/// DeviceKVCache's layer() points them at its scales). Asynchronous on `stream`.
/// Grid: one CTA per token. Preconditions (device data, not checked): every non-negative slot
/// is < num_blocks * block_size; the scales are finite and > 0 (DeviceKVCache::set_scales
/// checks them where they enter the device).
/// Errors: throws pagedkv::Error, before any CUDA call, on a null pointer with num_tokens > 0
/// (an 8-bit pool's k_scale / v_scale included, named), an 8-bit input dtype, num_tokens < 0
/// or > 2^31 - 1, or an invalid view; CUDA launch errors after.
/// Source: vLLM csrc/cache_kernels.cu (reshape_and_cache), int64 slot convention.
void reshape_and_cache(const KVLayerView& cache, const NewKV& input, Stream stream = nullptr);

/// copy_blocks for copy-on-write: for every pair (src, dst) and every pool p, block dst of pool
/// p becomes a copy of block src. ONE launch covers all pairs of all pools (2 per layer).
/// Shapes: pools [num_pools] device array of device pointers, each pool laid out as
/// [num_blocks, block_bytes] (true of HND and NHD: the block is the outermost dimension);
/// pairs [num_pairs] device array of BlockCopy. Units: block_bytes in bytes.
/// Preconditions (device data, not checked): ids in [0, num_blocks), no block is both a source
/// and a destination, no destination repeats (pairs run in parallel, not in order).
/// Errors: throws pagedkv::Error, before any CUDA call, on null pointers with non-zero counts,
/// negative counts, num_pools > 65535 or block_bytes < 1; CUDA launch errors after.
void copy_blocks(void* const* pools, int32_t num_pools, int64_t block_bytes, const BlockCopy* pairs,
                 int32_t num_pairs, Stream stream = nullptr);

}  // namespace pagedkv::cuda
