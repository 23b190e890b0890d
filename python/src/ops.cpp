// Paged attention on pools the engine owns: any object with __dlpack__ (numpy, torch tensors)
// is read in place through a KVLayerView built from its own shape and strides, and the CPU
// kernels (src/cpu) run on it with the GIL released; CUDA arrays go to cuda_ops.cpp's flows
// (the CUDA launchers on the caller's stream) after the same checks. vLLM's separate K and V pools
// and FlashInfer's combined [num_pages, 2, ...] pool, HND and NHD; K/V fp32, fp16, bf16 or 8-bit
// (fp8_e4m3 / fp8_e5m2 as uint8, int8, with k_scale / v_scale); queries, outputs and the new
// K/V of write_kv fp32, fp16 or bf16. Every wrong shape, dtype, device or stride is a ValueError
// naming it (pools.cpp).
#include "ops.hpp"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>

#include "bindings.hpp"
#include "cuda_ops.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/storage/kv_write.hpp"
#include "pools.hpp"

namespace pagedkv::py {

using namespace nb::literals;

DType check_activations(const char* name, const Any& a, const char* shape) {
  if (a.ndim() != 3) bad(std::string(name) + ": expected " + shape + ", got shape " + shape_of(a));
  const DType dtype = activation_dtype(name, a);
  check_dense(name, a, 3, static_cast<nb::dlpack::dtype_code>(a.dtype().code), a.dtype().bits,
              shape);
  return dtype;
}

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

AttentionParams params_for(const Any& q, const KVLayerView& cache, const AttentionArgs& args) {
  AttentionParams params;
  params.num_heads = static_cast<int32_t>(q.shape(1));
  params.num_kv_heads = cache.num_kv_heads;
  params.head_dim = static_cast<int32_t>(q.shape(2));
  params.scale = args.scale;
  params.window_left = args.window_left;
  params.sink_tokens = args.sink_tokens;
  params.chunk_size = args.chunk_size;
  return params;
}

DType check_write_inputs(const Any& key, const Any& value, const KVLayerView& cache,
                         const Any& slot_mapping) {
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
  return dtype;
}

std::vector<KVLayerView> layer_views(const nb::list& pools, const std::string& layout,
                                     const char* name, Place& place) {
  const KVLayout parsed = parse_layout(layout);
  std::vector<std::pair<Any, std::optional<Any>>> arrays;
  std::vector<Named> named;
  arrays.reserve(nb::len(pools));
  for (nb::handle item : pools) {
    const std::string at = std::string(name) + "[" + std::to_string(arrays.size()) + "]";
    if (nb::isinstance<nb::tuple>(item)) {
      const nb::tuple kv = nb::borrow<nb::tuple>(item);
      if (kv.size() != 2) bad(std::string(name) + ": a tuple item must be (k_cache, v_cache)");
      arrays.emplace_back(array_arg(at + "[0]", kv[0]), array_arg(at + "[1]", kv[1]));
      named.push_back({at + "[0]", &arrays.back().first});
      named.push_back({at + "[1]", &*arrays.back().second});
    } else {
      arrays.emplace_back(array_arg(at, item), std::nullopt);
      named.push_back({at, &arrays.back().first});
    }
  }
  place = place_of(named);
  std::vector<KVLayerView> views;
  for (const auto& [k, v] : arrays) views.push_back(pool_view(k, v, parsed, {}, false).base);
  return views;
}

std::span<const BlockCopy> pairs_of(const Any& block_copies) {
  check_cpu("block_copies", block_copies, "the ids are checked on the host");
  check_dense("block_copies", block_copies, 2, nb::dlpack::dtype_code::Int, 32,
              "int32 [n, 2] (src, dst)");
  if (block_copies.shape(1) != 2)
    bad("block_copies: expected [n, 2], got " + shape_of(block_copies));
  return {static_cast<const BlockCopy*>(block_copies.data()), block_copies.shape(0)};
}

namespace {

using StreamArg = std::optional<uintptr_t>;

// out: the caller's [rows, heads, dim] array of q's dtype, checked (returns None), or a new
// array of q's dtype (numpy for float32 / float16; a torch tensor for bfloat16, which numpy
// lacks), returned.
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
    return nb::none();  // the caller returns its own out
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

}  // namespace

nb::object attend_cpu(const Any& q, const KVLayerView& cache, const BlockTableView& tables,
                      std::optional<std::span<const int32_t>> query_start, AttentionArgs& args) {
  const DType q_dtype = check_activations(
      "q", q, query_start ? "[num_tokens, heads, dim]" : "[num_seqs, heads, dim]");
  if (!query_start && q.shape(0) != static_cast<size_t>(tables.num_seqs)) {
    bad("q " + shape_of(q) + " has " + std::to_string(q.shape(0)) + " rows, the tables " +
        std::to_string(tables.num_seqs) + " sequences");
  }
  const AttentionParams params = params_for(q, cache, args);
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

void write_cpu(const Any& key, const Any& value, const KVLayerView& cache,
               const Any& slot_mapping) {
  const DType dtype = check_write_inputs(key, value, cache, slot_mapping);
  const std::span<const Slot> slots(static_cast<const Slot*>(slot_mapping.data()),
                                    slot_mapping.size());
  const ActivationView ks{key.data(), key.size(), dtype};
  const ActivationView vs{value.data(), value.size(), dtype};
  nb::gil_scoped_release no_gil;
  reshape_and_cache(cache, slots, ks, vs);
}

namespace {

// The arrays of an attention call, for place_of.
std::vector<Named> attention_arrays(const Any& q, const Any& k, const std::optional<Any>& v,
                                    const AttentionArgs& args) {
  const auto opt = [](const std::optional<Any>& a) { return a ? &*a : nullptr; };
  return {{"q", &q},
          {"k_cache", &k},
          {"v_cache", opt(v)},
          {"out", opt(args.out)},
          {"k_scale", opt(args.quant.k_scale)},
          {"v_scale", opt(args.quant.v_scale)}};
}

// Decode (no query_start) or prefill (rows by query_start) over the given tables, on the CPU
// or (place.cuda) the device; `tables` are host arrays unless tables_on_device.
nb::object attend(const Any& q, const Any& k, const std::optional<Any>& v,
                  const BlockTableView& tables, std::optional<std::span<const int32_t>> query_start,
                  AttentionArgs& args, [[maybe_unused]] const Place& place,
                  [[maybe_unused]] bool tables_on_device, [[maybe_unused]] StreamArg stream) {
#if PAGEDKV_WITH_CUDA
  if (place.cuda) {
    return cuda_attend(q, k, v, {tables, tables_on_device, query_start}, args, place.device_id,
                       stream);
  }
#endif
  const Pool pool = pool_view(k, v, parse_layout(args.layout), args.quant, /*scaled=*/true);
  nb::object made = attend_cpu(q, pool.view(), tables, query_start, args);
  return args.out ? nb::cast(*args.out) : made;
}

void write(const Any& key, const Any& value, const Any& k, std::optional<Any> v,
           const Any& slot_mapping, const std::string& layout, QuantArgs quant,
           [[maybe_unused]] StreamArg stream) {
  const auto opt = [](const std::optional<Any>& a) { return a ? &*a : nullptr; };
  [[maybe_unused]] const Place place = place_of({{"key", &key},
                                                 {"value", &value},
                                                 {"k_cache", &k},
                                                 {"v_cache", opt(v)},
                                                 {"slot_mapping", &slot_mapping},
                                                 {"k_scale", opt(quant.k_scale)},
                                                 {"v_scale", opt(quant.v_scale)}});
#if PAGEDKV_WITH_CUDA
  if (place.cuda) {
    cuda_write_kv(key, value, k, v, slot_mapping, layout, quant, place.device_id, stream);
    return;
  }
#endif
  const Pool pool = pool_view(k, v, parse_layout(layout), quant, /*scaled=*/true);
  write_cpu(key, value, pool.view(), slot_mapping);
}

// swap_blocks (and copy_blocks, same_pools): the CPU copies, or the CUDA ones when a side is
// on a device.
void copy_all(const nb::list& src, const nb::list& dst, const Any& block_copies,
              const std::string& src_layout, const std::string& dst_layout, bool same_pools,
              [[maybe_unused]] StreamArg stream) {
  Place from_place;
  Place to_place;
  const std::vector<KVLayerView> from =
      layer_views(src, src_layout, same_pools ? "pools" : "src_pools", from_place);
  const std::vector<KVLayerView> to =
      same_pools ? from : layer_views(dst, dst_layout, "dst_pools", to_place);
  if (same_pools) to_place = from_place;
  if (from.size() != to.size()) {
    bad("src_pools has " + std::to_string(from.size()) + " layers, dst_pools " +
        std::to_string(to.size()));
  }
  if (from_place.cuda && to_place.cuda && from_place.device_id != to_place.device_id) {
    bad("src_pools are on cuda:" + std::to_string(from_place.device_id) +
        " but dst_pools on cuda:" + std::to_string(to_place.device_id) +
        " (copies between two devices are not supported)");
  }
  const std::span<const BlockCopy> pairs = pairs_of(block_copies);
#if PAGEDKV_WITH_CUDA
  if (from_place.cuda || to_place.cuda) {
    cuda_copy_blocks({from, from_place.cuda}, {to, to_place.cuda}, pairs, same_pools,
                     from_place.cuda ? from_place.device_id : to_place.device_id, stream);
    return;
  }
#endif
  nb::gil_scoped_release no_gil;
  for (size_t l = 0; l < from.size(); ++l) copy_blocks(from[l], to[l], pairs);
}

}  // namespace

void bind_ops(nb::module_& m) {
  m.attr("WITH_CUDA") = static_cast<bool>(PAGEDKV_WITH_CUDA);
  m.def(
      "copy_blocks",
      [](const nb::list& pools, const Any& block_copies, const std::string& layout,
         StreamArg stream) { copy_all(pools, pools, block_copies, layout, layout, true, stream); },
      "pools"_a, "block_copies"_a, nb::kw_only(), "layout"_a = "NHD", "stream"_a = nb::none(),
      "Copy-on-write for every layer in one call: pools is a list of (k_cache, v_cache) or "
      "combined pools; block_copies [n, 2] int32 (an AppendResult's copies).");
  m.def(
      "swap_blocks",
      [](const nb::list& src, const nb::list& dst, const Any& block_copies,
         const std::string& src_layout, const std::string& dst_layout, StreamArg stream) {
        copy_all(src, dst, block_copies, src_layout, dst_layout, false, stream);
      },
      "src_pools"_a, "dst_pools"_a, "block_copies"_a, nb::kw_only(), "src_layout"_a = "NHD",
      "dst_layout"_a = "NHD", "stream"_a = nb::none(),
      "Block copies between two pools of every layer (a SwapResult's copies: device -> host "
      "for swap_out, host -> device for swap_in).");
  m.def(
      "write_kv",
      [](const Any& key, const Any& value, const Any& k, std::optional<Any> v,
         const Any& slot_mapping, const std::string& layout, std::optional<std::string> kv_dtype,
         std::optional<Any> k_scale, std::optional<Any> v_scale, StreamArg stream) {
        write(key, value, k, std::move(v), slot_mapping, layout,
              {std::move(kv_dtype), std::move(k_scale), std::move(v_scale)}, stream);
      },
      "key"_a, "value"_a, "k_cache"_a, "v_cache"_a.none(), "slot_mapping"_a, nb::kw_only(),
      "layout"_a = "NHD", "kv_dtype"_a = nb::none(), "k_scale"_a = nb::none(),
      "v_scale"_a = nb::none(), "stream"_a = nb::none(),
      "reshape_and_cache: writes key/value [num_tokens, kv_heads, head_dim] float32, float16 or "
      "bfloat16 (both the same dtype; fp16 / bf16 widened exactly to float32) to their slots of "
      "the pools (converted to the pools' dtype; 8-bit: divided by k_scale / v_scale, rounded "
      "and saturated); negative slots are skipped.");
  // The attention ops: (q, k_cache, v_cache, tables..., *, layout, scale, window_left,
  // sink_tokens, chunk_size, out, kv_dtype, k_scale, v_scale, stream).
  const auto attention_kwargs = [](auto&&... positional) {
    return std::make_tuple(
        positional..., nb::kw_only(), "layout"_a = "NHD", "scale"_a = 0.0f, "window_left"_a = -1,
        "sink_tokens"_a = 0, "chunk_size"_a = 0, "out"_a = nb::none(), "kv_dtype"_a = nb::none(),
        "k_scale"_a = nb::none(), "v_scale"_a = nb::none(), "stream"_a = nb::none());
  };
  // Decode (prefill: false) or prefill over a BatchMetadata's host tables.
  const auto with_meta = [](bool prefill) {
    return [prefill](const Any& q, const Any& k, std::optional<Any> v, const BatchMetadata& meta,
                     std::string layout, float scale, int32_t window, int32_t sinks, int32_t chunk,
                     std::optional<Any> out, std::optional<std::string> kv_dtype,
                     std::optional<Any> k_scale, std::optional<Any> v_scale, StreamArg stream) {
      AttentionArgs args =
          attention_args(std::move(layout), scale, window, sinks, chunk, std::move(out),
                         std::move(kv_dtype), std::move(k_scale), std::move(v_scale));
      const Place place = place_of(attention_arrays(q, k, v, args));
      std::optional<std::span<const int32_t>> query_start;
      if (prefill) query_start = std::span<const int32_t>(meta.query_start);
      return attend(q, k, v, meta.padded.view(), query_start, args, place, false, stream);
    };
  };
  std::apply([&](auto&&... a) { m.def("paged_decode_attention", with_meta(false), a...); },
             attention_kwargs("q"_a, "k_cache"_a, "v_cache"_a.none(), "meta"_a));
  std::apply(
      [&](auto&&... a) {
        m.def(
            "paged_decode_attention",
            [](const Any& q, const Any& k, std::optional<Any> v, const Any& block_tables,
               const Any& seq_lens, std::string layout, float scale, int32_t window, int32_t sinks,
               int32_t chunk, std::optional<Any> out, std::optional<std::string> kv_dtype,
               std::optional<Any> k_scale, std::optional<Any> v_scale, StreamArg stream) {
              AttentionArgs args =
                  attention_args(std::move(layout), scale, window, sinks, chunk, std::move(out),
                                 std::move(kv_dtype), std::move(k_scale), std::move(v_scale));
              std::vector<Named> arrays = attention_arrays(q, k, v, args);
              arrays.push_back({"block_tables", &block_tables});
              arrays.push_back({"seq_lens", &seq_lens});
              const Place place = place_of(arrays);
              const KVLayerView geometry =
                  pool_view(k, v, parse_layout(args.layout), args.quant, false).base;
              return attend(q, k, v, tables_from(block_tables, seq_lens, geometry), std::nullopt,
                            args, place, place.cuda, stream);
            },
            a...);
      },
      attention_kwargs("q"_a, "k_cache"_a, "v_cache"_a.none(), "block_tables"_a, "seq_lens"_a));
  std::apply([&](auto&&... a) { m.def("paged_prefill_attention", with_meta(true), a...); },
             attention_kwargs("q"_a, "k_cache"_a, "v_cache"_a.none(), "meta"_a));
}

}  // namespace pagedkv::py
