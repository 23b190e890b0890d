#pragma once
/// @file device_decode_runner.hpp
/// Host-driven attention over device pools: the same calls, with host spans, as the CPU path
/// (pagedkv::paged_decode_attention / paged_prefill_attention over a KVLayerView), so a
/// host-side model loop such as `pagedkv generate --device cuda` swaps backends without touching
/// device pointers (the cache writes are DeviceKVCache::write, as HostKVCache::write).
/// Host declarations only; no CUDA headers. Defined only when PAGEDKV_WITH_CUDA is 1.

#include <cstdint>
#include <optional>
#include <span>

#include "pagedkv/attention_params.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv::cuda {

/// Stages host inputs into device buffers it owns (grown on demand, reused across calls),
/// launches on its stream, copies outputs back, and synchronizes before returning: every call
/// is synchronous, and its host spans may be reused as soon as it returns.
/// Not for the hot loop of a server (use the device-pointer launchers and DeviceBatchMetadata
/// there); right for a CLI, tests and examples. Not internally synchronized.
class DeviceDecodeRunner {
 public:
  /// A runner that launches on `stream` (not owned: it must outlive the runner). Allocates
  /// nothing yet; the staging buffers grow on the first calls.
  /// Errors: throws pagedkv::Error if there is no CUDA device.
  explicit DeviceDecodeRunner(Stream stream = nullptr);

  /// pagedkv::paged_decode_attention on the device. `cache` views device pools (e.g.
  /// DeviceKVCache::layer()).
  /// Shapes: `tables` holds HOST arrays (see BlockTableView); q, out [num_seqs, num_heads,
  /// head_dim] fp32, host. plan: make_decode_plan() for this batch unless given.
  /// Errors: throws pagedkv::Error on what the CPU function rejects (params/view mismatch, sizes,
  /// a context longer than the table, a block id out of range among those in use) and on an
  /// unsupported (dtype, head_dim, block_size) (supported_configs.hpp).
  void decode(const AttentionParams& params, const KVLayerView& cache, const BlockTableView& tables,
              std::span<const float> q, std::span<float> out,
              std::optional<DecodePlan> plan = std::nullopt);

  /// pagedkv::paged_prefill_attention on the device, by the decode kernel: query token t of
  /// sequence i (at position p = context_lens[i] - n_i + t) becomes one decode row with sequence
  /// i's block table and context p + 1, which is exactly causal attention to positions 0..p.
  /// Correct for any chunk; slower than a dedicated prefill kernel (K/V are re-read per query
  /// row), which is fine for a prompt processed once. Rows are launched in chunks of at most
  /// kMaxRowsPerLaunch.
  /// Shapes: query_start [num_seqs + 1] (query_start[0] = 0); q, out [query_start[num_seqs],
  /// num_heads, head_dim] fp32, host; `tables` host arrays; `cache` device pools.
  /// Errors: as decode, plus n_i < 0 or n_i > context_lens[i] (naming the sequence).
  void prefill(const AttentionParams& params, const KVLayerView& cache,
               const BlockTableView& tables, std::span<const int32_t> query_start,
               std::span<const float> q, std::span<float> out);

  /// Rows of one decode launch made by prefill() (the grid's y limit is 65535).
  static constexpr int32_t kMaxRowsPerLaunch = 16384;

  /// contiguous_decode_attention with host context lengths, q and out; `cache` is the
  /// contiguous_paged_view of device buffers (sequence i is block i, block_size = max_len).
  /// Shapes: context_lens [cache.num_blocks]; q, out [cache.num_blocks, num_heads, head_dim].
  /// Errors: as decode, plus a context length outside [0, max_len].
  void decode_contiguous(const AttentionParams& params, const KVLayerView& cache,
                         std::span<const int32_t> context_lens, std::span<const float> q,
                         std::span<float> out, std::optional<DecodePlan> plan = std::nullopt);

  /// The plan of the last decode call (one-pass before the first).
  [[nodiscard]] const DecodePlan& last_plan() const { return last_plan_; }
  /// The stream every call stages, launches and synchronizes on: the one given to the
  /// constructor (not owned; nullptr is the legacy default stream).
  [[nodiscard]] Stream stream() const { return stream_; }

 private:
  // Stages q, sizes out and the workspace, picks the plan; returns the launch settings.
  DecodeLaunch prepare(const AttentionParams& params, DType dtype, int32_t num_seqs,
                       int64_t max_context, std::span<const float> q, std::span<float> out,
                       const std::optional<DecodePlan>& plan);
  // Copies out back and synchronizes.
  void finish(std::span<float> out);

  Stream stream_ = nullptr;
  DecodePlan last_plan_;
  DeviceBuffer q_;
  DeviceBuffer out_;
  DeviceBuffer tables_;
  DeviceBuffer context_lens_;
  DeviceBuffer workspace_;
};

}  // namespace pagedkv::cuda
