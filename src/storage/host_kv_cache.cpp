#include "pagedkv/storage/host_kv_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "core/activations.hpp"
#include "core/check.hpp"
#include "pagedkv/storage/kv_write.hpp"
#include "storage/host_kv_cache_ops.hpp"

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

void detail::copy_block(const KVLayerView& cache, int64_t src, int64_t dst) {
  // A block's K (and V) is contiguous in every layout and placement (block is the outermost
  // dimension); offsets in bytes are int64 like the element offsets.
  const int64_t esize = dtype_size(cache.dtype);
  const int64_t bytes = int64_t{cache.block_size} * cache.num_kv_heads * cache.head_dim * esize;
  for (void* pool : {cache.k, cache.v}) {
    auto* base = static_cast<std::byte*>(pool);
    std::memcpy(base + cache.offset(dst, 0, 0) * esize, base + cache.offset(src, 0, 0) * esize,
                static_cast<size_t>(bytes));
  }
}

HostKVCache::HostKVCache(const KVCacheConfig& config, const HostMemoryOptions& memory)
    : config_((validate(config), config)),
      pool_bytes_(pool_elements(config_) * dtype_size(config_.dtype)),
      // Pools are zeroed (HostBuffer) so that reading an unwritten slot gives 0, not garbage
      // (deterministic tests; fp16/bf16 zero is also all-zero bits).
      arena_(2 * static_cast<int64_t>(config_.num_layers) * pool_stride(pool_bytes_), memory),
      scales_(static_cast<size_t>(2 * int64_t{config_.num_layers} * config_.num_kv_heads), 1.0f),
      scales_set_(static_cast<size_t>(config_.num_layers), false) {
  // Arena: one region of 2 pool strides per layer. Separate: layer 0 K pool, layer 0 V pool,
  // layer 1 K, ...; interleaved: per layer block 0 K, block 0 V, block 1 K, ...
  const int64_t per_block = pool_bytes_ / config_.num_blocks;
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    std::byte* region = arena_.data() + 2 * static_cast<int64_t>(l) * pool_stride(pool_bytes_);
    const int64_t v_off =
        config_.placement == KVPlacement::kInterleaved ? per_block : pool_stride(pool_bytes_);
    bases_.push_back({region, region + v_off});
  }
}

HostKVCache::HostKVCache(const KVCacheConfig& config, std::span<const ExternalKVPools> layers)
    : config_((validate(config), config)),
      pool_bytes_(pool_elements(config_) * dtype_size(config_.dtype)),
      scales_(static_cast<size_t>(2 * int64_t{config_.num_layers} * config_.num_kv_heads), 1.0f),
      scales_set_(static_cast<size_t>(config_.num_layers), false) {
  constexpr const char* kFn = "HostKVCache (external pools)";
  PAGEDKV_CHECK(static_cast<int64_t>(layers.size()) == config_.num_layers,
                "{}: {} layers of pools for a config of {} layers", kFn, layers.size(),
                config_.num_layers);
  const int64_t per_block = pool_bytes_ / config_.num_blocks;
  const auto align = static_cast<uintptr_t>(dtype_size(config_.dtype));
  for (size_t l = 0; l < layers.size(); ++l) {
    for (const auto& [name, p] : {std::pair{"k", layers[l].k}, std::pair{"v", layers[l].v}}) {
      PAGEDKV_CHECK(p != nullptr, "{}: layer {} {} is null", kFn, l, name);
      PAGEDKV_CHECK(reinterpret_cast<uintptr_t>(p) % align == 0,
                    "{}: layer {} {} ({}) is not aligned to its {}-byte dtype {}", kFn, l, name, p,
                    align, dtype_name(config_.dtype));
    }
    const auto gap =
        reinterpret_cast<uintptr_t>(layers[l].v) - reinterpret_cast<uintptr_t>(layers[l].k);
    PAGEDKV_CHECK(
        config_.placement != KVPlacement::kInterleaved || gap == static_cast<uintptr_t>(per_block),
        "{}: layer {} is interleaved, so v must be k + {} bytes (one block of K), got "
        "k {} and v {}",
        kFn, l, per_block, layers[l].k, layers[l].v);
    bases_.push_back({layers[l].k, layers[l].v});
  }
}

std::span<const float> HostKVCache::scales(int32_t layer, bool value) const {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "HostKVCache::scales: layer {} out of range [0, {})", layer, config_.num_layers);
  const auto h = static_cast<size_t>(config_.num_kv_heads);
  return {scales_.data() + scale_offset(config_, layer, value), h};
}

void HostKVCache::set_scales(int32_t layer, std::span<const float> k_scale,
                             std::span<const float> v_scale) {
  constexpr const char* kFn = "HostKVCache::set_scales";
  PAGEDKV_CHECK(dtype_is_quantized(config_.dtype), "{}: dtype {} has no scales (8-bit only)", kFn,
                dtype_name(config_.dtype));
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers, "{}: layer {} out of range [0, {})", kFn,
                layer, config_.num_layers);
  const KVScales s = expand_kv_scales(kFn, config_, k_scale, v_scale);
  float* dst = scales_.data() + scale_offset(config_, layer, false);
  std::copy(s.k.begin(), s.k.end(), dst);
  std::copy(s.v.begin(), s.v.end(), dst + s.k.size());
  scales_set_[static_cast<size_t>(layer)] = true;
}

