// DeviceDecodeRunner: host spans in, host spans out, device kernels in between.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.hpp"
#include "pagedkv/cuda/device_decode_runner.hpp"

namespace pagedkv::cuda {

namespace {

/// Grows `buffer` to at least `bytes` (contents not kept). Safe between calls because every
/// runner call synchronizes its stream before returning.
void ensure(DeviceBuffer& buffer, int64_t bytes) {
  if (buffer.bytes() < bytes) buffer = DeviceBuffer(std::max<int64_t>(bytes, 256));
}

void check_rows(const char* fn, const char* what, size_t size, int64_t rows,
                const AttentionParams& params) {
  const int64_t expected = rows * params.num_heads * params.head_dim;
  PAGEDKV_CHECK(static_cast<int64_t>(size) == expected,
                "{}: {} has {} elements, expected {} ({} rows x {} heads x {} dims)", fn, what,
                size, expected, rows, params.num_heads, params.head_dim);
}

}  // namespace

DeviceDecodeRunner::DeviceDecodeRunner(Stream stream) : stream_(stream) { require_device(); }

void DeviceDecodeRunner::write(DeviceKVCache& cache, int32_t layer,
                               std::span<const Slot> slot_mapping, std::span<const float> k,
                               std::span<const float> v) {
  constexpr const char* kFn = "DeviceDecodeRunner::write";
  const KVCacheConfig& c = cache.config();
  PAGEDKV_CHECK(layer >= 0 && layer < c.num_layers, "{}: layer {} out of range [0, {})", kFn, layer,
                c.num_layers);
  const auto num_tokens = static_cast<int64_t>(slot_mapping.size());
  const int64_t expected = num_tokens * c.num_kv_heads * c.head_dim;
  PAGEDKV_CHECK(
      static_cast<int64_t>(k.size()) == expected && static_cast<int64_t>(v.size()) == expected,
      "{}: k has {} and v {} elements, expected {} ({} tokens x {} kv heads x {} dims)", kFn,
      k.size(), v.size(), expected, num_tokens, c.num_kv_heads, c.head_dim);
  const int64_t num_slots = int64_t{c.num_blocks} * c.block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    PAGEDKV_CHECK(slot_mapping[t] < num_slots, "{}: slot {} of token {} out of range [0, {})", kFn,
                  slot_mapping[t], t, num_slots);
  }
  if (num_tokens == 0) return;
  ensure(slots_, num_tokens * 8);
  ensure(k_, expected * 4);
  ensure(v_, expected * 4);
  slots_.upload(slot_mapping.data(), num_tokens * 8, 0, stream_);
  k_.upload(k.data(), expected * 4, 0, stream_);
  v_.upload(v.data(), expected * 4, 0, stream_);
  NewKV input;
  input.k = k_.data();
  input.v = v_.data();
  input.dtype = DType::kF32;
  input.slot_mapping = slots_.as<const int64_t>();
  input.num_tokens = num_tokens;
  cache.write(layer, input, stream_);
  synchronize(stream_);
}

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
    ensure(workspace_, ws);
    launch.workspace = workspace_.data();
    launch.workspace_bytes = workspace_.bytes();
  }
  ensure(q_, static_cast<int64_t>(q.size_bytes()));
  ensure(out_, static_cast<int64_t>(out.size_bytes()));
  q_.upload(q.data(), static_cast<int64_t>(q.size_bytes()), 0, stream_);
  last_plan_ = launch.plan;
  return launch;
}

void DeviceDecodeRunner::finish(std::span<float> out) {
  out_.download(out.data(), static_cast<int64_t>(out.size_bytes()), 0, stream_);
}

