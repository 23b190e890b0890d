#pragma once
// Test helper: the one attention test-case grid of the CPU kernel tests (test_attention.cpp: the
// public functions and the plain kernel against the reference; test_attention_fast.cpp: the SIMD
// kernel against the plain one): the case type, its self-describing name, the batch it runs,
// and the grid of dtypes x block sizes x GQA groups x contexts plus extra shapes.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/paged_scenario.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv::testing {

/// > 1000 and prime: ends mid-block for every block size.
constexpr int32_t kLongContext = 1031;

/// One attention configuration (a batch is built from it by batch_for).
struct AttentionCase {
  std::string name;
  DType dtype = DType::kF32;
  KVLayout layout = KVLayout::kHND;
  int32_t head_dim = 64;
  int32_t block_size = 16;
  int32_t num_kv_heads = 2;
  int32_t group = 1;  // num_heads / num_kv_heads
  int32_t context = 1;
  bool prefill = false;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  int32_t chunk_size = 0;
};

/// "nhd_bf16_d64_bs16_gqa2_kv2_ctx50_win5_sink2_chunk8", after "decode_" / "prefill_" when
/// with_kind.
inline std::string case_name(const AttentionCase& c, bool with_kind) {
  std::string name = with_kind ? (c.prefill ? "prefill_" : "decode_") : "";
  if (c.layout == KVLayout::kNHD) name += "nhd_";
  name += std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_bs" +
          std::to_string(c.block_size) + "_gqa" + std::to_string(c.group) + "_kv" +
          std::to_string(c.num_kv_heads) + "_ctx" + std::to_string(c.context);
  if (c.window_left >= 0) name += "_win" + std::to_string(c.window_left);
  if (c.sink_tokens > 0) name += "_sink" + std::to_string(c.sink_tokens);
  if (c.chunk_size > 0) name += "_chunk" + std::to_string(c.chunk_size);
  return name;
}

/// Decode batch: the case's context plus two other lengths, so one batch mixes lengths.
/// Prefill batch: a chunk after a cached prefix (or the whole prompt when short), a whole
/// prompt, a decode row and an empty padding row, as a chunked-prefill scheduler mixes them.
inline std::vector<SeqSpec> batch_for(const AttentionCase& c) {
  const int32_t bs = c.block_size;
  if (!c.prefill) return {{c.context, 1}, {c.context / 3 + 1, 1}, {2 * bs + 3, 1}};
  const int32_t chunk = std::min(c.context, 19);
  const int32_t whole = std::min(c.context, 40);
  return {{c.context, chunk}, {whole, whole}, {bs + 5, 1}, {0, 0}};
}

inline PagedScenario scenario_for(const AttentionCase& c, uint32_t seed) {
  return scenario_from_case(c, batch_for(c), seed);
}

/// Appends the case of one shape (decode or prefill per `prefill`) to `cases`.
inline void add_shape(std::vector<AttentionCase>& cases, bool prefill, DType dtype, KVLayout layout,
                      int32_t d, int32_t bs, int32_t kv, int32_t group, int32_t ctx) {
  AttentionCase c;
  c.dtype = dtype;
  c.layout = layout;
  c.head_dim = d;
  c.block_size = bs;
  c.num_kv_heads = kv;
  c.group = group;
  c.context = ctx;
  c.prefill = prefill;
  cases.push_back(c);
}

