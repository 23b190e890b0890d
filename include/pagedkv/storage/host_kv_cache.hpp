#pragma once
/// @file host_kv_cache.hpp
/// Paged K/V storage in host memory: the pages themselves. Driven by the slots and block copies
/// that KVCacheManager returns; knows nothing of sequences.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/host_buffer.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// One layer's pools in memory the caller owns (HostKVCache's wrapping constructor): the first
/// byte of its K pool and of its V pool, laid out as the KVCacheConfig says.
struct ExternalKVPools {
  void* k = nullptr;  ///< K of block 0 (interleaved: the combined pool's first byte)
  void* v = nullptr;  ///< V of block 0 (interleaved: k + one block's K bytes)
};

/// Host-memory K and V pools for every layer, one zero-initialized HostBuffer arena (64-byte
/// aligned pools; transparent huge pages advised for arenas of 2 MiB or more, see
/// HostMemoryOptions).
/// Layout of a block: config.layout (default HND, [num_kv_heads, block_size, head_dim] per block).
/// The arena holds the layers in order; within a layer, config.placement decides:
///  - KVPlacement::kInterleaved (the default): one pool [num_blocks, 2 (K, V), ...], i.e.
///    block 0 K, block 0 V, block 1 K, ... (the view's v is k + one block, block_stride doubled);
///  - KVPlacement::kSeparate: a K pool [num_blocks, ...] then a V pool, so the arena reads
///    layer 0 K, layer 0 V, layer 1 K, ...
///
/// layer() expresses either through its strides, so kernels read both unchanged.
/// Memory: bytes() == kv_cache_bytes(config) exactly (pool padding to 64 bytes not counted).
class HostKVCache {
 public:
  /// Allocates the zeroed pools of `config` (every slot reads 0 until written).
  /// Errors: throws pagedkv::Error if the config is invalid (see validate()); std::bad_alloc if
  /// the arena cannot be allocated.
  explicit HostKVCache(const KVCacheConfig& config, const HostMemoryOptions& memory = {});
  /// Wraps pools the caller owns, e.g. an engine's CPU tensors: nothing is allocated, zeroed
  /// or freed (the caller keeps the memory alive and unmoved while the cache lives), and every
  /// operation below (write, copy_blocks, block_bytes, layer views for the kernels, ...) reads
  /// and writes the caller's memory. Layout per config: config.layout within a block;
  /// kSeparate placement: K and V pools [num_blocks, block] each (vLLM's separate K and V
  /// tensors); kInterleaved: one pool [num_blocks, 2 (K, V), block] (FlashInfer's combined
  /// [num_pages, 2, ...]), so v must be k + one block's K bytes. Scales are the cache's own,
  /// as for an owning cache.
  /// Shapes: layers [config.num_layers]; each pool of num_blocks x block_size x num_kv_heads x
  /// head_dim elements of config.dtype (x 2 interleaved), bytes().
  /// Errors: throws pagedkv::Error if the config is invalid (validate()), layers.size() !=
  /// num_layers, a pointer is null or not aligned to the dtype's size, (interleaved) v is not
  /// k + one block's bytes, or two pools overlap (a layer's K and V, or two layers), naming
  /// the layer and the pointer.
  /// Worked example (kSeparate, HND, fp32, block_size 4, 2 kv heads, head_dim 5: a block is
  /// 40 floats): write(0, {13}, k, v) stores K head 1, dim 2 of the token at float 3 x 40 +
  /// 1 x 20 + 1 x 5 + 2 = 147 of layers[0].k, V at float 147 of layers[0].v; kInterleaved, the
  /// same K is float 3 x 80 + 27 = 267 of layers[0].k and V float 307.
  HostKVCache(const KVCacheConfig& config, std::span<const ExternalKVPools> layers);

  /// reshape_and_cache: writes the K and V of new tokens to their slots in layer `layer`,
  /// converting fp32 to the storage dtype (round to nearest even; 8-bit dtypes: divided by the
  /// layer's scale and saturated, see dtype.hpp). A quantized layer whose scales were never set
  /// calibrates them from this first write (calibrate_kv_scales with config.scale_granularity:
  /// max |x| / format max), as vLLM's calculate_kv_scales does on the first prefill.
  /// Shapes: slot_mapping [num_tokens] int64 (negative = padding, skipped);
  ///         k, v [num_tokens, num_kv_heads, head_dim] fp32.
  /// Errors: throws pagedkv::Error if layer is out of range, k/v sizes differ from
  /// num_tokens * num_kv_heads * head_dim, or a slot is >= num_blocks * block_size; checked
  /// before anything is written (scales included).
  void write(int32_t layer, std::span<const Slot> slot_mapping, std::span<const float> k,
             std::span<const float> v);
  /// write with K and V in an engine's activation dtype (fp32, fp16 or bf16): widened exactly to
  /// fp32 (f16_to_f32 / bf16_to_f32), then written (and, first write of a quantized layer,
  /// calibrated) as the fp32 write does with the widened values, bit for bit.
  /// Shapes: as the fp32 write; k.size, v.size in elements.
  /// Errors: as the fp32 write, plus throws pagedkv::Error naming the dtype if k.dtype or
  /// v.dtype is not fp32, fp16 or bf16, or naming the argument if its data is null with size > 0.
  void write(int32_t layer, std::span<const Slot> slot_mapping, ActivationView k, ActivationView v);

