// Per-call cost of paged decode attention on a tiny problem, the C++ side of the Python
// binding's overhead measurement (issue 21 item 6; scripts/bench_python.py times the same call
// through `pagedkv.paged_decode_attention` and reports the difference).
//
// Benchmarks (names are parsed by scripts/bench_python.py):
//   BM_TinyDecode   one sequence, 1 query head over 1 kv head, head_dim 8, one block of 16
//                   tokens, all 16 in context; separate NHD fp32 K and V pools of 4 blocks
//                   (vLLM's layout, what the Python call gets from numpy arrays). The work is
//                   16 dot products of 8: the time is the call's fixed cost.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBlocks = 4;
constexpr int32_t kBlockSize = 16;
constexpr int32_t kDim = 8;

void BM_TinyDecode(benchmark::State& state) {
  std::vector<float> k(size_t{kBlocks} * kBlockSize * kDim, 0.25f);
  std::vector<float> v(k.size(), 0.5f);
  KVLayerView cache;
  cache.k = k.data();
  cache.v = v.data();
  cache.num_blocks = kBlocks;
  cache.block_size = kBlockSize;
  cache.num_kv_heads = 1;
  cache.head_dim = kDim;
  cache.block_stride = int64_t{kBlockSize} * kDim;
  cache.head_stride = kDim;  // NHD
  cache.token_stride = kDim;
  AttentionParams params;
  params.num_heads = 1;
  params.num_kv_heads = 1;
  params.head_dim = kDim;
  const std::vector<int32_t> table{2};
  const std::vector<int32_t> lens{kBlockSize};
  const BlockTableView tables{table.data(), lens.data(), 1, 1, kBlockSize, 0};
  std::vector<float> q(kDim, 1.0f);
  std::vector<float> out(kDim);
  for (auto _ : state) {
    paged_decode_attention(params, cache, tables, q, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel("1 seq, 1 head, head_dim 8, ctx 16, bs 16, fp32 NHD");
}
BENCHMARK(BM_TinyDecode);

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
