#pragma once
// Test helpers of the CUDA backend's tests (tests/cuda/test_cuda_*.cpp): the device guard, a
// NaN-filled output buffer, and host caches to compare device storage with (random contents,
// every byte, placement names). The precision bound is common/attention_bound.hpp's.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string_view>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

/// Skips the current test unless a CUDA device is usable; gtest prints "Skipped" and the
/// reason "no CUDA device" (CI has nvcc but no GPU).
#define PAGEDKV_REQUIRE_CUDA_DEVICE()           \
  do {                                          \
    if (!::pagedkv::cuda::device_available()) { \
      GTEST_SKIP() << "no CUDA device";         \
    }                                           \
  } while (0)

namespace pagedkv::testing {

/// Output buffer filled with NaN, so a row a kernel forgets to write fails every comparison.
inline std::vector<float> nan_filled(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

/// "separate" or "interleaved" (test-case names and traces).
inline std::string_view placement_name(KVPlacement p) {
  return p == KVPlacement::kInterleaved ? "interleaved" : "separate";
}

/// Writes uniform values in [-1, 1) into every slot of every layer of `h`, seeded.
inline void fill_random(HostKVCache& h, uint32_t seed) {
  const KVCacheConfig& c = h.config();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int64_t n = int64_t{c.num_blocks} * c.block_size;
  std::vector<Slot> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = i;
  std::vector<float> k(static_cast<size_t>(n * c.num_kv_heads * c.head_dim));
  std::vector<float> v(k.size());
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (float& x : k) x = uni(rng);
    for (float& x : v) x = uni(rng);
    h.write(l, slots, k, v);
  }
}

/// Every byte of every block of a host cache, block by block (HostKVCache::block_bytes).
inline std::vector<std::byte> all_bytes(const HostKVCache& h) {
  std::vector<std::byte> out;
  for (BlockId b = 0; b < h.config().num_blocks; ++b) {
    const std::vector<std::byte> x = h.block_bytes(b);
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

}  // namespace pagedkv::testing
