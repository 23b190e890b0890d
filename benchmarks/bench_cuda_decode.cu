// CUDA decode attention benchmark (issue 5, item 4): paged vs contiguous decode for batch
// 1..256, context 512..32k, fp16/bf16, head_dim 128, GQA 4 and 8 (8 kv heads, block_size 16,
// scattered block tables, K and V in the library's default placement). Reports the bandwidth
// achieved on the K/V bytes read, next to the device-to-device copy bandwidth measured at the
// start of the same run, and the paged / contiguous time ratio. Ends with a Markdown table for
// docs/benchmarks.md.
// 8-bit K/V (issue 19, item 6): bf16, fp8_e4m3 and int8 rows at contexts 8k and 32k (batch 1,
// 32, 128; GQA 4 and 8), and a second table of the 8-bit / bf16 paged decode time per shape.
// Page sizes (issue 22, item 3): bf16 GQA 4 at batch 32, contexts 4k and 32k, block_size 1, 8,
// 16, 32, 64, 128, and a third table of each page size's K/V rate relative to block_size 128
// (goals: >= 0.95 at block_size >= 16, >= 0.70 at block_size 1).
// Tensor cores (issue 22, item 2): the main grid's batch 1, 32, 128 rows at contexts 4k and 32k
// again with DecodeLaunch::use_tensor_cores, and a fourth table of their time against the
// CUDA-core kernel's.
// CUDA graphs (issue 22, item 6): the small-batch rows (bf16, GQA 4, batch 1 and 8, contexts
// 512 and 4096) again with each call captured once into a CUDA graph and replayed
// (cudaGraphLaunch), and a fifth table of the per-call floor with and without the graph.
//
// Goal (H200): >= 80% of the copy bandwidth at batch >= 32 and context >= 4k; paged within 5%
// of contiguous; 8-bit / bf16 <= 0.55 at contexts >= 8k (half the bytes). Copy bandwidth counts
// bytes read + written (cudaMemcpyAsync D2D), the usual convention (KINDS.md's ~4.3 TB/s); the
// kernel's bandwidth counts K/V bytes read.
//
// Run: bench_cuda_decode [--benchmark_filter=...]; scripts/gpu_check.sh runs it.

#include <benchmark/benchmark.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "benchmarks/cuda_decode_report.hpp"
#include "cuda/kernels/dispatch.cuh"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#include "pagedkv/storage/contiguous_paged_view.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace {

using pagedkv::DType;
namespace pc = pagedkv::cuda;

constexpr int32_t kNumKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBlockSize = pagedkv::bench::kDefaultBlockSize;

#define BENCH_CUDA(expr)                                                      \
  do {                                                                        \
    const cudaError_t e_ = (expr);                                            \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

double g_copy_bytes_per_s = 0.0;  // read + write, measured once in main()
std::string g_device_name;
int64_t g_l2_bytes = 0;
int64_t g_device_bytes = 0;

using pagedkv::bench::Row;
std::map<std::string, Row> g_rows;  // by arguments; the last (measured) call wins

// Deterministic values in [-1, 1): a hash of the index.
// grid: (min(ceil(n / 256), 65535)); block: 256, grid-stride
template <typename T>
__global__ void fill_kernel(T* __restrict__ p,  // [n]
                            int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    const float x = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    if constexpr (pagedkv::cuda::detail::kQuantized<T>) {
      p[i] = pagedkv::cuda::detail::quantize<T>(x * 100.0f);  // scales are 1: codes up to 100
    } else if constexpr (std::is_same_v<T, float>) {
      p[i] = x;
    } else if constexpr (std::is_same_v<T, __half>) {
      p[i] = __float2half_rn(x);
    } else {
      p[i] = __float2bfloat16_rn(x);
    }
  }
}

void fill(void* p, DType dtype, int64_t n, uint32_t seed) {
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535));
  pagedkv::cuda::detail::dispatch_storage_type(dtype, /*with_quantized=*/true, [&](auto type) {
    using T = typename decltype(type)::type;
    fill_kernel<<<blocks, 256>>>(static_cast<T*>(p), n, seed);
  });
  BENCH_CUDA(cudaGetLastError());
}

