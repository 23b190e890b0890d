#pragma once
/// @file pools.hpp
/// Argument checks of the ops on the engine's pools (python/src/ops.cpp): DLPack arrays of any
/// framework, their dtypes, and the KVLayerView built from a pool's own shape and strides,
/// 8-bit pools with their scales included, and the device all arrays of one call share (the
/// CPU or one CUDA device). Every failed check is a ValueError naming the argument.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv::py {

namespace nb = nanobind;

/// Any DLPack array (numpy, torch, ...), checked by hand so that errors name the argument.
using Any = nb::ndarray<>;

/// "(2, 3)" / "(4,)": an array's shape for messages.
std::string shape_of(const Any& a);
/// "float16", "bfloat16", "uint8", ...: an array's dtype for messages.
std::string dtype_of(const Any& a);
/// Throws nb::value_error(msg) (ValueError).
[[noreturn]] void bad(const std::string& msg);
/// True if a's elements are `code` of `bits` bits, one lane.
bool is(const Any& a, nb::dlpack::dtype_code code, int bits);
/// "the CPU", "cuda:1" or "DLPack device type 3": where an array lives, for messages.
std::string device_of(const Any& a);
/// `obj` as an array argument; TypeError naming it (`name`, e.g. "pools[1][0]") when it is
/// none: no __dlpack__ / buffer, or a read-only array (the ops take writable arrays), never
/// nanobind's bare std::bad_cast.
Any array_arg(const std::string& name, nb::handle obj);
/// ValueError unless a is on the CPU (`why` ends the message: what reads it there).
void check_cpu(const char* name, const Any& a, const char* why);

/// Where the arrays of one call live: the CPU or one CUDA device.
struct Place {
  bool cuda = false;      ///< a CUDA device (DLPack kDLCUDA), else the CPU
  int32_t device_id = 0;  ///< the CUDA device's ordinal (0 on the CPU)
};
/// One argument of a call for place_of: its name in messages, and the array (null: an optional
/// argument not given, skipped).
struct Named {
  std::string name;
  const Any* array = nullptr;
};
/// The place shared by every given array. Errors: ValueError naming the array if one is on
/// another DLPack device type than CPU and CUDA; if it is on another device than the first
/// array (both named, both devices: "k_cache is on cuda:1 but q is on cuda:0"), a CPU array
/// among CUDA ones included; or, in a build without CUDA, if it is a CUDA array ("this
/// pagedkv was built without CUDA"). An empty list is the CPU.
Place place_of(const std::vector<Named>& arrays);

/// ValueError unless a is a C-contiguous array (on any device: place_of checks devices) of
/// `ndim` dims of the given element type (`what` describes the expected shape and dtype in the
/// message).
void check_dense(const char* name, const Any& a, size_t ndim, nb::dlpack::dtype_code code, int bits,
                 const char* what);
/// "NHD" or "HND"; ValueError naming anything else.
KVLayout parse_layout(const std::string& layout);
/// A q / out dtype: float32, float16 or bfloat16; ValueError naming the array and its dtype.
DType activation_dtype(const char* name, const Any& a);
/// The DLPack dtype of an activation dtype (fp32, fp16, bf16).
nb::dlpack::dtype dlpack_dtype(DType dtype);

/// The storage arguments of an op on 8-bit pools: kv_dtype names the format where the tensor's
/// dtype does not (uint8: fp8_e4m3 or fp8_e5m2); k_scale / v_scale float32 [1] (per tensor) or
/// [num_kv_heads] (per head), x = stored * scale.
struct QuantArgs {
  std::optional<std::string> kv_dtype;
  std::optional<Any> k_scale;
  std::optional<Any> v_scale;
};

/// Reads a float32 [n] array that is not in host memory into host memory (the CUDA ops: a copy
/// on their stream, waited for), so that pool_view checks CUDA scales as it checks CPU ones.
using DeviceFloats = std::function<std::vector<float>(const Any&)>;

/// One layer's pools as the kernels read them, with the scales the view points to.
struct Pool {
  KVLayerView base;            ///< view without scale pointers
  std::vector<float> k_scale;  ///< [num_kv_heads] for 8-bit pools, else empty
  std::vector<float> v_scale;  ///< as k_scale
  /// base with k_scale / v_scale pointing into this object (valid while it lives).
  [[nodiscard]] KVLayerView view() const {
    KVLayerView v = base;
    if (!k_scale.empty()) v.k_scale = k_scale.data();
    if (!v_scale.empty()) v.v_scale = v_scale.data();
    return v;
  }
};

/// The view of one layer's pools. Separate pools (v given): k, v [blocks, bs, heads, dim] (NHD)
/// or [blocks, heads, bs, dim] (HND), same dtype, shape and strides. Combined (v None):
/// k [blocks, 2, bs, heads, dim] (NHD) or [blocks, 2, heads, bs, dim] (HND), index 1 = V.
/// Element types: float32 / float16 / bfloat16; int8 (kv_dtype None or "int8"); uint8 with
/// kv_dtype "fp8_e4m3" or "fp8_e5m2". With `scaled` (attention, write) an 8-bit pool needs
/// k_scale and v_scale, each value finite and > 0; without it (block copies: bytes are bytes) a
/// uint8 pool needs no kv_dtype and scales are not read.
/// Errors: ValueError naming the argument: a wrong dims count, shape, dtype or stride, a
/// kv_dtype that disagrees with the tensor's dtype, a missing kv_dtype for uint8, a missing or
/// wrongly shaped scale, a scale that is zero, negative, NaN or inf, or scales for a float pool.
/// Scales in device memory are read with `device_floats` (ValueError without one); the Pool's
/// k_scale / v_scale are host copies either way.
Pool pool_view(const Any& k, const std::optional<Any>& v, KVLayout layout, const QuantArgs& quant,
               bool scaled, const DeviceFloats& device_floats = {});

}  // namespace pagedkv::py
