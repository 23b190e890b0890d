#pragma once
// Test helper: KV cache group specs of one layer each, for the HybridKVCacheManager and
// group_layers tests (full(), window(W, sinks), chunked(C)), and N, the null block.

#include <gmock/gmock.h>

#include <cstdint>

#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

/// Expects `stmt` to throw a pagedkv::Error whose message contains `needle`.
#define EXPECT_ERROR(stmt, needle) \
  EXPECT_THAT([&] { stmt; }, ::testing::ThrowsMessage<Error>(::testing::HasSubstr(needle)))

namespace pagedkv::testing {

/// The reserved null block, as it appears in released table entries.
inline constexpr BlockId N = HybridKVCacheManager::kNullBlock;

inline KVCacheGroupSpec full() { return {}; }
inline KVCacheGroupSpec window(int32_t w, int32_t sinks = 0) {
  return {GroupAttention::kSlidingWindow, w, sinks, 0, 1};
}
inline KVCacheGroupSpec chunked(int32_t c) { return {GroupAttention::kChunkedLocal, 0, 0, c, 1}; }

}  // namespace pagedkv::testing
