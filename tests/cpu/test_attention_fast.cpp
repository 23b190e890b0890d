// The fast CPU attention kernel (src/cpu/attention_fast.hpp) against its oracle, the plain kernel,
// and against the textbook reference, over the configuration grid of test_attention.cpp; plus
// the code paths only the fast kernel has: every compiled instruction set, every SIMD width,
// one thread vs many, and key partitions merged by log-sum-exp.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/attention_cases.hpp"
#include "common/paged_scenario.hpp"
#include "cpu/attention_fast.hpp"
#include "cpu/attention_plain.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv {
namespace {

using detail::FastAttentionConfig;
using testing::attention_grid;
using testing::attention_within;
using testing::AttentionCase;
using testing::case_name;
using testing::kLongContext;
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

std::vector<float> run_plain(const PagedScenario& s) {
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  detail::plain_paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, out);
  return out;
}

std::vector<float> run_fast(const PagedScenario& s, const FastAttentionConfig& config) {
  // NaN-filled so that a row the kernel forgets to write fails every comparison.
  std::vector<float> out(s.q.size(), std::numeric_limits<float>::quiet_NaN());
  detail::fast_paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, out,
                                       config);
  return out;
}

/// The kernel configurations every case runs under: the default (what the public functions
/// use), one thread with one kv head per item, several threads with small forced partitions (so
/// short contexts also go through the log-sum-exp merge; 40 is not a tile multiple and gets
/// rounded up to 64) and all kv heads of a block in one item, and one-key partitions.
struct Variant {
  const char* name;
  FastAttentionConfig config;
};
const Variant kVariants[] = {
    {"default", {}},
    {"one_thread_one_head", {.num_threads = 1, .partition_keys = 0, .heads_per_item = 1}},
    {"split40_3threads_all_heads",
     {.num_threads = 3, .partition_keys = 40, .heads_per_item = 1 << 20}},
    {"split1_2threads", {.num_threads = 2, .partition_keys = 1, .heads_per_item = 0}},
};

class FastVsPlain : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(FastVsPlain, MatchesPlainAndReference) {
  const AttentionCase& c = GetParam();
  const PagedScenario s =
      scenario_for(c, /*seed=*/static_cast<uint32_t>(c.context * 131 + c.group + c.head_dim));
  const std::vector<float> plain = run_plain(s);
  const std::vector<float> ref_rounded = s.reference(/*rounded=*/true);
  const std::vector<float> ref_exact = s.reference(/*rounded=*/false);
  ASSERT_LE(max_abs_diff(plain, ref_rounded), kAttentionMaxAbs) << "the oracle itself is off";
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const std::vector<float> fast = run_fast(s, v.config);
    const double vs_plain = max_abs_diff(fast, plain);
    const double vs_ref = max_abs_diff(fast, ref_rounded);
    RecordProperty(std::string("max_abs_vs_plain_") + v.name, sci(vs_plain));
    RecordProperty(std::string("max_abs_vs_ref_") + v.name, sci(vs_ref));
    const int64_t row = int64_t{s.params.num_heads} * s.params.head_dim;
    EXPECT_TRUE(attention_within(fast, plain, row));
    EXPECT_TRUE(attention_within(fast, ref_rounded, row));
    if (c.dtype != DType::kF32) {
      EXPECT_LE(rel_error(fast, ref_exact), storage_rel_bound(c.dtype));
    }
  }
}

