#pragma once
/// @file batch_metadata.hpp
/// Per-batch metadata handed to attention kernels, in the two standard formats, plus the slot
/// mapping of the tokens being written. Host-only; plain vectors of int32/int64.

#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/types.hpp"

namespace pagedkv {

/// Non-owning view of a padded block table (vLLM style), what kernels read.
/// Shapes: block_tables [num_seqs, max_blocks_per_seq] row-major, entries past a sequence's
/// last block are -1; context_lens [num_seqs] in tokens (0 = padding row: output zeros).
/// Logical block j of sequence i is physical block block_tables[i * max_blocks_per_seq + j];
/// position p lives at slot block_tables[i * max_blocks_per_seq + p / bs] * bs + p % bs.
/// Geometry: the view states the block size (and, optionally, the pool size) the tables were
/// built for, and every attention entry point checks it against the cache view it is given: a
/// table of 4-token blocks read through a cache of 16-token blocks addresses the wrong tokens
/// as soon as blocks are not contiguous. Worked example: a manager with block_size 4 and a
/// HostKVCache with block_size 16 are rejected by paged_decode_attention with a message
/// naming 4 and 16.
struct BlockTableView {
  /// [num_seqs, max_blocks_per_seq] row-major physical block ids, -1 past a sequence's blocks.
  const int32_t* block_tables = nullptr;
  const int32_t* context_lens = nullptr;  ///< [num_seqs] tokens per sequence, 0 = padding row
  int32_t num_seqs = 0;                   ///< rows of the batch
  int32_t max_blocks_per_seq = 0;         ///< row width of block_tables, in blocks
  /// Tokens per block the tables were built for (KVCacheManagerConfig::block_size). Required:
  /// attention rejects a view whose block_size differs from the cache's (0, unset, included).
  int32_t block_size = 0;
  /// Blocks of the pool the ids index (KVCacheManagerConfig::num_blocks); 0 = not stated. When
  /// set, attention rejects a cache with fewer blocks (ids are range-checked either way).
  int32_t num_blocks = 0;
};

/// Non-owning view of explicit per-row key lists (the kept sets of KVCacheManager::kept_tokens),
/// what paged_attention_over_slots reads.
/// Shapes: indptr [num_rows + 1] int32, indptr[0] = 0, non-decreasing; slots [indptr[num_rows]]
/// int64, slot = block_id * block_size + offset.
/// Geometry: as BlockTableView: block_size is required and must equal the cache's, num_blocks
/// (0 = not stated) must not exceed it.
struct SlotListView {
  std::span<const int32_t> indptr;  ///< [num_rows + 1] offsets into slots
  std::span<const Slot> slots;      ///< [indptr[num_rows]] slot of each listed key
  int32_t block_size = 0;           ///< tokens per block the slots were computed with
  int32_t num_blocks = 0;           ///< blocks of the pool the slots address; 0 = not stated
};

/// vLLM-style padded block table.
/// Shapes: block_tables [num_seqs, max_blocks_per_seq] int32 (-1 padded), context_lens [num_seqs].
/// max_blocks_per_seq = max over sequences of ceil(context_len / block_size) (at least 1 when
/// num_seqs > 0, so the array is never zero-width).
struct PaddedBlockTables {
  int32_t num_seqs = 0;            ///< rows (sequences of the batch, padding rows included)
  int32_t max_blocks_per_seq = 0;  ///< row width in blocks; >= 1 when num_seqs > 0
  /// [num_seqs, max_blocks_per_seq] row-major physical block ids; -1 past a row's last block.
  std::vector<int32_t> block_tables;
  std::vector<int32_t> context_lens;  ///< [num_seqs] tokens per sequence, 0 = padding row
  /// Tokens per block the tables were built for (set by build_padded_block_tables).
  int32_t block_size = 0;
  /// Blocks of the pool the ids index; 0 = not stated (see BlockTableView::num_blocks).
  int32_t num_blocks = 0;