/// Device-to-device copy bandwidth, bytes read + written per second, over 1 GiB buffers.
double measure_copy_bandwidth() {
  const size_t bytes = size_t{1} << 30;
  void* a = nullptr;
  void* b = nullptr;
  BENCH_CUDA(cudaMalloc(&a, bytes));
  BENCH_CUDA(cudaMalloc(&b, bytes));
  BENCH_CUDA(cudaMemset(a, 1, bytes));
  BENCH_CUDA(cudaMemset(b, 0, bytes));
  cudaEvent_t start;
  cudaEvent_t stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) BENCH_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  constexpr int kReps = 20;
  BENCH_CUDA(cudaEventRecord(start));
  for (int i = 0; i < kReps; ++i)
    BENCH_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
  BENCH_CUDA(cudaEventRecord(stop));
  BENCH_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  BENCH_CUDA(cudaFree(a));
  BENCH_CUDA(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) * kReps / (ms * 1e-3);
}

/// Average seconds of one call of `launch` over `reps` back-to-back launches on `stream`.
template <typename F>
double time_launches(F&& launch, int reps, cudaStream_t stream = nullptr) {
  cudaEvent_t start;
  cudaEvent_t stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  BENCH_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < reps; ++i) launch();
  BENCH_CUDA(cudaEventRecord(stop, stream));
  BENCH_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CUDA(cudaEventDestroy(start));
  BENCH_CUDA(cudaEventDestroy(stop));
  return ms * 1e-3 / reps;
}

/// What `launch` queues on `stream`, captured once into an instantiated CUDA graph.
template <typename F>
cudaGraphExec_t capture_graph(cudaStream_t stream, F&& launch) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  launch();
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CUDA(cudaGraphDestroy(graph));
  return exec;
}

/// Mean seconds per call of `paged` and `contiguous` (each queues one decode call on `stream`),
/// timed side by side every iteration, `reps` back-to-back calls per measurement. With `graph`
/// each is captured once (after an eager warm-up call that loads its kernels) and replayed.
template <typename P, typename C>
std::pair<double, double> measure(benchmark::State& state, P& paged, C& contiguous, int reps,
                                  cudaStream_t stream, bool graph) {
  paged();
  contiguous();
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraphExec_t paged_graph = graph ? capture_graph(stream, paged) : nullptr;
  cudaGraphExec_t contiguous_graph = graph ? capture_graph(stream, contiguous) : nullptr;
  const auto run = [&](auto& eager, cudaGraphExec_t exec) {
    return [&eager, exec, stream] {
      if (exec != nullptr) {
        BENCH_CUDA(cudaGraphLaunch(exec, stream));
      } else {
        eager();
      }
    };
  };
  const auto run_paged = run(paged, paged_graph);
  const auto run_contiguous = run(contiguous, contiguous_graph);
  double paged_s = 0;
  double contiguous_s = 0;
  int64_t n = 0;
  for (auto _ : state) {
    const double p = time_launches(run_paged, reps, stream);
    const double c = time_launches(run_contiguous, reps, stream);
    state.SetIterationTime(p * reps);  // the iteration's device time: reps calls
    paged_s += p;
    contiguous_s += c;
    ++n;
  }
  if (graph) {
    BENCH_CUDA(cudaGraphExecDestroy(paged_graph));
    BENCH_CUDA(cudaGraphExecDestroy(contiguous_graph));
  }
  return {paged_s / static_cast<double>(n), contiguous_s / static_cast<double>(n)};
}

/// Benchmark argument 0 -> K/V dtype.
constexpr DType kBenchDTypes[] = {DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kInt8};

