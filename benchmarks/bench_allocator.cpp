// Metadata layer throughput: the work a scheduler does per step besides the kernels.
//
// Benchmarks (names are parsed by benchmarks/summarize.py):
//   BM_AllocateFree/pool:N         one allocate() + one release() per item: items_per_second =
//                                  pairs per second (target >= 20 M/s)
//   BM_AllocateFreeBurst/burst:B   B allocates then B releases (blocks of a sequence coming and
//                                  going together); items = pairs
//   BM_AppendSlots/seqs:256/prefix:P   a decode step: append (append_slots; prefix:1
//                                  append_tokens with prefix caching on) then commit (the forward
//                                  pass wrote it; prefix:1 publishes each block as it fills) for
//                                  each of 256 sequences; items = appended tokens. Every 2048
//                                  steps the sequences are freed and re-added (inside the timing:
//                                  part of the lifecycle; prefix:1 then evicts cached blocks)
//   BM_BatchMetadata/seqs:256/blocks:256/reuse:R   KVCacheManager::batch_metadata for a decode
//                                  step of 256 sequences of 256 blocks each (both formats +
//                                  slots); items = sequences
//   BM_BuildPadded/..., BM_BuildCsr/...    each format alone from per-sequence tables
//   .../reuse:0 the returning forms; .../reuse:1 the output-parameter overloads into one object
//   kept across steps (what a serving loop calls)

#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/metadata/block_allocator.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

