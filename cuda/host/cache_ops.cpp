// Public CUDA cache-write and block-copy entry points: checks on the host, then one launch
// (cuda/kernels/cache_ops.cu).

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <cstdint>
#include <utility>

#include "core/check.hpp"
#include "cuda/launch.hpp"
#include "pagedkv/cuda/cache_ops.hpp"

namespace pagedkv::cuda {

void reshape_and_cache(const KVLayerView& cache, const NewKV& input, Stream stream) {
  constexpr const char* kFn = "cuda::reshape_and_cache";
  PAGEDKV_CHECK(input.num_tokens >= 0 && input.num_tokens <= INT32_MAX,
                "{}: num_tokens {} outside [0, 2^31 - 1]", kFn, input.num_tokens);
  PAGEDKV_CHECK(cache.block_size >= 1 && cache.num_kv_heads >= 1 && cache.head_dim >= 1 &&
                    cache.num_blocks >= 1,
                "{}: invalid cache view (num_blocks {}, block_size {}, num_kv_heads {}, "
                "head_dim {})",
                kFn, cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_dim);
  PAGEDKV_CHECK(!dtype_is_quantized(input.dtype),
                "{}: input dtype {}: new K/V are fp32, fp16 or bf16 (the pool may be 8-bit)", kFn,
                dtype_name(input.dtype));
  if (input.num_tokens == 0) return;
  if (dtype_is_quantized(cache.dtype)) {
    for (const auto& [name, s] :
         {std::pair{"k_scale", cache.k_scale}, {"v_scale", cache.v_scale}}) {
      PAGEDKV_CHECK(s != nullptr && reinterpret_cast<uintptr_t>(s) % alignof(float) == 0,
                    "{}: a {} cache needs a device {} of {} floats, got {}", kFn,
                    dtype_name(cache.dtype), name, cache.num_kv_heads, static_cast<const void*>(s));
    }
  }
  PAGEDKV_CHECK(cache.k != nullptr && cache.v != nullptr, "{}: cache view has a null pool", kFn);
  PAGEDKV_CHECK(input.k != nullptr && input.v != nullptr && input.slot_mapping != nullptr,
                "{}: null input for {} tokens (k={}, v={}, slot_mapping={})", kFn, input.num_tokens,
                input.k, input.v, static_cast<const void*>(input.slot_mapping));
  detail::CacheWrite w;
  w.k = input.k;
  w.v = input.v;
  w.slot_mapping = input.slot_mapping;
  w.k_cache = cache.k;
  w.v_cache = cache.v;
  w.num_tokens = input.num_tokens;
  w.block_stride = cache.block_stride;
  w.head_stride = cache.head_stride;
  w.token_stride = cache.token_stride;
  w.block_size = cache.block_size;
  w.num_kv_heads = cache.num_kv_heads;
  w.head_dim = cache.head_dim;
  w.src_dtype = input.dtype;
  w.dtype = cache.dtype;
  w.k_scale = cache.k_scale;
  w.v_scale = cache.v_scale;
  detail::launch_reshape_and_cache(w, stream);
}

void copy_blocks(void* const* pools, int32_t num_pools, int64_t block_bytes, const BlockCopy* pairs,
                 int32_t num_pairs, Stream stream) {
  constexpr const char* kFn = "cuda::copy_blocks";
  PAGEDKV_CHECK(num_pools >= 0 && num_pools <= 65535, "{}: num_pools {} outside [0, 65535]", kFn,
                num_pools);
  PAGEDKV_CHECK(num_pairs >= 0, "{}: num_pairs must be >= 0, got {}", kFn, num_pairs);
  PAGEDKV_CHECK(block_bytes >= 1, "{}: block_bytes must be >= 1, got {}", kFn, block_bytes);
  if (num_pools == 0 || num_pairs == 0) return;
  PAGEDKV_CHECK(pools != nullptr && pairs != nullptr, "{}: null pools or pairs", kFn);
  detail::launch_copy_blocks(pools, num_pools, block_bytes, pairs, num_pairs, stream);
}

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
