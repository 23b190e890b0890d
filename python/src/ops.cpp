// Paged attention on pools the engine owns: any object with __dlpack__ (numpy, torch CPU
// tensors) is read in place through a KVLayerView built from its own shape and strides, and
// the CPU kernels (src/cpu) run on it with the GIL released. vLLM's separate K and V pools and
// FlashInfer's combined [num_pages, 2, ...] pool, HND and NHD; K/V fp32, fp16, bf16 or 8-bit
// (fp8_e4m3 / fp8_e5m2 as uint8, int8, with k_scale / v_scale); queries, outputs and the new
// K/V of write_kv fp32, fp16 or bf16. Every wrong shape, dtype, device or stride is a ValueError
// naming it (pools.cpp).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "bindings.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/storage/kv_write.hpp"
#include "pools.hpp"

namespace pagedkv::py {

using namespace nb::literals;

namespace {

// q, out, or the key / value of write_kv: [rows, heads, dim] float32, float16 or bfloat16,
// C-contiguous, on the CPU.
DType check_activations(const char* name, const Any& a, const char* shape) {
  check_cpu(name, a);
  if (a.ndim() != 3) bad(std::string(name) + ": expected " + shape + ", got shape " + shape_of(a));
  const DType dtype = activation_dtype(name, a);
  check_dense(name, a, 3, static_cast<nb::dlpack::dtype_code>(a.dtype().code), a.dtype().bits,
              shape);
  return dtype;
}

// out: the caller's [rows, heads, dim] array of q's dtype, checked, or a new array of q's
// dtype (numpy for float32 / float16; a torch tensor for bfloat16, which numpy lacks).
nb::object output_for(const Any& q, DType dtype, std::optional<Any>& out,
                      MutableActivationView& view) {
  if (out) {
    const DType out_dtype = check_activations("out", *out, "[rows, heads, dim]");
    if (out_dtype != dtype) {
      bad("out: dtype " + dtype_of(*out) + " differs from q's " + dtype_of(q) +
          " (out must have q's dtype)");
    }
    for (size_t i = 0; i < 3; ++i) {
      if (out->shape(i) != q.shape(i))
        bad("out shape " + shape_of(*out) + " != q shape " + shape_of(q));
    }
    view = {out->data(), out->size(), dtype};
    return nb::cast(*out);
  }
  const size_t bytes = q.size() * static_cast<size_t>(dtype_size(dtype));
  auto* heap = new std::vector<float>((bytes + sizeof(float) - 1) / sizeof(float));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  view = {heap->data(), q.size(), dtype};
  static float anchor = 0.0f;
  void* data = heap->empty() ? &anchor : heap->data();
  const std::initializer_list<size_t> shape = {q.shape(0), q.shape(1), q.shape(2)};
  if (dtype == DType::kBF16)
    return nb::cast(nb::ndarray<nb::pytorch>(data, shape, owner, {}, dlpack_dtype(dtype)));
  return nb::cast(nb::ndarray<nb::numpy>(data, shape, owner, {}, dlpack_dtype(dtype)));
}

// Block tables from arrays: block_tables [num_seqs, max_blocks] int32, seq_lens [num_seqs]
// int32, built for the cache's block size.
BlockTableView tables_from(const Any& block_tables, const Any& seq_lens, const KVLayerView& c) {
  check_dense("block_tables", block_tables, 2, nb::dlpack::dtype_code::Int, 32,
              "int32 [num_seqs, max_blocks_per_seq]");
  check_dense("seq_lens", seq_lens, 1, nb::dlpack::dtype_code::Int, 32, "int32 [num_seqs]");
  if (seq_lens.shape(0) != block_tables.shape(0)) {
    bad("seq_lens " + shape_of(seq_lens) + " and block_tables " + shape_of(block_tables) +
        " differ in num_seqs");
  }
  return {static_cast<const int32_t*>(block_tables.data()),
          static_cast<const int32_t*>(seq_lens.data()),
          static_cast<int32_t>(block_tables.shape(0)),
          static_cast<int32_t>(block_tables.shape(1)),
          c.block_size,
          0};
}

// The keyword arguments the attention ops share.
struct AttentionArgs {
  std::string layout = "NHD";
  float scale = 0.0f;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  int32_t chunk_size = 0;
  std::optional<Any> out;
  QuantArgs quant;
};

// The keyword arguments every attention op takes, in their binding order.
AttentionArgs attention_args(std::string layout, float scale, int32_t window, int32_t sinks,
                             int32_t chunk, std::optional<Any> out,
                             std::optional<std::string> kv_dtype, std::optional<Any> k_scale,
                             std::optional<Any> v_scale) {
  return {std::move(layout),
          scale,
          window,
          sinks,
          chunk,
          std::move(out),
          {std::move(kv_dtype), std::move(k_scale), std::move(v_scale)}};
}

// Decode (no query_start) or prefill (rows by query_start) over the given tables.
nb::object attend(const Any& q, const Any& k, const std::optional<Any>& v,
                  const BlockTableView& tables, std::optional<std::span<const int32_t>> query_start,
                  AttentionArgs& args) {
  const DType q_dtype = check_activations(
      "q", q, query_start ? "[num_tokens, heads, dim]" : "[num_seqs, heads, dim]");
  if (!query_start && q.shape(0) != static_cast<size_t>(tables.num_seqs)) {
    bad("q " + shape_of(q) + " has " + std::to_string(q.shape(0)) + " rows, the tables " +
        std::to_string(tables.num_seqs) + " sequences");
  }
  const Pool pool = pool_view(k, v, parse_layout(args.layout), args.quant, /*scaled=*/true);
  const KVLayerView cache = pool.view();
  AttentionParams params;
  params.num_heads = static_cast<int32_t>(q.shape(1));
  params.num_kv_heads = cache.num_kv_heads;
  params.head_dim = static_cast<int32_t>(q.shape(2));
  params.scale = args.scale;
  params.window_left = args.window_left;
  params.sink_tokens = args.sink_tokens;
  params.chunk_size = args.chunk_size;
  MutableActivationView o;
  nb::object result = output_for(q, q_dtype, args.out, o);
  const ActivationView qs{q.data(), q.size(), q_dtype};
  {
    nb::gil_scoped_release no_gil;
    if (query_start) {
      paged_prefill_attention(params, cache, tables, *query_start, qs, o);
    } else {
      paged_decode_attention(params, cache, tables, qs, o);
    }
  }
  return result;
}

void write(const Any& key, const Any& value, const Any& k, std::optional<Any> v,
           const Any& slot_mapping, const std::string& layout, QuantArgs quant) {
  const Pool pool = pool_view(k, v, parse_layout(layout), quant, /*scaled=*/true);
  const KVLayerView cache = pool.view();
  check_dense("slot_mapping", slot_mapping, 1, nb::dlpack::dtype_code::Int, 64,
              "int64 [num_tokens]");
  const char* shape = "[num_tokens, kv_heads, head_dim]";
  const DType dtype = check_activations("key", key, shape);
  if (check_activations("value", value, shape) != dtype) {
    bad("value: dtype " + dtype_of(value) + " differs from key's " + dtype_of(key) +
        " (key and value must have the same dtype)");
  }
  for (const auto* a : {&key, &value}) {
    if (a->shape(0) != slot_mapping.shape(0) ||
        a->shape(1) != static_cast<size_t>(cache.num_kv_heads) ||
        a->shape(2) != static_cast<size_t>(cache.head_dim)) {
      bad(std::string(a == &key ? "key" : "value") + " shape " + shape_of(*a) + " != (" +
          std::to_string(slot_mapping.shape(0)) + ", " + std::to_string(cache.num_kv_heads) + ", " +
          std::to_string(cache.head_dim) + ") (slot_mapping's tokens, the pool's heads " +
          "and head_dim)");
    }
  }
  const std::span<const Slot> slots(static_cast<const Slot*>(slot_mapping.data()),
                                    slot_mapping.size());
  const ActivationView ks{key.data(), key.size(), dtype};
  const ActivationView vs{value.data(), value.size(), dtype};
  nb::gil_scoped_release no_gil;
  reshape_and_cache(cache, slots, ks, vs);
}

// One view per layer: an item of `pools` is a (k_cache, v_cache) tuple or a combined pool.
// Block copies move bytes: 8-bit pools need neither kv_dtype nor scales here.
std::vector<KVLayerView> layer_views(const nb::list& pools, const std::string& layout) {
  std::vector<KVLayerView> views;
  const KVLayout parsed = parse_layout(layout);
  for (nb::handle item : pools) {
    if (nb::isinstance<nb::tuple>(item)) {
      const nb::tuple kv = nb::borrow<nb::tuple>(item);
      if (kv.size() != 2) bad("pools: a tuple item must be (k_cache, v_cache)");
      views.push_back(
          pool_view(nb::cast<Any>(kv[0]), nb::cast<Any>(kv[1]), parsed, {}, false).base);
    } else {
      views.push_back(pool_view(nb::cast<Any>(item), std::nullopt, parsed, {}, false).base);
    }
  }
  return views;
}

std::span<const BlockCopy> pairs_of(const Any& block_copies) {
  check_dense("block_copies", block_copies, 2, nb::dlpack::dtype_code::Int, 32,
              "int32 [n, 2] (src, dst)");
  if (block_copies.shape(1) != 2)
    bad("block_copies: expected [n, 2], got " + shape_of(block_copies));
  return {static_cast<const BlockCopy*>(block_copies.data()), block_copies.shape(0)};
}

void copy_all(const nb::list& src, const nb::list& dst, const Any& block_copies,
              const std::string& src_layout, const std::string& dst_layout) {
  const std::vector<KVLayerView> from = layer_views(src, src_layout);
  const std::vector<KVLayerView> to = layer_views(dst, dst_layout);
  if (from.size() != to.size()) {
    bad("src_pools has " + std::to_string(from.size()) + " layers, dst_pools " +
        std::to_string(to.size()));
  }
  const std::span<const BlockCopy> pairs = pairs_of(block_copies);
  nb::gil_scoped_release no_gil;
  for (size_t l = 0; l < from.size(); ++l) copy_blocks(from[l], to[l], pairs);
}

}  // namespace

void bind_ops(nb::module_& m) {
  m.def(
      "copy_blocks",
      [](const nb::list& pools, const Any& block_copies, const std::string& layout) {
        copy_all(pools, pools, block_copies, layout, layout);
      },
      "pools"_a, "block_copies"_a, nb::kw_only(), "layout"_a = "NHD",
      "Copy-on-write for every layer in one call: pools is a list of (k_cache, v_cache) or "
      "combined pools; block_copies [n, 2] int32 (an AppendResult's copies).");
  m.def("swap_blocks", &copy_all, "src_pools"_a, "dst_pools"_a, "block_copies"_a, nb::kw_only(),
        "src_layout"_a = "NHD", "dst_layout"_a = "NHD",
        "Block copies between two pools of every layer (a SwapResult's copies: device -> host "
        "for swap_out, host -> device for swap_in).");
  m.def(
      "write_kv",
      [](const Any& key, const Any& value, const Any& k, std::optional<Any> v,
         const Any& slot_mapping, const std::string& layout, std::optional<std::string> kv_dtype,
         std::optional<Any> k_scale, std::optional<Any> v_scale) {
        write(key, value, k, std::move(v), slot_mapping, layout,
              {std::move(kv_dtype), std::move(k_scale), std::move(v_scale)});
      },
      "key"_a, "value"_a, "k_cache"_a, "v_cache"_a.none(), "slot_mapping"_a, nb::kw_only(),
      "layout"_a = "NHD", "kv_dtype"_a = nb::none(), "k_scale"_a = nb::none(),
      "v_scale"_a = nb::none(),
      "reshape_and_cache: writes key/value [num_tokens, kv_heads, head_dim] float32, float16 or "
      "bfloat16 (both the same dtype; fp16 / bf16 widened exactly to float32) to their slots of "
      "the pools (converted to the pools' dtype; 8-bit: divided by k_scale / v_scale, rounded "
      "and saturated); negative slots are skipped.");
  // The attention ops: (q, k_cache, v_cache, tables..., *, layout, scale, window_left,
  // sink_tokens, chunk_size, out, kv_dtype, k_scale, v_scale).
  const auto attention_kwargs = [](auto&&... positional) {
    return std::make_tuple(positional..., nb::kw_only(), "layout"_a = "NHD", "scale"_a = 0.0f,
                           "window_left"_a = -1, "sink_tokens"_a = 0, "chunk_size"_a = 0,
                           "out"_a = nb::none(), "kv_dtype"_a = nb::none(),
                           "k_scale"_a = nb::none(), "v_scale"_a = nb::none());
  };
  std::apply(
      [&](auto&&... a) {
        m.def(
            "paged_decode_attention",
            [](const Any& q, const Any& k, std::optional<Any> v, const BatchMetadata& meta,
               std::string layout, float scale, int32_t window, int32_t sinks, int32_t chunk,
               std::optional<Any> out, std::optional<std::string> kv_dtype,
               std::optional<Any> k_scale, std::optional<Any> v_scale) {
              AttentionArgs args =
                  attention_args(std::move(layout), scale, window, sinks, chunk, std::move(out),
                                 std::move(kv_dtype), std::move(k_scale), std::move(v_scale));
              return attend(q, k, v, meta.padded.view(), std::nullopt, args);
            },
            a...);
      },
      attention_kwargs("q"_a, "k_cache"_a, "v_cache"_a.none(), "meta"_a));
  std::apply(
      [&](auto&&... a) {
        m.def(
            "paged_decode_attention",
            [](const Any& q, const Any& k, std::optional<Any> v, const Any& block_tables,
               const Any& seq_lens, std::string layout, float scale, int32_t window, int32_t sinks,
               int32_t chunk, std::optional<Any> out, std::optional<std::string> kv_dtype,
               std::optional<Any> k_scale, std::optional<Any> v_scale) {
              AttentionArgs args =
                  attention_args(std::move(layout), scale, window, sinks, chunk, std::move(out),
                                 std::move(kv_dtype), std::move(k_scale), std::move(v_scale));
              const KVLayerView geometry =
                  pool_view(k, v, parse_layout(args.layout), args.quant, false).base;
              return attend(q, k, v, tables_from(block_tables, seq_lens, geometry), std::nullopt,
                            args);
            },
            a...);
      },
      attention_kwargs("q"_a, "k_cache"_a, "v_cache"_a.none(), "block_tables"_a, "seq_lens"_a));
  std::apply(
      [&](auto&&... a) {
        m.def(
            "paged_prefill_attention",
            [](const Any& q, const Any& k, std::optional<Any> v, const BatchMetadata& meta,
               std::string layout, float scale, int32_t window, int32_t sinks, int32_t chunk,
               std::optional<Any> out, std::optional<std::string> kv_dtype,
               std::optional<Any> k_scale, std::optional<Any> v_scale) {
              AttentionArgs args =
                  attention_args(std::move(layout), scale, window, sinks, chunk, std::move(out),
                                 std::move(kv_dtype), std::move(k_scale), std::move(v_scale));
              return attend(q, k, v, meta.padded.view(), std::span<const int32_t>(meta.query_start),
                            args);
            },
            a...);
      },
      attention_kwargs("q"_a, "k_cache"_a, "v_cache"_a.none(), "meta"_a));
}

}  // namespace pagedkv::py
