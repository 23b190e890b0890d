// Paged attention (plain CPU kernel behind the public functions) against the textbook
// reference, over scattered block tables; masking; padding rows; every documented error.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/attention_cases.hpp"
#include "common/paged_scenario.hpp"
#include "cpu/attention_plain.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv {
namespace {

using testing::attention_grid;
using testing::attention_within;
using testing::AttentionCase;
using testing::case_name;
using ::testing::HasSubstr;
using testing::make_scenario;
using testing::mask_grid;
using testing::max_abs_diff;
using testing::PagedScenario;
using testing::param_name;
using testing::rel_error;
using testing::scenario_for;
using testing::sci;

using testing::kAttentionMaxAbs;
using testing::kLowPrecisionRel;
using testing::storage_rel_bound;

/// The public functions (whatever kernel they dispatch to) or the plain kernel directly: the
/// plain kernel is the oracle faster kernels are compared with, so it must match the
/// reference on its own.
enum class Path { kPublic, kPlain };

std::vector<float> run_paged(const AttentionCase& c, const PagedScenario& s,
                             Path path = Path::kPublic) {
  // NaN-filled so that a row the kernel forgets to write fails the comparison.
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  if (path == Path::kPlain) {
    std::vector<int32_t> decode_rows(s.seqs.size() + 1);
    std::iota(decode_rows.begin(), decode_rows.end(), 0);
    detail::plain_paged_prefill_attention(s.params, s.layer(), s.view(),
                                          c.prefill ? s.query_start : decode_rows, s.q, out);
  } else if (c.prefill) {
    paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, out);
  } else {
    paged_decode_attention(s.params, s.layer(), s.view(), s.q, out);
  }
  return out;
}

class PagedVsReference : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(PagedVsReference, MatchesReference) {
  const AttentionCase& c = GetParam();
  const PagedScenario s =
      scenario_for(c, /*seed=*/static_cast<uint32_t>(c.context * 131 + c.group));
  // Same rounded K/V as the kernel saw: only fp32 arithmetic differs, for every dtype.
  const std::vector<float> ref_rounded = s.reference(/*rounded=*/true);
  const std::vector<float> ref_exact =
      c.dtype == DType::kF32 ? ref_rounded : s.reference(/*rounded=*/false);
  for (Path path : {Path::kPublic, Path::kPlain}) {
    const std::string tag = path == Path::kPublic ? "public" : "plain";
    SCOPED_TRACE(tag);
    const std::vector<float> out = run_paged(c, s, path);
    const double abs_err = max_abs_diff(out, ref_rounded);
    // Recorded in the XML report (--gtest_output=xml) to watch the margin to the bounds.
    RecordProperty("max_abs_err_same_rounding_" + tag, sci(abs_err));
    EXPECT_TRUE(attention_within(out, ref_rounded, int64_t{s.params.num_heads} * c.head_dim));
    if (c.dtype == DType::kF32) continue;
    // Against the unrounded fp32 inputs: the storage rounding error, bounded relatively.
    const double rel_err = rel_error(out, ref_exact);
    RecordProperty("rel_err_vs_fp32_inputs_" + tag, sci(rel_err));
    EXPECT_LE(rel_err, storage_rel_bound(c.dtype));
    EXPECT_LE(rel_error(out, ref_rounded), storage_rel_bound(c.dtype));
  }
}

std::vector<AttentionCase> grid(bool prefill) {
  std::vector<AttentionCase> cases = attention_grid(prefill);
  for (AttentionCase& c : cases) c.name = case_name(c, /*with_kind=*/false);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Decode, PagedVsReference, ::testing::ValuesIn(grid(false)), param_name);
INSTANTIATE_TEST_SUITE_P(Prefill, PagedVsReference, ::testing::ValuesIn(grid(true)), param_name);