/// The grid of test_attention.cpp (attention_cases.hpp: dtypes x block sizes {1, 7, 16, 32} x
/// GQA groups {1, 2, 5, 8} x contexts {1, bs-1, bs, bs+1, 1031}, decode and chunked prefill, its
/// extra shapes), plus head dims that take each SIMD width (full vectors, 4 lanes, 1 lane).
std::vector<AttentionCase> grid(bool prefill) {
  std::vector<AttentionCase> cases = attention_grid(prefill);
  auto extra = [&](DType dtype, KVLayout layout, int32_t d, int32_t bs, int32_t kv, int32_t group,
                   int32_t ctx) {
    testing::add_shape(cases, prefill, dtype, layout, d, bs, kv, group, ctx);
  };
  // SIMD widths: 48 (the default model's head size), 40 (4 lanes on AVX-512), 6 and 3 (1 lane),
  // 256 (more vectors than the 4-way unroll), MQA with 32 query heads (one row set of 32 rows).
  extra(DType::kF32, KVLayout::kHND, 48, 16, 6, 1, 200);
  extra(DType::kBF16, KVLayout::kHND, 40, 16, 2, 4, 130);
  extra(DType::kF16, KVLayout::kHND, 6, 8, 2, 2, 90);
  extra(DType::kF32, KVLayout::kNHD, 3, 5, 3, 1, 57);
  extra(DType::kBF16, KVLayout::kHND, 256, 16, 1, 2, 260);
  extra(DType::kF32, KVLayout::kHND, 64, 16, 1, 32, 500);
  // Blocks longer than a tile with several kv heads per item: spans of whole blocks (128 keys
  // for block_size 100 and 128, capped at 256 for 300), each head through all their tiles.
  extra(DType::kBF16, KVLayout::kHND, 64, 100, 4, 2, 450);
  extra(DType::kF32, KVLayout::kHND, 32, 128, 3, 2, 700);
  extra(DType::kF16, KVLayout::kNHD, 16, 300, 2, 4, kLongContext);
  extra(DType::kF32, KVLayout::kHND, 16, 128, 4, 1, 129);
  for (AttentionCase& c : cases) c.name = case_name(c, /*with_kind=*/true);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Decode, FastVsPlain, ::testing::ValuesIn(grid(false)), param_name);
INSTANTIATE_TEST_SUITE_P(Prefill, FastVsPlain, ::testing::ValuesIn(grid(true)), param_name);

/// Sliding window and sinks (test_attention.cpp's masks, and long ones whose sink-to-window jump
/// falls inside a tile and inside a partition).
std::vector<AttentionCase> mask_cases() {
  std::vector<AttentionCase> cases;
  for (bool prefill : {false, true}) {
    for (const AttentionCase& c : mask_grid(prefill)) cases.push_back(c);
    for (auto [window, sinks] : {std::pair{300, 4}, {100, 45}, {517, 33}, {64, 64}}) {
      AttentionCase c;
      c.block_size = window == 300 ? 128 : 16;  // 128: the sink-to-window jump inside a span
      c.group = 4;
      c.context = kLongContext;
      c.prefill = prefill;
      c.window_left = window;
      c.sink_tokens = sinks;
      c.dtype = DType::kF16;
      cases.push_back(c);
    }
  }
  for (AttentionCase& c : cases) c.name = case_name(c, /*with_kind=*/true);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Mask, FastVsPlain, ::testing::ValuesIn(mask_cases()), param_name);

/// Every instruction set compiled in and supported here runs the same cases (AVX-512, AVX2,
/// SSE4, the scalar emulation, ...), so a target-specific bug shows on any machine.
class FastPerTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override { detail::force_fast_attention_target(""); }
};

TEST_P(FastPerTarget, MatchesPlain) {
  ASSERT_TRUE(detail::force_fast_attention_target(GetParam()));
  EXPECT_EQ(std::string(detail::fast_attention_target()), GetParam());
  const AttentionCase cases[] = {
      {.dtype = DType::kF32, .head_dim = 64, .block_size = 16, .group = 4, .context = 300},
      {.dtype = DType::kF16, .head_dim = 128, .block_size = 7, .group = 1, .context = 100},
      {.dtype = DType::kBF16, .head_dim = 48, .block_size = 32, .group = 2, .context = 129},
      {.dtype = DType::kBF16, .head_dim = 40, .block_size = 16, .group = 3, .context = 61},
      {.dtype = DType::kF32, .head_dim = 6, .block_size = 5, .group = 2, .context = 45},
      // bf16's even/odd widening at the full width of every target (head_dim a multiple of two
      // vectors), with row blocks of 4 + 1 (group 5) and two blocks of 4 (group 8).
      {.dtype = DType::kBF16, .head_dim = 128, .block_size = 16, .group = 4, .context = 300},
      {.dtype = DType::kBF16, .head_dim = 96, .block_size = 16, .group = 5, .context = 150},
      {.dtype = DType::kBF16,
       .head_dim = 64,
       .block_size = 128,
       .group = 8,
       .context = 200,
       .prefill = true},
      {.dtype = DType::kF16,
       .head_dim = 64,
       .block_size = 16,
       .group = 2,
       .context = 200,
       .prefill = true,
       .window_left = 50,
       .sink_tokens = 3},
  };
  for (const AttentionCase& c : cases) {
    SCOPED_TRACE(case_name(c, /*with_kind=*/true));
    const PagedScenario s = scenario_for(c, 77);
    const std::vector<float> plain = run_plain(s);
    for (const Variant& v : kVariants) {
      SCOPED_TRACE(v.name);
      EXPECT_LE(max_abs_diff(run_fast(s, v.config), plain), kAttentionMaxAbs);
    }
  }
}

