#pragma once
/// @file host_kv_cache.hpp
/// Paged K/V storage in host memory: the pages themselves. Driven by the slots and block copies
/// that KVCacheManager returns; knows nothing of sequences.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagedkv/storage/host_buffer.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Host-memory K and V pools for every layer, one zero-initialized HostBuffer arena (64-byte
/// aligned pools; transparent huge pages advised for arenas of 2 MiB or more, see
/// HostMemoryOptions).
/// Layout per pool: config.layout (default HND, [num_blocks, num_kv_heads, block_size, head_dim]);
/// config.placement: separate K and V pools per layer (default), or per layer one pool with each
/// block's K and V adjacent ([num_blocks, 2, ...]). layer() expresses either through its strides.
/// Memory: bytes() == kv_cache_bytes(config) exactly.
class HostKVCache {
 public:
  /// Errors: throws pagedkv::Error if the config is invalid (see validate()); std::bad_alloc if
  /// the arena cannot be allocated.
  explicit HostKVCache(const KVCacheConfig& config, const HostMemoryOptions& memory = {});

  /// reshape_and_cache: writes the K and V of new tokens to their slots in layer `layer`,
  /// converting fp32 to the storage dtype (round to nearest even).
  /// Shapes: slot_mapping [num_tokens] int64 (negative = padding, skipped);
  ///         k, v [num_tokens, num_kv_heads, head_dim] fp32.
  /// Errors: throws pagedkv::Error if layer is out of range, k/v sizes differ from
  /// num_tokens * num_kv_heads * head_dim, or a slot is >= num_blocks * block_size; checked
  /// before anything is written.
  void write(int32_t layer, std::span<const Slot> slot_mapping, std::span<const float> k,
             std::span<const float> v);

  /// Copies whole blocks src -> dst in every layer, K and V (copy-on-write, defragmentation).
  /// Pairs are applied in order. Errors: throws if an id is out of range (checked first).
  void copy_blocks(std::span<const BlockCopy> pairs);

  /// Reads the K (or V) vector of one (slot, kv head) of a layer as fp32.
  /// Shapes: returns [head_dim]. Errors: throws on out-of-range layer, slot or head.
  [[nodiscard]] std::vector<float> read(int32_t layer, Slot slot, int32_t kv_head,
                                        bool value) const;

  /// Sets every element of the given blocks (all layers, K and V) to `value`; tests use NaN to
  /// poison reused blocks. Errors: throws if an id is out of range.
  void fill_blocks(std::span<const BlockId> blocks, float value);

  /// Raw bytes of one block across all layers, K then V per layer (for swap and bit-exact
  /// comparisons). Errors: throws if the id is out of range.
  [[nodiscard]] std::vector<std::byte> block_bytes(BlockId block) const;
  /// Restores bytes captured by block_bytes() into block `block`.
  /// Errors: throws if the id is out of range or the size differs.
  void set_block_bytes(BlockId block, std::span<const std::byte> bytes);

  /// View of layer `layer` for kernels. Errors: throws if out of range.
  [[nodiscard]] KVLayerView layer(int32_t layer) const;
  [[nodiscard]] const KVCacheConfig& config() const { return config_; }
  /// Bytes held by the pools: kv_cache_bytes(config()).
  [[nodiscard]] int64_t bytes() const { return kv_cache_bytes(config_); }

 private:
  /// First byte of block `block`'s K (value false) or V (true) in layer `layer`.
  [[nodiscard]] std::byte* block_ptr(int32_t layer, bool value, int64_t block) const;
  void check_block(BlockId block, const char* op) const;

  KVCacheConfig config_;
  int64_t pool_bytes_ = 0;
  HostBuffer arena_;
};

}  // namespace pagedkv
