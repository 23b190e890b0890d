#pragma once
// Private, target-independent vocabulary of the fast CPU kernel (attention_hwy.cpp): its tuning
// constants, what every work item reads (KernelArgs), the rows of one item (RowSet), and the
// plan of a call: which items exist, how long contexts are split into key partitions, and the
// log-sum-exp merge of the partitions (attention_work.cpp). The per-target SIMD code that runs
// an item lives in the *-inl.h headers.

#include <algorithm>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "cpu/attention_fast.hpp"

namespace pagedkv::detail::fast {

/// The 8-bit fp formats as the kernel loads them: one byte each, distinct types so that LoadF32
/// (attention_tile-inl.h) picks each one's widening. int8 loads as int8_t.
struct Fp8E4M3 {
  uint8_t bits;
};
struct Fp8E5M2 {
  uint8_t bits;
};
/// What LoadF32 returns times this is the stored value: e4m3 widens through fp16 with its
/// exponent field moved, not re-biased, so it reads 2^-8 of its value; the factor folds into
/// the per-head scales (KernelArgs::key_scale, value_scale) with the format's own scale.
template <typename T>
inline constexpr float kLoadFactor = std::is_same_v<T, Fp8E4M3> ? 256.0f : 1.0f;

/// Keys per tile: the scores of a tile are four AVX-512 vectors; one kv head's K (or V) rows of
/// a tile (64 x 128 x 2 B = 16 KiB for bf16 head_dim 128) stay in L1 while its rows use them,
/// and the next tile is prefetched one tile ahead. Measured on bf16 d128 decode (one thread):
/// 64 was 5-10% faster than 32 (prefetch too close) and than 128 (tiles spill L1).
constexpr int32_t kTile = 64;
/// Most keys gathered at once (a span: whole blocks of up to 256 positions for a set of several
/// kv heads; see AttendImpl).
constexpr int32_t kMaxSpan = 4 * kTile;
/// Rows (query heads x query tokens) per work item: bounds the L1 footprint of the fp32
/// accumulators (32 x 128 x 4 B = 16 KiB) while letting prefill reuse each K/V tile 32 times.
constexpr int32_t kMaxRows = 32;
/// Smallest key partition: below it, partial results and their merge cost more than the
/// parallelism gains.
constexpr int64_t kMinPartitionKeys = 256;
/// Work items per thread the automatic partitioning aims at, for load balance across
/// sequences of different lengths.
constexpr int64_t kItemsPerThread = 4;
/// Below this many key-row visits a call runs on the calling thread: waking a thread team costs
/// microseconds, as much as attending a few thousand keys.
constexpr int64_t kMinParallelWork = 16384;

/// Everything a work item reads, shared by all items of a call.
struct KernelArgs {
  KVLayerView cache;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  const float* q = nullptr;  // [rows, num_heads, head_dim]
  float* out = nullptr;      // [rows, num_heads, head_dim]
  float* partial = nullptr;  // split items: [parts][rows of the set][2 + head_dim] (m, l, acc)
  int32_t num_heads = 0;
  int32_t group = 0;  // query heads per kv head
  int32_t head_dim = 0;
  float scale = 0.0f;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  int32_t chunk_size = 0;
};

/// The rows of one work item: query tokens [first_pos, first_pos + num_q) of a sequence, the
/// `group` query heads of each of the kv heads [kv_head, kv_head + num_kv). Row r is token
/// r / (num_kv * group), kv head kv_head + (r % (num_kv * group)) / group; the query heads of
/// consecutive kv heads are adjacent in q, so a token's rows are one contiguous run of q.
/// Their visible keys are a subset of the key set [0, sink_len) ++ [main_begin, main_end),
/// addressed by a flat index j in [0, num_keys()).
struct RowSet {
  int32_t seq = 0;
  int32_t kv_head = 0;
  int32_t num_kv = 1;
  int32_t num_q = 0;
  int64_t q_row = 0;      // query row of the first token
  int64_t first_pos = 0;  // position of the first token (-1 for a decode padding row)
  int64_t sink_len = 0;
  int64_t main_begin = 0;
  int64_t main_end = 0;
  int32_t num_parts = 1;
  int64_t part_keys = 0;        // flat keys per partition
  int64_t partial_offset = -1;  // floats into KernelArgs::partial; -1 = write `out` directly

  [[nodiscard]] int64_t num_keys() const { return sink_len + (main_end - main_begin); }
  [[nodiscard]] int32_t rows_per_token(int32_t group) const { return num_kv * group; }
  [[nodiscard]] int32_t num_rows(int32_t group) const { return num_q * num_kv * group; }
};

/// First visible key of a query at `pos` outside the sinks (window and chunk edges;
/// AttentionParams::mask_first_visible).
inline int64_t window_lo(int64_t pos, const KernelArgs& a) {
  return AttentionParams::mask_first_visible(pos, a.window_left, a.chunk_size);
}
/// End of the always-visible sink range of a query whose first visible key is `lo`.
inline int64_t sink_end(int64_t lo, const KernelArgs& a) {
  return AttentionParams::mask_sink_end(lo, a.window_left, a.chunk_size, a.sink_tokens);
}

/// One work item: partition `part` of row set `set`.
struct WorkItem {
  int32_t set;
  int32_t part;
};

/// The work of one call: its row sets and their items, in the order they are handed out.
struct WorkPlan {
  std::vector<RowSet> sets;
  std::vector<WorkItem> items;
  int64_t total_work = 0;      // key-row visits of the whole call
  int64_t partial_floats = 0;  // floats of KernelArgs::partial the split sets need (0: none)
};

/// The arguments every item of a call reads (partial is set by the caller).
[[nodiscard]] KernelArgs make_kernel_args(const AttentionParams& params, const KVLayerView& cache,
                                          const BlockTableView& tables, std::span<const float> q,
                                          std::span<float> out);

/// Row sets (sequence, query tile, kv heads) of a call with the union of their rows' visible
/// keys, then each set cut into key partitions (config.partition_keys, else automatic: a set
/// with more than its share of the work of `threads` threads is split) and listed as items.
[[nodiscard]] WorkPlan plan_work(const AttentionParams& params, const KernelArgs& a,
                                 const BlockTableView& tables, std::span<const int32_t> query_start,
                                 const FastAttentionConfig& config, int32_t threads);

/// Merges the key partitions of every split set of `plan` into `a.out` (log-sum-exp), on
/// `threads` threads when `parallel`.
void merge_partitions(const KernelArgs& a, const WorkPlan& plan, int32_t threads, bool parallel);

}  // namespace pagedkv::detail::fast
