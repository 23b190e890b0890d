// The fast kernel's block stream (attention_hwy.cpp, PrefetchStream): when blocks are no
// longer than a tile and each block is a long run (all kv heads of an item, K and V together
// when adjacent) of rows of at most 256 bytes, what comes next is prefetched block by block.
// The prefetch changes no value, but the stream is built from the span's keys and block runs
// (window and sink jumps, partial first and last blocks, NHD, more heads than the 256 KiB
// look-ahead covers), so these geometries run the public entry points and the fast kernel
// under forced configurations against the textbook reference (and under the sanitizers in CI).

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

using testing::kF32MaxAbs;
using testing::kLowPrecisionRel;
using testing::max_abs_diff;
using testing::PagedScenario;
using testing::rel_error;
using testing::scenario_from_case;
using testing::SeqSpec;

struct StreamCase {
  DType dtype = DType::kBF16;
  KVLayout layout = KVLayout::kHND;
  KVPlacement placement = KVPlacement::kInterleaved;
  int32_t head_dim = 128;  // bf16 rows of 256 bytes
  int32_t block_size = 16;
  int32_t num_kv_heads = 8;
  int32_t group = 4;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  bool prefill = false;
};

std::string case_name(const StreamCase& c) {
  std::string name = c.prefill ? "prefill_" : "decode_";
  if (c.layout == KVLayout::kNHD) name += "nhd_";
  if (c.placement == KVPlacement::kSeparate) name += "separate_";
  name += std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_bs" +
          std::to_string(c.block_size) + "_kv" + std::to_string(c.num_kv_heads) + "_gqa" +
          std::to_string(c.group);
  if (c.window_left >= 0) name += "_win" + std::to_string(c.window_left);
  if (c.sink_tokens > 0) name += "_sink" + std::to_string(c.sink_tokens);
  return name;
}

/// Contexts over several spans that end inside, at and just past a block; prefill rows mix a
/// chunk after a cached prefix, a whole prompt and a decode row.
std::vector<SeqSpec> batch_for(const StreamCase& c) {
  const int32_t bs = c.block_size;
  if (!c.prefill) return {{9 * bs + 5, 1}, {4 * bs, 1}, {bs + 1, 1}, {3, 1}, {300, 1}};
  return {{6 * bs + 7, 40}, {2 * bs + 1, 2 * bs + 1}, {bs, 1}};
}

class BlockStreamVsReference : public ::testing::TestWithParam<StreamCase> {};

TEST_P(BlockStreamVsReference, MatchesReference) {
  const StreamCase& c = GetParam();
  const PagedScenario s =
      scenario_from_case(c, batch_for(c), static_cast<uint32_t>(c.block_size * 13 + c.group));
  const std::vector<float> ref = s.reference(/*rounded=*/true);
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  if (c.prefill) {
    paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, out);
  } else {
    paged_decode_attention(s.params, s.layer(), s.view(), s.q, out);
  }
  EXPECT_LE(max_abs_diff(out, ref), kF32MaxAbs);
  if (c.dtype != DType::kF32) {
    EXPECT_LE(rel_error(out, s.reference(/*rounded=*/false)), kLowPrecisionRel);
  }
  const detail::FastAttentionConfig variants[] = {
      {.num_threads = 1, .partition_keys = 0, .heads_per_item = 0},
      {.num_threads = 1, .partition_keys = 0, .heads_per_item = 1 << 20},
      {.num_threads = 2, .partition_keys = 48, .heads_per_item = 1 << 20},
      {.num_threads = 3, .partition_keys = 100, .heads_per_item = 2},
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

std::vector<StreamCase> cases() {
  std::vector<StreamCase> out;
  for (bool prefill : {false, true}) {
    // Block runs of 64 KiB and more (interleaved from block_size 16, separate from 32).
    for (int32_t bs : {16, 32, 64}) {
      for (KVPlacement placement : {KVPlacement::kInterleaved, KVPlacement::kSeparate}) {
        StreamCase c;
        c.block_size = bs;
        c.placement = placement;
        c.prefill = prefill;
        out.push_back(c);
      }
    }
    // fp32 rows of 256 bytes; windows and sinks whose edges fall inside spans and blocks.
    for (auto [window, sinks] : {std::pair{-1, 0}, {70, 3}, {16, 1}, {0, 20}, {100, 5000}}) {
      StreamCase c;
      c.dtype = DType::kF32;
      c.head_dim = 64;
      c.window_left = window;
      c.sink_tokens = sinks;
      c.prefill = prefill;
      out.push_back(c);
    }
    // 16 kv heads per item: 512 KiB spans, streamed over the last heads only.
    StreamCase wide;
    wide.num_kv_heads = 16;
    wide.group = 2;
    wide.prefill = prefill;
    out.push_back(wide);
    // NHD: a block's rows of all heads of the item are one run.
    StreamCase nhd;
    nhd.layout = KVLayout::kNHD;
    nhd.block_size = 32;
    nhd.prefill = prefill;
    out.push_back(nhd);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(BlockStream, BlockStreamVsReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<StreamCase>& info) {
                           return case_name(info.param);
                         });

}  // namespace
}  // namespace pagedkv
