#pragma once
/// @file device_kv_cache.hpp
/// Paged K/V storage in device memory, with a pinned host pool for swapping (preemption).
/// The device twin of HostKVCache: same KVCacheConfig, layout and dtypes, same arena order, and
/// the same write / copy_blocks / layer shape (storage/paged_kv_storage.hpp), so one model loop
/// drives either. Host declarations only; no CUDA headers. Defined only when PAGEDKV_WITH_CUDA
/// is 1.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/storage/paged_kv_storage.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv::cuda {

/// Device K and V pools for every layer in ONE cudaMalloc arena (zeroed), in HostKVCache's
/// order, per config.placement: separate, layer 0 K pool, layer 0 V pool, layer 1 K, ...
/// (each [num_blocks, ...layout]); interleaved, per layer one pool [num_blocks, 2, ...layout]
/// (block 0 K, block 0 V, block 1 K, ...). Either way a block's K (and V) is
/// pool_block_bytes() contiguous bytes, and layer() gives the same strides as HostKVCache.
/// Memory: bytes() == kv_cache_bytes(config) on the device (the pools, and for an 8-bit dtype
/// its scales in a separate buffer: [num_layers][K, V][num_kv_heads] fp32, 1 until set), plus
/// num_host_blocks * block_bytes() of pinned host memory for swapping.
///
/// 8-bit dtypes (fp8_e4m3, fp8_e5m2, int8; docs/quantization.md): scales as HostKVCache's, set
/// with set_scales() or calibrated by the first host-span write() of a layer (max |x| / format
/// max, as HostKVCache::write); layer() points the view's k_scale / v_scale at the device
/// copy, which the CUDA write and decode read. The host keeps a mirror (scales()), which is
/// what the checks read: the device copy is only ever written from checked values.
///
/// The swap pool holds whole blocks, block-major: host block j is block_bytes() contiguous
/// bytes, K then V for layer 0, then layer 1, ... -- the byte order of
/// HostKVCache::block_bytes(), so host_block(j) compares directly with it.
///
/// Streams: every operation is asynchronous on the stream it is given, except the
/// host-mirror functions upload()/download(), which synchronize. Not internally synchronized.
class DeviceKVCache {
 public:
  /// Allocates the zeroed device pools of `config` and a zeroed pinned swap pool of
  /// num_host_blocks blocks (block_bytes() each); synchronous (returns with the pools zeroed).
  /// Errors: throws pagedkv::Error if the config is invalid (validate()), num_host_blocks < 0,
  /// there is no CUDA device (require_device()), or an allocation fails (names the bytes).
  explicit DeviceKVCache(const KVCacheConfig& config, int32_t num_host_blocks = 0);
  ~DeviceKVCache();
  /// Takes other's device arena, pointer table, staging buffers and pinned swap pool without
  /// copying or synchronizing. Views and pointers taken from `other` (layer(), pool_pointers(),
  /// host_block()) stay valid and now belong to this cache. The moved-from cache owns no memory
  /// (it still reports its config() and sizes): only destroying it or assigning to it is valid.
  DeviceKVCache(DeviceKVCache&&) noexcept;
  /// Frees this cache's device and pinned memory and takes other's, leaving `other` as the move
  /// constructor does. Self-move keeps the cache.
  DeviceKVCache& operator=(DeviceKVCache&&) noexcept;
  DeviceKVCache(const DeviceKVCache&) = delete;
  DeviceKVCache& operator=(const DeviceKVCache&) = delete;

  /// View of one layer's device pools, for the kernels; for an 8-bit dtype its k_scale /
  /// v_scale are DEVICE pointers to the layer's [num_kv_heads] scales. Errors: throws if layer
  /// is out of range.
  [[nodiscard]] KVLayerView layer(int32_t layer) const;

