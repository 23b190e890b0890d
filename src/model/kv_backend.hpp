#pragma once
/// @file kv_backend.hpp
/// Where the model's keys and values live and how attention reads them: the three cache modes
/// of `pagedkv generate`, each built only on pagedkv's public API.
///
///  - paged:      KVCacheManager::append_slots -> HostKVCache::write with the slot mapping ->
///                paged_prefill_attention (a prompt, in one pass) or paged_decode_attention
///                (one token per sequence);
///  - contiguous: ReferenceKVCache::append -> reference_attention (the ground truth);
///  - none:       no cache: the caller feeds every sequence's whole history each step; K/V go
///                to a scratch pool that is emptied after the step, attention is the same
///                paged prefill kernel, so none vs paged measures the caching alone.
///
/// Device: the paged mode also runs on a CUDA device (kv_backend_cuda.cpp, `--device cuda`): the
/// same backend (paged_backend.hpp) over another storage and attention, the same
/// KVCacheManager on the host, the pools in a cuda::DeviceKVCache, attention by
/// cuda::DeviceDecodeRunner. contiguous and none exist on the CPU only.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "model/kv_tiering.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/reference/reference_attention.hpp"
#include "pagedkv/reference/reference_kv_cache.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv::model {

enum class CacheMode : uint8_t { kPaged, kContiguous, kNone };

/// "paged", "contiguous", "none".
[[nodiscard]] std::string_view cache_mode_name(CacheMode mode);
/// Inverse of cache_mode_name; empty for anything else.
[[nodiscard]] std::optional<CacheMode> parse_cache_mode(std::string_view name);

/// Where a backend keeps K/V and runs attention.
enum class Device : uint8_t { kCpu, kCuda };

/// "cpu", "cuda".
[[nodiscard]] std::string_view device_name(Device device);
/// Inverse of device_name; empty for anything else.
[[nodiscard]] std::optional<Device> parse_device(std::string_view name);

/// Geometry a backend needs from the model.
struct KVBackendConfig {
  int32_t num_layers = 1;
  int32_t num_heads = 1;
  int32_t num_kv_heads = 1;
  int32_t head_dim = 2;
  int32_t block_size = 16;  ///< tokens per block (paged and none)
  /// Pool size of the paged and none modes, blocks; the caller sizes it for the whole run.
  int32_t num_blocks = 1;
  /// Storage dtype of the paged mode's pools (the 8-bit ones calibrate their per-tensor scales
  /// on the first prefill, HostKVCache::write); the other modes keep fp32.
  DType kv_dtype = DType::kF32;
  /// KVCacheConfig::calibration_headroom of the 8-bit pools (>= 1).
  float kv_scale_headroom = 1.0f;
  /// Paged mode on the CPU: automatic prefix caching (add_prompt() shares published blocks).
  bool prefix_caching = false;
  /// Paged mode on the CPU: tiers below the pool and KV events (implies prefix caching).
  TieringOptions tiering;
  /// [num_layers] each layer's attention (full, sliding window, chunked local), or empty: all
  /// full. Every mode applies the layer's mask; the paged mode then keeps the layers in KV
  /// cache groups over one pool (HybridKVCacheManager, group_layers), releasing what a local
  /// layer no longer sees, and sizes its pool as num_blocks per group plus the null block.
  std::vector<KVCacheGroupSpec> layer_attention;
};

/// KV held by one KV cache group of the hybrid paged mode. Units: blocks, bytes.
struct GroupKVUsage {
  KVCacheGroupSpec spec;  ///< the group's attention; spec.num_layers its real layers
  int64_t blocks = 0;     ///< non-null table entries over all sequences
  int64_t bytes = 0;      ///< blocks x page bytes (the page holds the group's layer slots)
};

/// One forward step's attention for a batch of sequences.
/// Protocol per step: begin_step(seqs, n_new), then attend() once per layer in order, then
/// end_step(). Sequence i contributes n_new[i] consecutive new tokens, appended after its
/// cached ones (none mode: after nothing, since it caches nothing between steps).
class KVBackend {
 public:
  virtual ~KVBackend() = default;
  [[nodiscard]] virtual CacheMode mode() const = 0;
  /// False for none: the caller must feed each sequence's whole history every step.
  [[nodiscard]] bool caches() const { return mode() != CacheMode::kNone; }

