#pragma once
/// @file device_batch_metadata.hpp
/// Decode-step metadata (block tables, context lengths, slot mapping, CSR tables) in device
/// buffers of FIXED capacity, so that a decode step can be captured once in a CUDA graph and
/// replayed with new contents. Host declarations only; no CUDA headers. Defined only when
/// PAGEDKV_WITH_CUDA is 1.
///
/// CUDA-graph recipe (docs/cuda.md has the full example):
///  1. DeviceBatchMetadata meta(capacity); plan = make_decode_plan(params, dtype,
///     capacity.max_seqs, max_context_len); a DeviceBuffer workspace of
///     decode_workspace_bytes(capacity.max_seqs, ...).
///  2. meta.upload(first_batch, stream); cudaStreamBeginCapture(stream); per layer
///     reshape_and_cache(..., {.slot_mapping = meta.slot_mapping(), .num_tokens =
///     capacity.max_tokens}) and paged_decode_attention(params, layer, meta.tables(), q, out,
///     {plan, workspace, ...}); cudaStreamEndCapture -> graph; instantiate.
///  3. Every step: meta.upload(batch, stream) (outside the graph, same stream), then
///     cudaGraphLaunch(exec, stream). Pointers and grid sizes never change: the kernels see
///     num_seqs = capacity.max_seqs rows, the unused ones being padding rows (context 0 ->
///     zero output, slot -1 -> no write).

#include <cstdint>

#include "pagedkv/cuda/device.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"

namespace pagedkv::cuda {

/// Capacity of a DeviceBatchMetadata (fixed for its lifetime).
struct DeviceBatchCapacity {
  int32_t max_seqs = 1;            ///< rows of every table
  int32_t max_blocks_per_seq = 1;  ///< row stride of the padded block table
  int64_t max_tokens = 1;          ///< entries of the slot mapping
};

/// Fixed-capacity device copies of BatchMetadata, plus device-side builders of the CSR format
/// and of the slot mapping (CUB exclusive scans).
/// Device arrays (all sized by the capacity, never reallocated):
///   block_tables [max_seqs, max_blocks_per_seq] int32 (-1 padded), context_lens [max_seqs]
///   int32, slot_mapping [max_tokens] int64 (-1 padded), query_start [max_seqs + 1] int32,
///   csr_indptr [max_seqs + 1], csr_indices [max_seqs * max_blocks_per_seq],
///   csr_last_page_len [max_seqs] int32.
class DeviceBatchMetadata {
 public:
  /// Allocates every buffer for `capacity` and fills them as an all-padding batch (context 0,
  /// table -1, slot -1; num_seqs() == 0); synchronous (on the legacy default stream).
  /// Errors: throws pagedkv::Error if a capacity field is < 1 (or the tables exceed 2^31 - 1
  /// entries), there is no CUDA device, or an allocation fails.
  explicit DeviceBatchMetadata(const DeviceBatchCapacity& capacity);
  ~DeviceBatchMetadata();
  /// Takes other's device buffers, pinned staging and event without copying or synchronizing.
  /// Device pointers and views taken from `other` (tables(), slot_mapping(), ...) stay valid and
  /// now belong to this object, so a graph captured with them keeps working. The moved-from
  /// object owns no memory (it still reports its capacity() and counts): only destroying it or
  /// assigning to it is valid.
  DeviceBatchMetadata(DeviceBatchMetadata&&) noexcept;
  /// Releases this object's buffers and event and takes other's, leaving `other` as the move
  /// constructor does. Self-move keeps the object.
  DeviceBatchMetadata& operator=(DeviceBatchMetadata&&) noexcept;
  DeviceBatchMetadata(const DeviceBatchMetadata&) = delete;
  DeviceBatchMetadata& operator=(const DeviceBatchMetadata&) = delete;

  /// The capacity the buffers were sized for (fixed for the object's lifetime).
  [[nodiscard]] const DeviceBatchCapacity& capacity() const { return capacity_; }