/// Sliding window and attention sinks, decode and prefill, against the reference mask.
std::vector<AttentionCase> window_cases() {
  std::vector<AttentionCase> cases;
  for (bool prefill : {false, true}) {
    for (AttentionCase& c : mask_grid(prefill)) {
      c.name = case_name(c, /*with_kind=*/true);
      cases.push_back(c);
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mask, PagedVsReference, ::testing::ValuesIn(window_cases()), param_name);

TEST(PagedAttention, WindowZeroWithoutSinksOutputsZeros) {
  // window_left 0 admits no key at all (p - 0 < k <= p is empty): a row that sees nothing.
  AttentionCase c;
  c.block_size = 4;
  c.context = 10;
  c.window_left = 0;
  const PagedScenario s = scenario_for(c, 5);
  for (Path path : {Path::kPublic, Path::kPlain}) {
    for (float x : run_paged(c, s, path)) ASSERT_EQ(x, 0.0f);
  }
}

TEST(PagedAttention, SingleVisibleKeyReturnsItsValueExactly) {
  // window_left 1 = only the query's own position: softmax weight 1, output = V[pos] exactly.
  AttentionCase c;
  c.block_size = 7;
  c.context = 20;
  c.window_left = 1;
  const PagedScenario s = scenario_for(c, 9);
  const int32_t d = c.head_dim;
  const int32_t heads = s.params.num_heads;
  const std::vector<float> v0 = s.stored(0, true);
  for (Path path : {Path::kPublic, Path::kPlain}) {
    const std::vector<float> out = run_paged(c, s, path);
    for (int32_t h = 0; h < heads; ++h) {
      for (int32_t i = 0; i < d; ++i) {
        // Sequence 0, last position 19, kv head h (group 1).
        ASSERT_EQ(out[h * d + i], v0[(19 * c.num_kv_heads + h) * d + i]);
      }
    }
  }
}

TEST(PagedAttention, DecodePaddingRowsAreZeroAndOthersUnaffected) {
  KVCacheConfig geometry;
  geometry.block_size = 16;
  geometry.num_kv_heads = 2;
  geometry.head_dim = 64;
  geometry.dtype = DType::kF16;
  AttentionParams params;
  params.num_heads = 4;
  params.num_kv_heads = 2;
  params.head_dim = 64;
  const PagedScenario padded =
      make_scenario(geometry, params, {{37, 1}, {0, 1}, {12, 1}, {0, 1}}, 17);
  std::vector<float> out(padded.q.size(), std::numeric_limits<float>::quiet_NaN());
  paged_decode_attention(params, padded.layer(), padded.view(), padded.q, out);
  AttentionCase decode;  // only .prefill matters to run_paged
  EXPECT_LE(max_abs_diff(run_paged(decode, padded, Path::kPlain), padded.reference(true)),
            kAttentionMaxAbs);

  const int64_t row = 4 * 64;
  for (int64_t r : {1, 3}) {
    for (int64_t i = 0; i < row; ++i) ASSERT_EQ(out[r * row + i], 0.0f) << "row " << r;
  }
  // The same two real sequences without padding rows: bit-identical outputs.
  const int32_t mb = padded.max_blocks_per_seq;
  std::vector<int32_t> table(padded.padded.begin(), padded.padded.begin() + mb);
  table.insert(table.end(), padded.padded.begin() + 2 * mb, padded.padded.begin() + 3 * mb);
  const std::vector<int32_t> lens = {37, 12};
  std::vector<float> q(padded.q.begin(), padded.q.begin() + row);
  q.insert(q.end(), padded.q.begin() + 2 * row, padded.q.begin() + 3 * row);
  std::vector<float> dense(2 * row);
  paged_decode_attention(params, padded.layer(), {table.data(), lens.data(), 2, mb, 16}, q, dense);
  for (int64_t i = 0; i < row; ++i) {
    EXPECT_EQ(out[i], dense[i]);
    EXPECT_EQ(out[2 * row + i], dense[row + i]);
  }
  EXPECT_LE(max_abs_diff(out, padded.reference(true)), kAttentionMaxAbs);
}

TEST(PagedAttention, DecodeEqualsPrefillWithOneQueryPerSequence) {
  AttentionCase c;
  c.dtype = DType::kBF16;
  c.block_size = 7;
  c.group = 5;
  c.context = 60;
  const PagedScenario s = scenario_for(c, 23);
  const std::vector<float> decode = run_paged(c, s);
  std::vector<float> prefill(s.q.size());
  paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, prefill);
  EXPECT_EQ(decode, prefill);
}

TEST(PagedAttention, EmptyBatchWritesNothingButStillChecksSizes) {
  KVCacheConfig config;
  config.num_blocks = 1;
  HostKVCache cache(config);
  AttentionParams params;
  const std::vector<int32_t> qs = {0};
  BlockTableView empty;  // no rows, but the geometry is still the cache's (issue 16)
  empty.block_size = config.block_size;
  // The outputs are zero-length prefixes of sentinel buffers: nothing past them is written.
  std::vector<float> out(4, 7.0f);
  paged_decode_attention(params, cache.layer(0), empty, {}, std::span(out).first(0));
  paged_prefill_attention(params, cache.layer(0), empty, qs, {}, std::span(out).first(0));
  EXPECT_EQ(out, std::vector<float>(4, 7.0f));
  // Zero rows still go through the size checks: a non-empty out is refused, naming 0 rows.
  EXPECT_THAT([&] { paged_decode_attention(params, cache.layer(0), empty, {}, out); },
              ::testing::ThrowsMessage<Error>(HasSubstr("out has 4 elements, expected 0 (0 rows")));
  EXPECT_THAT([&] { paged_prefill_attention(params, cache.layer(0), empty, qs, {}, out); },
              ::testing::ThrowsMessage<Error>(HasSubstr("out has 4 elements, expected 0 (0 rows")));
  EXPECT_EQ(out, std::vector<float>(4, 7.0f));
}

TEST(PagedAttention, ExplicitScaleIsUsed) {
  AttentionCase c;
  c.context = 40;
  PagedScenario s = scenario_for(c, 31);
  s.params.scale = 0.7f;
  const std::vector<float> out = run_paged(c, s);
  EXPECT_LE(max_abs_diff(out, s.reference(true)), kAttentionMaxAbs);
  s.params.scale = 0.0f;
  EXPECT_GT(max_abs_diff(out, s.reference(true)), 1e-4);  // the default scale differs
}

TEST(PagedAttention, LargeScoresStayFinite) {
  // Scores of order 1e4: a softmax without max subtraction would overflow exp() to inf.
  AttentionCase c;
  c.context = 100;
  PagedScenario s = scenario_for(c, 41);
  s.params.scale = 1000.0f;
  for (Path path : {Path::kPublic, Path::kPlain}) {
    const std::vector<float> out = run_paged(c, s, path);
    for (float x : out) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LE(max_abs_diff(out, s.reference(true)), kAttentionMaxAbs);
  }
}

// ---- errors ------------------------------------------------------------------------------------

class AttentionErrors : public ::testing::Test {
 protected:
  AttentionErrors() : s_(make()) {}
  static PagedScenario make() {
    KVCacheConfig geometry;
    geometry.block_size = 4;
    geometry.num_kv_heads = 2;
    geometry.head_dim = 8;
    AttentionParams params;
    params.num_heads = 4;
    params.num_kv_heads = 2;
    params.head_dim = 8;
    return make_scenario(geometry, params, {{6, 1}, {3, 1}}, 3);
  }
  /// Runs decode with the scenario's data and `params`/`tables`; returns the error message.
  std::string decode_error(const AttentionParams& params, const BlockTableView& tables) {
    std::vector<float> out(s_.q.size(), 7.0f);
    try {
      paged_decode_attention(params, s_.layer(), tables, s_.q, out);
    } catch (const Error& e) {
      // A failed call writes nothing.
      for (float x : out) EXPECT_EQ(x, 7.0f);
      return e.what();
    }
    ADD_FAILURE() << "no pagedkv::Error thrown";
    return "";
  }
  std::string prefill_error(std::span<const int32_t> query_start, size_t q_rows) {
    std::vector<float> q(q_rows * 32, 0.5f), out(q_rows * 32, 7.0f);
    try {
      paged_prefill_attention(s_.params, s_.layer(), s_.view(), query_start, q, out);
    } catch (const Error& e) {
      for (float x : out) EXPECT_EQ(x, 7.0f);
      return e.what();
    }
    ADD_FAILURE() << "no pagedkv::Error thrown";
    return "";
  }
  PagedScenario s_;
};

TEST_F(AttentionErrors, HeadsNotAMultipleOfKvHeads) {
  AttentionParams p = s_.params;
  p.num_heads = 5;
  EXPECT_THAT(decode_error(p, s_.view()),
              HasSubstr("num_heads 5 is not a multiple of num_kv_heads 2"));
}

TEST_F(AttentionErrors, SizeBelowOne) {
  AttentionParams p = s_.params;
  p.num_heads = 0;
  EXPECT_THAT(decode_error(p, s_.view()), HasSubstr("num_heads must be >= 1, got 0"));
  p = s_.params;
  p.head_dim = -3;
  EXPECT_THAT(decode_error(p, s_.view()), HasSubstr("head_dim must be >= 1, got -3"));
}

TEST_F(AttentionErrors, ParamsDifferFromView) {
  AttentionParams p = s_.params;
  p.num_kv_heads = 4;
  EXPECT_THAT(decode_error(p, s_.view()),
              HasSubstr("params.num_kv_heads 4 != cache num_kv_heads 2"));
  p = s_.params;
  p.head_dim = 16;
  EXPECT_THAT(decode_error(p, s_.view()), HasSubstr("params.head_dim 16 != cache head_dim 8"));
}

TEST_F(AttentionErrors, BadMaskParameters) {
  AttentionParams p = s_.params;
  p.window_left = -2;
  EXPECT_THAT(decode_error(p, s_.view()), HasSubstr("got -2"));
  p = s_.params;
  p.sink_tokens = -1;
  EXPECT_THAT(decode_error(p, s_.view()), HasSubstr("sink_tokens must be >= 0, got -1"));
  p = s_.params;
  p.chunk_size = -3;
  EXPECT_THAT(decode_error(p, s_.view()), HasSubstr("chunk_size must be >= 0 (0 = none), got -3"));
}

TEST_F(AttentionErrors, CheckAttentionParamsDirectly) {
  AttentionParams p = s_.params;
  p.num_kv_heads = 1;
  p.num_heads = 4;
  EXPECT_THAT([&] { check_attention_params(p, s_.layer()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("params.num_kv_heads 1")));
  EXPECT_NO_THROW(check_attention_params(s_.params, s_.layer()));
}

TEST_F(AttentionErrors, BlockIdOutOfRange) {
  std::vector<int32_t> table = s_.padded;
  table[1] = 99;  // sequence 0, logical block 1 (positions 4, 5 are in use)
  BlockTableView view = s_.view();
  view.block_tables = table.data();
  EXPECT_THAT(decode_error(s_.params, view),
              HasSubstr("block id 99 (sequence 0, logical block 1) out of range"));
  table = s_.padded;
  table[s_.max_blocks_per_seq] = -1;  // sequence 1's only block
  view.block_tables = table.data();
  EXPECT_THAT(decode_error(s_.params, view), HasSubstr("block id -1 (sequence 1"));
}

TEST_F(AttentionErrors, UnusedTableEntriesAreNotChecked) {
  // Sequence 1 (3 tokens) uses 1 of its 2 entries; the -1 (or garbage) after it is never read.
  std::vector<int32_t> table = s_.padded;
  ASSERT_EQ(table[s_.max_blocks_per_seq + 1], -1);
  table[s_.max_blocks_per_seq + 1] = 12345;
  BlockTableView view = s_.view();
  view.block_tables = table.data();
  std::vector<float> out(s_.q.size(), std::numeric_limits<float>::quiet_NaN());
  paged_decode_attention(s_.params, s_.layer(), view, s_.q, out);
  // Bit-identical to the run over the clean table, and the reference's answer: the entry was
  // neither checked nor read.
  std::vector<float> clean(s_.q.size(), std::numeric_limits<float>::quiet_NaN());
  paged_decode_attention(s_.params, s_.layer(), s_.view(), s_.q, clean);
  EXPECT_EQ(out, clean);
  EXPECT_LE(max_abs_diff(out, s_.reference(true)), kAttentionMaxAbs);
}

TEST_F(AttentionErrors, TablesMayBeViewsIntoLargerBuffers) {
  // What lies before sequence 0 in the caller's buffers (a negative length, a row of
  // out-of-range block ids) belongs to no sequence: it is neither checked nor read.
  std::vector<int32_t> lens{-5};
  lens.insert(lens.end(), s_.context_lens.begin(), s_.context_lens.end());
  std::vector<int32_t> table(static_cast<size_t>(s_.max_blocks_per_seq), 99);
  table.insert(table.end(), s_.padded.begin(), s_.padded.end());
  BlockTableView view = s_.view();
  view.context_lens = lens.data() + 1;
  view.block_tables = table.data() + s_.max_blocks_per_seq;
  std::vector<float> out(s_.q.size(), std::numeric_limits<float>::quiet_NaN());
  paged_decode_attention(s_.params, s_.layer(), view, s_.q, out);
  std::vector<float> clean(s_.q.size(), std::numeric_limits<float>::quiet_NaN());
  paged_decode_attention(s_.params, s_.layer(), s_.view(), s_.q, clean);
  EXPECT_EQ(out, clean);
}

TEST_F(AttentionErrors, ContextLongerThanTable) {
  std::vector<int32_t> lens = s_.context_lens;
  lens[1] = 9;  // 2 blocks x 4 tokens = 8
  BlockTableView view = s_.view();
  view.context_lens = lens.data();
  EXPECT_THAT(decode_error(s_.params, view),
              HasSubstr("context length 9 of sequence 1 exceeds max_blocks_per_seq 2 x "
                        "block_size 4 = 8"));
  lens[1] = -2;
  EXPECT_THAT(decode_error(s_.params, view), HasSubstr("context length -2 of sequence 1"));
}

TEST_F(AttentionErrors, QueryAndOutputSizes) {
  std::vector<float> q(s_.q.size() - 1), out(s_.q.size());
  EXPECT_THAT([&] { paged_decode_attention(s_.params, s_.layer(), s_.view(), q, out); },
              ::testing::ThrowsMessage<Error>(HasSubstr("q has 63 elements, expected 64")));
  q.resize(s_.q.size());
  out.resize(10);
  EXPECT_THAT([&] { paged_decode_attention(s_.params, s_.layer(), s_.view(), q, out); },
              ::testing::ThrowsMessage<Error>(HasSubstr("out has 10 elements, expected 64")));
}

TEST_F(AttentionErrors, PrefillQueryStart) {
  const std::vector<int32_t> too_many = {0, 7, 8};  // sequence 0: 7 queries, context 6
  EXPECT_THAT(prefill_error(too_many, 8),
              HasSubstr("sequence 0 has 7 query tokens but context length 6"));
  const std::vector<int32_t> negative = {0, 2, 1};
  EXPECT_THAT(prefill_error(negative, 1),
              HasSubstr("negative query count -1 (query_start 2 -> 1)"));
  const std::vector<int32_t> short_list = {0, 1};
  EXPECT_THAT(prefill_error(short_list, 1),
              HasSubstr("query_start has 2 entries, expected num_seqs + 1 = 3"));
  const std::vector<int32_t> offset = {1, 2, 3};
  EXPECT_THAT(prefill_error(offset, 3), HasSubstr("query_start[0] must be 0, got 1"));
  const std::vector<int32_t> ok = {0, 2, 3};
  EXPECT_THAT(prefill_error(ok, 4), HasSubstr("q has 128 elements, expected 96"));
}

}  // namespace
}  // namespace pagedkv