std::byte* HostKVCache::block_ptr(int32_t layer, bool value, int64_t block) const {
  // Blocks of one kind follow each other (separate) or alternate with the other kind's.
  const int64_t per_block = pool_bytes_ / config_.num_blocks;
  const int64_t stride = config_.placement == KVPlacement::kInterleaved ? 2 * per_block : per_block;
  const ExternalKVPools& b = bases_[static_cast<size_t>(layer)];
  return static_cast<std::byte*>(value ? b.v : b.k) + block * stride;
}

void HostKVCache::check_block(BlockId block, const char* op) const {
  PAGEDKV_CHECK(block >= 0 && block < config_.num_blocks,
                "HostKVCache::{}: block id {} out of range [0, {})", op, block, config_.num_blocks);
}

KVLayerView HostKVCache::layer(int32_t layer) const {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "HostKVCache::layer: layer {} out of range [0, {})", layer, config_.num_layers);
  KVLayerView view = layer_view(config_, block_ptr(layer, false, 0), block_ptr(layer, true, 0));
  if (dtype_is_quantized(config_.dtype)) {
    view.k_scale = scales(layer, false).data();
    view.v_scale = scales(layer, true).data();
  }
  return view;
}

void HostKVCache::write(int32_t layer, std::span<const Slot> slot_mapping, std::span<const float> k,
                        std::span<const float> v) {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "HostKVCache::write: layer {} out of range [0, {})", layer, config_.num_layers);
  if (dtype_is_quantized(config_.dtype) && !scales_set_[static_cast<size_t>(layer)] &&
      !slot_mapping.empty()) {
    // Calibrate on a copy first: a write that then fails its checks leaves the scales unset.
    const int64_t token_elems = int64_t{config_.num_kv_heads} * config_.head_dim;
    if (static_cast<int64_t>(k.size()) == static_cast<int64_t>(slot_mapping.size()) * token_elems &&
        k.size() == v.size()) {
      const KVScales s =
          calibrate_kv_scales(config_.dtype, config_.scale_granularity, config_.num_kv_heads,
                              config_.head_dim, k, v, config_.calibration_headroom);
      const std::vector<float> saved = scales_;
      std::copy(s.k.begin(), s.k.end(), scales_.begin() + scale_offset(config_, layer, false));
      std::copy(s.v.begin(), s.v.end(), scales_.begin() + scale_offset(config_, layer, true));
      try {
        reshape_and_cache(this->layer(layer), slot_mapping, k, v);
      } catch (...) {
        scales_ = saved;
        throw;
      }
      scales_set_[static_cast<size_t>(layer)] = true;
      return;
    }
  }
  reshape_and_cache(this->layer(layer), slot_mapping, k, v);
}

void HostKVCache::write(int32_t layer, std::span<const Slot> slot_mapping, ActivationView k,
                        ActivationView v) {
  detail::check_activation("HostKVCache::write", "k", k.dtype, k.data, k.size);
  detail::check_activation("HostKVCache::write", "v", v.dtype, v.data, v.size);
  std::vector<float> k_buffer;
  std::vector<float> v_buffer;
  write(layer, slot_mapping, detail::widened(k, k_buffer), detail::widened(v, v_buffer));
}

void HostKVCache::copy_blocks(std::span<const BlockCopy> pairs) {
  for (const BlockCopy& p : pairs) {
    check_block(p.src, "copy_blocks(src)");
    check_block(p.dst, "copy_blocks(dst)");
  }
  for (const BlockCopy& p : pairs) {
    if (p.src == p.dst) continue;  // memcpy onto itself is undefined; the result is the same
    for (int32_t l = 0; l < config_.num_layers; ++l) detail::copy_block(layer(l), p.src, p.dst);
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
  const float scale = scales(layer, value)[static_cast<size_t>(kv_head)];
  for (int32_t d = 0; d < config_.head_dim; ++d) {
    out[d] = load_as_f32(base, config_.dtype, off + d) * scale;
  }
  return out;
}

void HostKVCache::fill_blocks(std::span<const BlockId> blocks, float value) {
  for (BlockId b : blocks) check_block(b, "fill_blocks");
  for (BlockId b : blocks) {
    for (int32_t l = 0; l < config_.num_layers; ++l) {
      const KVLayerView view = this->layer(l);
      for (bool is_v : {false, true}) {
        void* base = is_v ? view.v : view.k;
        const std::span<const float> s = scales(l, is_v);
        for (int32_t h = 0; h < config_.num_kv_heads; ++h) {
          const float stored = dtype_is_quantized(config_.dtype) ? value / s[h] : value;
          for (int32_t t = 0; t < config_.block_size; ++t) {
            const int64_t off = view.offset(b, h, t);
            for (int32_t d = 0; d < config_.head_dim; ++d) {
              store_from_f32(base, config_.dtype, off + d, stored);
            }
          }
        }
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