/// The grid of issue 2: dtypes x block sizes {1, 7, 16, 32} x GQA groups {1, 2, 5, 8} x
/// contexts {1, bs-1, bs, bs+1, 1031}, decode or chunked prefill, plus a few head dims, MQA/MHA
/// shapes and the NHD layout. Names are left to the caller (case_name).
inline std::vector<AttentionCase> attention_grid(bool prefill) {
  std::vector<AttentionCase> cases;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t bs : {1, 7, 16, 32}) {
      for (int32_t group : {1, 2, 5, 8}) {
        std::set<int32_t> contexts = {1, bs - 1, bs, bs + 1, kLongContext};
        contexts.erase(0);
        for (int32_t ctx : contexts) {
          add_shape(cases, prefill, dtype, KVLayout::kHND, 64, bs, 2, group, ctx);
        }
      }
    }
  }
  add_shape(cases, prefill, DType::kF32, KVLayout::kHND, 128, 16, 4, 4, 300);  // Llama-style
  add_shape(cases, prefill, DType::kF16, KVLayout::kHND, 128, 16, 8, 1, 77);   // MHA
  add_shape(cases, prefill, DType::kBF16, KVLayout::kHND, 80, 7, 1, 8, 150);   // MQA, odd d
  add_shape(cases, prefill, DType::kF32, KVLayout::kHND, 8, 32, 3, 3, 65);     // tiny d, 3 kv heads
  add_shape(cases, prefill, DType::kF32, KVLayout::kNHD, 64, 16, 2, 2, 33);
  add_shape(cases, prefill, DType::kF16, KVLayout::kNHD, 64, 7, 4, 5, kLongContext);
  add_shape(cases, prefill, DType::kBF16, KVLayout::kNHD, 128, 32, 2, 8, 100);
  // The 8-bit formats (per-head scales, see make_scenario) on a smaller grid: the dtype only
  // changes the loads and the scale folding, which these shapes cover (one and several kv
  // heads per item, partial blocks, long contexts split into partitions, NHD, each SIMD width).
  for (DType dtype : {DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8}) {
    for (int32_t bs : {7, 16}) {
      for (int32_t group : {1, 5}) {
        for (int32_t ctx : {bs + 1, kLongContext}) {
          add_shape(cases, prefill, dtype, KVLayout::kHND, 64, bs, 2, group, ctx);
        }
      }
    }
    add_shape(cases, prefill, dtype, KVLayout::kNHD, 128, 16, 4, 2, 300);
    add_shape(cases, prefill, dtype, KVLayout::kHND, 8, 32, 3, 3, 65);
  }
  return cases;
}

/// The window / sink masks of the grid (window_left, sink_tokens): empty windows, single keys,
/// windows shorter and longer than a block, sinks past the context.
inline constexpr std::pair<int32_t, int32_t> kMasks[] = {
    {0, 0}, {0, 3}, {1, 0}, {5, 0}, {7, 0}, {16, 0}, {5, 2}, {1, 4}, {30, 3}, {2000, 0}, {4, 100}};

/// Chunked local attention masks of the grid (chunk_size, window_left, sink_tokens): chunks of
/// one key, shorter than, equal to and longer than a block (7), not dividing the context, past
/// the context (= full), with sinks, and with a window that binds inside the chunk.
inline constexpr std::array<int32_t, 3> kChunkMasks[] = {{1, -1, 0}, {4, -1, 0},  {7, -1, 0},
                                                         {8, -1, 0}, {16, -1, 0}, {64, -1, 0},
                                                         {8, -1, 3}, {16, 5, 0},  {20, 9, 2}};

/// The mask cases of the grid (block_size 7, group 2, context 50; fp32 for even windows or
/// chunks, bf16 for odd ones), decode or prefill: kMasks, then kChunkMasks. The blocks each
/// mask hides are released (scenario_from_case). Names are left to the caller.
inline std::vector<AttentionCase> mask_grid(bool prefill) {
  std::vector<AttentionCase> cases;
  const auto add = [&](int32_t window, int32_t sinks, int32_t chunk) {
    AttentionCase c;
    c.block_size = 7;
    c.group = 2;
    c.context = 50;
    c.prefill = prefill;
    c.window_left = window;
    c.sink_tokens = sinks;
    c.chunk_size = chunk;
    c.dtype = (chunk > 0 ? chunk : window) % 2 == 0 ? DType::kF32 : DType::kBF16;
    cases.push_back(c);
  };
  for (auto [window, sinks] : kMasks) add(window, sinks, 0);
  for (auto [chunk, window, sinks] : kChunkMasks) add(window, sinks, chunk);
  return cases;
}

/// The gtest parameter name of a case (its name).
inline std::string param_name(const ::testing::TestParamInfo<AttentionCase>& info) {
  return info.param.name;
}

/// x in scientific notation with 4 digits, for RecordProperty.
inline std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", x);
  return buf;
}

}  // namespace pagedkv::testing