  /// Sets the scales of a quantized layer (x = stored * scale): one value each for K and V
  /// (per tensor; repeated per head), or num_kv_heads values each (config.scale_granularity
  /// kPerHead only). K/V already stored keep their bytes: set scales before the first write.
  /// Errors: throws pagedkv::Error if the dtype is not quantized, the layer is out of range,
  /// a count is neither 1 nor (per head) num_kv_heads, or a scale is not finite and > 0
  /// (naming it and its index); nothing changes then.
  void set_scales(int32_t layer, std::span<const float> k_scale, std::span<const float> v_scale);
  /// The K (value false) or V (true) scales of a layer, [num_kv_heads] (all 1 for the float
  /// dtypes and for a quantized layer not yet written or set).
  /// Errors: throws pagedkv::Error on an out-of-range layer.
  [[nodiscard]] std::span<const float> scales(int32_t layer, bool value) const;

  /// Copies whole blocks src -> dst in every layer, K and V (copy-on-write, defragmentation):
  /// the AppendResult::copies of KVCacheManager, before the slots are written.
  /// Pairs are applied in order ({1, 3} then {3, 4} leaves block 1's data in 4); src == dst is a
  /// no-op. Errors: throws pagedkv::Error if an id is outside [0, num_blocks) (all checked
  /// first, nothing copied).
  void copy_blocks(std::span<const BlockCopy> pairs);

  /// Reads the K (value false) or V (value true) vector of one (slot, kv head) of a layer as
  /// fp32 (dequantized: stored x scale), for tests and debugging. Shapes: returns [head_dim].
  /// Errors: throws pagedkv::Error on an out-of-range layer, slot (negative included) or head.
  [[nodiscard]] std::vector<float> read(int32_t layer, Slot slot, int32_t kv_head,
                                        bool value) const;

  /// Sets every element of the given blocks (all layers, K and V) to `value`, rounded to the
  /// dtype (quantized: value / scale); tests use NaN to poison reused blocks (int8 has no NaN:
  /// it stores 0).
  /// Errors: throws pagedkv::Error if an id is out of range (all checked first).
  void fill_blocks(std::span<const BlockId> blocks, float value);

  /// Raw bytes of one block across all layers, K then V per layer (layer 0 K, layer 0 V, layer 1
  /// K, ...) in either placement, for swap and bit-exact comparisons.
  /// Shapes: returns 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_size bytes.
  /// Errors: throws pagedkv::Error if the id is out of range.
  [[nodiscard]] std::vector<std::byte> block_bytes(BlockId block) const;
  /// Restores bytes captured by block_bytes() (of this cache or one with an equal config) into
  /// block `block`. Errors: throws pagedkv::Error if the id is out of range or the size differs
  /// from block_bytes()'s.
  void set_block_bytes(BlockId block, std::span<const std::byte> bytes);

  /// View of layer `layer` for kernels (valid as long as this cache lives; moving the cache
  /// keeps the pools where they are). Errors: throws pagedkv::Error if layer is out of
  /// [0, num_layers).
  [[nodiscard]] KVLayerView layer(int32_t layer) const;
  /// The geometry the cache was built with.
  [[nodiscard]] const KVCacheConfig& config() const { return config_; }
  /// Bytes of the pools and scales: kv_cache_bytes(config()) (a wrapping cache: the bytes of
  /// the caller's pools it addresses, plus its own scales).
  [[nodiscard]] int64_t bytes() const { return kv_cache_bytes(config_); }
  /// True for a cache over the caller's memory (the ExternalKVPools constructor).
  [[nodiscard]] bool wraps_external_memory() const { return arena_.data() == nullptr; }

 private:
  /// First byte of block `block`'s K (value false) or V (true) in layer `layer`.
  [[nodiscard]] std::byte* block_ptr(int32_t layer, bool value, int64_t block) const;
  void check_block(BlockId block, const char* op) const;

  KVCacheConfig config_;
  int64_t pool_bytes_ = 0;
  HostBuffer arena_;  // empty when wrapping the caller's pools
  /// [num_layers] first byte of each layer's K and V pools (in arena_, or the caller's).
  std::vector<ExternalKVPools> bases_;
  /// [num_layers][2 (K, V)][num_kv_heads] scales (1 for the float dtypes).
  std::vector<float> scales_;
  /// Per layer: scales set or calibrated (a quantized layer calibrates on its first write).
  std::vector<bool> scales_set_;
};

}  // namespace pagedkv