  /// HostKVCache::set_scales on the device cache: checks (the same errors: a float dtype, a
  /// layer out of range, a count neither 1 nor (per head) num_kv_heads, a scale not finite and
  /// > 0, each named), then copies the layer's scales to the device, stream-ordered on
  /// `stream` (the values are taken before it returns). K/V already stored keep their bytes.
  void set_scales(int32_t layer, std::span<const float> k_scale, std::span<const float> v_scale,
                  Stream stream = nullptr);
  /// The K (value false) or V (true) scales of a layer, [num_kv_heads], from the host mirror
  /// (all 1 for the float dtypes). Errors: throws if layer is out of range.
  [[nodiscard]] std::span<const float> scales(int32_t layer, bool value) const;
  /// The geometry the cache was built with (the same meaning as HostKVCache::config()).
  [[nodiscard]] const KVCacheConfig& config() const { return config_; }
  /// Device bytes of the pools: kv_cache_bytes(config()).
  [[nodiscard]] int64_t bytes() const { return kv_cache_bytes(config_); }
  /// Bytes of one block in one pool: block_size * num_kv_heads * head_dim * dtype_size.
  [[nodiscard]] int64_t pool_block_bytes() const { return pool_block_bytes_; }
  /// Bytes of one block across all layers, K and V: 2 * num_layers * pool_block_bytes().
  [[nodiscard]] int64_t block_bytes() const { return 2 * config_.num_layers * pool_block_bytes_; }
  /// Blocks of the pinned host swap pool (the constructor's num_host_blocks): valid host ids
  /// for swap_out() destinations, swap_in() sources and host_block() are [0, num_host_blocks).
  [[nodiscard]] int32_t num_host_blocks() const { return num_host_blocks_; }
  /// Device array [num_copy_pools()] of device pointers, the `pools` argument of
  /// cuda::copy_blocks() with block_bytes = copy_block_bytes(): separate placement, the
  /// 2 * num_layers pools (K of layer 0, V of layer 0, ...), blocks of pool_block_bytes();
  /// interleaved, the num_layers layer pools, blocks of 2 * pool_block_bytes() (K then V).
  [[nodiscard]] void* const* pool_pointers() const { return pool_ptrs_.as<void* const>(); }
  /// Entries of pool_pointers(): 2 * num_layers (separate) or num_layers (interleaved).
  [[nodiscard]] int32_t num_copy_pools() const { return num_copy_pools_; }
  /// Bytes of one block in one entry of pool_pointers(): pool_block_bytes() (separate) or
  /// 2 * pool_block_bytes() (interleaved).
  [[nodiscard]] int64_t copy_block_bytes() const { return copy_block_bytes_; }

  /// HostKVCache::write on the device, from host memory: the K/V of new tokens into their slots
  /// of layer `layer`, converted from fp32 to the pool dtype (round to nearest even, the host's
  /// bits; 8-bit: stored = Q(x / scale), the bytes of HostKVCache::write). An 8-bit layer whose
  /// scales were never set calibrates them from this write first, as HostKVCache::write does.
  /// Stages the inputs through device buffers owned by this cache and synchronizes
  /// `stream` before returning, so the spans may be reused at once.
  /// Shapes: slot_mapping [num_tokens] int64 (negative = padding, skipped); k, v [num_tokens,
  /// num_kv_heads, head_dim] fp32, host.
  /// Errors: throws pagedkv::Error, before anything is written, if the layer is out of range,
  /// a size differs, or a slot is >= num_blocks * block_size; CUDA errors after.
  void write(int32_t layer, std::span<const Slot> slot_mapping, std::span<const float> k,
             std::span<const float> v, Stream stream = nullptr);

  /// reshape_and_cache into layer `layer` from device memory (see cuda::reshape_and_cache: fp32,
  /// fp16 or bf16 inputs). Asynchronous on `stream`.
  /// Errors: throws if layer is out of range, or (8-bit dtype, num_tokens > 0) its scales were
  /// never set or calibrated (device inputs are not calibrated: set_scales first), plus
  /// reshape_and_cache's errors.
  void write(int32_t layer, const NewKV& input, Stream stream = nullptr);