void DeviceDecodeRunner::decode(const AttentionParams& params, const DeviceKVCache& cache,
                                int32_t layer, const BlockTableView& tables,
                                std::span<const float> q, std::span<float> out,
                                std::optional<DecodePlan> plan) {
  constexpr const char* kFn = "DeviceDecodeRunner::decode";
  const KVLayerView view = cache.layer(layer);
  check_decode_config(view.dtype, view.head_dim, view.block_size);
  check_attention_params(params, view);
  PAGEDKV_CHECK(tables.num_seqs >= 0 && tables.max_blocks_per_seq >= 0,
                "{}: num_seqs {} and max_blocks_per_seq {} must be >= 0", kFn, tables.num_seqs,
                tables.max_blocks_per_seq);
  check_rows(kFn, "q", q.size(), tables.num_seqs, params);
  check_rows(kFn, "out", out.size(), tables.num_seqs, params);
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
  ensure(tables_, table_bytes);
  ensure(context_lens_, int64_t{tables.num_seqs} * 4);
  tables_.upload(tables.block_tables, table_bytes, 0, stream_);
  context_lens_.upload(tables.context_lens, int64_t{tables.num_seqs} * 4, 0, stream_);
  const DecodeLaunch launch =
      prepare(params, view.dtype, tables.num_seqs, max_context, q, out, plan);
  BlockTableView device_tables{tables_.as<const int32_t>(), context_lens_.as<const int32_t>(),
                               tables.num_seqs, tables.max_blocks_per_seq};
  paged_decode_attention(params, view, device_tables, q_.as<const float>(), out_.as<float>(),
                         launch);
  finish(out);
}

void DeviceDecodeRunner::prefill(const AttentionParams& params, const DeviceKVCache& cache,
                                 int32_t layer, const BlockTableView& tables,
                                 std::span<const int32_t> query_start, std::span<const float> q,
                                 std::span<float> out) {
  constexpr const char* kFn = "DeviceDecodeRunner::prefill";
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
  check_rows(kFn, "q", q.size(), rows, params);
  check_rows(kFn, "out", out.size(), rows, params);
  // One decode row per query token: its sequence's table row and context = position + 1.
  const int64_t width = tables.max_blocks_per_seq;
  const int64_t row_elems = int64_t{params.num_heads} * params.head_dim;
  std::vector<int32_t> row_tables;
  std::vector<int32_t> row_lens;
  int64_t first = 0;  // first query row of the pending launch
  auto flush = [&] {
    const auto n = static_cast<int32_t>(row_lens.size());
    if (n == 0) return;
    const BlockTableView view{row_tables.data(), row_lens.data(), n, tables.max_blocks_per_seq};
    decode(params, cache, layer, view, q.subspan(first * row_elems, n * row_elems),
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

void DeviceDecodeRunner::decode_contiguous(const AttentionParams& params,
                                           const ContiguousKVView& cache,
                                           std::span<const int32_t> context_lens,
                                           std::span<const float> q, std::span<float> out,
                                           std::optional<DecodePlan> plan) {
  constexpr const char* kFn = "DeviceDecodeRunner::decode_contiguous";
  check_decode_config(cache.dtype, cache.head_dim);
  PAGEDKV_CHECK(static_cast<int64_t>(context_lens.size()) == cache.num_seqs,
                "{}: {} context lengths for {} sequences", kFn, context_lens.size(),
                cache.num_seqs);
  check_rows(kFn, "q", q.size(), cache.num_seqs, params);
  check_rows(kFn, "out", out.size(), cache.num_seqs, params);
  if (cache.num_seqs == 0) return;
  int64_t max_context = 0;
  for (size_t i = 0; i < context_lens.size(); ++i) {
    PAGEDKV_CHECK(context_lens[i] >= 0 && context_lens[i] <= cache.max_len,
                  "{}: context length {} of sequence {} outside [0, max_len {}]", kFn,
                  context_lens[i], i, cache.max_len);
    max_context = std::max<int64_t>(max_context, context_lens[i]);
  }
  ensure(context_lens_, int64_t{cache.num_seqs} * 4);
  context_lens_.upload(context_lens.data(), int64_t{cache.num_seqs} * 4, 0, stream_);
  const DecodeLaunch launch =
      prepare(params, cache.dtype, cache.num_seqs, max_context, q, out, plan);
  contiguous_decode_attention(params, cache, context_lens_.as<const int32_t>(),
                              q_.as<const float>(), out_.as<float>(), launch);
  finish(out);
}

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
