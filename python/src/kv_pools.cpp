// pagedkv.KVPools: the engine's pools of every layer, imported once (FlashInfer's wrapper
// objects hold their workspace and plan the same way: the fixed arguments once, then one cheap
// call per layer). The free ops (ops.cpp) import every array through DLPack on every call,
// which costs about 1 us per torch 1.13 tensor (its __dlpack__ is Python code); a per-layer
// call here imports only q and out (attention) or key, value and slot_mapping (write_kv).
//
// Held: each pool as nanobind imported it (the DLPack handle keeps the tensor's memory alive
// while this object lives) and, for CPU pools, the KVLayerView built from its shape and strides
// (with host copies of 8-bit scales) by the same checks as the free ops (pools.cpp). CUDA pools
// go to the CUDA flows of cuda_ops.hpp with the held arrays on every call, as the free ops do.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "cuda_ops.hpp"
#include "ops.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pools.hpp"

namespace pagedkv::py {

namespace {

using namespace nb::literals;
using StreamArg = std::optional<uintptr_t>;

/// torch.Tensor once torch is imported (looked up until it is; invalid before).
nb::handle torch_tensor_type() {
  static nb::handle type;  // under the GIL; a type lives as long as its module: no reference
  if (!type.is_valid()) {
    PyObject* module = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");
    if (module != nullptr) type = nb::handle(module).attr("Tensor");
  }
  return type;
}

/// An array argument taken as an object: TypeError naming it when it is no array. torch 1.13's
/// Tensor.__dlpack__ is Python code (about 1 us a call) whose last step is torch._C._to_dlpack;
/// for a plain torch.Tensor (not a subclass, which may override it) that does not require grad
/// (which __dlpack__ refuses), this calls that step directly: the same capsule in about half
/// the time. Anything else is imported as nanobind does it (its __dlpack__). Only for CPU pools
/// (`fast`): such an array has no Python owner, so it must never be handed back to Python (the
/// CUDA flows return their out array).
Any to_array(const char* name, nb::handle obj, bool fast = false) {
  // torch._C._to_dlpack, looked up once torch is imported; a reference kept for the process
  // (a static must not decref at exit). Under the GIL.
  static nb::handle to_dlpack;
  const nb::handle tensor_type = torch_tensor_type();
  if (!to_dlpack.is_valid() && tensor_type.is_valid()) {
    to_dlpack = nb::object(nb::module_::import_("torch").attr("_C").attr("_to_dlpack")).release();
  }
  Any a;
  if (fast && tensor_type.is_valid() && obj.type().is(tensor_type)) {
    if (nb::cast<bool>(obj.attr("requires_grad"))) {
      throw nb::type_error((std::string(name) +
                            ": a torch tensor that requires grad (DLPack refuses it): pass " +
                            name + ".detach()")
                               .c_str());
    }
    if (nb::try_cast<Any>(to_dlpack(obj), a)) return a;
  }
  return array_arg(name, obj);
}

/// A per-layer argument that is None, one array for every layer, or a list of one per layer.
std::optional<Any> per_layer(nb::handle obj, size_t layer, size_t num_layers, const char* name) {
  if (obj.is_none()) return std::nullopt;
  if (nb::isinstance<nb::list>(obj) || nb::isinstance<nb::tuple>(obj)) {
    if (nb::len(obj) != num_layers) {
      bad(std::string(name) + ": a list of " + std::to_string(nb::len(obj)) + " for " +
          std::to_string(num_layers) + " layers of pools");
    }
    return array_arg(std::string(name) + "[" + std::to_string(layer) + "]", obj[layer]);
  }
  return array_arg(name, obj);
}

class KVPools {
 public:
  KVPools(const KVPools&) = delete;  // views point into the layers' own scale vectors
  KVPools& operator=(const KVPools&) = delete;
  KVPools(const nb::list& pools, const std::string& layout, std::optional<std::string> kv_dtype,
          nb::handle k_scale, nb::handle v_scale)
      : layout_(layout) {
    const KVLayout parsed = parse_layout(layout);
    const size_t n = nb::len(pools);
    if (n == 0) bad("pools: empty (one (k_cache, v_cache) tuple or combined pool per layer)");
    std::vector<Named> named;
    layers_.reserve(n);
    for (size_t l = 0; l < n; ++l) {
      Layer layer;
      const nb::handle item = pools[l];
      const std::string at = "pools[" + std::to_string(l) + "]";
      nb::handle k = item;
      nb::handle v;
      if (nb::isinstance<nb::tuple>(item)) {
        const nb::tuple kv = nb::borrow<nb::tuple>(item);
        if (kv.size() != 2) bad(at + ": a tuple item must be (k_cache, v_cache)");
        k = kv[0];
        v = kv[1];
        layer.v = array_arg(at + "[1]", kv[1]);
      }
      layer.k = array_arg(layer.v ? at + "[0]" : at, k);
      if (l == 0) first_pool_ = nb::borrow(k);
      layer.torch_data = {{nb::borrow(k), layer.k.data(), layer.v ? at + "[0]" : at}};
      if (layer.v) layer.torch_data.push_back({nb::borrow(v), layer.v->data(), at + "[1]"});
      std::erase_if(layer.torch_data, [](const TorchData& t) { return !is_torch(t.tensor); });
      layer.quant = {kv_dtype, per_layer(k_scale, l, n, "k_scale"),
                     per_layer(v_scale, l, n, "v_scale")};
      layers_.push_back(std::move(layer));
    }
    // Devices after every import (the vector no longer moves): all on one device.
    for (size_t l = 0; l < n; ++l) {
      const Layer& layer = layers_[l];
      const std::string at = "pools[" + std::to_string(l) + "]";
      named.push_back({layer.v ? at + "[0]" : at, &layer.k});
      if (layer.v) named.push_back({at + "[1]", &*layer.v});
      if (layer.quant.k_scale) named.push_back({"k_scale", &*layer.quant.k_scale});
      if (layer.quant.v_scale) named.push_back({"v_scale", &*layer.quant.v_scale});
    }
    place_ = place_of(named);
    for (Layer& layer : layers_) {
      // CUDA pools: geometry checked here, scales read on every call (the CUDA flows' own
      // pool_view); CPU pools: the whole view, scales included, once.
      layer.pool = pool_view(layer.k, layer.v, parsed, layer.quant, /*scaled=*/!place_.cuda);
      views_.push_back(layer.pool.base);
    }
    for (const Layer& layer : layers_) {
      const KVLayerView& a = layer.pool.base;
      const KVLayerView& b = layers_[0].pool.base;
      if (a.dtype != b.dtype || a.num_blocks != b.num_blocks || a.block_size != b.block_size ||
          a.num_kv_heads != b.num_kv_heads || a.head_dim != b.head_dim) {
        bad("pools: every layer needs pools[0]'s dtype and geometry (blocks, block_size, "
            "kv_heads, head_dim)");
      }
    }
    for (Layer& layer : layers_) layer.view = layer.pool.view();
  }

