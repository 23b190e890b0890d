// Argument checks of the pool ops and the KVLayerView of an engine's pools (pools.hpp).
#include "pools.hpp"

#include <cmath>
#include <cstdio>
#include <string>

#include "pagedkv/config.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::py {

namespace {

bool c_contiguous(const Any& a) {
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

/// The storage dtype of a pool tensor: its own float dtype, int8, or uint8 + kv_dtype.
DType pool_dtype(const Any& k, const std::optional<std::string>& kv_dtype, bool scaled) {
  std::optional<DType> named;
  if (kv_dtype) {
    try {
      named = parse_dtype(*kv_dtype);
    } catch (const Error& e) {
      bad(std::string("kv_dtype: ") + e.what());
    }
  }
  DType own = DType::kF32;
  if (is(k, nb::dlpack::dtype_code::Float, 32)) {
    own = DType::kF32;
  } else if (is(k, nb::dlpack::dtype_code::Float, 16)) {
    own = DType::kF16;
  } else if (is(k, nb::dlpack::dtype_code::Bfloat, 16)) {
    own = DType::kBF16;
  } else if (is(k, nb::dlpack::dtype_code::Int, 8)) {
    own = DType::kInt8;
  } else if (is(k, nb::dlpack::dtype_code::UInt, 8)) {
    if (!named && !scaled) return DType::kFP8E4M3;  // a copy moves bytes: either fp8 will do
    if (!named || (*named != DType::kFP8E4M3 && *named != DType::kFP8E5M2)) {
      bad("k_cache is uint8: pass kv_dtype='fp8_e4m3' or 'fp8_e5m2' (the tensor's dtype does "
          "not say which fp8 format its bytes hold)" +
          (named ? std::string(", got kv_dtype='") + *kv_dtype + "'" : std::string()));
    }
    return *named;
  } else {
    bad("k_cache: dtype " + dtype_of(k) +
        " is not float32, float16, bfloat16, int8 or uint8 (fp8 bytes)");
  }
  if (named && *named != own) {
    bad("kv_dtype='" + *kv_dtype + "' does not match k_cache's dtype " + dtype_of(k) +
        (dtype_is_quantized(*named) && *named != DType::kInt8 ? " (fp8 pools are uint8 tensors)"
                                                              : ""));
  }
  return own;
}

std::string number(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
  return buf;
}

/// k_scale / v_scale of an 8-bit pool: float32 [1] or [num_kv_heads], finite and > 0, as
/// [num_kv_heads] (a per-tensor scale repeated per head).
std::vector<float> scales_for(const char* name, const std::optional<Any>& a, DType dtype,
                              int32_t num_kv_heads, const DeviceFloats& device_floats) {
  const std::string heads = std::to_string(num_kv_heads);
  if (!a) {
    bad(std::string(name) + " is required for an 8-bit pool (" + std::string(dtype_name(dtype)) +
        "): float32 [1] (per tensor) or [" + heads + "] (per kv head)");
  }
  if (a->ndim() != 1 || !is(*a, nb::dlpack::dtype_code::Float, 32) ||
      (a->shape(0) != 1 && a->shape(0) != static_cast<size_t>(num_kv_heads))) {
    bad(std::string(name) + ": expected float32 [1] or [" + heads + "] (num_kv_heads), got " +
        dtype_of(*a) + " of shape " + shape_of(*a));
  }
  std::vector<float> out(static_cast<size_t>(num_kv_heads));
  std::vector<float> copied;  // the values of a device array, read to the host
  if (a->device_type() != nb::device::cpu::value) {
    if (!device_floats) check_cpu(name, *a, "its values are read on the host");
    copied = device_floats(*a);
  }
  const auto* data = copied.empty() ? static_cast<const float*>(a->data()) : copied.data();
  const int64_t stride = copied.empty() ? a->stride(0) : 1;
  for (size_t h = 0; h < out.size(); ++h) {
    const size_t i = a->shape(0) == 1 ? 0 : h;
    const float s = data[static_cast<int64_t>(i) * stride];
    if (!(std::isfinite(s) && s > 0.0f)) {
      bad(std::string(name) + "[" + std::to_string(i) + "] = " + number(s) +
          " is not finite and > 0");
    }
    out[h] = s;
  }
  return out;
}

void check_same_pools(const Any& k, const Any& v) {
  bool same = v.ndim() == k.ndim() && v.dtype() == k.dtype();
  for (size_t i = 0; same && i < k.ndim(); ++i)
    same = v.shape(i) == k.shape(i) && v.stride(i) == k.stride(i);
  if (!same) {
    bad("v_cache (" + dtype_of(v) + " " + shape_of(v) + ") differs from k_cache (" + dtype_of(k) +
        " " + shape_of(k) + ") in dtype, shape or strides");
  }
}

}  // namespace

std::string shape_of(const Any& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

void bad(const std::string& msg) { throw nb::value_error(msg.c_str()); }

Any array_arg(const std::string& name, nb::handle obj) {
  Any a;
  if (nb::try_cast<Any>(obj, a)) return a;
  const bool read_only = nb::hasattr(obj, "flags") && nb::hasattr(obj.attr("flags"), "writeable") &&
                         !nb::cast<bool>(obj.attr("flags").attr("writeable"));
  throw nb::type_error((name +
                        ": expected a writable array (numpy, torch, any object with "
                        "__dlpack__), got " +
                        (read_only ? std::string("a read-only ") : std::string()) +
                        nb::type_name(obj.type()).c_str())
                           .c_str());
}

std::string device_of(const Any& a) {
  if (a.device_type() == nb::device::cpu::value) return "the CPU";
  if (a.device_type() == nb::device::cuda::value) return "cuda:" + std::to_string(a.device_id());
  return "DLPack device type " + std::to_string(a.device_type());
}

void check_cpu(const char* name, const Any& a, const char* why) {
  if (a.device_type() != nb::device::cpu::value)
    bad(std::string(name) + " is on " + device_of(a) + ": it must be a CPU array (" + why + ")");
}

Place place_of(const std::vector<Named>& arrays) {
  const Named* first = nullptr;
  for (const Named& n : arrays) {
    if (!n.array) continue;
    const Any& a = *n.array;
    const bool cuda = a.device_type() == nb::device::cuda::value;
    if (!cuda && a.device_type() != nb::device::cpu::value) {
      bad(n.name + " is on " + device_of(a) + ": pagedkv takes CPU and CUDA arrays");
    }
    if (cuda && !PAGEDKV_WITH_CUDA) {
      bad(n.name + " is a CUDA array (" + device_of(a) +
          "): this pagedkv was built without CUDA (PAGEDKV_WITH_CUDA=0); build it with a CUDA "
          "compiler, or pass CPU arrays");
    }
    if (!first) {
      first = &n;
    } else if (a.device_type() != first->array->device_type() ||
               (cuda && a.device_id() != first->array->device_id())) {
      bad(n.name + " is on " + device_of(a) + " but " + first->name + " is on " +
          device_of(*first->array) +
          " (all arrays of one call must be on one device: no CPU and CUDA mix)");
    }
  }
  if (!first || first->array->device_type() != nb::device::cuda::value) return {};
  return {true, static_cast<int32_t>(first->array->device_id())};
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

void check_dense(const char* name, const Any& a, size_t ndim, nb::dlpack::dtype_code code, int bits,
                 const char* what) {
  if (a.ndim() != ndim || !is(a, code, bits)) {
    bad(std::string(name) + ": expected " + what + ", got " + dtype_of(a) + " of shape " +
        shape_of(a));
  }
  if (!c_contiguous(a)) bad(std::string(name) + " must be C-contiguous");
}

KVLayout parse_layout(const std::string& layout) {
  if (layout == "NHD") return KVLayout::kNHD;
  if (layout == "HND") return KVLayout::kHND;
  bad("layout = '" + layout + "' is not 'NHD' or 'HND'");
}

DType activation_dtype(const char* name, const Any& a) {
  if (is(a, nb::dlpack::dtype_code::Float, 32)) return DType::kF32;
  if (is(a, nb::dlpack::dtype_code::Float, 16)) return DType::kF16;
  if (is(a, nb::dlpack::dtype_code::Bfloat, 16)) return DType::kBF16;
  bad(std::string(name) + ": dtype " + dtype_of(a) + " is not float32, float16 or bfloat16");
}

nb::dlpack::dtype dlpack_dtype(DType dtype) {
  if (dtype == DType::kF32) return nb::dtype<float>();
  const auto code =
      dtype == DType::kF16 ? nb::dlpack::dtype_code::Float : nb::dlpack::dtype_code::Bfloat;
  return {static_cast<uint8_t>(code), 16, 1};
}

Pool pool_view(const Any& k, const std::optional<Any>& v, KVLayout layout, const QuantArgs& quant,
               bool scaled, const DeviceFloats& device_floats) {
  const size_t first = v ? 1 : 2;  // dim of block_size or heads after [blocks(, 2)]
  if (k.ndim() != first + 3) {
    bad(std::string("k_cache: expected ") +
        (v ? "4 dims (separate K and V pools)" : "5 dims [num_pages, 2, ...] (v_cache None)") +
        ", got shape " + shape_of(k));
  }
  if (v) {
    check_same_pools(k, *v);
  } else if (k.shape(1) != 2) {
    bad("k_cache: a combined pool has 2 at dim 1 (K, V), got shape " + shape_of(k));
  }
  for (size_t i = 0; i < k.ndim(); ++i) {
    if (k.stride(i) < 0) bad("k_cache: negative stride at dim " + std::to_string(i));
  }
  if (k.stride(k.ndim() - 1) != 1) bad("k_cache: head_dim (the last dim) must be contiguous");
  const size_t tok = layout == KVLayout::kNHD ? first : first + 1;
  const size_t head = layout == KVLayout::kNHD ? first + 1 : first;
  Pool pool;
  KVLayerView& view = pool.base;
  view.dtype = pool_dtype(k, quant.kv_dtype, scaled);
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
  if (scaled && dtype_is_quantized(view.dtype)) {
    pool.k_scale =
        scales_for("k_scale", quant.k_scale, view.dtype, view.num_kv_heads, device_floats);
    pool.v_scale =
        scales_for("v_scale", quant.v_scale, view.dtype, view.num_kv_heads, device_floats);
  } else if (scaled && (quant.k_scale || quant.v_scale)) {
    bad(std::string(quant.k_scale ? "k_scale" : "v_scale") +
        " is for the 8-bit pools (fp8_e4m3, fp8_e5m2, int8), k_cache is " + dtype_of(k));
  }
  return pool;
}

}  // namespace pagedkv::py
