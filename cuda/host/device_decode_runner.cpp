// DeviceDecodeRunner: host spans in, host spans out, device kernels in between.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/attention_checks.hpp"
#include "core/check.hpp"
#include "cuda/host/staging.hpp"
#include "cuda/launch.hpp"
#include "pagedkv/cuda/device_decode_runner.hpp"

namespace pagedkv::cuda {

using detail::ensure_bytes;
using ::pagedkv::detail::check_attention_rows;

DeviceDecodeRunner::DeviceDecodeRunner(Stream stream) : stream_(stream) { require_device(); }

DecodeLaunch DeviceDecodeRunner::prepare(const AttentionParams& params, DType dtype,
                                         int32_t num_seqs, int64_t max_context,
                                         std::span<const float> q, std::span<float> out,
                                         const std::optional<DecodePlan>& plan) {
  DecodeLaunch launch;
  launch.stream = stream_;
  launch.plan = plan ? *plan : make_decode_plan(params, dtype, num_seqs, max_context);
  const int64_t ws =
      decode_workspace_bytes(num_seqs, params.num_heads, params.head_dim, launch.plan);
  if (ws > 0) {
    ensure_bytes(workspace_, ws);
    launch.workspace = workspace_.data();
    launch.workspace_bytes = workspace_.bytes();
  }
  ensure_bytes(q_, static_cast<int64_t>(q.size_bytes()));
  ensure_bytes(out_, static_cast<int64_t>(out.size_bytes()));
  q_.upload(q.data(), static_cast<int64_t>(q.size_bytes()), 0, stream_);
  last_plan_ = launch.plan;
  return launch;
}

void DeviceDecodeRunner::finish(std::span<float> out) {
  out_.download(out.data(), static_cast<int64_t>(out.size_bytes()), 0, stream_);
}

void DeviceDecodeRunner::decode(const AttentionParams& params, const KVLayerView& view,
                                const BlockTableView& tables, std::span<const float> q,
                                std::span<float> out, std::optional<DecodePlan> plan) {
  constexpr const char* kFn = "DeviceDecodeRunner::decode";
  check_decode_config(view.dtype, view.head_dim, view.block_size);
  detail::check_device_attention_params(kFn, params, view);
  check_table_geometry(kFn, view, tables.block_size, tables.num_blocks);
  PAGEDKV_CHECK(tables.num_seqs >= 0 && tables.max_blocks_per_seq >= 0,
                "{}: num_seqs {} and max_blocks_per_seq {} must be >= 0", kFn, tables.num_seqs,
                tables.max_blocks_per_seq);
  check_attention_rows(kFn, "q", q.size(), tables.num_seqs, params);
  check_attention_rows(kFn, "out", out.size(), tables.num_seqs, params);
  if (tables.num_seqs == 0) return;
  PAGEDKV_CHECK(tables.context_lens != nullptr && tables.block_tables != nullptr &&
                    tables.max_blocks_per_seq >= 1,
                "{}: null tables or zero-width table for {} sequences", kFn, tables.num_seqs);
  const int64_t capacity = int64_t{tables.max_blocks_per_seq} * view.block_size;
  int64_t max_context = 0;
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    const int64_t ctx = tables.context_lens[i];
    PAGEDKV_CHECK(ctx >= 0 && ctx <= capacity,
                  "{}: context length {} of sequence {} outside [0, max_blocks_per_seq {} x "
                  "block_size {} = {}]",
                  kFn, ctx, i, tables.max_blocks_per_seq, view.block_size, capacity);
    const int32_t* row = tables.block_tables + int64_t{i} * tables.max_blocks_per_seq;
    for (int64_t j = 0; j < blocks_for_tokens(ctx, view.block_size); ++j) {
      PAGEDKV_CHECK(row[j] >= 0 && row[j] < view.num_blocks,
                    "{}: block id {} (sequence {}, logical block {}) out of range [0, {})", kFn,
                    row[j], i, j, view.num_blocks);
    }
    max_context = std::max(max_context, ctx);
  }
  const int64_t table_bytes = int64_t{tables.num_seqs} * tables.max_blocks_per_seq * 4;
  ensure_bytes(tables_, table_bytes);
  ensure_bytes(context_lens_, int64_t{tables.num_seqs} * 4);
  tables_.upload(tables.block_tables, table_bytes, 0, stream_);
  context_lens_.upload(tables.context_lens, int64_t{tables.num_seqs} * 4, 0, stream_);
  const DecodeLaunch launch =
      prepare(params, view.dtype, tables.num_seqs, max_context, q, out, plan);
  BlockTableView device_tables = tables;
  device_tables.block_tables = tables_.as<const int32_t>();
  device_tables.context_lens = context_lens_.as<const int32_t>();
  paged_decode_attention(params, view, device_tables, q_.as<const float>(), out_.as<float>(),
                         launch);
  finish(out);
}