  [[nodiscard]] size_t num_layers() const { return layers_.size(); }
  [[nodiscard]] const KVLayerView& geometry() const { return layers_[0].view; }
  [[nodiscard]] bool cuda() const { return place_.cuda; }
  [[nodiscard]] const std::string& layout() const { return layout_; }

  nb::object attend(int32_t layer, const Any& q, const BatchMetadata& meta, bool prefill,
                    AttentionArgs& args, [[maybe_unused]] StreamArg stream) {
    const Layer& l = at(layer);
    check_unmoved(l);
    check_place({{"q", &q}, {"out", args.out ? &*args.out : nullptr}});
    std::optional<std::span<const int32_t>> query_start;
    if (prefill) query_start = std::span<const int32_t>(meta.query_start);
#if PAGEDKV_WITH_CUDA
    if (place_.cuda) {
      args.layout = layout_;
      args.quant = l.quant;
      stream = cuda_stream(stream);
      if (!args.out) args.out = cuda_out(q);
      return cuda_attend(q, l.k, l.v, {meta.padded.view(), false, query_start}, args,
                         place_.device_id, stream);
    }
#endif
    return attend_cpu(q, l.view, meta.padded.view(), query_start, args);
  }

  void write_kv(int32_t layer, const Any& key, const Any& value, const Any& slot_mapping,
                [[maybe_unused]] StreamArg stream) {
    const Layer& l = at(layer);
    check_unmoved(l);
    check_place({{"key", &key}, {"value", &value}, {"slot_mapping", &slot_mapping}});
#if PAGEDKV_WITH_CUDA
    if (place_.cuda) {
      cuda_write_kv(key, value, l.k, l.v, slot_mapping, layout_, l.quant, place_.device_id,
                    cuda_stream(stream));
      return;
    }
#endif
    write_cpu(key, value, l.view, slot_mapping);
  }

