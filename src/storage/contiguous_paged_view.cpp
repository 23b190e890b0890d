#include "pagedkv/storage/contiguous_paged_view.hpp"

#include <numeric>

#include "core/check.hpp"

namespace pagedkv {

KVLayerView contiguous_paged_view(const ContiguousKVShape& shape, void* k, void* v) {
  constexpr const char* kFn = "contiguous_paged_view";
  PAGEDKV_CHECK(shape.num_seqs >= 1, "{}: num_seqs must be >= 1, got {}", kFn, shape.num_seqs);
  PAGEDKV_CHECK(shape.num_kv_heads >= 1, "{}: num_kv_heads must be >= 1, got {}", kFn,
                shape.num_kv_heads);
  PAGEDKV_CHECK(shape.max_len >= 1, "{}: max_len must be >= 1, got {}", kFn, shape.max_len);
  PAGEDKV_CHECK(shape.head_dim >= 1, "{}: head_dim must be >= 1, got {}", kFn, shape.head_dim);
  PAGEDKV_CHECK(k != nullptr && v != nullptr, "{}: null K or V buffer (k={}, v={})", kFn, k, v);
  KVLayerView view;
  view.k = k;
  view.v = v;
  view.dtype = shape.dtype;
  view.num_blocks = shape.num_seqs;
  view.block_size = shape.max_len;  // one block spans a whole sequence
  view.num_kv_heads = shape.num_kv_heads;
  view.head_dim = shape.head_dim;
  layout_strides(shape.layout, shape.max_len, shape.num_kv_heads, shape.head_dim,
                 &view.block_stride, &view.head_stride, &view.token_stride);
  return view;
}

PaddedBlockTables identity_block_tables(std::span<const int32_t> context_lens, int32_t max_len) {
  constexpr const char* kFn = "identity_block_tables";
  PAGEDKV_CHECK(max_len >= 1, "{}: max_len must be >= 1, got {}", kFn, max_len);
  for (size_t i = 0; i < context_lens.size(); ++i) {
    PAGEDKV_CHECK(context_lens[i] >= 0 && context_lens[i] <= max_len,
                  "{}: context length {} of sequence {} outside [0, max_len {}]", kFn,
                  context_lens[i], i, max_len);
  }
  PaddedBlockTables tables;
  tables.num_seqs = static_cast<int32_t>(context_lens.size());
  tables.max_blocks_per_seq = tables.num_seqs > 0 ? 1 : 0;
  tables.block_tables.resize(context_lens.size());
  std::iota(tables.block_tables.begin(), tables.block_tables.end(), 0);
  tables.context_lens.assign(context_lens.begin(), context_lens.end());
  // The geometry of contiguous_paged_view over these rows: one max_len block per sequence.
  tables.block_size = max_len;
  tables.num_blocks = tables.num_seqs;
  return tables;
}

}  // namespace pagedkv
