// The CUDA flow of copy_blocks and swap_blocks (cuda_ops.hpp). copy_blocks on device pools is
// one cuda::copy_blocks launch per distinct block size when the pairs are independent (no
// destination repeated, no block both read and written) and every pool is [num_blocks,
// block bytes]; anything else (swaps, a host side, chained pairs, padded layouts) is one
// cudaMemcpyAsync per block, pool and pair (2D per head where the two layouts differ), queued
// in the CPU path's order, as vLLM's swap_blocks does.
#include "cuda_ops.hpp"

#if PAGEDKV_WITH_CUDA

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "device_call.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::py {

namespace {

// Elements of one block's K (or V): block_size x kv_heads x head_dim.
int64_t block_elems(const KVLayerView& v) {
  return int64_t{v.block_size} * v.num_kv_heads * v.head_dim;
}

// True when a block's K (and V) elements are one dense run (NHD or HND without padding; the
// stride of a dim of size 1 is free).
bool dense_block(const KVLayerView& v) {
  const int64_t d = v.head_dim;
  const int64_t tok = v.block_size == 1 ? -1 : v.token_stride;
  const int64_t head = v.num_kv_heads == 1 ? -1 : v.head_stride;
  const bool nhd = (tok < 0 || tok == v.num_kv_heads * d) && (head < 0 || head == d);
  const bool hnd = (head < 0 || head == v.block_size * d) && (tok < 0 || tok == d);
  return nhd || hnd;
}

void check_layers(const std::vector<KVLayerView>& from, const std::vector<KVLayerView>& to,
                  std::span<const BlockCopy> pairs) {
  for (size_t l = 0; l < from.size(); ++l) {
    const KVLayerView& a = from[l];
    const KVLayerView& b = to[l];
    const std::string at = "layer " + std::to_string(l);
    if (dtype_size(a.dtype) != dtype_size(b.dtype) || a.block_size != b.block_size ||
        a.num_kv_heads != b.num_kv_heads || a.head_dim != b.head_dim) {
      throw Error(at +
                  ": the source and destination pools differ in dtype size, block_size, kv_heads "
                  "or head_dim");
    }
    for (const KVLayerView* v : {&a, &b}) {
      if (v->block_size > 1 && v->token_stride < v->head_dim)
        throw Error(at + ": a token stride below head_dim (overlapping rows) cannot be copied");
    }
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (pairs[i].src < 0 || pairs[i].src >= a.num_blocks || pairs[i].dst < 0 ||
          pairs[i].dst >= b.num_blocks) {
        throw Error("block_copies[" + std::to_string(i) + "] = (" + std::to_string(pairs[i].src) +
                    ", " + std::to_string(pairs[i].dst) + ") is outside the pools' [0, " +
                    std::to_string(a.num_blocks) + ") / [0, " + std::to_string(b.num_blocks) +
                    ") (" + at + ")");
      }
    }
  }
}

// One block of one pool (K or V): `src` / `dst` point at block 0 of that pool.
void copy_block(DeviceCall& call, const KVLayerView& a, const void* src, const KVLayerView& b,
                void* dst, const BlockCopy& pair, CopyKind kind) {
  const int64_t es = dtype_size(a.dtype);
  const auto* from = static_cast<const std::byte*>(src);
  auto* to = static_cast<std::byte*>(dst);
  const bool same_runs = dense_block(a) && dense_block(b) && a.token_stride == b.token_stride &&
                         a.head_stride == b.head_stride;
  if (same_runs) {
    call.copy_rows(to + b.offset(pair.dst, 0, 0) * es, 0, from + a.offset(pair.src, 0, 0) * es, 0,
                   block_elems(a) * es, 1, kind);
    return;
  }
  for (int32_t h = 0; h < a.num_kv_heads; ++h) {  // block_size rows of head_dim per head
    call.copy_rows(to + b.offset(pair.dst, h, 0) * es, b.token_stride * es,
                   from + a.offset(pair.src, h, 0) * es, a.token_stride * es, a.head_dim * es,
                   a.block_size, kind);
  }
}

// True when no pair reads a block another pair writes and no destination repeats (src == dst
// pairs dropped): then all pairs may run at once, as cuda::copy_blocks runs them.
bool independent(std::span<const BlockCopy> pairs, std::vector<BlockCopy>& kept) {
  std::set<BlockId> srcs;
  std::set<BlockId> dsts;
  for (const BlockCopy& p : pairs) {
    if (p.src == p.dst) continue;
    if (!dsts.insert(p.dst).second) return false;
    srcs.insert(p.src);
    kept.push_back(p);
  }
  return std::none_of(srcs.begin(), srcs.end(), [&](BlockId b) { return dsts.count(b) > 0; });
}

// The pools of the layers as cuda::copy_blocks sees them, by block bytes: a combined pool whose
// V follows K in each block is one pool of both; separate (or split) K and V are two. False if
// a pool is not [num_blocks, block bytes] (padding between blocks, or not one dense run).
bool pools_by_size(const std::vector<KVLayerView>& layers,
                   std::map<int64_t, std::vector<void*>>& pools) {
  for (const KVLayerView& v : layers) {
    if (!dense_block(v)) return false;
    const int64_t es = dtype_size(v.dtype);
    const int64_t n = block_elems(v);
    if (v.block_stride == 2 * n &&
        static_cast<std::byte*>(v.v) == static_cast<std::byte*>(v.k) + n * es) {
      pools[2 * n * es].push_back(v.k);
    } else if (v.block_stride == n) {
      pools[n * es].push_back(v.k);
      pools[n * es].push_back(v.v);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

void cuda_copy_blocks(const CopySide& from, const CopySide& to, std::span<const BlockCopy> pairs,
                      bool same_pools, int32_t device, std::optional<uintptr_t> stream) {
  check_layers(from.layers, to.layers, pairs);
  DeviceCall call(device, stream);
  if (pairs.empty() || from.layers.empty()) return;
  nb::gil_scoped_release no_gil;
  std::vector<BlockCopy> kept;
  std::map<int64_t, std::vector<void*>> pools;
  if (same_pools && independent(pairs, kept) && pools_by_size(from.layers, pools)) {
    if (kept.empty()) return;
    const BlockCopy* device_pairs = call.upload(kept);
    constexpr size_t kMaxPools = 65535;  // cuda::copy_blocks' grid limit
    for (const auto& [bytes, all] : pools) {
      for (size_t first = 0; first < all.size(); first += kMaxPools) {
        const std::vector<void*> some(
            all.begin() + static_cast<int64_t>(first),
            all.begin() + static_cast<int64_t>(std::min(all.size(), first + kMaxPools)));
        cuda::copy_blocks(call.upload(some), static_cast<int32_t>(some.size()), bytes, device_pairs,
                          static_cast<int32_t>(kept.size()), call.stream());
      }
    }
    return;
  }
  const CopyKind kind = from.cuda && to.cuda ? CopyKind::kDeviceToDevice
                        : from.cuda          ? CopyKind::kDeviceToHost
                                             : CopyKind::kHostToDevice;
  for (size_t l = 0; l < from.layers.size(); ++l) {
    const KVLayerView& a = from.layers[l];
    const KVLayerView& b = to.layers[l];
    for (const BlockCopy& pair : pairs) {
      if (same_pools && pair.src == pair.dst) continue;  // a no-op, as on the CPU
      copy_block(call, a, a.k, b, b.k, pair, kind);
      copy_block(call, a, a.v, b, b.v, pair, kind);
    }
  }
}

}  // namespace pagedkv::py

#endif  // PAGEDKV_WITH_CUDA
