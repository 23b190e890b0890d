#pragma once
/// @file types.hpp
/// Scalar vocabulary types shared by every layer.

#include <cstdint>

/// @def PAGEDKV_HOST_DEVICE
/// Marks a function that CUDA kernels call as well as host code (address math, sizes):
/// `__host__ __device__` when nvcc compiles the file (`__CUDACC__` defined), nothing for a host
/// C++ compiler, so the vocabulary and storage headers need no CUDA headers.
#if defined(__CUDACC__)
#define PAGEDKV_HOST_DEVICE __host__ __device__
#else
#define PAGEDKV_HOST_DEVICE
#endif

namespace pagedkv {

/// Physical block (page) id, in [0, num_blocks). -1 marks "no block" in padded tables.
using BlockId = int32_t;
/// Caller-chosen sequence (request) id.
using SeqId = int64_t;
/// Slot = block_id * block_size + offset_in_block; negative = padding, skip. int64 because
/// num_blocks * block_size can exceed 2^31 on large pools.
using Slot = int64_t;
/// Token id of a vocabulary.
using TokenId = int32_t;

/// A whole-block copy (copy-on-write, swap): every layer's K and V of block `src` go to `dst`.
/// Returned by KVCacheManager in AppendResult::copies (copy-on-write: both ids in the one pool)
/// and SwapResult::copies (swap: one id in the device pool, the other in the host swap pool);
/// applied by HostKVCache::copy_blocks and by the CUDA device cache, which check the ids.
struct BlockCopy {
  BlockId src;  ///< block that is read, in [0, num_blocks) of its pool
  BlockId dst;  ///< block that is overwritten, in [0, num_blocks) of its pool
  /// Equal when both ids are equal (tests compare copy lists exactly).
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

/// Number of blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size).
/// Units: tokens. Precondition: num_tokens >= 0, block_size >= 1.
PAGEDKV_HOST_DEVICE constexpr int64_t blocks_for_tokens(int64_t num_tokens, int64_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace pagedkv
