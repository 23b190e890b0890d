#pragma once
/// @file types.hpp
/// Scalar vocabulary types shared by every layer.

#include <cstdint>

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
struct BlockCopy {
  BlockId src;
  BlockId dst;
  friend bool operator==(const BlockCopy&, const BlockCopy&) = default;
};

/// Number of blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size).
/// Units: tokens. Precondition: num_tokens >= 0, block_size >= 1.
PAGEDKV_HOST_DEVICE constexpr int64_t blocks_for_tokens(int64_t num_tokens, int64_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

}  // namespace pagedkv
