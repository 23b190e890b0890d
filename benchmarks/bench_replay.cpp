// Whole-trace replay speed per memory strategy (issue 6): the Azure conversation trace (19,366
// requests, one hour) through the scheduler simulation on the real KVCacheManager, under a
// 40 GiB KV budget, for Llama-3-8B (light memory pressure) and Llama-2-7B (MHA: 4x the bytes
// per token, so contiguous reservation queues and paging preempts). Target: < 5 s per strategy
// on 2 cores. Counters: simulated steps, mean utilization, preemptions, peak RSS of the process.
//
// Needs ../shared/traces (PAGEDKV_SHARED_DIR); without it every case reports an error.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <memory>
#include <string>

#include "sim/model_preset.hpp"
#include "sim/replay.hpp"
#include "sim/trace.hpp"

namespace {

using namespace pagedkv::sim;

const Trace* conversation_trace() {
  static const std::unique_ptr<Trace> trace = [] {
    try {
      return std::make_unique<Trace>(
          read_trace(std::string(PAGEDKV_SHARED_DIR) + "/traces/AzureLLMInferenceTrace_conv.csv"));
    } catch (const std::exception&) {
      return std::unique_ptr<Trace>();
    }
  }();
  return trace.get();
}

constexpr const char* kModels[] = {"llama-3-8b", "llama-2-7b"};

void BM_ReplayAzureConv(benchmark::State& state) {
  const Trace* trace = conversation_trace();
  if (trace == nullptr) {
    state.SkipWithError("../shared/traces/AzureLLMInferenceTrace_conv.csv not found");
    return;
  }
  const Strategy strategy = default_strategies().at(static_cast<size_t>(state.range(0)));
  const ModelPreset& model = find_preset(kModels[state.range(1)]);
  ReplayConfig config;
  config.kv_memory_bytes = int64_t{40} << 30;
  config.kv_bytes_per_token = kv_bytes_per_token(model);
  config.max_context = model.max_context;
  state.SetLabel(model.name + " " + strategy.name());
  ReplayResult r;
  for (auto _ : state) {
    r = replay(*trace, config, strategy);
    benchmark::DoNotOptimize(r.steps);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["steps"] = static_cast<double>(r.steps);
  state.counters["util_mean"] = r.util_mean;
  state.counters["preemptions"] = static_cast<double>(r.preemptions);
  state.counters["requests_per_s"] = benchmark::Counter(
      static_cast<double>(r.requests), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["max_rss_mib"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
}

void strategies_and_models(benchmark::internal::Benchmark* b) {
  const auto n = static_cast<int64_t>(default_strategies().size());
  for (int64_t m = 0; m < 2; ++m) {
    for (int64_t s = 0; s < n; ++s) b->Args({s, m});
  }
}

BENCHMARK(BM_ReplayAzureConv)
    ->Apply(strategies_and_models)
    ->ArgNames({"strategy", "model"})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