void BM_AllocateFree(benchmark::State& state) {
  BlockAllocator allocator(static_cast<int32_t>(state.range(0)));
  for (auto _ : state) {
    const std::optional<BlockId> id = allocator.allocate();
    benchmark::DoNotOptimize(id);
    allocator.release(*id);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AllocateFree)->ArgName("pool")->Arg(1 << 16);

void BM_AllocateFreeBurst(benchmark::State& state) {
  const auto burst = static_cast<int32_t>(state.range(0));
  BlockAllocator allocator(1 << 16);
  std::vector<BlockId> ids(static_cast<size_t>(burst));
  for (auto _ : state) {
    for (BlockId& id : ids) id = *allocator.allocate();
    benchmark::DoNotOptimize(ids.data());
    for (BlockId id : ids) allocator.release(id);
  }
  state.SetItemsProcessed(state.iterations() * burst);
}
BENCHMARK(BM_AllocateFreeBurst)->ArgName("burst")->Arg(64)->Arg(1024);

constexpr int32_t kBlockSize = 16;

void BM_AppendSlots(benchmark::State& state) {
  const auto num_seqs = static_cast<int32_t>(state.range(0));
  const bool prefix = state.range(1) != 0;
  constexpr int64_t kStepsPerLife = 2048;  // tokens per sequence before it is recycled
  KVCacheManager manager(
      {.num_blocks = num_seqs * static_cast<int32_t>(kStepsPerLife / kBlockSize + 1),
       .block_size = kBlockSize,
       .enable_prefix_caching = prefix});
  for (int32_t s = 0; s < num_seqs; ++s) manager.add_sequence(s);
  int64_t step = 0;
  int64_t life = 0;
  for (auto _ : state) {
    for (int32_t s = 0; s < num_seqs; ++s) {
      std::optional<AppendResult> r;
      if (prefix) {
        // Distinct content per sequence and life, so every full block is a new key.
        const TokenId id = static_cast<TokenId>(((life * num_seqs + s) * kStepsPerLife + step) %
                                                (int64_t{1} << 30));
        r = manager.append_tokens(s, std::span<const TokenId>(&id, 1));
      } else {
        r = manager.append_slots(s, 1);
      }
      benchmark::DoNotOptimize(r);
      manager.commit(s, step + 1);  // the step's forward pass wrote the token
    }
    if (++step == kStepsPerLife) {
      ++life;
      for (int32_t s = 0; s < num_seqs; ++s) {
        manager.free_sequence(s);
        manager.add_sequence(s);
      }
      step = 0;
    }
  }
  state.SetItemsProcessed(state.iterations() * num_seqs);
}
BENCHMARK(BM_AppendSlots)->ArgNames({"seqs", "prefix"})->Args({256, 0})->Args({256, 1});

/// 256 sequences of blocks_per_seq full blocks each, in a manager (decode step metadata).
struct MetadataFixture {
  KVCacheManager manager;
  std::vector<SeqId> seqs;
  std::vector<int64_t> num_new;
  std::vector<std::vector<BlockId>> tables;
  std::vector<int32_t> lens;

  MetadataFixture(int32_t num_seqs, int32_t blocks_per_seq)
      : manager({.num_blocks = num_seqs * blocks_per_seq, .block_size = kBlockSize}) {
    for (int32_t s = 0; s < num_seqs; ++s) {
      manager.add_sequence(s);
      // Interleaved appends, as a running batch grows: tables end up scattered.
      seqs.push_back(s);
      num_new.push_back(1);
    }
    for (int32_t b = 0; b < blocks_per_seq; ++b) {
      for (int32_t s = 0; s < num_seqs; ++s) (void)manager.append_slots(s, kBlockSize);
    }
    for (int32_t s = 0; s < num_seqs; ++s) {
      const std::span<const BlockId> t = manager.block_table(s);
      tables.emplace_back(t.begin(), t.end());
      lens.push_back(blocks_per_seq * kBlockSize);
    }
  }
};

using TableSpans = std::span<const std::span<const BlockId>>;

/// Times `step(fixture, tables)` on the 256-sequence fixture; items = sequences.
template <typename Step>
void run_metadata_step(benchmark::State& state, Step step) {
  MetadataFixture f(static_cast<int32_t>(state.range(0)), static_cast<int32_t>(state.range(1)));
  const std::vector<std::span<const BlockId>> tables(f.tables.begin(), f.tables.end());
  for (auto _ : state) step(f, TableSpans(tables));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// reuse:0 calls the returning forms (fresh vectors every step, freed at the end of the step);
// reuse:1 the output-parameter overloads into one object kept across steps.
void BM_BatchMetadata(benchmark::State& state) {
  const bool reuse = state.range(2) != 0;
  BatchMetadata meta;
  run_metadata_step(state, [&](MetadataFixture& f, auto) {
    if (reuse) {
      f.manager.batch_metadata(f.seqs, f.num_new, meta);
      benchmark::DoNotOptimize(meta);
    } else {
      BatchMetadata fresh = f.manager.batch_metadata(f.seqs, f.num_new);
      benchmark::DoNotOptimize(fresh);
    }
  });
}
BENCHMARK(BM_BatchMetadata)
    ->ArgNames({"seqs", "blocks", "reuse"})
    ->Args({256, 256, 0})
    ->Args({256, 256, 1});

/// One format's builder: reuse:0 through its returning form, reuse:1 through its
/// output-parameter form.
template <typename Tables>
void run_builder(benchmark::State& state,
                 Tables (*build)(TableSpans, std::span<const int32_t>, int32_t),
                 void (*build_into)(TableSpans, std::span<const int32_t>, int32_t, Tables&)) {
  const bool reuse = state.range(2) != 0;
  Tables t;
  run_metadata_step(state, [&](MetadataFixture& f, TableSpans tables) {
    if (reuse) {
      build_into(tables, f.lens, kBlockSize, t);
      benchmark::DoNotOptimize(t);
    } else {
      Tables fresh = build(tables, f.lens, kBlockSize);
      benchmark::DoNotOptimize(fresh);
    }
  });
}

void BM_BuildPadded(benchmark::State& state) {
  run_builder<PaddedBlockTables>(state, build_padded_block_tables, build_padded_block_tables);
}
BENCHMARK(BM_BuildPadded)
    ->ArgNames({"seqs", "blocks", "reuse"})
    ->Args({256, 256, 0})
    ->Args({256, 256, 1});

void BM_BuildCsr(benchmark::State& state) {
  run_builder<CsrBlockTables>(state, build_csr_block_tables, build_csr_block_tables);
}
BENCHMARK(BM_BuildCsr)
    ->ArgNames({"seqs", "blocks", "reuse"})
    ->Args({256, 256, 0})
    ->Args({256, 256, 1});

}  // namespace
}  // namespace pagedkv

BENCHMARK_MAIN();
