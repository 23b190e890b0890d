#pragma once
/// @file contiguous_paged_view.hpp
/// A contiguous (non-paged) KV cache seen through the paged kernels' view: the fair speed peer of
/// paged attention, run by the very same kernel code.
///
/// A contiguous cache reserves max_len positions per sequence:
///   HND: K, V [num_seqs, num_kv_heads, max_len, head_dim]   (per-head rows contiguous)
///   NHD: K, V [num_seqs, max_len, num_kv_heads, head_dim]   (HF/llama.cpp style)
/// which is exactly a paged pool with block_size = max_len, one block per sequence, and the
/// identity block table (sequence i owns block i). No kernel code is specific to it.
///
/// Worked example (HND, 2 sequences, 4 kv heads, max_len 1024, head_dim 128, fp32):
///   view: num_blocks 2, block_size 1024, block_stride 524288, head_stride 131072,
///   token_stride 128; tables: block_tables {0, 1}, max_blocks_per_seq 1.

#include <cstdint>
#include <span>

#include "pagedkv/dtype.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv {

/// Geometry of one layer of a contiguous cache. Every size must be >= 1
/// (contiguous_paged_view() checks).
struct ContiguousKVShape {
  int32_t num_seqs = 1;       ///< sequences (rows of the batch); becomes the view's num_blocks
  int32_t num_kv_heads = 1;   ///< K/V heads
  int32_t max_len = 1;        ///< positions reserved per sequence, tokens; the view's block_size
  int32_t head_dim = 64;      ///< elements per head vector
  DType dtype = DType::kF32;  ///< element type of the K and V buffers
  KVLayout layout = KVLayout::kHND;  ///< HND = [seq, head, pos, dim]; NHD = [seq, pos, head, dim]
};

/// Elements of one of K or V: num_seqs * num_kv_heads * max_len * head_dim (int64).
[[nodiscard]] constexpr int64_t contiguous_kv_elements(const ContiguousKVShape& s) {
  return static_cast<int64_t>(s.num_seqs) * s.num_kv_heads * s.max_len * s.head_dim;
}

/// The paged view of a contiguous layer: num_blocks = num_seqs, block_size = max_len, strides of
/// `shape.layout`. k and v each point to contiguous_kv_elements(shape) elements of shape.dtype;
/// the view does not own them.
/// Errors: throws pagedkv::Error if k or v is null or a size of `shape` is < 1 (naming it).
[[nodiscard]] KVLayerView contiguous_paged_view(const ContiguousKVShape& shape, void* k, void* v);

/// The identity block table for a contiguous cache: sequence i -> block i, context_lens copied.
/// Its geometry is the contiguous view's: block_size max_len, num_blocks num_seqs (a view of
/// more reserved sequences than rows is accepted; one of fewer is not).
/// Shapes: context_lens [num_seqs] in tokens; result has max_blocks_per_seq 1 (0 sequences give
/// an empty table).
/// Errors: throws pagedkv::Error if a context length is negative or exceeds max_len (naming the
/// sequence), or max_len < 1.
[[nodiscard]] PaddedBlockTables identity_block_tables(std::span<const int32_t> context_lens,
                                                      int32_t max_len);

}  // namespace pagedkv
