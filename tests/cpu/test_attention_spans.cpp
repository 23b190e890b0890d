// The public CPU attention entry points (paged_decode_attention, paged_prefill_attention) in
// the fast kernel's two ways of walking a sequence, against the textbook reference, and the fast
// kernel itself under forced configurations (one head per item, all heads per item with small
// key partitions over several threads), so spans also meet partition edges:
// - blocks longer than one 64-key tile, read in "spans" of whole blocks serving several kv
//   heads per item: block sizes just past a tile (65), between tiles (100, 257, 300), exact
//   tile multiples (128, 512, the latter past the 256-key span cap), with several kv heads,
//   GQA, sliding windows and attention sinks;
// - blocks of at most a tile with long K/V runs of short rows, where the next span is
//   prefetched block by block (the block stream, attention_hwy.cpp): the stream is built from
//   the span's keys and block runs (window and sink jumps, partial blocks, NHD, separate or
//   interleaved K/V, more heads than its 256 KiB look-ahead covers), so those run here too
//   (and under the sanitizers in CI).

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "common/paged_scenario.hpp"
#include "cpu/attention_fast.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv {
namespace {

using testing::max_abs_diff;
using testing::PagedScenario;
using testing::rel_error;
using testing::scenario_from_case;
using testing::SeqSpec;

using testing::kAttentionMaxAbs;
using testing::kLowPrecisionRel;

struct SpanCase {
  DType dtype = DType::kF32;
  KVLayout layout = KVLayout::kHND;
  KVPlacement placement = KVPlacement::kInterleaved;
  int32_t head_dim = 32;
  int32_t block_size = 65;
  int32_t num_kv_heads = 4;
  int32_t group = 2;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  bool prefill = false;
};

std::string case_name(const SpanCase& c) {
  std::string name = c.prefill ? "prefill_" : "decode_";
  if (c.layout == KVLayout::kNHD) name += "nhd_";
  if (c.placement == KVPlacement::kSeparate) name += "separate_";
  name += std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_bs" +
          std::to_string(c.block_size) + "_gqa" + std::to_string(c.group) + "_kv" +
          std::to_string(c.num_kv_heads);
  if (c.window_left >= 0) name += "_win" + std::to_string(c.window_left);
  if (c.sink_tokens > 0) name += "_sink" + std::to_string(c.sink_tokens);
  return name;
}

/// Contexts that end one before, at and one after a block boundary, inside the first block, and
/// long ones spanning several blocks (and, for blocks of at most a tile, several spans); prefill
/// rows mix a chunk after a cached prefix, a whole prompt and a decode row.
std::vector<SeqSpec> batch_for(const SpanCase& c) {
  const int32_t bs = c.block_size;
  if (!c.prefill) {
    std::vector<SeqSpec> seqs = {{3 * bs + 17, 1}, {bs - 1, 1}, {bs, 1},
                                 {bs + 1, 1},      {1, 1},      {2 * bs, 1}};
    if (bs <= 64) seqs.push_back({300, 1});
    return seqs;
  }
  if (bs <= 64) return {{6 * bs + 7, 40}, {2 * bs + 1, 2 * bs + 1}, {bs, 1}};
  return {{2 * bs + 9, 70}, {bs + 3, bs + 3}, {bs, 1}, {5, 5}};
}

PagedScenario scenario_for(const SpanCase& c, uint32_t seed) {
  return scenario_from_case(c, batch_for(c), seed);
}

class SpanVsReference : public ::testing::TestWithParam<SpanCase> {};

TEST_P(SpanVsReference, MatchesReference) {
  const SpanCase& c = GetParam();
  const PagedScenario s = scenario_for(c, static_cast<uint32_t>(c.block_size * 7 + c.group));
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  if (c.prefill) {
    paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, out);
  } else {
    paged_decode_attention(s.params, s.layer(), s.view(), s.q, out);
  }
  EXPECT_LE(max_abs_diff(out, s.reference(/*rounded=*/true)), kAttentionMaxAbs);
  const std::vector<float> ref = s.reference(/*rounded=*/true);
  if (c.dtype != DType::kF32) {
    EXPECT_LE(rel_error(out, s.reference(/*rounded=*/false)), kLowPrecisionRel);
  }
  const detail::FastAttentionConfig variants[] = {
      {.num_threads = 1, .partition_keys = 0, .heads_per_item = 1},
      {.num_threads = 1, .partition_keys = 0, .heads_per_item = 1 << 20},
      {.num_threads = 3, .partition_keys = 40, .heads_per_item = 1 << 20},
      {.num_threads = 2, .partition_keys = 1, .heads_per_item = 2},
      {.num_threads = 1, .partition_keys = 0, .heads_per_item = 4},
      {.num_threads = 2, .partition_keys = 300, .heads_per_item = 0},
  };
  for (const detail::FastAttentionConfig& v : variants) {
    SCOPED_TRACE("threads " + std::to_string(v.num_threads) + " partition " +
                 std::to_string(v.partition_keys) + " heads " + std::to_string(v.heads_per_item));
    std::vector<float> fast(s.q.size(), std::numeric_limits<float>::quiet_NaN());
    detail::fast_paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, fast,
                                         v);
    EXPECT_LE(max_abs_diff(fast, ref), kAttentionMaxAbs);
  }
}

