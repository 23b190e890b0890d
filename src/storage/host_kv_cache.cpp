#include "pagedkv/storage/host_kv_cache.hpp"

#include <cstring>

#include "core/check.hpp"

namespace pagedkv {

namespace {

/// Distance between consecutive pools in the arena: the pool size rounded up to a cache line,
/// so that every pool starts aligned as the arena does and vector loads of a pool's first block
/// never straddle a line. The padding (< 64 bytes a pool) is not part of any pool and not
/// counted in bytes().
int64_t pool_stride(int64_t pool_bytes) {
  constexpr int64_t kLine = HostBuffer::kAlignment;
  return (pool_bytes + kLine - 1) / kLine * kLine;
}

}  // namespace

HostKVCache::HostKVCache(const KVCacheConfig& config, const HostMemoryOptions& memory)
    : config_((validate(config), config)),
      pool_bytes_(pool_elements(config_) * dtype_size(config_.dtype)),
      // Pools are zeroed (HostBuffer) so that reading an unwritten slot gives 0, not garbage
      // (deterministic tests; fp16/bf16 zero is also all-zero bits).
      arena_(2 * static_cast<int64_t>(config_.num_layers) * pool_stride(pool_bytes_), memory) {}

std::byte* HostKVCache::block_ptr(int32_t layer, bool value, int64_t block) const {
  // Arena: one region of 2 pool strides per layer. Separate: layer 0 K pool, layer 0 V pool,
  // layer 1 K, ...; interleaved: per layer block 0 K, block 0 V, block 1 K, ...
  const int64_t per_block = pool_bytes_ / config_.num_blocks;
  std::byte* region = arena_.data() + 2 * static_cast<int64_t>(layer) * pool_stride(pool_bytes_);
  if (config_.placement == KVPlacement::kInterleaved) {
    return region + (2 * block + (value ? 1 : 0)) * per_block;
  }
  return region + (value ? pool_stride(pool_bytes_) : 0) + block * per_block;
}

void HostKVCache::check_block(BlockId block, const char* op) const {
  PAGEDKV_CHECK(block >= 0 && block < config_.num_blocks,
                "HostKVCache::{}: block id {} out of range [0, {})", op, block, config_.num_blocks);
}

KVLayerView HostKVCache::layer(int32_t layer) const {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "HostKVCache::layer: layer {} out of range [0, {})", layer, config_.num_layers);
  return layer_view(config_, block_ptr(layer, false, 0), block_ptr(layer, true, 0));
}

void HostKVCache::write(int32_t layer, std::span<const Slot> slot_mapping, std::span<const float> k,
                        std::span<const float> v) {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "HostKVCache::write: layer {} out of range [0, {})", layer, config_.num_layers);
  write_kv(this->layer(layer), slot_mapping, k, v);
}

void HostKVCache::copy_blocks(std::span<const BlockCopy> pairs) {
  for (const BlockCopy& p : pairs) {
    check_block(p.src, "copy_blocks(src)");
    check_block(p.dst, "copy_blocks(dst)");
  }
  // A block's K (and V) is contiguous in every layout and placement (block is the outermost
  // dimension).
  const int64_t per_block = pool_bytes_ / config_.num_blocks;
  for (const BlockCopy& p : pairs) {
    if (p.src == p.dst) continue;  // memcpy onto itself is undefined; the result is the same
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      for (bool value : {false, true}) {
        std::memcpy(block_ptr(l, value, p.dst), block_ptr(l, value, p.src),
                    static_cast<size_t>(per_block));
      }
    }
  }
}

std::vector<float> HostKVCache::read(int32_t layer, Slot slot, int32_t kv_head, bool value) const {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "HostKVCache::read: layer {} out of range [0, {})", layer, config_.num_layers);
  const int64_t num_slots = static_cast<int64_t>(config_.num_blocks) * config_.block_size;
  PAGEDKV_CHECK(slot >= 0 && slot < num_slots, "HostKVCache::read: slot {} out of range [0, {})",
                slot, num_slots);
  PAGEDKV_CHECK(kv_head >= 0 && kv_head < config_.num_kv_heads,
                "HostKVCache::read: kv head {} out of range [0, {})", kv_head,
                config_.num_kv_heads);
  const KVLayerView view = this->layer(layer);
  const void* base = value ? view.v : view.k;
  const int64_t off = view.slot_offset(slot, kv_head);
  std::vector<float> out(static_cast<size_t>(config_.head_dim));
  for (int32_t d = 0; d < config_.head_dim; ++d) out[d] = load_as_f32(base, config_.dtype, off + d);
  return out;
}

void HostKVCache::fill_blocks(std::span<const BlockId> blocks, float value) {
  for (BlockId b : blocks) check_block(b, "fill_blocks");
  const int64_t block_elems = pool_elements(config_) / config_.num_blocks;
  for (BlockId b : blocks) {
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      for (bool is_v : {false, true}) {
        std::byte* base = block_ptr(l, is_v, b);
        for (int64_t i = 0; i < block_elems; ++i) store_from_f32(base, config_.dtype, i, value);
      }
    }
  }
}

std::vector<std::byte> HostKVCache::block_bytes(BlockId block) const {
  check_block(block, "block_bytes");
  const int64_t per_pool = pool_bytes_ / config_.num_blocks;
  std::vector<std::byte> out(static_cast<size_t>(2 * config_.num_layers * per_pool));
  std::byte* dst = out.data();
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    for (bool value : {false, true}) {
      std::memcpy(dst, block_ptr(l, value, block), static_cast<size_t>(per_pool));
      dst += per_pool;
    }
  }
  return out;
}

void HostKVCache::set_block_bytes(BlockId block, std::span<const std::byte> bytes) {
  check_block(block, "set_block_bytes");
  const int64_t per_pool = pool_bytes_ / config_.num_blocks;
  const int64_t expected = 2 * config_.num_layers * per_pool;
  PAGEDKV_CHECK(static_cast<int64_t>(bytes.size()) == expected,
                "HostKVCache::set_block_bytes: got {} bytes, a block holds {}", bytes.size(),
                expected);
  const std::byte* src = bytes.data();
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    for (bool value : {false, true}) {
      std::memcpy(block_ptr(l, value, block), src, static_cast<size_t>(per_pool));
      src += per_pool;
    }
  }
}

}  // namespace pagedkv
