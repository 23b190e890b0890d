#pragma once
/// @file cuda_ops.hpp
/// The CUDA flows of the ops on the engine's pools (cuda_ops.cpp, cuda_copies.cpp): the same
/// checks as the CPU flows (ops.hpp, pools.hpp), then the pagedkv::cuda launchers on the
/// caller's stream, with the arrays' device made current for the call. Declared and defined
/// only when pagedkv is built with CUDA; ops.cpp calls them after place_of found CUDA arrays.
///
/// Streams: `stream` is a cudaStream_t as a Python int (torch: `Tensor.cuda_stream` of
/// torch.cuda.current_stream(), what pagedkv's Python layer passes for torch tensors); None is
/// the legacy default stream. Everything is queued on it and the call returns without waiting,
/// except where a value must reach the host first (8-bit pools' scales are read back and
/// checked: one synchronization of the stream).

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ops.hpp"
#include "pools.hpp"

namespace pagedkv::py {

/// The tables of an attention call.
struct AttentionTables {
  /// Host pointers (a BatchMetadata's padded tables: checked on the host, uploaded per call) or
  /// device pointers (on_device: block_tables / seq_lens CUDA arrays, read in place, unchecked).
  BlockTableView tables;
  bool on_device = false;
  /// Prefill: the host query_start [num_seqs + 1] (host tables only); decode: none.
  std::optional<std::span<const int32_t>> query_start;
};

/// paged_decode_attention / paged_prefill_attention on CUDA arrays of device `device`: q
/// float32, float16 or bfloat16, out of q's dtype (ValueError naming both otherwise; the kernel
/// widens q and rounds out, computing in fp32), out required (ValueError: pagedkv allocates no
/// result on a device); returns out.
nb::object cuda_attend(const Any& q, const Any& k, const std::optional<Any>& v,
                       const AttentionTables& tables, AttentionArgs& args, int32_t device,
                       std::optional<uintptr_t> stream);

/// write_kv (cuda::reshape_and_cache) on CUDA arrays of device `device`.
void cuda_write_kv(const Any& key, const Any& value, const Any& k, const std::optional<Any>& v,
                   const Any& slot_mapping, const std::string& layout, const QuantArgs& quant,
                   int32_t device, std::optional<uintptr_t> stream);

/// The pools of every layer of one side of a block copy, and whether they are on the device.
struct CopySide {
  const std::vector<KVLayerView>& layers;
  bool cuda = false;
};

/// copy_blocks (same_pools: from and to are the same pools) or swap_blocks with at least one
/// side on device `device`: device <-> device, device -> host, host -> device. Pairs run in
/// order, as on the CPU. Errors: ValueError on layers that differ (dtype, block_size,
/// kv_heads, head_dim) or an id out of range (naming the pair), all checked before any copy.
void cuda_copy_blocks(const CopySide& from, const CopySide& to, std::span<const BlockCopy> pairs,
                      bool same_pools, int32_t device, std::optional<uintptr_t> stream);

}  // namespace pagedkv::py

#endif  // PAGEDKV_WITH_CUDA