  /// Copy-on-write copies from a host list (what KVCacheManager::append_slots returns): every
  /// layer's K and V of src go to dst, in one kernel launch. The list is staged to the device
  /// through a buffer owned by this cache (stream-ordered: calls on different streams must be
  /// ordered by the caller). Errors: throws, before anything is copied, if an id is out of
  /// range, a block is both a source and a destination, or a destination repeats.
  void copy_blocks(std::span<const BlockCopy> pairs, Stream stream = nullptr);

  /// Swap out (preemption): for each pair, device block `src` (all layers, K and V) is copied
  /// into host swap block `dst`, batched: one cudaMemcpy2DAsync per copy pool per run of
  /// consecutive pairs (src and dst both incrementing), never per token. Asynchronous on
  /// `stream`: synchronize it before reading host_block().
  /// Errors: throws, before anything is copied, if src is not in [0, num_blocks), dst not in
  /// [0, num_host_blocks), or a destination repeats.
  void swap_out(std::span<const BlockCopy> pairs, Stream stream = nullptr);
  /// Swap in: host swap block `src` -> device block `dst` (possibly a different id than it was
  /// swapped out from). Batched like swap_out. Errors: as swap_out with the roles exchanged.
  void swap_in(std::span<const BlockCopy> pairs, Stream stream = nullptr);

  /// Bytes of host swap block `block` (block_bytes() long). Errors: throws if out of range.
  [[nodiscard]] std::span<const std::byte> host_block(int32_t block) const;

  /// Copies every pool of `host` to the device (synchronous), and for an 8-bit dtype its scales
  /// (every layer's then counts as set). The configs must be equal.
  /// Errors: throws pagedkv::Error naming the first differing field; CUDA errors.
  void upload(const HostKVCache& host);
  /// Copies every device pool into `host` (synchronous), and for an 8-bit dtype the scales of
  /// the layers set here (HostKVCache::set_scales). Errors: as upload().
  void download(HostKVCache& host) const;
  /// Sets every pool byte to 0. Asynchronous.
  void zero(Stream stream = nullptr);

 private:
  /// Entry p of pool_pointers() (host-side address arithmetic on the arena).
  [[nodiscard]] std::byte* copy_pool(int32_t p) const;
  /// The same pool in `host` (same config): where upload/download copy it from/to.
  [[nodiscard]] std::byte* host_copy_pool(const HostKVCache& host, int32_t p) const;
  /// Block 0 of layer `layer`'s K (value false) or V (true).
  [[nodiscard]] std::byte* pool(int32_t layer, bool value) const;
  void swap(std::span<const BlockCopy> pairs, bool out, Stream stream);
  // 8-bit scales (cuda/host/device_kv_cache_scales.cpp): all 1 on the device and the mirror.
  void init_scales();
  // The host-span write's calibration of a quantized layer never set (inputs already checked).
  void calibrate_if_unset(int32_t layer, std::span<const float> k, std::span<const float> v,
                          Stream stream);
  void upload_scales(const HostKVCache& host);
  void download_scales(HostKVCache& host) const;

  KVCacheConfig config_;
  int32_t num_host_blocks_ = 0;
  int64_t pool_block_bytes_ = 0;
  int32_t num_copy_pools_ = 0;
  int64_t copy_block_bytes_ = 0;
  DeviceBuffer arena_;
  DeviceBuffer scales_;             // [num_layers][2][num_kv_heads] fp32, 8-bit dtypes only
  std::vector<float> host_scales_;  // the same, host mirror (1 for the float dtypes)
  std::vector<bool> scales_set_;    // per layer: set or calibrated
  DeviceBuffer pool_ptrs_;          // [2 * num_layers] void*
  DeviceBuffer pair_staging_;       // BlockCopy list for copy_blocks()
  DeviceBuffer slot_staging_;       // write() from host memory: [num_tokens] int64
  DeviceBuffer k_staging_;          // [num_tokens, num_kv_heads, head_dim] fp32
  DeviceBuffer v_staging_;
  PinnedHostBuffer host_pool_;
};

static_assert(PagedKVStorage<DeviceKVCache>);

}  // namespace pagedkv::cuda
