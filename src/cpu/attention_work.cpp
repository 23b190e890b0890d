// The plan of a fast-kernel call (row sets, key partitions, work items) and the log-sum-exp merge
// of split sets: target-independent host code around the SIMD items of attention_hwy.cpp.

#include "cpu/attention_work.hpp"

#include <cmath>
#include <limits>

namespace pagedkv::detail::fast {

namespace {

/// KV heads per decode work item: by default as many as kMaxRows query rows allow. A block holds
/// every kv head's rows; reading one head at a time turns each block into short scattered runs
/// (HND: block_size x head_dim elements) that the hardware prefetcher never locks onto, while
/// an item over all heads reads each block in one sweep. Measured (bench_attention_cpu, d128,
/// context 4k, batch 8, 1 thread, paged / contiguous time): one head per item took 1.16-1.25
/// (bf16, block_size 8 and 16) where all heads took 1.05-1.13; at block_size 128 one head took
/// 1.07 and all heads 1.01; the contiguous peer itself ran 3% faster with all heads.
int32_t heads_per_item(const AttentionParams& params, const FastAttentionConfig& config) {
  const int32_t H = params.num_kv_heads;
  const int32_t G = params.num_heads / H;
  int32_t hg = config.heads_per_item > 0 ? config.heads_per_item : std::max(1, kMaxRows / G);
  hg = std::clamp(hg, 1, H);
  while (H % hg != 0) --hg;  // equal groups
  return hg;
}

/// Appends the row sets of sequence i (n query tokens, context ctx) to plan.sets.
void add_row_sets(const KernelArgs& a, int32_t num_kv_heads, int32_t heads_per_set, int32_t i,
                  int64_t q_begin, int64_t n, int64_t ctx, WorkPlan& plan) {
  const int32_t G = a.group;
  // Decode rows group kv heads (one pass over whole blocks); prefill rows group query tokens
  // instead (each K/V tile then serves up to 32 / group queries).
  const int32_t hg = n == 1 ? heads_per_set : 1;
  const int32_t q_per_set = std::max(1, kMaxRows / (G * hg));
  for (int64_t t0 = 0; t0 < n; t0 += q_per_set) {
    RowSet rs;
    rs.seq = i;
    rs.num_kv = hg;
    rs.num_q = static_cast<int32_t>(std::min<int64_t>(q_per_set, n - t0));
    rs.q_row = q_begin + t0;
    rs.first_pos = ctx - n + t0;
    const int64_t last_pos = rs.first_pos + rs.num_q - 1;
    const int64_t lo = window_lo(rs.first_pos, a);
    const int64_t se = sink_end(window_lo(last_pos, a), a);
    // The rows' windows [lo(p), p] overlap or touch from row to row (lo never decreases and
    // lo(p + 1) <= p + 1), so their union is [lo, last_pos]; window_left 0 makes each one
    // empty, and only the sinks remain. No key outside the union is read (a local group's
    // released entries may point at garbage).
    if (a.window_left == 0) {
      rs.sink_len = 0;
      rs.main_begin = 0;
      rs.main_end = se;
    } else if (se >= lo) {  // sinks and window touch: one range
      rs.sink_len = 0;
      rs.main_begin = 0;
      rs.main_end = std::max<int64_t>(0, last_pos + 1);
    } else {
      rs.sink_len = se;
      rs.main_begin = lo;
      rs.main_end = std::max(rs.main_begin, last_pos + 1);
    }
    for (int32_t h = 0; h < num_kv_heads; h += hg) {
      rs.kv_head = h;
      plan.sets.push_back(rs);
      plan.total_work += rs.num_keys() * rs.num_rows(G);
    }
  }
}

/// Cuts set s into key partitions of at most part_keys keys (whole tiles when split), lists its
/// items and reserves its partial results.
void add_partitions(const KernelArgs& a, int64_t item_work, int64_t partition_keys, size_t s,
                    WorkPlan& plan) {
  RowSet& rs = plan.sets[s];
  const int64_t keys = rs.num_keys();
  const int32_t rows = rs.num_rows(a.group);
  int64_t part_keys = keys;
  if (partition_keys > 0) {
    part_keys = partition_keys;
  } else if (keys * rows > item_work) {
    part_keys = std::max(kMinPartitionKeys, item_work / rows);
  }
  part_keys = std::max<int64_t>(1, std::min(part_keys, keys));
  // A row set with no visible key still gets one item: it writes the zero rows.
  rs.num_parts = static_cast<int32_t>(std::max<int64_t>(1, (keys + part_keys - 1) / part_keys));
  if (rs.num_parts > 1) {
    // Balance the parts and keep them whole tiles.
    part_keys = (keys + rs.num_parts - 1) / rs.num_parts;
    part_keys = (part_keys + kTile - 1) / kTile * kTile;
    rs.num_parts = static_cast<int32_t>((keys + part_keys - 1) / part_keys);
  }
  rs.part_keys = std::max<int64_t>(1, part_keys);
  if (rs.num_parts > 1) {
    rs.partial_offset = plan.partial_floats;
    plan.partial_floats += static_cast<int64_t>(rs.num_parts) * rows * (a.head_dim + 2);
  }
  for (int32_t p = 0; p < rs.num_parts; ++p) plan.items.push_back({static_cast<int32_t>(s), p});
}

/// Merges the partitions of one row: o = sum_p e^(m_p - M) acc_p / sum_p e^(m_p - M) l_p.
void merge_row(const float* parts, int32_t num_parts, int64_t stride, int32_t head_dim,
               float* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int32_t p = 0; p < num_parts; ++p) mx = std::max(mx, parts[p * stride]);
  std::fill(out, out + head_dim, 0.0f);
  if (mx == -std::numeric_limits<float>::infinity()) return;  // no visible key at all
  float sum = 0.0f;
  for (int32_t p = 0; p < num_parts; ++p) {
    const float* src = parts + p * stride;
    if (src[1] == 0.0f) continue;
    const float w = std::exp(src[0] - mx);
    sum += w * src[1];
    for (int32_t d = 0; d < head_dim; ++d) out[d] += w * src[2 + d];
  }
  const float inv = 1.0f / sum;
  for (int32_t d = 0; d < head_dim; ++d) out[d] *= inv;
}

}  // namespace

