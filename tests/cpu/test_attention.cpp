// Paged attention (plain CPU kernel behind the public functions) against the textbook
// reference, over scattered block tables; masking; padding rows; every documented error.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/paged_scenario.hpp"
#include "cpu/attention_plain.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using testing::make_scenario;
using testing::max_abs_diff;
using testing::PagedScenario;
using testing::rel_error;
using testing::scenario_from_case;
using testing::SeqSpec;

using testing::kF32MaxAbs;
using testing::kLowPrecisionRel;
constexpr int32_t kLongContext = 1031;  // > 1000, prime: ends mid-block for every block size

struct AttnCase {
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
};

std::string case_name(const AttnCase& c) {
  std::string name = c.layout == KVLayout::kNHD ? "nhd_" : "";
  name += std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_bs" +
          std::to_string(c.block_size) + "_gqa" + std::to_string(c.group) + "_kv" +
          std::to_string(c.num_kv_heads) + "_ctx" + std::to_string(c.context);
  if (c.window_left >= 0) name += "_win" + std::to_string(c.window_left);
  if (c.sink_tokens > 0) name += "_sink" + std::to_string(c.sink_tokens);
  return name;
}

/// Decode batch: the case's context plus two other lengths, so one batch mixes lengths.
/// Prefill batch: a chunk after a cached prefix (or the whole prompt when short), a whole
/// prompt, a decode row and an empty padding row, as a chunked-prefill scheduler mixes them.
std::vector<SeqSpec> batch_for(const AttnCase& c) {
  const int32_t bs = c.block_size;
  if (!c.prefill) return {{c.context, 1}, {c.context / 3 + 1, 1}, {2 * bs + 3, 1}};
  const int32_t chunk = std::min(c.context, 19);
  const int32_t whole = std::min(c.context, 40);
  return {{c.context, chunk}, {whole, whole}, {bs + 5, 1}, {0, 0}};
}

PagedScenario scenario_for(const AttnCase& c, uint32_t seed) {
  return scenario_from_case(c, batch_for(c), seed);
}

/// The public functions (whatever kernel they dispatch to) or the plain kernel directly: the
/// plain kernel is the oracle faster kernels are compared with, so it must match the
/// reference on its own.
enum class Path { kPublic, kPlain };

std::vector<float> run_paged(const AttnCase& c, const PagedScenario& s, Path path = Path::kPublic) {
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

std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", x);
  return buf;
}

class PagedVsReference : public ::testing::TestWithParam<AttnCase> {};

TEST_P(PagedVsReference, MatchesReference) {
  const AttnCase& c = GetParam();
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
    EXPECT_LE(abs_err, kF32MaxAbs);
    if (c.dtype == DType::kF32) continue;
    // Against the unrounded fp32 inputs: the storage rounding error, bounded relatively.
    const double rel_err = rel_error(out, ref_exact);
    RecordProperty("rel_err_vs_fp32_inputs_" + tag, sci(rel_err));
    EXPECT_LE(rel_err, kLowPrecisionRel);
    EXPECT_LE(rel_error(out, ref_rounded), kLowPrecisionRel);
  }
}

/// The grid of issue 2: dtypes x block sizes {1, 7, 16, 32} x GQA groups {1, 2, 5, 8} x
/// contexts {1, bs-1, bs, bs+1, 1031}, for decode and chunked prefill, plus a few head dims,
/// MQA/MHA shapes and the NHD layout.
std::vector<AttnCase> grid(bool prefill) {
  std::vector<AttnCase> cases;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int32_t bs : {1, 7, 16, 32}) {
      for (int32_t group : {1, 2, 5, 8}) {
        std::set<int32_t> contexts = {1, bs - 1, bs, bs + 1, kLongContext};
        contexts.erase(0);
        for (int32_t ctx : contexts) {
          AttnCase c;
          c.dtype = dtype;
          c.block_size = bs;
          c.group = group;
          c.context = ctx;
          c.prefill = prefill;
          cases.push_back(c);
        }
      }
    }
  }
  auto extra = [&](DType dtype, KVLayout layout, int32_t d, int32_t bs, int32_t kv, int32_t group,
                   int32_t ctx) {
    AttnCase c;
    c.dtype = dtype;
    c.layout = layout;
    c.head_dim = d;
    c.block_size = bs;
    c.num_kv_heads = kv;
    c.group = group;
    c.context = ctx;
    c.prefill = prefill;
    cases.push_back(c);
  };
  extra(DType::kF32, KVLayout::kHND, 128, 16, 4, 4, 300);  // Llama-style d128
  extra(DType::kF16, KVLayout::kHND, 128, 16, 8, 1, 77);   // MHA
  extra(DType::kBF16, KVLayout::kHND, 80, 7, 1, 8, 150);   // MQA, odd head_dim
  extra(DType::kF32, KVLayout::kHND, 8, 32, 3, 3, 65);     // tiny head_dim, 3 kv heads
  extra(DType::kF32, KVLayout::kNHD, 64, 16, 2, 2, 33);
  extra(DType::kF16, KVLayout::kNHD, 64, 7, 4, 5, kLongContext);
  extra(DType::kBF16, KVLayout::kNHD, 128, 32, 2, 8, 100);
  for (AttnCase& c : cases) c.name = case_name(c);
  return cases;
}

