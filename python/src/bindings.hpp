#pragma once
/// @file bindings.hpp
/// Shared pieces of the nanobind module pagedkv._pagedkv (python/src): numpy arrays over C++
/// vectors without copying, argument checks that raise ValueError, and the manager wrapper that
/// serializes threads once the GIL is released.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::py {

namespace nb = nanobind;

/// A numpy array over `data` (product of `shape` elements) that keeps `owner` alive: the
/// results' properties are views of the C++ vectors inside the Python result object, made
/// only when read (an append that nobody reads the slots of costs no numpy array).
template <class T>
nb::ndarray<nb::numpy, T> view(nb::handle owner, T* data, std::initializer_list<size_t> shape) {
  // An empty vector has no buffer; numpy still wants a non-null, aligned pointer.
  static T empty_anchor{};
  return nb::ndarray<nb::numpy, T>(data ? data : &empty_anchor, shape, owner);
}

/// [n] view of a vector held by `owner`.
template <class T>
nb::ndarray<nb::numpy, T> view(nb::handle owner, std::vector<T>& v) {
  return view(owner, v.data(), {v.size()});
}

/// [n, 2] int32 view of (src, dst) block pairs held by `owner`: what copy_blocks takes.
nb::ndarray<nb::numpy, int32_t> copies_view(nb::handle owner, std::vector<BlockCopy>& copies);

/// A numpy array that owns a vector (moved into a capsule; nothing is copied).
template <class T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return view(owner, *heap);
}

/// Token ids from Python ints: ValueError naming the index and value of one outside int32.
std::vector<TokenId> to_token_ids(const std::vector<int64_t>& values, const char* what);

/// ValueError unless min <= value <= max (`what` names the argument).
void check_range(const char* what, int64_t value, int64_t min, int64_t max);

/// The manager as Python holds it: a mutex serializes calls, because calls that release the
/// GIL would otherwise let two Python threads into the unsynchronized C++ manager at once.
/// Rule: the mutex is never waited for while holding the GIL (no deadlock with a thread that
/// holds the mutex and wants the GIL back).
class PyManager {
 public:
  explicit PyManager(const KVCacheManagerConfig& config);

  /// Runs f(manager) under the mutex with the GIL released: for calls whose cost grows with
  /// their input (prompt hashing, batch tables, invariant checks).
  template <class F>
  auto released(F&& f) {
    nb::gil_scoped_release no_gil;
    std::lock_guard<std::mutex> lock(mutex_);
    return f(manager_);
  }
  /// Runs f(manager) under the mutex, keeping the GIL when the mutex is free (short calls:
  /// a GIL round trip would cost more than the call).
  template <class F>
  auto held(F&& f) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      nb::gil_scoped_release no_gil;
      lock.lock();
    }
    return f(manager_);
  }

 private:
  std::mutex mutex_;
  KVCacheManager manager_;
};

void bind_types(nb::module_& m);     // types.cpp: enums, configs, results, stats, events
void bind_manager(nb::module_& m);   // manager.cpp: KVCacheManager
void bind_ops(nb::module_& m);       // ops.cpp: paged attention on the engine's pools
void bind_kv_pools(nb::module_& m);  // kv_pools.cpp: KVPools, the pools imported once
void bind_testing(nb::module_& m);   // testing.cpp: the C++ HostKVCache path for the tests

}  // namespace pagedkv::py
