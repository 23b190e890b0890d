#pragma once
/// @file bindings.hpp
/// Shared pieces of the nanobind module pagedkv._pagedkv (python/src): numpy arrays that take
/// over C++ vectors without copying, argument checks that raise ValueError, the Python-side
/// result types, and the manager wrapper that serializes threads once the GIL is released.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::py {

namespace nb = nanobind;

/// A numpy array of any rank over a vector's buffer; the vector moves into a capsule that the
/// array owns, so building it copies nothing and runs no per-element Python code.
/// Shapes: the product of `shape` must equal v.size().
template <class T>
nb::object to_numpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  // An empty vector has no buffer; numpy still wants a non-null, aligned pointer.
  static T empty_anchor{};
  T* data = heap->empty() ? &empty_anchor : heap->data();
  return nb::cast(nb::ndarray<nb::numpy, T>(data, shape, owner));
}

/// [n] array of a vector.
template <class T>
nb::object to_numpy(std::vector<T>&& v) {
  const size_t n = v.size();
  return to_numpy(std::move(v), {n});
}

/// [n, 2] int32 array of (src, dst) block pairs: what copy_blocks / swap_blocks take.
nb::object copies_to_numpy(const std::vector<BlockCopy>& copies);

/// Token ids from Python ints: ValueError naming the index and value of one outside int32.
std::vector<TokenId> to_token_ids(const std::vector<int64_t>& values, const char* what);

/// ValueError unless 0 <= value <= max (`what` names the argument).
void check_range(const char* what, int64_t value, int64_t min, int64_t max);

/// Python view of AppendResult: slots [n] int64, copies [k, 2] int32.
struct PyAppendResult {
  nb::object slots;
  nb::object copies;
};
PyAppendResult to_python(AppendResult&& r);

/// Python view of AddResult.
struct PyAddResult {
  int64_t num_computed_tokens = 0;
  nb::object slots;
  nb::object copies;
};

/// Python view of BatchMetadata, the arrays under the names vLLM and FlashInfer use.
struct PyBatchMetadata {
  int32_t block_size = 0;
  int32_t num_seqs = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t num_blocks = 0;
  nb::object block_tables;            // [num_seqs, max_blocks_per_seq] int32, -1 padded
  nb::object seq_lens;                // [num_seqs] int32 (C++ context_lens)
  nb::object paged_kv_indptr;         // [num_seqs + 1] int32
  nb::object paged_kv_indices;        // [indptr[num_seqs]] int32
  nb::object paged_kv_last_page_len;  // [num_seqs] int32
  nb::object slot_mapping;            // [num_new_tokens_total] int64
  nb::object query_start_loc;         // [num_seqs + 1] int32 (FlashInfer: qo_indptr)
};
PyBatchMetadata to_python(BatchMetadata&& m);

/// Python view of PrefixLookup: blocks [num_computed_tokens / block_size] int32.
struct PyPrefixLookup {
  int64_t num_computed_tokens = 0;
  nb::object blocks;
};

/// Python view of SwapResult: copies [live blocks, 2] int32 (src, dst).
struct PySwapResult {
  nb::object copies;
};

/// Python view of PreemptedSequence: tokens [num_tokens] int32 when all were known, else [0].
struct PyPreemptedSequence {
  SeqId seq = 0;
  int64_t num_tokens = 0;
  nb::object tokens;
  uint64_t extra_key = 0;
};

/// Python view of KeptTokens: indptr [num_seqs + 1] int32, slots and positions [indptr[-1]]
/// int64.
struct PyKeptTokens {
  nb::object indptr;
  nb::object slots;
  nb::object positions;
};

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

void bind_types(nb::module_& m);    // types.cpp: enums, configs, results, stats, events
void bind_manager(nb::module_& m);  // manager.cpp: KVCacheManager

}  // namespace pagedkv::py