std::vector<SpanCase> cases() {
  std::vector<SpanCase> out;
  for (bool prefill : {false, true}) {
    for (int32_t bs : {65, 100, 128, 257, 300, 512}) {
      for (auto [kv, group] : {std::pair{4, 2}, {3, 1}, {2, 8}, {8, 4}, {6, 5}}) {
        SpanCase c;
        c.block_size = bs;
        c.num_kv_heads = kv;
        c.group = group;
        c.prefill = prefill;
        c.dtype = bs % 2 == 0 ? DType::kF32 : DType::kBF16;
        if (kv == 6) c.head_dim = 8;  // 6 heads: forced sets of 4 and 2 fall back to 3 and 2
        out.push_back(c);
      }
      // Windows whose lower edge and sink-to-window jump fall inside a span and inside a block.
      for (auto [window, sinks] :
           {std::pair{70, 3}, {bs, 1}, {bs + 40, 65}, {0, 2}, {1, 0}, {9, 5000}}) {
        SpanCase c;
        c.block_size = bs;
        c.num_kv_heads = 4;
        c.group = 2;
        c.window_left = window;
        c.sink_tokens = sinks;
        c.prefill = prefill;
        c.dtype = DType::kF16;
        out.push_back(c);
      }
      SpanCase nhd;
      nhd.block_size = bs;
      nhd.layout = KVLayout::kNHD;
      nhd.num_kv_heads = 2;
      nhd.group = 3;
      nhd.prefill = prefill;
      out.push_back(nhd);
    }
  }
  return out;
}

/// Geometries of the block stream: 8 kv heads of bf16 d128 or fp32 d64 (rows of 256 bytes) with
/// GQA 4, whose blocks of 16-64 tokens are K/V runs of 64 KiB or more (interleaved from 16,
/// separate from 32).
std::vector<SpanCase> stream_cases() {
  std::vector<SpanCase> out;
  SpanCase base;
  base.dtype = DType::kBF16;
  base.head_dim = 128;
  base.num_kv_heads = 8;
  base.group = 4;
  for (bool prefill : {false, true}) {
    base.prefill = prefill;
    for (int32_t bs : {16, 32, 64}) {
      for (KVPlacement placement : {KVPlacement::kInterleaved, KVPlacement::kSeparate}) {
        SpanCase c = base;
        c.block_size = bs;
        c.placement = placement;
        out.push_back(c);
      }
    }
    // Windows and sinks whose edges fall inside spans and blocks.
    for (auto [window, sinks] : {std::pair{-1, 0}, {70, 3}, {16, 1}, {0, 20}, {100, 5000}}) {
      SpanCase c = base;
      c.dtype = DType::kF32;
      c.head_dim = 64;
      c.block_size = 16;
      c.window_left = window;
      c.sink_tokens = sinks;
      out.push_back(c);
    }
    // 16 kv heads per item: 512 KiB spans, streamed over their last heads only.
    SpanCase wide = base;
    wide.block_size = 16;
    wide.num_kv_heads = 16;
    wide.group = 2;
    out.push_back(wide);
    // NHD: a block's rows of all heads of the item are one run.
    SpanCase nhd = base;
    nhd.block_size = 32;
    nhd.layout = KVLayout::kNHD;
    out.push_back(nhd);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(BlockStream, SpanVsReference, ::testing::ValuesIn(stream_cases()),
                         [](const ::testing::TestParamInfo<SpanCase>& info) {
                           return case_name(info.param);
                         });

INSTANTIATE_TEST_SUITE_P(Spans, SpanVsReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<SpanCase>& info) {
                           return case_name(info.param);
                         });

}  // namespace
}  // namespace pagedkv