/// Every code of each 8-bit format through every target's widening, and fp16's specials: one
/// key, so each query row's output is that key's V exactly (softmax weight 1). V holds the 256
/// codes as raw bytes (8-bit: the subnormals, both zeros, the largest finite codes and the NaN
/// codes; fp16: code << 8, so inf, NaN and subnormals too); the expected values are dtype.hpp's
/// decoders times a power-of-two scale, compared bit for bit (NaN where the code is NaN). A NaN
/// code in K must change its kv head's rows as the reference does.
TEST_P(FastPerTarget, EveryCodeWidensAsTheDecoder) {
  ASSERT_TRUE(detail::force_fast_attention_target(GetParam()));
  for (DType dtype : {DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const AttentionCase c{.dtype = dtype,
                          .head_dim = 256,
                          .block_size = 16,
                          .num_kv_heads = 2,
                          .group = 4,
                          .context = 1};
    PagedScenario s = testing::scenario_from_case(c, {{1, 1}}, 3);
    const bool quantized = dtype_is_quantized(dtype);
    const std::vector<float> k_scale{0.25f, 0.5f}, v_scale{0.5f, 2.0f};
    if (quantized) s.cache->set_scales(PagedScenario::kLayer, k_scale, v_scale);
    const auto esize = static_cast<size_t>(dtype_size(dtype));
    // codes[i]: code i in the dtype's bytes (fp16: the bits i << 8, little-endian).
    std::vector<uint8_t> codes(256 * esize, 0);
    for (size_t i = 0; i < 256; ++i) codes[i * esize + esize - 1] = static_cast<uint8_t>(i);
    const KVLayerView layer = s.layer();
    const auto element = [&](void* pool, int32_t h, int32_t d) {
      return static_cast<uint8_t*>(pool) +
             (layer.offset(s.tables[0][0], h, 0) + d) * static_cast<int64_t>(esize);
    };
    const auto code_of = [](int32_t h, int32_t d) { return (d + 17 * h) % 256; };
    for (int32_t h = 0; h < 2; ++h) {
      for (int32_t d = 0; d < 256; ++d) {
        std::copy_n(&codes[code_of(h, d) * esize], esize, element(layer.v, h, d));
      }
    }
    const std::vector<float> out = run_fast(s, {.num_threads = 1});
    for (int32_t row = 0; row < 8; ++row) {
      const int32_t h = row / 4;
      for (int32_t d = 0; d < 256; ++d) {
        const float want = load_as_f32(codes.data(), dtype, code_of(h, d)) *
                           (quantized ? v_scale[static_cast<size_t>(h)] : 1.0f);
        const float got = out[static_cast<size_t>(row * 256 + d)];
        SCOPED_TRACE("row " + std::to_string(row) + " code " + std::to_string(code_of(h, d)));
        EXPECT_EQ(std::isnan(got), std::isnan(want));
        if (!std::isnan(want)) EXPECT_EQ(got, want);
      }
    }
    if (dtype == DType::kInt8) continue;                              // int8 has no NaN
    const int32_t nan_code = dtype == DType::kFP8E4M3 ? 0xFF : 0xFE;  // negative NaNs
    ASSERT_TRUE(std::isnan(load_as_f32(codes.data(), dtype, nan_code)));
    std::copy_n(&codes[static_cast<size_t>(nan_code) * esize], esize, element(layer.k, 1, 100));
    // With one key any finite score gives it weight 1 and leaves the output at V: a NaN code
    // widened to a finite value would change nothing. Widened to NaN, kv head 1's rows follow
    // the reference's treatment of a NaN score; kv head 0's rows are untouched.
    const std::vector<float> poisoned = run_fast(s, {.num_threads = 1});
    const std::vector<float> ref = s.reference(/*rounded=*/true);
    for (int32_t i = 0; i < 8 * 256; ++i) {
      const auto e = static_cast<size_t>(i);
      const float want = i < 4 * 256 ? out[e] : ref[e];
      SCOPED_TRACE("element " + std::to_string(i));
      EXPECT_EQ(std::isnan(poisoned[e]), std::isnan(want));
      if (!std::isnan(want)) EXPECT_EQ(poisoned[e], want);
      if (i >= 4 * 256 && out[e] != 0.0f && std::isfinite(out[e])) EXPECT_NE(poisoned[e], out[e]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FastPerTarget,
                         ::testing::ValuesIn(detail::fast_attention_targets()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(FastAttention, TargetHookRejectsUnknownNames) {
  const std::string best = detail::fast_attention_target();
  EXPECT_FALSE(detail::force_fast_attention_target("NOT_A_TARGET"));
  EXPECT_EQ(std::string(detail::fast_attention_target()), best);
  ASSERT_FALSE(detail::fast_attention_targets().empty());
  EXPECT_EQ(detail::fast_attention_targets().front(), best);
  EXPECT_GE(detail::fast_attention_max_threads(), 1);
}

TEST(FastAttention, ResultDoesNotDependOnThreadCountWithoutPartitions) {
  // Items are independent when no key range is split: any thread count gives the same bits.
  AttentionCase c{
      .dtype = DType::kBF16, .block_size = 16, .num_kv_heads = 4, .group = 2, .context = 700};
  const PagedScenario s = scenario_for(c, 5);
  const std::vector<float> one =
      run_fast(s, {.num_threads = 1, .partition_keys = 0, .heads_per_item = 0});
  const std::vector<float> four =
      run_fast(s, {.num_threads = 4,
                   .partition_keys = std::numeric_limits<int64_t>::max(),
                   .heads_per_item = 0});
  EXPECT_EQ(one, four);
}

TEST(FastAttention, LongContextPartitionsMergeToTheUnsplitResult) {
  // 20k keys in partitions of 1k, 3k (not dividing the context) and automatic ones, against
  // the single pass: the log-sum-exp merge is exact up to fp32 rounding.
  AttentionCase c{.dtype = DType::kF16,
                  .head_dim = 128,
                  .block_size = 16,
                  .num_kv_heads = 1,
                  .group = 8,
                  .context = 20000};
  PagedScenario s = scenario_for(c, 11);
  s.params.scale = 0.5f;  // sharper softmax: partitions have very different maxima
  const std::vector<float> whole =
      run_fast(s, {.num_threads = 1, .partition_keys = 0, .heads_per_item = 0});
  EXPECT_LE(max_abs_diff(whole, run_plain(s)), kAttentionMaxAbs);
  for (int64_t part : {1000, 3000, 0}) {
    SCOPED_TRACE(part);
    EXPECT_LE(
        max_abs_diff(run_fast(s, {.num_threads = 2, .partition_keys = part, .heads_per_item = 0}),
                     whole),
        kAttentionMaxAbs);
  }
}

TEST(FastAttention, LargeScoresStayFiniteAcrossPartitions) {
  AttentionCase c{.context = 600};
  PagedScenario s = scenario_for(c, 41);
  s.params.scale = 1000.0f;  // scores ~1e4: exp without max subtraction would overflow
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const std::vector<float> out = run_fast(s, v.config);
    for (float x : out) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LE(max_abs_diff(out, run_plain(s)), kAttentionMaxAbs);
  }
}

TEST(FastAttention, RowsWithoutVisibleKeysAreZeroInEveryVariant) {
  // Padding rows (context 0) and window 0 without sinks: no key at all, output exactly 0.
  AttentionCase c{.block_size = 4, .context = 10, .window_left = 0};
  const PagedScenario s = scenario_for(c, 5);
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    for (float x : run_fast(s, v.config)) ASSERT_EQ(x, 0.0f);
  }
}

}  // namespace
}  // namespace pagedkv