/// args: dtype (kBenchDTypes index: 0 fp16, 1 bf16, 2 fp8_e4m3, 3 int8), group, batch,
/// context, block_size, tensor cores (0 or 1), CUDA graph replay (0 or 1). 8-bit pools keep
/// DeviceKVCache's default scales (1); the contiguous peer uses them.
void BM_Decode(benchmark::State& state) {
  const DType dtype = kBenchDTypes[state.range(0)];
  const auto group = static_cast<int32_t>(state.range(1));
  const auto batch = static_cast<int32_t>(state.range(2));
  const auto context = static_cast<int32_t>(state.range(3));
  const auto block_size = static_cast<int32_t>(state.range(4));
  const bool tensor_cores = state.range(5) != 0;
  const bool graph = state.range(6) != 0;
  const int64_t elem = pagedkv::dtype_size(dtype);
  const int64_t kv_elems_per_pool = int64_t{batch} * context * kNumKvHeads * kHeadDim;
  const double kv_bytes = 2.0 * static_cast<double>(kv_elems_per_pool * elem);
  if (2.0 * kv_bytes > 0.85 * static_cast<double>(g_device_bytes)) {
    state.SkipWithError("does not fit: paged + contiguous caches exceed device memory");
    return;
  }

  pagedkv::AttentionParams params;
  params.num_heads = kNumKvHeads * group;
  params.num_kv_heads = kNumKvHeads;
  params.head_dim = kHeadDim;

  // Paged cache with scattered block tables (a seeded permutation of all block ids): the
  // library's DeviceKVCache, in its default placement (KVCacheConfig::placement).
  const int32_t blocks_per_seq = (context + block_size - 1) / block_size;
  const int32_t num_blocks = batch * blocks_per_seq;
  pagedkv::KVCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.num_kv_heads = kNumKvHeads;
  config.head_dim = kHeadDim;
  config.dtype = dtype;
  const pc::DeviceKVCache cache(config);
  const pagedkv::KVLayerView paged = cache.layer(0);
  // The layer's K pool starts the arena, which holds the pools (the scales are apart).
  fill(paged.k, dtype, (cache.bytes() - pagedkv::kv_scale_bytes(config)) / elem, 1);
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(42));
  std::vector<int32_t> lens(static_cast<size_t>(batch), context);
  pc::DeviceBuffer tables(int64_t{num_blocks} * 4);
  pc::DeviceBuffer context_lens(int64_t{batch} * 4);
  tables.upload(std::span<const int32_t>(ids));
  context_lens.upload(std::span<const int32_t>(lens));
  const pagedkv::BlockTableView table_view{tables.as<const int32_t>(),
                                           context_lens.as<const int32_t>(),
                                           batch,
                                           blocks_per_seq,
                                           block_size,
                                           num_blocks};

  // Contiguous peer: [batch, kv heads, context, head_dim].
  pc::DeviceBuffer ck(kv_elems_per_pool * elem);
  pc::DeviceBuffer cv(kv_elems_per_pool * elem);
  fill(ck.data(), dtype, kv_elems_per_pool, 1);
  fill(cv.data(), dtype, kv_elems_per_pool, 2);
  pagedkv::KVLayerView contiguous = pagedkv::contiguous_paged_view(
      {batch, kNumKvHeads, context, kHeadDim, dtype, pagedkv::KVLayout::kHND}, ck.data(),
      cv.data());
  contiguous.k_scale = paged.k_scale;  // device [kNumKvHeads]; null for the float dtypes
  contiguous.v_scale = paged.v_scale;

  const int64_t q_elems = int64_t{batch} * params.num_heads * kHeadDim;
  pc::DeviceBuffer q(q_elems * 4);
  pc::DeviceBuffer out(q_elems * 4);
  fill(q.data(), DType::kF32, q_elems, 3);
  const pc::DecodePlan plan = pc::make_decode_plan(params, dtype, batch, context);
  pc::DeviceBuffer workspace(
      std::max<int64_t>(pc::decode_workspace_bytes(batch, params.num_heads, kHeadDim, plan), 1));
  cudaStream_t stream = nullptr;  // the legacy stream, or a captured one for the graph rows
  if (graph) BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  pc::DecodeLaunch launch{plan, workspace.data(), workspace.bytes(), stream};
  launch.use_tensor_cores = tensor_cores;
  BENCH_CUDA(cudaDeviceSynchronize());

  auto run_paged = [&] {
    pc::paged_decode_attention(params, paged, table_view, q.as<const float>(), out.as<float>(),
                               launch);
  };
  auto run_contiguous = [&] {
    pc::contiguous_decode_attention(params, contiguous, context_lens.as<const int32_t>(),
                                    q.as<const float>(), out.as<float>(), launch);
  };
  // >= ~1 ms of work per measurement, at most 200 launches.
  const int reps = static_cast<int>(std::clamp(2e9 / kv_bytes, 1.0, 200.0));
  const auto [paged_s, contiguous_s] =
      measure(state, run_paged, run_contiguous, reps, stream, graph);
  if (graph) BENCH_CUDA(cudaStreamDestroy(stream));
  const double gbps = kv_bytes / paged_s / 1e9;
  state.counters["splits"] = plan.num_splits;
  state.counters["paged_us"] = paged_s * 1e6;
  state.counters["contig_us"] = contiguous_s * 1e6;
  state.counters["paged/contig"] = paged_s / contiguous_s;
  state.counters["kv_GBps"] = gbps;
  state.counters["pct_of_copy"] = 100.0 * kv_bytes / paged_s / g_copy_bytes_per_s;
  g_rows[std::to_string(state.range(0)) + '/' + std::to_string(group) + '/' +
         std::to_string(batch) + '/' + std::to_string(context) + '/' + std::to_string(block_size) +
         '/' + std::to_string(state.range(5)) + '/' + std::to_string(state.range(6))] =
      Row{std::string(pagedkv::dtype_name(dtype)),
          group,
          batch,
          context,
          block_size,
          tensor_cores,
          graph,
          plan.num_splits,
          paged_s * 1e6,
          contiguous_s * 1e6,
          kv_bytes};
}