  void copy(const Any& block_copies, [[maybe_unused]] StreamArg stream) {
    const std::span<const BlockCopy> pairs = pairs_of(block_copies);
    for (const Layer& l : layers_) check_unmoved(l);
#if PAGEDKV_WITH_CUDA
    if (place_.cuda) {
      cuda_copy_blocks({views_, true}, {views_, true}, pairs, true, place_.device_id,
                       cuda_stream(stream));
      return;
    }
#endif
    nb::gil_scoped_release no_gil;
    for (const KVLayerView& v : views_) copy_blocks(v, v, pairs);
  }

 private:
  /// A torch pool as given and where its data was when imported. torch's resize_() and set_()
  /// move a tensor's data and free the old memory, which the DLPack handle does not keep alive:
  /// every call checks data_ptr() (about 0.1 us a pool) and refuses a moved pool.
  struct TorchData {
    nb::object tensor;
    const void* data;
    std::string name;  // "pools[i]" or "pools[i][0]" / "pools[i][1]"
  };
  static bool is_torch(nb::handle obj) {
    const nb::handle type = torch_tensor_type();
    return type.is_valid() && PyObject_IsInstance(obj.ptr(), type.ptr()) == 1;
  }
  struct Layer {
    Any k;
    std::optional<Any> v;
    std::vector<TorchData> torch_data;  // the layer's torch pools (none for numpy)
    QuantArgs quant;
    Pool pool;         // geometry, and host scales of a CPU 8-bit pool
    KVLayerView view;  // pool.view(): points into pool's scales
  };

  static void check_unmoved(const Layer& l) {
    for (const TorchData& t : l.torch_data) {
      const auto now = nb::cast<uintptr_t>(t.tensor.attr("data_ptr")());
      if (now != reinterpret_cast<uintptr_t>(t.data)) {
        bad(t.name + ": the torch tensor's data moved since KVPools imported it (from " +
            std::to_string(reinterpret_cast<uintptr_t>(t.data)) + " to " + std::to_string(now) +
            ": resize_() or set_()?), and its old memory may be freed: build a new KVPools");
      }
    }
  }

  const Layer& at(int32_t layer) const {
    if (layer < 0 || static_cast<size_t>(layer) >= layers_.size()) {
      bad("layer = " + std::to_string(layer) + " is outside [0, " + std::to_string(layers_.size()) +
          ")");
    }
    return layers_[static_cast<size_t>(layer)];
  }

  // The call's arrays must be where the pools are (place_of's messages, the pools named
  // first); the common case, all there, costs no message strings.
  void check_place(std::initializer_list<std::pair<const char*, const Any*>> arrays) const {
    const Any& pool = layers_[0].k;
    bool same = true;
    for (const auto& [name, a] : arrays) {
      same = same && (a == nullptr || (a->device_type() == pool.device_type() &&
                                       a->device_id() == pool.device_id()));
    }
    if (same) return;
    std::vector<Named> all{{"pools[0]", &pool}};
    for (const auto& [name, a] : arrays) all.push_back({name, a});
    (void)place_of(all);
  }

#if PAGEDKV_WITH_CUDA
  // The free ops' defaults for torch CUDA pools (pagedkv/_ops.py): torch's current stream on
  // the pools' device, and out = a new tensor of q's shape and dtype there. Other CUDA arrays:
  // the legacy default stream, and out required (cuda_attend says so).
  StreamArg cuda_stream(StreamArg stream) const {
    if (stream) return stream;
    const nb::object s =
        nb::module_::import_("pagedkv._ops").attr("current_stream")(nb::make_tuple(first_pool_));
    return s.is_none() ? StreamArg{} : StreamArg{nb::cast<uintptr_t>(s)};
  }
  std::optional<Any> cuda_out(const Any& q) const {
    const nb::object t =
        nb::module_::import_("pagedkv._ops")
            .attr("empty_like_pool")(
                first_pool_, nb::make_tuple(q.shape(0), q.shape(1), q.shape(2)), dtype_of(q));
    if (t.is_none()) return std::nullopt;
    return nb::cast<Any>(t);
  }
#endif