void DeviceDecodeRunner::prefill(const AttentionParams& params, const KVLayerView& cache,
                                 const BlockTableView& tables, std::span<const int32_t> query_start,
                                 std::span<const float> q, std::span<float> out) {
  constexpr const char* kFn = "DeviceDecodeRunner::prefill";
  check_table_geometry(kFn, cache, tables.block_size, tables.num_blocks);
  PAGEDKV_CHECK(tables.num_seqs >= 0 && tables.max_blocks_per_seq >= 0,
                "{}: num_seqs {} and max_blocks_per_seq {} must be >= 0", kFn, tables.num_seqs,
                tables.max_blocks_per_seq);
  PAGEDKV_CHECK(static_cast<int64_t>(query_start.size()) == int64_t{tables.num_seqs} + 1,
                "{}: query_start has {} entries, expected num_seqs + 1 = {}", kFn,
                query_start.size(), int64_t{tables.num_seqs} + 1);
  PAGEDKV_CHECK(query_start[0] == 0, "{}: query_start[0] must be 0, got {}", kFn, query_start[0]);
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    const int64_t n = int64_t{query_start[i + 1]} - query_start[i];
    PAGEDKV_CHECK(n >= 0, "{}: sequence {} has a negative query count {}", kFn, i, n);
    PAGEDKV_CHECK(n <= tables.context_lens[i],
                  "{}: sequence {} has {} query tokens but context length {}", kFn, i, n,
                  tables.context_lens[i]);
  }
  const int64_t rows = query_start[tables.num_seqs];
  check_attention_rows(kFn, "q", q.size(), rows, params);
  check_attention_rows(kFn, "out", out.size(), rows, params);
  // One decode row per query token: its sequence's table row and context = position + 1.
  const int64_t width = tables.max_blocks_per_seq;
  const int64_t row_elems = int64_t{params.num_heads} * params.head_dim;
  std::vector<int32_t> row_tables;
  std::vector<int32_t> row_lens;
  int64_t first = 0;  // first query row of the pending launch
  auto flush = [&] {
    const auto n = static_cast<int32_t>(row_lens.size());
    if (n == 0) return;
    BlockTableView view = tables;  // the geometry travels with every row
    view.block_tables = row_tables.data();
    view.context_lens = row_lens.data();
    view.num_seqs = n;
    decode(params, cache, view, q.subspan(first * row_elems, n * row_elems),
           out.subspan(first * row_elems, n * row_elems));
    first += n;
    row_tables.clear();
    row_lens.clear();
  };
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    const int32_t n = query_start[i + 1] - query_start[i];
    const int32_t* table = tables.block_tables + i * width;
    for (int32_t t = 0; t < n; ++t) {
      row_tables.insert(row_tables.end(), table, table + width);
      row_lens.push_back(tables.context_lens[i] - n + t + 1);
      if (static_cast<int32_t>(row_lens.size()) == kMaxRowsPerLaunch) flush();
    }
  }
  flush();
}

void DeviceDecodeRunner::decode_contiguous(const AttentionParams& params, const KVLayerView& cache,
                                           std::span<const int32_t> context_lens,
                                           std::span<const float> q, std::span<float> out,
                                           std::optional<DecodePlan> plan) {
  constexpr const char* kFn = "DeviceDecodeRunner::decode_contiguous";
  check_decode_config(cache.dtype, cache.head_dim);
  const int32_t num_seqs = cache.num_blocks;  // sequence i is block i
  const int32_t max_len = cache.block_size;
  PAGEDKV_CHECK(static_cast<int64_t>(context_lens.size()) == num_seqs,
                "{}: {} context lengths for {} sequences", kFn, context_lens.size(), num_seqs);
  check_attention_rows(kFn, "q", q.size(), num_seqs, params);
  check_attention_rows(kFn, "out", out.size(), num_seqs, params);
  if (num_seqs == 0) return;
  int64_t max_context = 0;
  for (size_t i = 0; i < context_lens.size(); ++i) {
    PAGEDKV_CHECK(context_lens[i] >= 0 && context_lens[i] <= max_len,
                  "{}: context length {} of sequence {} outside [0, max_len {}]", kFn,
                  context_lens[i], i, max_len);
    max_context = std::max<int64_t>(max_context, context_lens[i]);
  }
  ensure_bytes(context_lens_, int64_t{num_seqs} * 4);
  context_lens_.upload(context_lens.data(), int64_t{num_seqs} * 4, 0, stream_);
  const DecodeLaunch launch = prepare(params, cache.dtype, num_seqs, max_context, q, out, plan);
  contiguous_decode_attention(params, cache, context_lens_.as<const int32_t>(),
                              q_.as<const float>(), out_.as<float>(), launch);
  finish(out);
}

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
