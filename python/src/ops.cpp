// Paged attention on pools the engine owns: any object with __dlpack__ (numpy, torch CPU
// tensors) is read in place through a KVLayerView built from its own shape and strides, and
// the CPU kernels (src/cpu) run on it with the GIL released. vLLM's separate K and V pools and
// FlashInfer's combined [num_pages, 2, ...] pool, HND and NHD; K/V fp32, fp16 or bf16; queries
// and outputs fp32. Every wrong shape, dtype, device or stride is a ValueError naming it.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <span>
#include <string>

#include "bindings.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/storage/kv_write.hpp"

namespace pagedkv::py {

using namespace nb::literals;

namespace {

using Any = nb::ndarray<>;

std::string shape_of(const Any& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

[[noreturn]] void bad(const std::string& msg) { throw nb::value_error(msg.c_str()); }

void check_cpu(const char* name, const Any& a) {
  if (a.device_type() != nb::device::cpu::value) {
    bad(std::string(name) + " is on device type " + std::to_string(a.device_type()) +
        ": these are the CPU kernels (CUDA tensors are not supported yet)");
  }
}

bool is(const Any& a, nb::dlpack::dtype_code code, int bits) {
  return a.dtype().code == static_cast<uint8_t>(code) && a.dtype().bits == bits &&
         a.dtype().lanes == 1;
}

std::string dtype_of(const Any& a) {
  const auto code = static_cast<nb::dlpack::dtype_code>(a.dtype().code);
  const char* kind = code == nb::dlpack::dtype_code::Float    ? "float"
                     : code == nb::dlpack::dtype_code::Bfloat ? "bfloat"
                     : code == nb::dlpack::dtype_code::Int    ? "int"
                     : code == nb::dlpack::dtype_code::UInt   ? "uint"
                                                              : "other";
  return kind + std::to_string(a.dtype().bits);
}

bool c_contiguous(const Any& a) {
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

// A dense CPU array of `ndim` dims and the given element type (`what` names it in errors).
void check_dense(const char* name, const Any& a, size_t ndim, nb::dlpack::dtype_code code, int bits,
                 const char* what) {
  check_cpu(name, a);
  if (a.ndim() != ndim || !is(a, code, bits)) {
    bad(std::string(name) + ": expected " + what + ", got " + dtype_of(a) + " of shape " +
        shape_of(a));
  }
  if (!c_contiguous(a)) bad(std::string(name) + " must be C-contiguous");
}

DType kv_dtype(const Any& a) {
  if (is(a, nb::dlpack::dtype_code::Float, 32)) return DType::kF32;
  if (is(a, nb::dlpack::dtype_code::Float, 16)) return DType::kF16;
  if (is(a, nb::dlpack::dtype_code::Bfloat, 16)) return DType::kBF16;
  bad("k_cache: dtype " + dtype_of(a) + " is not float32, float16 or bfloat16");
}

KVLayout parse_layout(const std::string& layout) {
  if (layout == "NHD") return KVLayout::kNHD;
  if (layout == "HND") return KVLayout::kHND;
  bad("layout = '" + layout + "' is not 'NHD' or 'HND'");
}

// The view of one layer's pools. Separate pools (v_cache given): k, v [blocks, bs, heads, dim]
// (NHD) or [blocks, heads, bs, dim] (HND), same dtype, shape and strides. Combined (v_cache
// None): k [blocks, 2, bs, heads, dim] (NHD) or [blocks, 2, heads, bs, dim] (HND), index 1 = V.
KVLayerView pool_view(const Any& k, const std::optional<Any>& v, KVLayout layout) {
  check_cpu("k_cache", k);
  const size_t first = v ? 1 : 2;  // dim of block_size or heads after [blocks(, 2)]
  if (k.ndim() != first + 3) {
    bad(std::string("k_cache: expected ") +
        (v ? "4 dims (separate K and V pools)" : "5 dims [num_pages, 2, ...] (v_cache None)") +
        ", got shape " + shape_of(k));
  }
  if (v) {
    check_cpu("v_cache", *v);
    bool same = v->ndim() == k.ndim() && v->dtype() == k.dtype();
    for (size_t i = 0; same && i < k.ndim(); ++i)
      same = v->shape(i) == k.shape(i) && v->stride(i) == k.stride(i);
    if (!same) {
      bad("v_cache (" + dtype_of(*v) + " " + shape_of(*v) + ") differs from k_cache (" +
          dtype_of(k) + " " + shape_of(k) + ") in dtype, shape or strides");
    }
  } else if (k.shape(1) != 2) {
    bad("k_cache: a combined pool has 2 at dim 1 (K, V), got shape " + shape_of(k));
  }
  for (size_t i = 0; i < k.ndim(); ++i) {
    if (k.stride(i) < 0) bad("k_cache: negative stride at dim " + std::to_string(i));
  }
  if (k.stride(k.ndim() - 1) != 1) bad("k_cache: head_dim (the last dim) must be contiguous");
  const size_t tok = layout == KVLayout::kNHD ? first : first + 1;
  const size_t head = layout == KVLayout::kNHD ? first + 1 : first;
  KVLayerView view;
  view.dtype = kv_dtype(k);
  const int64_t esize = dtype_size(view.dtype);
  view.k = k.data();
  view.v = v ? v->data() : static_cast<char*>(k.data()) + k.stride(1) * esize;
  view.num_blocks = static_cast<int32_t>(k.shape(0));
  view.block_size = static_cast<int32_t>(k.shape(tok));
  view.num_kv_heads = static_cast<int32_t>(k.shape(head));
  view.head_dim = static_cast<int32_t>(k.shape(k.ndim() - 1));
  view.block_stride = k.stride(0);
  view.head_stride = k.stride(head);
  view.token_stride = k.stride(tok);
  return view;
}

AttentionParams params_for(const Any& q, const KVLayerView& cache, float scale, int32_t window,
                           int32_t sinks) {
  AttentionParams p;
  p.num_heads = static_cast<int32_t>(q.shape(1));
  p.num_kv_heads = cache.num_kv_heads;
  p.head_dim = static_cast<int32_t>(q.shape(2));
  p.scale = scale;
  p.window_left = window;
  p.sink_tokens = sinks;
  return p;
}

// out: the caller's [rows, heads, dim] float32 array, checked, or a new numpy array.
nb::object output_for(const Any& q, std::optional<Any>& out, std::span<float>& span) {
  if (out) {
    check_dense("out", *out, 3, nb::dlpack::dtype_code::Float, 32, "float32 [rows, heads, dim]");
    for (size_t i = 0; i < 3; ++i) {
      if (out->shape(i) != q.shape(i))
        bad("out shape " + shape_of(*out) + " != q shape " + shape_of(q));
    }
    span = {static_cast<float*>(out->data()), out->size()};
    return nb::cast(*out);
  }
  auto* heap = new std::vector<float>(q.size());
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  span = {heap->data(), heap->size()};
  static float anchor = 0.0f;
  return nb::cast(nb::ndarray<nb::numpy, float>(heap->empty() ? &anchor : heap->data(),
                                                {q.shape(0), q.shape(1), q.shape(2)}, owner));
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

nb::object decode(const Any& q, const Any& k, std::optional<Any> v, const BlockTableView& tables,
                  const std::string& layout, float scale, int32_t window, int32_t sinks,
                  std::optional<Any> out) {
  check_dense("q", q, 3, nb::dlpack::dtype_code::Float, 32, "float32 [num_seqs, heads, dim]");
  if (q.shape(0) != static_cast<size_t>(tables.num_seqs)) {
    bad("q " + shape_of(q) + " has " + std::to_string(q.shape(0)) + " rows, the tables " +
        std::to_string(tables.num_seqs) + " sequences");
  }
  const KVLayerView cache = pool_view(k, v, parse_layout(layout));
  const AttentionParams params = params_for(q, cache, scale, window, sinks);
  std::span<float> o;
  nb::object result = output_for(q, out, o);
  const std::span<const float> qs(static_cast<const float*>(q.data()), q.size());
  {
    nb::gil_scoped_release no_gil;
    paged_decode_attention(params, cache, tables, qs, o);
  }
  return result;
}

nb::object prefill(const Any& q, const Any& k, std::optional<Any> v, const BlockTableView& tables,
                   std::span<const int32_t> query_start, const std::string& layout, float scale,
                   int32_t window, int32_t sinks, std::optional<Any> out) {
  check_dense("q", q, 3, nb::dlpack::dtype_code::Float, 32, "float32 [num_tokens, heads, dim]");
  const KVLayerView cache = pool_view(k, v, parse_layout(layout));
  const AttentionParams params = params_for(q, cache, scale, window, sinks);
  std::span<float> o;
  nb::object result = output_for(q, out, o);
  const std::span<const float> qs(static_cast<const float*>(q.data()), q.size());
  {
    nb::gil_scoped_release no_gil;
    paged_prefill_attention(params, cache, tables, query_start, qs, o);
  }
  return result;
}

void write(const Any& key, const Any& value, const Any& k, std::optional<Any> v,
           const Any& slot_mapping, const std::string& layout) {
  const KVLayerView cache = pool_view(k, v, parse_layout(layout));
  check_dense("slot_mapping", slot_mapping, 1, nb::dlpack::dtype_code::Int, 64,
              "int64 [num_tokens]");
  const char* shape = "float32 [num_tokens, kv_heads, head_dim]";
  check_dense("key", key, 3, nb::dlpack::dtype_code::Float, 32, shape);
  check_dense("value", value, 3, nb::dlpack::dtype_code::Float, 32, shape);
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
  const std::span<const float> ks(static_cast<const float*>(key.data()), key.size());
  const std::span<const float> vs(static_cast<const float*>(value.data()), value.size());
  nb::gil_scoped_release no_gil;
  reshape_and_cache(cache, slots, ks, vs);
}

// One view per layer: an item of `pools` is a (k_cache, v_cache) tuple or a combined pool.
std::vector<KVLayerView> layer_views(const nb::list& pools, const std::string& layout) {
  std::vector<KVLayerView> views;
  for (nb::handle item : pools) {
    if (nb::isinstance<nb::tuple>(item)) {
      const nb::tuple kv = nb::borrow<nb::tuple>(item);
      if (kv.size() != 2) bad("pools: a tuple item must be (k_cache, v_cache)");
      views.push_back(pool_view(nb::cast<Any>(kv[0]), nb::cast<Any>(kv[1]), parse_layout(layout)));
    } else {
      views.push_back(pool_view(nb::cast<Any>(item), std::nullopt, parse_layout(layout)));
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
  m.def("write_kv", &write, "key"_a, "value"_a, "k_cache"_a, "v_cache"_a.none(), "slot_mapping"_a,
        nb::kw_only(), "layout"_a = "NHD",
        "reshape_and_cache: writes key/value [num_tokens, kv_heads, head_dim] float32 to their "
        "slots of the pools (converted to the pools' dtype); negative slots are skipped.");
  m.def(
      "paged_decode_attention",
      [](const Any& q, const Any& k, std::optional<Any> v, const BatchMetadata& meta,
         const std::string& layout, float scale, int32_t window, int32_t sinks,
         std::optional<Any> out) {
        return decode(q, k, std::move(v), meta.padded.view(), layout, scale, window, sinks,
                      std::move(out));
      },
      "q"_a, "k_cache"_a, "v_cache"_a.none(), "meta"_a, nb::kw_only(), "layout"_a = "NHD",
      "scale"_a = 0.0f, "window_left"_a = -1, "sink_tokens"_a = 0, "out"_a = nb::none());
  m.def(
      "paged_decode_attention",
      [](const Any& q, const Any& k, std::optional<Any> v, const Any& block_tables,
         const Any& seq_lens, const std::string& layout, float scale, int32_t window, int32_t sinks,
         std::optional<Any> out) {
        const KVLayerView cache = pool_view(k, v, parse_layout(layout));
        return decode(q, k, std::move(v), tables_from(block_tables, seq_lens, cache), layout, scale,
                      window, sinks, std::move(out));
      },
      "q"_a, "k_cache"_a, "v_cache"_a.none(), "block_tables"_a, "seq_lens"_a, nb::kw_only(),
      "layout"_a = "NHD", "scale"_a = 0.0f, "window_left"_a = -1, "sink_tokens"_a = 0,
      "out"_a = nb::none());
  m.def(
      "paged_prefill_attention",
      [](const Any& q, const Any& k, std::optional<Any> v, const BatchMetadata& meta,
         const std::string& layout, float scale, int32_t window, int32_t sinks,
         std::optional<Any> out) {
        return prefill(q, k, std::move(v), meta.padded.view(), meta.query_start, layout, scale,
                       window, sinks, std::move(out));
      },
      "q"_a, "k_cache"_a, "v_cache"_a.none(), "meta"_a, nb::kw_only(), "layout"_a = "NHD",
      "scale"_a = 0.0f, "window_left"_a = -1, "sink_tokens"_a = 0, "out"_a = nb::none());
}

}  // namespace pagedkv::py
