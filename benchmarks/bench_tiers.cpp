// Store and load bandwidth of each tier below the pool (issue 18, item 6; docs/tiers.md):
// put() and get() of block records of a serving model's size, side by side with a memcpy of
// the same bytes (the ceiling of any tier). Redis runs when PAGEDKV_BENCH_REDIS=HOST:PORT names
// a server (scripts/bench-tiers.sh starts one on loopback); otherwise that row is skipped.
// Counters: bytes_per_second (value bytes), and records per iteration.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "pagedkv/tiers/disk_tier.hpp"
#include "pagedkv/tiers/host_tier.hpp"
#include "pagedkv/tiers/redis_tier.hpp"

namespace {

using pagedkv::KVTier;

constexpr int kRecords = 32;  // records per iteration

std::vector<std::byte> value_of(size_t bytes) {
  std::vector<std::byte> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::byte>(i * 131 + 7);
  return v;
}

std::string key_of(int i) { return "pagedkv:bench:" + std::to_string(i); }

// tier: 0 host, 1 disk (page cache), 2 disk (O_DIRECT), 3 redis.
std::unique_ptr<KVTier> make_tier(int tier, int64_t value_bytes, std::string* why) {
  const int64_t budget = 2 * kRecords * (value_bytes + 8192);
  switch (tier) {
    case 0:
      return std::make_unique<pagedkv::HostMemoryTier>(budget);
    case 1:
    case 2: {
      const auto path = std::filesystem::temp_directory_path() / "pagedkv_bench_tier.bin";
      std::filesystem::remove(path);
      return std::make_unique<pagedkv::DiskTier>(
          pagedkv::DiskTierConfig{path.string(), budget, value_bytes, tier == 2});
    }
    default: {
      const char* addr = std::getenv("PAGEDKV_BENCH_REDIS");
      if (addr == nullptr) {
        *why = "PAGEDKV_BENCH_REDIS=HOST:PORT not set";
        return nullptr;
      }
      const std::string a(addr);
      pagedkv::RedisTierConfig c;
      c.host = a.substr(0, a.rfind(':'));
      c.port = std::stoi(a.substr(a.rfind(':') + 1));
      c.timeout_ms = 2000;
      return std::make_unique<pagedkv::RedisTier>(c);
    }
  }
}

// The tier of state.range(0) for values of state.range(1) bytes, or empty after skipping the
// benchmark with the reason (no Redis address, or a tier that failed to open).
std::unique_ptr<KVTier> open_tier(benchmark::State& state) {
  std::string why;
  std::unique_ptr<KVTier> tier;
  try {
    tier = make_tier(static_cast<int>(state.range(0)), state.range(1), &why);
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!tier) state.SkipWithError(why.c_str());
  return tier;
}

void BM_TierStore(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(1));
  const std::unique_ptr<KVTier> tier = open_tier(state);
  if (!tier) return;
  const std::vector<std::byte> value = value_of(bytes);
  for (auto _ : state) {
    for (int i = 0; i < kRecords; ++i) {
      if (tier->put(key_of(i), value) != pagedkv::PutOutcome::kStored) {
        state.SkipWithError("put failed");
        return;
      }
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kRecords *
                          static_cast<int64_t>(bytes));
  state.SetLabel(std::string(tier->name()));
}

void BM_TierLoad(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(1));
  const std::unique_ptr<KVTier> tier = open_tier(state);
  if (!tier) return;
  const std::vector<std::byte> value = value_of(bytes);
  for (int i = 0; i < kRecords; ++i) (void)tier->put(key_of(i), value);
  for (auto _ : state) {
    for (int i = 0; i < kRecords; ++i) {
      auto v = tier->get(key_of(i));
      if (!v || v->size() != bytes) {
        state.SkipWithError("get missed");
        return;
      }
      benchmark::DoNotOptimize(v->data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kRecords *
                          static_cast<int64_t>(bytes));
  state.SetLabel(std::string(tier->name()));
}

// The ceiling: a memcpy of the same records into fresh buffers (what get() must at least do).
void BM_MemcpyPeer(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(1));
  const std::vector<std::byte> value = value_of(bytes);
  for (auto _ : state) {
    for (int i = 0; i < kRecords; ++i) {
      std::vector<std::byte> copy(bytes);
      std::memcpy(copy.data(), value.data(), bytes);
      benchmark::DoNotOptimize(copy.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kRecords *
                          static_cast<int64_t>(bytes));
}

// Record sizes: stories260K's 16-token block (20 KiB + header), a 1B-class model's fp16 block
// (256 KiB), Llama-3-8B's fp16 16-token block (32 layers x 2 x 16 x 8 x 128 x 2 B = 2 MiB).
void record_sizes(benchmark::internal::Benchmark* b, bool tiers) {
  for (const int64_t bytes : {20560, 262144 + 256, 2097152 + 256}) {
    if (!tiers) {
      b->Args({0, bytes});
      continue;
    }
    for (int tier = 0; tier < 4; ++tier) b->Args({tier, bytes});
  }
  // Wall time: a disk or Redis tier waits on I/O, which CPU time would not count.
  b->ArgNames({"tier", "bytes"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_TierStore)->Apply([](auto* b) { record_sizes(b, true); });
BENCHMARK(BM_TierLoad)->Apply([](auto* b) { record_sizes(b, true); });
BENCHMARK(BM_MemcpyPeer)->Apply([](auto* b) { record_sizes(b, false); });

}  // namespace

BENCHMARK_MAIN();
