// The CUDA flows of write_kv and the attention ops (cuda_ops.hpp): checks shared with the CPU
// flows, then cuda::reshape_and_cache and cuda::paged_decode_attention on the caller's stream.
// Prefill runs on the decode kernel as cuda::DeviceDecodeRunner::prefill does: query token t of
// sequence i becomes a decode row with i's block table and context p + 1 (p its position).
#include "cuda_ops.hpp"

#if PAGEDKV_WITH_CUDA

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "device_call.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device_decode_runner.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::py {

namespace {

// The pools' view with device copies of an 8-bit pool's scales (pool.k_scale / v_scale are
// host copies, read and checked by pool_view).
KVLayerView device_view(DeviceCall& call, const Pool& pool) {
  KVLayerView cache = pool.base;
  if (!pool.k_scale.empty()) cache.k_scale = call.upload(pool.k_scale);
  if (!pool.v_scale.empty()) cache.v_scale = call.upload(pool.v_scale);
  return cache;
}

Pool device_pool(DeviceCall& call, const Any& k, const std::optional<Any>& v,
                 const std::string& layout, const QuantArgs& quant) {
  return pool_view(k, v, parse_layout(layout), quant, /*scaled=*/true,
                   [&call](const Any& a) { return call.read_floats(a); });
}

// Host tables (a BatchMetadata's): every context within its row and the block ids it covers in
// range, as the CPU kernels check them (pagedkv::Error, a ContractError, as theirs). Returns
// the longest context.
int64_t check_host_tables(const BlockTableView& t, const KVLayerView& cache) {
  check_table_geometry("paged_decode_attention (CUDA)", cache, t.block_size, t.num_blocks);
  const int64_t capacity = int64_t{t.max_blocks_per_seq} * cache.block_size;
  int64_t longest = 0;
  for (int32_t i = 0; i < t.num_seqs; ++i) {
    const int64_t ctx = t.context_lens[i];
    if (ctx < 0 || ctx > capacity) {
      throw Error("meta: context length " + std::to_string(ctx) + " of sequence " +
                  std::to_string(i) + " outside [0, " + std::to_string(capacity) +
                  "] (its table's blocks x block_size)");
    }
    const int32_t* row = t.block_tables + int64_t{i} * t.max_blocks_per_seq;
    for (int64_t j = 0; j < blocks_for_tokens(ctx, cache.block_size); ++j) {
      if (row[j] < 0 || row[j] >= cache.num_blocks) {
        throw Error("meta: block id " + std::to_string(row[j]) + " (sequence " + std::to_string(i) +
                    ", logical block " + std::to_string(j) + ") outside the pool's [0, " +
                    std::to_string(cache.num_blocks) + ")");
      }
    }
    longest = std::max(longest, ctx);
  }
  return longest;
}

// Decode rows [0, tables.num_seqs) over DEVICE tables, in launches of at most
// DeviceDecodeRunner::kMaxRowsPerLaunch rows (the grid's y limit), each with its plan and a
// stream-ordered workspace. `longest` bounds every context (tokens; the plan's input).
void launch_rows(DeviceCall& call, const AttentionParams& params, const KVLayerView& cache,
                 const BlockTableView& tables, int64_t longest, ActivationView q,
                 MutableActivationView out) {
  const int64_t row_elems = int64_t{params.num_heads} * params.head_dim;
  const int64_t q_row_bytes = row_elems * dtype_size(q.dtype);
  const int64_t out_row_bytes = row_elems * dtype_size(out.dtype);
  for (int32_t first = 0; first < tables.num_seqs;) {
    const int32_t n =
        std::min(tables.num_seqs - first, cuda::DeviceDecodeRunner::kMaxRowsPerLaunch);
    BlockTableView rows = tables;
    rows.block_tables = tables.block_tables + int64_t{first} * tables.max_blocks_per_seq;
    rows.context_lens = tables.context_lens + first;
    rows.num_seqs = n;
    cuda::DecodeLaunch launch;
    launch.stream = call.stream();
    launch.plan = cuda::make_decode_plan(params, cache.dtype, n, longest);
    launch.workspace_bytes =
        cuda::decode_workspace_bytes(n, params.num_heads, params.head_dim, launch.plan);
    launch.workspace = call.alloc(launch.workspace_bytes);
    const auto elems = static_cast<size_t>(n * row_elems);
    cuda::paged_decode_attention(
        params, cache, rows,
        ActivationView{static_cast<const std::byte*>(q.data) + first * q_row_bytes, elems, q.dtype},
        MutableActivationView{static_cast<std::byte*>(out.data) + first * out_row_bytes, elems,
                              out.dtype},
        launch);
    first += n;
  }
}

// Prefill's decode rows: per query token its sequence's table row and context position + 1.
struct PrefillRows {
  std::vector<int32_t> tables;
  std::vector<int32_t> lens;
};

PrefillRows prefill_rows(const BlockTableView& t, std::span<const int32_t> query_start,
                         size_t q_rows) {
  if (query_start.size() != static_cast<size_t>(t.num_seqs) + 1 || query_start[0] != 0) {
    bad("meta: query_start_loc has " + std::to_string(query_start.size()) +
        " entries (expected num_seqs + 1, starting at 0)");
  }
  if (static_cast<size_t>(query_start[t.num_seqs]) != q_rows) {
    bad("q has " + std::to_string(q_rows) + " rows, meta " +
        std::to_string(query_start[t.num_seqs]) + " query tokens (query_start_loc[-1])");
  }
  PrefillRows rows;
  const int64_t width = t.max_blocks_per_seq;
  for (int32_t i = 0; i < t.num_seqs; ++i) {
    const int32_t n = query_start[i + 1] - query_start[i];
    if (n < 0 || n > t.context_lens[i]) {
      throw Error("meta: sequence " + std::to_string(i) + " has " + std::to_string(n) +
                  " query tokens but context length " + std::to_string(t.context_lens[i]));
    }
    const int32_t* table = t.block_tables + i * width;
    for (int32_t r = 0; r < n; ++r) {
      rows.tables.insert(rows.tables.end(), table, table + width);
      rows.lens.push_back(t.context_lens[i] - n + r + 1);
    }
  }
  return rows;
}

}  // namespace