KernelArgs make_kernel_args(const AttentionParams& params, const KVLayerView& cache,
                            const BlockTableView& tables, std::span<const float> q,
                            std::span<float> out) {
  KernelArgs a;
  a.cache = cache;
  a.block_tables = tables.block_tables;
  a.max_blocks_per_seq = tables.max_blocks_per_seq;
  a.q = q.data();
  a.out = out.data();
  a.num_heads = params.num_heads;
  a.group = params.num_heads / params.num_kv_heads;
  a.head_dim = params.head_dim;
  a.scale = params.softmax_scale();
  a.window_left = params.window_left;
  a.sink_tokens = params.sink_tokens;
  a.chunk_size = params.chunk_size;
  return a;
}

WorkPlan plan_work(const AttentionParams& params, const KernelArgs& a, const BlockTableView& tables,
                   std::span<const int32_t> query_start, const FastAttentionConfig& config,
                   int32_t threads) {
  WorkPlan plan;
  const int32_t heads_per_set = heads_per_item(params, config);
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    add_row_sets(a, params.num_kv_heads, heads_per_set, i, query_start[i],
                 query_start[i + 1] - query_start[i], tables.context_lens[i], plan);
  }
  // Target work per item: the batch's work spread over kItemsPerThread items per thread.
  const int64_t item_work =
      threads > 1 ? std::max<int64_t>(1, plan.total_work / (threads * kItemsPerThread))
                  : std::numeric_limits<int64_t>::max();
  plan.items.reserve(plan.sets.size());
  for (size_t s = 0; s < plan.sets.size(); ++s) {
    add_partitions(a, item_work, config.partition_keys, s, plan);
  }
  return plan;
}

void merge_partitions(const KernelArgs& a, const WorkPlan& plan, [[maybe_unused]] int32_t threads,
                      [[maybe_unused]] bool parallel) {
  const int32_t G = a.group;
  const auto num_sets = static_cast<int64_t>(plan.sets.size());
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads) if (parallel)
#endif
  for (int64_t s = 0; s < num_sets; ++s) {
    const RowSet& rs = plan.sets[s];
    if (rs.partial_offset < 0) continue;
    const int32_t rows = rs.num_rows(G);
    const int32_t rt = rs.rows_per_token(G);
    const int64_t stride = static_cast<int64_t>(rows) * (a.head_dim + 2);
    for (int32_t r = 0; r < rows; ++r) {
      const int64_t head = static_cast<int64_t>(rs.kv_head) * G + r % rt;
      merge_row(a.partial + rs.partial_offset + static_cast<int64_t>(r) * (a.head_dim + 2),
                rs.num_parts, stride, a.head_dim,
                a.out + ((rs.q_row + r / rt) * a.num_heads + head) * a.head_dim);
    }
  }
}

}  // namespace pagedkv::detail::fast