  /// Errors: throws pagedkv::Error if `seq` exists.
  virtual void add_sequence(SeqId seq) = 0;
  /// Registers `seq` with its prompt and returns how many leading prompt tokens are cached
  /// already (prefix hits in the pool, blocks onboarded from the tiers): the caller forwards
  /// only the rest. Without prefix caching: add_sequence(seq), 0.
  /// Errors: throws pagedkv::Error if `seq` exists or the pool cannot hold the hits.
  virtual int64_t add_prompt(SeqId seq, std::span<const TokenId> prompt) {
    (void)prompt;
    add_sequence(seq);
    return 0;
  }
  /// Errors: throws pagedkv::Error if `seq` is unknown.
  virtual void free_sequence(SeqId seq) = 0;
  /// Tokens cached for `seq` (0 for none between steps).
  [[nodiscard]] virtual int64_t num_tokens(SeqId seq) const = 0;

  /// Reserves room for the new tokens. Errors: throws pagedkv::Error on unknown sequences,
  /// size mismatches, or when the pool cannot hold them (the caller sized it too small).
  virtual void begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) = 0;

  /// Stores the new tokens' K/V for `layer` and computes their attention outputs.
  /// Shapes: q, out [N, num_heads, head_dim]; k, v [N, num_kv_heads, head_dim] fp32, with
  /// N = sum n_new and rows in batch order (sequence by sequence, positions ascending).
  virtual void attend(int32_t layer, std::span<const float> q, std::span<const float> k,
                      std::span<const float> v, std::span<float> out) = 0;

  /// begin_step with the new tokens' ids ([sum n_new], batch order), which a prefix-caching
  /// backend needs to publish full blocks; the others ignore them.
  virtual void begin_step_with_tokens(std::span<const SeqId> seqs, std::span<const int64_t> n_new,
                                      std::span<const TokenId> tokens) {
    (void)tokens;
    begin_step(seqs, n_new);
  }

  virtual void end_step() {}

  /// End of a run, after every sequence was freed: the tiers write down what the policy says
  /// and finish their queued stores. Nothing for the other backends.
  virtual void finish() {}
  /// Between passes, with every sequence freed: drops the pool's prefix cache
  /// (KVCacheManager::reset_prefix_cache); with tiers the dropped blocks are written down
  /// first (under either write policy) and the queued stores finished, so later prompts hit in
  /// the tiers instead. Errors: throws pagedkv::Error for a backend without prefix caching.
  virtual void drop_prefix_cache();
  /// What the tiers did (empty without tiers).
  [[nodiscard]] virtual TieringReport tiering_report() const { return {}; }
  /// KV per group of the hybrid paged mode, now ([num_groups]); empty for the other backends.
  [[nodiscard]] virtual std::vector<GroupKVUsage> group_usage() const { return {}; }

  /// K/V bytes held now (paged: blocks in use x block bytes; contiguous: stored tokens; none:
  /// 0 between steps). Units: bytes.
  [[nodiscard]] virtual int64_t bytes_in_use() const = 0;
};

/// Creates the backend for `mode` on `device`.
/// Errors: throws pagedkv::Error on an invalid geometry, for Device::kCuda with a mode other
/// than paged, and as make_cuda_paged_backend.
[[nodiscard]] std::unique_ptr<KVBackend> make_kv_backend(CacheMode mode,
                                                         const KVBackendConfig& config,
                                                         Device device = Device::kCpu);

/// The paged mode on the CUDA device: fp32 pools in device memory, the block manager on the
/// host. Defined in every build. Memory: kv_cache_bytes of the pool on the device.
/// Errors: throws pagedkv::Error with one line: "no CUDA device: ..." when none is usable or
/// pagedkv was built without CUDA (cuda::require_device), "CUDA decode attention: head_dim 320
/// is not supported (supported: 1..256; fast kernel: 64, 128, 256)" and the like for a geometry
/// outside cuda/supported_configs.hpp (checked before anything is allocated), or a failed
/// allocation.
[[nodiscard]] std::unique_ptr<KVBackend> make_cuda_paged_backend(const KVBackendConfig& config);

}  // namespace pagedkv::model