  /// Copies meta.padded (tables, context lengths) and meta.slot_mapping into the fixed
  /// buffers, padding to capacity (rows past meta.padded.num_seqs: context 0, table -1; slots
  /// past meta.slot_mapping.size(): -1). Packs into pinned staging on the host, then one
  /// cudaMemcpyAsync per array on `stream`; waits (host side) only if the previous upload's
  /// copies have not yet left the staging buffer.
  /// The tables' geometry (meta.padded.block_size, or meta.block_size when that is unset, and
  /// meta.padded.num_blocks) is recorded for tables() and the builders below.
  /// Errors: throws pagedkv::Error naming the value if num_seqs, max_blocks_per_seq or the slot
  /// count exceeds the capacity, or meta.block_size and meta.padded.block_size are both set and
  /// differ; nothing is copied then.
  void upload(const BatchMetadata& meta, Stream stream = nullptr);

  /// Device view with num_seqs = capacity.max_seqs (fixed, for graph capture): the rows past
  /// the last upload are padding rows. block_size and num_blocks are the last upload's (0
  /// before the first, which attention rejects: the tables' geometry is not known yet).
  [[nodiscard]] BlockTableView tables() const;
  /// Device view with num_seqs = the last upload's count (smaller grids; not graph-stable);
  /// geometry as tables().
  [[nodiscard]] BlockTableView active_tables() const;
  /// Sequences of the last upload: meta.padded.num_seqs (0 before the first).
  [[nodiscard]] int32_t num_seqs() const { return num_seqs_; }
  /// Slot-mapping entries (tokens) of the last upload: meta.slot_mapping.size(), before the
  /// padding to capacity().max_tokens (0 before the first).
  [[nodiscard]] int64_t num_slots() const { return num_slots_; }

  [[nodiscard]] const int64_t* slot_mapping() const;       ///< [max_tokens]
  [[nodiscard]] const int32_t* query_start() const;        ///< [max_seqs + 1]
  [[nodiscard]] const int32_t* csr_indptr() const;         ///< [max_seqs + 1]
  [[nodiscard]] const int32_t* csr_indices() const;        ///< [max_seqs * max_blocks_per_seq]
  [[nodiscard]] const int32_t* csr_last_page_len() const;  ///< [max_seqs]

  /// Builds the CSR tables on the device from the device padded tables and context lengths:
  /// blocks per row ceil(context / block_size), cub::DeviceScan::ExclusiveSum -> csr_indptr
  /// (csr_indptr[max_seqs] = total), scatter of the used blocks -> csr_indices, and
  /// csr_last_page_len (tokens in the last block, 0 for an empty row). Same values as
  /// build_csr_block_tables() on the host. Asynchronous; graph-capturable.
  /// Errors: throws if block_size < 1, or differs from the uploaded tables' block_size (naming
  /// both).
  void build_csr(int32_t block_size, Stream stream = nullptr);

  /// Builds query_start (exclusive scan of num_new_tokens, query_start[max_seqs] = total) and
  /// the slot mapping on the device: row i's new tokens are its last num_new_tokens[i]
  /// positions, slot = table[pos / bs] * bs + pos % bs; entries past the total are -1.
  /// Shapes: num_new_tokens [max_seqs] int32, device (rows past the batch: 0).
  /// Preconditions (device data): 0 <= num_new_tokens[i] <= context_lens[i], total <=
  /// max_tokens. Asynchronous; graph-capturable. Errors: throws if block_size < 1 or differs
  /// from the uploaded tables' block_size (naming both), or the pointer is null.
  void build_slot_mapping(const int32_t* num_new_tokens, int32_t block_size,
                          Stream stream = nullptr);

 private:
  /// Throws naming both values if `block_size` differs from the uploaded tables' (when known).
  void check_uploaded_block_size(const char* fn, int32_t block_size) const;

  DeviceBatchCapacity capacity_;
  int32_t num_seqs_ = 0;
  int64_t num_slots_ = 0;
  int32_t block_size_ = 0;  // geometry of the last upload (0 before the first)
  int32_t num_blocks_ = 0;
  DeviceBuffer tables_;    // block_tables, then context_lens
  DeviceBuffer slots_;     // slot_mapping
  DeviceBuffer scan_;      // query_start, csr_indptr, csr_indices, csr_last_page_len, counts
  DeviceBuffer cub_temp_;  // CUB scan temporary storage, sized once
  int64_t cub_temp_bytes_ = 0;
  PinnedHostBuffer staging_;      // tables + context_lens + slots, packed like the device buffers
  void* staging_done_ = nullptr;  // cudaEvent_t recorded after the staging copies
};

}  // namespace pagedkv::cuda