std::string param_name(const ::testing::TestParamInfo<AttnCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Decode, PagedVsReference, ::testing::ValuesIn(grid(false)), param_name);
INSTANTIATE_TEST_SUITE_P(Prefill, PagedVsReference, ::testing::ValuesIn(grid(true)), param_name);

/// Sliding window and attention sinks, decode and prefill, against the reference mask.
std::vector<AttnCase> window_cases() {
  std::vector<AttnCase> cases;
  const std::pair<int32_t, int32_t> masks[] = {{0, 0}, {0, 3}, {1, 0},  {5, 0},    {7, 0},  {16, 0},
                                               {5, 2}, {1, 4}, {30, 3}, {2000, 0}, {4, 100}};
  for (bool prefill : {false, true}) {
    for (auto [window, sinks] : masks) {
      AttnCase c;
      c.block_size = 7;
      c.group = 2;
      c.context = 50;
      c.prefill = prefill;
      c.window_left = window;
      c.sink_tokens = sinks;
      c.dtype = window % 2 == 0 ? DType::kF32 : DType::kBF16;
      c.name = std::string(prefill ? "prefill_" : "decode_") + case_name(c);
      cases.push_back(c);
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mask, PagedVsReference, ::testing::ValuesIn(window_cases()), param_name);

TEST(PagedAttention, WindowZeroWithoutSinksOutputsZeros) {
  // window_left 0 admits no key at all (p - 0 < k <= p is empty): a row that sees nothing.
  AttnCase c;
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
  AttnCase c;
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
  AttnCase decode;  // only .prefill matters to run_paged
  EXPECT_LE(max_abs_diff(run_paged(decode, padded, Path::kPlain), padded.reference(true)),
            kF32MaxAbs);

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
  paged_decode_attention(params, padded.layer(), {table.data(), lens.data(), 2, mb}, q, dense);
  for (int64_t i = 0; i < row; ++i) {
    EXPECT_EQ(out[i], dense[i]);
    EXPECT_EQ(out[2 * row + i], dense[row + i]);
  }
  EXPECT_LE(max_abs_diff(out, padded.reference(true)), kF32MaxAbs);
}

TEST(PagedAttention, DecodeEqualsPrefillWithOneQueryPerSequence) {
  AttnCase c;
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

TEST(PagedAttention, EmptyBatchIsANoOp) {
  KVCacheConfig config;
  config.num_blocks = 1;
  HostKVCache cache(config);
  AttentionParams params;
  const std::vector<int32_t> qs = {0};
  paged_decode_attention(params, cache.layer(0), {}, {}, {});
  paged_prefill_attention(params, cache.layer(0), {}, qs, {}, {});
}

TEST(PagedAttention, ExplicitScaleIsUsed) {
  AttnCase c;
  c.context = 40;
  PagedScenario s = scenario_for(c, 31);
  s.params.scale = 0.7f;
  const std::vector<float> out = run_paged(c, s);
  EXPECT_LE(max_abs_diff(out, s.reference(true)), kF32MaxAbs);
  s.params.scale = 0.0f;
  EXPECT_GT(max_abs_diff(out, s.reference(true)), 1e-4);  // the default scale differs
}

TEST(PagedAttention, LargeScoresStayFinite) {
  // Scores of order 1e4: a softmax without max subtraction would overflow exp() to inf.
  AttnCase c;
  c.context = 100;
  PagedScenario s = scenario_for(c, 41);
  s.params.scale = 1000.0f;
  for (Path path : {Path::kPublic, Path::kPlain}) {
    const std::vector<float> out = run_paged(c, s, path);
    for (float x : out) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LE(max_abs_diff(out, s.reference(true)), kF32MaxAbs);
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
  std::vector<float> out(s_.q.size());
  EXPECT_NO_THROW(paged_decode_attention(s_.params, s_.layer(), view, s_.q, out));
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
  EXPECT_THAT(prefill_error(negative, 1), HasSubstr("negative query count -1"));
  const std::vector<int32_t> short_list = {0, 1};
  EXPECT_THAT(prefill_error(short_list, 1), HasSubstr("query_start has 2 entries, expected"));
  const std::vector<int32_t> offset = {1, 2, 3};
  EXPECT_THAT(prefill_error(offset, 3), HasSubstr("query_start[0] must be 0, got 1"));
  const std::vector<int32_t> ok = {0, 2, 3};
  EXPECT_THAT(prefill_error(ok, 4), HasSubstr("q has 128 elements, expected 96"));
}

}  // namespace
}  // namespace pagedkv