void decode_args(benchmark::internal::Benchmark* b) {
  for (int dtype : {0, 1}) {
    for (int group : {4, 8}) {
      for (int batch : {1, 8, 32, 64, 128, 256}) {
        for (int context : {512, 4096, 32768})
          b->Args({dtype, group, batch, context, kBlockSize, 0, 0});
      }
    }
  }
}

BENCHMARK(BM_Decode)
    ->ArgNames({"bf16", "gqa", "batch", "ctx", "bs", "tc", "graph"})
    ->Apply(decode_args)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);

/// The 8-bit rows beside bf16 (dtype 1 bf16, 2 fp8_e4m3, 3 int8) at contexts >= 8k. The bf16
/// rows at 32k repeat decode_args' (same key: the later measurement wins).
void quantized_args(benchmark::internal::Benchmark* b) {
  for (int dtype : {1, 2, 3}) {
    for (int group : {4, 8}) {
      for (int batch : {1, 32, 128}) {
        for (int context : {8192, 32768}) b->Args({dtype, group, batch, context, kBlockSize, 0, 0});
      }
    }
  }
}

BENCHMARK(BM_Decode)
    ->Name("BM_Decode8bit")
    ->ArgNames({"dtype", "gqa", "batch", "ctx", "bs", "tc", "graph"})
    ->Apply(quantized_args)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);

/// The page-size series: bf16, GQA 4, batch 32, contexts 4k and 32k, every page size from
/// SGLang's 1 to TensorRT-LLM's 128 (the block_size 16 rows repeat decode_args').
void page_size_args(benchmark::internal::Benchmark* b) {
  for (int context : {4096, 32768}) {
    for (int bs : {1, 8, 16, 32, 64, 128}) b->Args({1, 4, 32, context, bs, 0, 0});
  }
}

BENCHMARK(BM_Decode)
    ->Name("BM_DecodePageSize")
    ->ArgNames({"bf16", "gqa", "batch", "ctx", "bs", "tc", "graph"})
    ->Apply(page_size_args)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);

/// The tensor-core rows: fp16 / bf16, GQA 4 and 8, batch 1, 32, 128, contexts 4k and 32k.
void tensor_core_args(benchmark::internal::Benchmark* b) {
  for (int dtype : {0, 1}) {
    for (int group : {4, 8}) {
      for (int batch : {1, 32, 128}) {
        for (int context : {4096, 32768}) b->Args({dtype, group, batch, context, kBlockSize, 1, 0});
      }
    }
  }
}

BENCHMARK(BM_Decode)
    ->Name("BM_DecodeTensorCores")
    ->ArgNames({"bf16", "gqa", "batch", "ctx", "bs", "tc", "graph"})
    ->Apply(tensor_core_args)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);

/// The graph rows: bf16, GQA 4, batch 1 and 8, contexts 512 and 4096 (eager twins in decode_args).
void graph_args(benchmark::internal::Benchmark* b) {
  for (int batch : {1, 8}) {
    for (int context : {512, 4096}) b->Args({1, 4, batch, context, kBlockSize, 0, 1});
  }
}

BENCHMARK(BM_Decode)
    ->Name("BM_DecodeGraph")
    ->ArgNames({"bf16", "gqa", "batch", "ctx", "bs", "tc", "graph"})
    ->Apply(graph_args)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  if (!pc::device_available()) {
    std::printf("bench_cuda_decode: no CUDA device, nothing to measure\n");
    return 0;
  }
  const pc::DeviceInfo info = pc::device_info();
  g_device_name = info.name + " (sm_" + std::to_string(info.compute_capability) + ", " +
                  std::to_string(info.sm_count) + " SMs)";
  g_l2_bytes = info.l2_cache_bytes;
  g_device_bytes = info.global_memory_bytes;
  g_copy_bytes_per_s = measure_copy_bandwidth();
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", g_copy_bytes_per_s / 1e9);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  pagedkv::bench::print_markdown(g_rows, {g_device_name, g_copy_bytes_per_s, g_l2_bytes});
  return 0;
}
