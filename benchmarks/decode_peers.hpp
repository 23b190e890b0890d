#pragma once
// The peers BM_Decode (bench_attention_cpu.cpp) times beside each paged decode call (issue 24):
//  - the read stream: a read-only pass over exactly the bytes the paged call reads (the same
//    blocks of the same buffers, so the same pages), on the kernel's OpenMP threads: the limit a
//    memory-bound kernel can reach on this machine for this call;
//  - the compute ceiling: the same kernel on a slice of the same cache small enough to stay in
//    the caches (ceiling_budget_bytes; warmed just before it is timed), read as bytes per
//    second: where the kernel's arithmetic, not memory, binds.

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv::bench {

/// One contiguous run of bytes a decode call reads.
struct ByteRun {
  const std::byte* data;
  int64_t bytes;
};

/// The runs of K and V a decode call over `tables` (rows of `blocks_per_seq` block ids, each
/// sequence `context` tokens, whole blocks) reads from `view`: per block its K and its V (one
/// run when the view interleaves them, K and V adjacent in each block).
inline std::vector<ByteRun> decode_runs(const KVLayerView& view, const std::vector<int32_t>& table,
                                        int32_t batch, int32_t blocks_per_seq) {
  const int64_t esize = dtype_size(view.dtype);
  const int64_t kind_bytes =
      static_cast<int64_t>(view.block_size) * view.num_kv_heads * view.head_dim * esize;
  const auto* k = static_cast<const std::byte*>(view.k);
  const auto* v = static_cast<const std::byte*>(view.v);
  const bool adjacent = v == k + kind_bytes && view.block_stride * esize == 2 * kind_bytes;
  std::vector<ByteRun> runs;
  for (int32_t s = 0; s < batch; ++s) {
    for (int32_t j = 0; j < blocks_per_seq; ++j) {
      const int64_t at =
          view.offset(table[static_cast<size_t>(s) * blocks_per_seq + j], 0, 0) * esize;
      if (adjacent) {
        runs.push_back({k + at, 2 * kind_bytes});
      } else {
        runs.push_back({k + at, kind_bytes});
        runs.push_back({v + at, kind_bytes});
      }
    }
  }
  return runs;
}

/// Sum of the 16-byte words of a run (bytes a multiple of 64, 16-byte aligned): four
/// independent vector accumulators, so reading is bound by memory, not by the core.
using U64x2 = uint64_t __attribute__((vector_size(16)));
inline U64x2 sum_run(const std::byte* p, int64_t bytes) {
  const auto* w = reinterpret_cast<const U64x2*>(p);
  U64x2 a0{}, a1{}, a2{}, a3{};
  for (int64_t i = 0; i < bytes / 16; i += 4) {
    a0 += w[i];
    a1 += w[i + 1];
    a2 += w[i + 2];
    a3 += w[i + 3];
  }
  return a0 + a1 + a2 + a3;
}

/// Reads every run once on `threads` OpenMP threads (the kernel's pool), runs dealt out in
/// order in equal shares. Returns a checksum so the reads cannot be optimized away.
inline uint64_t stream_runs(const std::vector<ByteRun>& runs, int32_t threads) {
  uint64_t total = 0;
  const auto n = static_cast<int64_t>(runs.size());
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
  for (int64_t r = 0; r < n; ++r) {
    const U64x2 s = sum_run(runs[static_cast<size_t>(r)].data, runs[static_cast<size_t>(r)].bytes);
    total += s[0] + s[1];
  }
  return total;
}

/// Bytes the compute ceiling's slice may take: half the L3 (sysconf), but at most twice the
/// private L2 of the `threads` cores, since a virtual machine reports the whole host's L3
/// (300 MiB on the 2-core guest this was written on), which its neighbours share; 4 MiB per
/// thread when the system reports neither.
inline int64_t ceiling_budget_bytes(int32_t threads) {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const int64_t per_thread = l2 > 0 ? 2 * int64_t{l2} : int64_t{4} << 20;
  const int64_t budget = per_thread * std::max(threads, 1);
  return l3 > 0 ? std::min(budget, int64_t{l3} / 2) : budget;
}

/// The slice of a decode call the compute ceiling runs: the first `batch` sequences, `context`
/// tokens each (a multiple of block_size), at most ceiling_budget_bytes in K and V bytes.
/// The batch shrinks first, down to 1 (a sequence's context keeps the call's partitioning), then
/// the context, down to 8 blocks.
struct CeilingSlice {
  int32_t batch;
  int32_t context;
};
inline CeilingSlice ceiling_slice(int32_t batch, int32_t context, int32_t block_size,
                                  int64_t token_bytes, int32_t threads) {
  const int64_t budget = ceiling_budget_bytes(threads);
  CeilingSlice s{batch, context};
  const int32_t min_context = std::min(context, 8 * block_size);
  while (s.batch > 1 && int64_t{s.batch} * s.context * token_bytes > budget) s.batch /= 2;
  while (s.context > min_context && int64_t{s.batch} * s.context * token_bytes > budget) {
    s.context = std::max(min_context, (s.context / 2) / block_size * block_size);
  }
  return s;
}

}  // namespace pagedkv::bench