nb::object cuda_attend(const Any& q, const Any& k, const std::optional<Any>& v,
                       const AttentionTables& in, AttentionArgs& args, int32_t device,
                       std::optional<uintptr_t> stream) {
  const bool prefill = in.query_start.has_value();
  const DType q_dtype =
      check_activations("q", q, prefill ? "[num_tokens, heads, dim]" : "[num_seqs, heads, dim]");
  if (!args.out) {
    bad("out is required for CUDA q: pagedkv allocates no result on a device (pass "
        "out=torch.empty_like(q); pagedkv's Python layer does it for torch tensors)");
  }
  if (check_activations("out", *args.out, "[rows, heads, dim]") != q_dtype) {
    bad("out: dtype " + dtype_of(*args.out) + " differs from q's " + dtype_of(q) +
        " (out must have q's dtype)");
  }
  for (size_t i = 0; i < 3; ++i) {
    if (args.out->shape(i) != q.shape(i))
      bad("out shape " + shape_of(*args.out) + " != q shape " + shape_of(q));
  }
  if (!prefill && q.shape(0) != static_cast<size_t>(in.tables.num_seqs)) {
    bad("q " + shape_of(q) + " has " + std::to_string(q.shape(0)) + " rows, the tables " +
        std::to_string(in.tables.num_seqs) + " sequences");
  }
  DeviceCall call(device, stream);
  const Pool pool = device_pool(call, k, v, args.layout, args.quant);
  const KVLayerView cache = device_view(call, pool);
  const AttentionParams params = params_for(q, cache, args);
  const ActivationView qd{q.data(), q.size(), q_dtype};
  const MutableActivationView od{args.out->data(), args.out->size(), q_dtype};
  BlockTableView tables = in.tables;
  // Device tables are not read here: the capacity of a row bounds every context (a plan for a
  // longer context than the batch's is correct, only maybe slower).
  int64_t longest = int64_t{tables.max_blocks_per_seq} * cache.block_size;
  if (prefill) {
    check_host_tables(tables, cache);
    const PrefillRows rows = prefill_rows(tables, *in.query_start, q.shape(0));
    tables.num_seqs = static_cast<int32_t>(rows.lens.size());
    tables.block_tables = call.upload(rows.tables);
    tables.context_lens = call.upload(rows.lens);
  } else if (!in.on_device) {
    longest = check_host_tables(tables, cache);
    const auto table_elems = static_cast<size_t>(tables.num_seqs) * tables.max_blocks_per_seq;
    tables.block_tables =
        call.upload(std::vector<int32_t>(tables.block_tables, tables.block_tables + table_elems));
    tables.context_lens = call.upload(
        std::vector<int32_t>(tables.context_lens, tables.context_lens + tables.num_seqs));
  }
  if (tables.num_seqs > 0) {
    nb::gil_scoped_release no_gil;
    launch_rows(call, params, cache, tables, longest, qd, od);
  }
  return nb::cast(*args.out);
}

void cuda_write_kv(const Any& key, const Any& value, const Any& k, const std::optional<Any>& v,
                   const Any& slot_mapping, const std::string& layout, const QuantArgs& quant,
                   int32_t device, std::optional<uintptr_t> stream) {
  DeviceCall call(device, stream);
  const Pool pool = device_pool(call, k, v, layout, quant);
  const DType dtype = check_write_inputs(key, value, pool.base, slot_mapping);
  const KVLayerView cache = device_view(call, pool);
  cuda::NewKV input;
  input.k = key.data();
  input.v = value.data();
  input.dtype = dtype;
  input.slot_mapping = static_cast<const int64_t*>(slot_mapping.data());
  input.num_tokens = static_cast<int64_t>(slot_mapping.shape(0));
  if (input.num_tokens == 0) return;
  nb::gil_scoped_release no_gil;
  cuda::reshape_and_cache(cache, input, call.stream());
}

}  // namespace pagedkv::py

#endif  // PAGEDKV_WITH_CUDA
