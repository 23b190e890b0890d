// Public CPU attention entry points: every contract check lives here, then the kernel runs
// unchecked (checks at the edge, kernels trust their inputs). The kernel is the fast one
// (attention_fast.hpp); the plain one (attention_plain.hpp) is its test oracle.

#include "pagedkv/cpu/attention.hpp"

#include <cmath>
#include <numeric>
#include <vector>

#include "core/attention_checks.hpp"
#include "core/check.hpp"
#include "cpu/attention_fast.hpp"

namespace pagedkv {

namespace {

/// Checks the block table against the cache: the geometry it was built for is the cache's,
/// lengths fit the table and every block id that covers a position in use is a real block.
/// Entries past a sequence's last block (-1 padding) are never read and not checked.
void check_tables(const char* fn, const KVLayerView& cache, const BlockTableView& tables) {
  check_table_geometry(fn, cache, tables.block_size, tables.num_blocks);
  PAGEDKV_CHECK(tables.num_seqs >= 0, "{}: num_seqs must be >= 0, got {}", fn, tables.num_seqs);
  PAGEDKV_CHECK(tables.max_blocks_per_seq >= 0, "{}: max_blocks_per_seq must be >= 0, got {}", fn,
                tables.max_blocks_per_seq);
  if (tables.num_seqs == 0) return;
  PAGEDKV_CHECK(tables.context_lens != nullptr, "{}: context_lens is null for {} sequences", fn,
                tables.num_seqs);
  PAGEDKV_CHECK(tables.block_tables != nullptr || tables.max_blocks_per_seq == 0,
                "{}: block_tables is null with max_blocks_per_seq {}", fn,
                tables.max_blocks_per_seq);
  const int64_t capacity = static_cast<int64_t>(tables.max_blocks_per_seq) * cache.block_size;
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    const int64_t ctx = tables.context_lens[i];
    PAGEDKV_CHECK(ctx >= 0, "{}: context length {} of sequence {} is negative", fn, ctx, i);
    PAGEDKV_CHECK(ctx <= capacity,
                  "{}: context length {} of sequence {} exceeds max_blocks_per_seq {} x "
                  "block_size {} = {}",
                  fn, ctx, i, tables.max_blocks_per_seq, cache.block_size, capacity);
    const int64_t used = blocks_for_tokens(ctx, cache.block_size);
    const int32_t* row = tables.block_tables + static_cast<int64_t>(i) * tables.max_blocks_per_seq;
    for (int64_t j = 0; j < used; ++j) {
      PAGEDKV_CHECK(row[j] >= 0 && row[j] < cache.num_blocks,
                    "{}: block id {} (sequence {}, logical block {}) out of range [0, {})", fn,
                    row[j], i, j, cache.num_blocks);
    }
  }
}

}  // namespace

void paged_decode_attention(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, std::span<const float> q,
                            std::span<float> out) {
  constexpr const char* kFn = "paged_decode_attention";
  check_attention_params(params, cache);
  check_tables(kFn, cache, tables);
  detail::check_attention_rows(kFn, "q", q.size(), tables.num_seqs, params);
  detail::check_attention_rows(kFn, "out", out.size(), tables.num_seqs, params);
  // Decode = prefill with one query per sequence. A padding row (context 0) also gets one
  // query row; its position is -1, it sees no key, and the kernel writes zeros.
  std::vector<int32_t> query_start(static_cast<size_t>(tables.num_seqs) + 1);
  std::iota(query_start.begin(), query_start.end(), 0);
  detail::fast_paged_prefill_attention(params, cache, tables, query_start, q, out);
}

void paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                             const BlockTableView& tables, std::span<const int32_t> query_start,
                             std::span<const float> q, std::span<float> out) {
  constexpr const char* kFn = "paged_prefill_attention";
  check_attention_params(params, cache);
  check_tables(kFn, cache, tables);
  PAGEDKV_CHECK(static_cast<int64_t>(query_start.size()) == int64_t{tables.num_seqs} + 1,
                "{}: query_start has {} entries, expected num_seqs + 1 = {}", kFn,
                query_start.size(), int64_t{tables.num_seqs} + 1);
  PAGEDKV_CHECK(query_start[0] == 0, "{}: query_start[0] must be 0, got {}", kFn, query_start[0]);
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    const int64_t n = int64_t{query_start[i + 1]} - query_start[i];
    PAGEDKV_CHECK(n >= 0, "{}: sequence {} has a negative query count {} (query_start {} -> {})",
                  kFn, i, n, query_start[i], query_start[i + 1]);
    PAGEDKV_CHECK(n <= tables.context_lens[i],
                  "{}: sequence {} has {} query tokens but context length {}", kFn, i, n,
                  tables.context_lens[i]);
  }
  const int64_t rows = query_start[tables.num_seqs];
  detail::check_attention_rows(kFn, "q", q.size(), rows, params);
  detail::check_attention_rows(kFn, "out", out.size(), rows, params);
  detail::fast_paged_prefill_attention(params, cache, tables, query_start, q, out);
}

}  // namespace pagedkv