  /// View for kernels, geometry included; valid while this object lives and is not modified.
  [[nodiscard]] BlockTableView view() const {
    return {block_tables.data(), context_lens.data(), num_seqs,
            max_blocks_per_seq,  block_size,          num_blocks};
  }
};

/// FlashInfer-style CSR page table.
/// Shapes: indptr [num_seqs + 1] (indptr[0] = 0), indices [indptr[num_seqs]] = the physical
/// blocks of sequence i in logical order at indices[indptr[i] .. indptr[i+1]), last_page_len
/// [num_seqs] = tokens in the last block, in [1, block_size], or 0 for an empty sequence.
struct CsrBlockTables {
  /// [num_seqs + 1] offsets into indices: sequence i's blocks are [indptr[i], indptr[i+1]).
  std::vector<int32_t> indptr;
  /// [indptr[num_seqs]] physical block ids, each sequence's in logical order.
  std::vector<int32_t> indices;
  /// [num_seqs] tokens in each sequence's last block, in [1, block_size]; 0 for an empty one.
  std::vector<int32_t> last_page_len;
};

/// Everything a kernel needs for one batch step, built by KVCacheManager::batch_metadata: the
/// same tables in both formats, the slot mapping of the tokens this step writes, and the query
/// offsets. Row i of every array is sequence i of the batch (a padding row: context 0, no
/// blocks, no new tokens).
/// Shapes: padded and csr as PaddedBlockTables and CsrBlockTables; slot_mapping
/// [num_new_tokens_total]; query_start [num_seqs + 1].
struct BatchMetadata {
  int32_t block_size = 0;    ///< tokens per block (KVCacheManagerConfig::block_size)
  PaddedBlockTables padded;  ///< vLLM-style tables; padded.view() is what the kernels take
  CsrBlockTables csr;        ///< the same tables in FlashInfer's CSR format
  /// [num_new_tokens_total] int64 slot of each token being written: sequences in batch order,
  /// tokens in position order; -1 for padding. What HostKVCache::write takes.
  std::vector<int64_t> slot_mapping;
  /// [num_seqs + 1] query token offsets per sequence (prefix sum of new tokens, query_start[0]
  /// = 0): the `q_indptr` of prefill kernels.
  std::vector<int32_t> query_start;
};

/// Builds the padded format from per-sequence tables; the result's block_size is `block_size`
/// and its num_blocks 0 (not stated: a caller that knows the pool size sets it afterwards).
/// Shapes: tables[i] = physical blocks of sequence i in logical order (extra blocks past
/// ceil(context_lens[i] / block_size) are ignored); context_lens [num_seqs] in tokens.
/// Errors: throws pagedkv::Error if block_size < 1, sizes differ, a context length is negative,
/// a table has fewer than ceil(context_len / block_size) blocks (the message names the sequence
/// index), or there are more than 2^31 - 1 sequences (int32 num_seqs).
[[nodiscard]] PaddedBlockTables build_padded_block_tables(
    std::span<const std::span<const BlockId>> tables, std::span<const int32_t> context_lens,
    int32_t block_size);

/// Builds the CSR format; only the ceil(context_len / block_size) blocks in use are listed.
/// Errors: as build_padded_block_tables, and if the batch lists more than 2^31 - 1 blocks in
/// all (int32 indptr; the message gives the count).
[[nodiscard]] CsrBlockTables build_csr_block_tables(
    std::span<const std::span<const BlockId>> tables, std::span<const int32_t> context_lens,
    int32_t block_size);

/// build_padded_block_tables() writing into caller-owned storage: `out` is overwritten and its
/// vectors keep their capacity, so a serving loop that passes the same object every step
/// allocates only when a batch outgrows all earlier ones (the returning forms allocate every
/// array on every call). Shapes, units and contents: exactly those of the returning form.
/// `tables` and `context_lens` must not point into `out`.
/// Errors: as the returning form; every check runs before `out` is written, so a throw leaves
/// `out` unchanged.
void build_padded_block_tables(std::span<const std::span<const BlockId>> tables,
                               std::span<const int32_t> context_lens, int32_t block_size,
                               PaddedBlockTables& out);
/// build_csr_block_tables() writing into caller-owned storage, with the contract of the padded
/// form above: `out` is overwritten, its vectors keep their capacity, and the inputs must not
/// point into it. Errors: as the returning form (the block count included); every check runs
/// before `out` is written, so a throw leaves `out` unchanged.
/// Worked example: `CsrBlockTables csr;` once, then each step
/// `build_csr_block_tables(tables, lens, bs, csr);` reuses csr.indices' storage.
void build_csr_block_tables(std::span<const std::span<const BlockId>> tables,
                            std::span<const int32_t> context_lens, int32_t block_size,
                            CsrBlockTables& out);

/// Slot of position `pos` (tokens) given a sequence's block table: table[pos / bs] * bs + pos % bs,
/// computed in int64. Errors: throws pagedkv::Error if block_size < 1, or pos is negative or past
/// the table.
[[nodiscard]] Slot slot_for_position(std::span<const BlockId> table, int64_t pos,
                                     int32_t block_size);

/// Appends the slots of positions [first, first + n) (tokens) to `out`, in position order:
/// slot_for_position of each, computed block by block (one division per block, not per
/// token). The managers' append results are built with it.
/// Shapes: table [>= ceil((first + n) / block_size)] block ids; out grows by n.
/// Errors: throws pagedkv::Error if block_size < 1, first or n is negative, or (n > 0) position
/// first + n - 1 is past the table; checked before `out` is touched.
/// Worked example: table {7, 3}, block_size 4, first 2, n 4 appends {30, 31, 12, 13}.
void append_position_slots(std::span<const BlockId> table, int64_t first, int64_t n,
                           int32_t block_size, std::vector<Slot>& out);

}  // namespace pagedkv