  nb::object first_pool_;  // pools[0]'s K (or combined) pool as given: torch's device
  std::string layout_;
  std::vector<Layer> layers_;
  std::vector<KVLayerView> views_;  // [num_layers] without scales: block copies move bytes
  Place place_;
};

}  // namespace

void bind_kv_pools(nb::module_& m) {
  nb::class_<KVPools> cls(
      m, "KVPools",
      "The engine's pools of every layer, imported once: per-layer write_kv, decode and "
      "prefill calls then import only their activations (docs/python.md, 'KVPools').");
  cls.def(nb::init<const nb::list&, const std::string&, std::optional<std::string>, nb::handle,
                   nb::handle>(),
          "pools"_a, nb::kw_only(), "layout"_a = "NHD", "kv_dtype"_a = nb::none(),
          "k_scale"_a = nb::none(), "v_scale"_a = nb::none())
      .def_prop_ro("num_layers", &KVPools::num_layers)
      .def_prop_ro("layout", &KVPools::layout)
      .def_prop_ro("is_cuda", &KVPools::cuda)
      .def_prop_ro("num_blocks", [](const KVPools& p) { return p.geometry().num_blocks; })
      .def_prop_ro("block_size", [](const KVPools& p) { return p.geometry().block_size; })
      .def_prop_ro("num_kv_heads", [](const KVPools& p) { return p.geometry().num_kv_heads; })
      .def_prop_ro("head_dim", [](const KVPools& p) { return p.geometry().head_dim; })
      .def(
          "write_kv",
          [](KVPools& p, int32_t layer, nb::handle key, nb::handle value, const Any& slot_mapping,
             StreamArg stream) {
            const bool fast = !p.cuda();
            p.write_kv(layer, to_array("key", key, fast), to_array("value", value, fast),
                       slot_mapping, stream);
          },
          "layer"_a, "key"_a, "value"_a, "slot_mapping"_a, nb::kw_only(), "stream"_a = nb::none())
      .def("copy_blocks", &KVPools::copy, "block_copies"_a, nb::kw_only(), "stream"_a = nb::none());
  const auto attention = [](bool prefill) {
    // out is taken as the caller's object and returned as such (a numpy out stays the same
    // numpy array, a torch one the same tensor).
    return [prefill](KVPools& p, int32_t layer, nb::handle q_obj, const BatchMetadata& meta,
                     nb::object out, float scale, int32_t window, int32_t sinks, int32_t chunk,
                     StreamArg stream) {
      AttentionArgs args;
      const Any q = to_array("q", q_obj, !p.cuda());
      if (!out.is_none()) args.out = to_array("out", out, !p.cuda());
      args.scale = scale;
      args.window_left = window;
      args.sink_tokens = sinks;
      args.chunk_size = chunk;
      nb::object result = p.attend(layer, q, meta, prefill, args, stream);
      return out.is_none() ? result : out;
    };
  };
  for (const bool prefill : {false, true}) {
    cls.def(prefill ? "prefill" : "decode", attention(prefill), "layer"_a, "q"_a, "meta"_a,
            nb::kw_only(), "out"_a = nb::none(), "scale"_a = 0.0f, "window_left"_a = -1,
            "sink_tokens"_a = 0, "chunk_size"_a = 0, "stream"_a = nb::none());
  }
}

}  // namespace pagedkv::py
