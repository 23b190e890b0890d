// The public CPU attention entry points (paged_decode_attention, paged_prefill_attention) over
// blocks longer than one 64-key tile, where the fast kernel reads keys in "spans" of whole
// blocks and serves several kv heads per item: block sizes just past a tile (65), between tiles
// (100, 257, 300), exact tile multiples (128, 512, the latter past the 256-key span cap), with
// several kv heads, GQA, sliding windows and attention sinks, against the textbook reference;
// and the fast kernel itself under forced configurations (one head per item, all heads per
// item with small key partitions over several threads), so spans also meet partition edges.

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "cpu/attention_fast.hpp"
#include "paged_scenario.hpp"
#include "pagedkv/attention.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv {
namespace {

using testing::scenario_from_case;
using testing::max_abs_diff;
using testing::PagedScenario;
using testing::rel_error;
using testing::SeqSpec;

using testing::kF32MaxAbs;
using testing::kLowPrecisionRel;

struct SpanCase {
  DType dtype = DType::kF32;
  KVLayout layout = KVLayout::kHND;
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
  name += std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_bs" +
          std::to_string(c.block_size) + "_gqa" + std::to_string(c.group) + "_kv" +
          std::to_string(c.num_kv_heads);
  if (c.window_left >= 0) name += "_win" + std::to_string(c.window_left);
  if (c.sink_tokens > 0) name += "_sink" + std::to_string(c.sink_tokens);
  return name;
}

/// Contexts that end one before, at and one after a block boundary, inside the first block, and
/// a long one spanning several blocks; prefill rows mix a chunk after a cached prefix, a whole
/// prompt and a decode row.
std::vector<SeqSpec> batch_for(const SpanCase& c) {
  const int32_t bs = c.block_size;
  if (!c.prefill) {
    return {{3 * bs + 17, 1}, {bs - 1, 1}, {bs, 1}, {bs + 1, 1}, {1, 1}, {2 * bs, 1}};
  }
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
  EXPECT_LE(max_abs_diff(out, s.reference(/*rounded=*/true)), kF32MaxAbs);
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
    EXPECT_LE(max_abs_diff(fast, ref), kF32MaxAbs);
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
      for (auto [window, sinks] : {std::pair{70, 3}, {bs, 1}, {bs + 40, 65}, {0, 2}, {1, 0}, {9, 5000}}) {
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

INSTANTIATE_TEST_SUITE_P(Spans, SpanVsReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<SpanCase>& info) {
                           return case_name(info.param);
                         });

}  // namespace
}  // namespace pagedkv
