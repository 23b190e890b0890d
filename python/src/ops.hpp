#pragma once
/// @file ops.hpp
/// The argument checks the ops on the engine's pools share between their CPU flow (ops.cpp)
/// and their CUDA flow (cuda_ops.cpp): activations, block tables from arrays, the attention
/// keywords, the write_kv inputs and the pools of every layer. Device-agnostic: they read
/// shapes, dtypes and strides, never data (pools.hpp's place_of checks the devices first).

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pagedkv/attention_params.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pools.hpp"

namespace pagedkv::py {

/// q, out, or the key / value of write_kv: [rows, heads, dim] float32, float16 or bfloat16,
/// C-contiguous. Returns its dtype. Errors: ValueError naming the array.
DType check_activations(const char* name, const Any& a, const char* shape);

/// Block tables from arrays: block_tables [num_seqs, max_blocks] int32, seq_lens [num_seqs]
/// int32, built for the cache's block size (pointers into the arrays, wherever they live).
BlockTableView tables_from(const Any& block_tables, const Any& seq_lens, const KVLayerView& c);

/// The keyword arguments the attention ops share.
struct AttentionArgs {
  std::string layout = "NHD";
  float scale = 0.0f;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  int32_t chunk_size = 0;
  std::optional<Any> out;
  QuantArgs quant;
};

/// The keyword arguments every attention op takes, in their binding order.
AttentionArgs attention_args(std::string layout, float scale, int32_t window, int32_t sinks,
                             int32_t chunk, std::optional<Any> out,
                             std::optional<std::string> kv_dtype, std::optional<Any> k_scale,
                             std::optional<Any> v_scale);

/// The AttentionParams of q [rows, heads, dim] over `cache` with the keywords' mask and scale.
AttentionParams params_for(const Any& q, const KVLayerView& cache, const AttentionArgs& args);

/// write_kv's key and value against slot_mapping and the pool: int64 [num_tokens] slots, key
/// and value [num_tokens, kv_heads, head_dim] of one activation dtype (returned).
/// Errors: ValueError naming the array.
DType check_write_inputs(const Any& key, const Any& value, const KVLayerView& cache,
                         const Any& slot_mapping);

/// The pools of every layer (block copies: bytes are bytes, no scales). An item of `pools` is a
/// (k_cache, v_cache) tuple or a combined pool; `name` ("pools", "src_pools") names the list in
/// messages. `place` gets the device all of them are on (place_of's errors, "pools[1][0]").
std::vector<KVLayerView> layer_views(const nb::list& pools, const std::string& layout,
                                     const char* name, Place& place);

/// The CPU flow of the attention ops over a checked view (the pools' own, or a KVPools
/// layer's): q [rows, heads, dim] float32, float16 or bfloat16 checked against the tables,
/// out (args.out) checked or allocated (output_for), the kernel run with the GIL released.
/// Decode without query_start, prefill with it. Returns the out it made, None when args.out
/// was given (the caller returns its own object for it).
nb::object attend_cpu(const Any& q, const KVLayerView& cache, const BlockTableView& tables,
                      std::optional<std::span<const int32_t>> query_start, AttentionArgs& args);

/// The CPU flow of write_kv over a checked view: key / value against slot_mapping and the
/// view (check_write_inputs), then reshape_and_cache with the GIL released.
void write_cpu(const Any& key, const Any& value, const KVLayerView& cache, const Any& slot_mapping);

/// block_copies: int32 [n, 2] (src, dst) pairs on the CPU (the manager's result arrays; their
/// ids are checked on the host before any copy). Errors: ValueError naming it.
std::span<const BlockCopy> pairs_of(const Any& block_copies);

}  // namespace pagedkv::py
