// paged_decode_attention / paged_prefill_attention with fp16 / bf16 queries and outputs (the
// ActivationView overloads): the result must be the fp32 entry point's on the widened q, each
// output rounded to nearest even. The rounding here is independent of dtype.hpp's bit tricks:
// the nearest of all finite values of the format (decoded with ldexp), ties to the even code.
// Across decode / prefill, HND / NHD, GQA and K/V dtypes; bad dtypes and sizes throw naming the
// value and leave out untouched.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error_message.hpp"
#include "common/paged_scenario.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using testing::message_of;
using testing::PagedScenario;
using testing::scenario_from_case;
using testing::SeqSpec;

/// Every finite non-negative value of a 16-bit float format, in code order (which is value
/// order), decoded from its fields: fp16 1-5-10 (bias 15), bf16 1-8-7 (bias 127).
struct Format16 {
  std::vector<double> values;  // index = code (sign bit clear)
  explicit Format16(DType dtype) {
    const int man_bits = dtype == DType::kF16 ? 10 : 7;
    const int bias = dtype == DType::kF16 ? 15 : 127;
    const uint32_t exp_max = dtype == DType::kF16 ? 31 : 255;
    for (uint32_t code = 0; (code >> man_bits) < exp_max; ++code) {
      const uint32_t e = code >> man_bits;
      const uint32_t m = code & ((1u << man_bits) - 1);
      values.push_back(e == 0 ? std::ldexp(double(m), 1 - bias - man_bits)
                              : std::ldexp(double((1u << man_bits) + m), int(e) - bias - man_bits));
    }
  }
  [[nodiscard]] double decode(uint16_t bits) const {
    const double v = values.at(bits & 0x7FFFu);
    return (bits & 0x8000u) ? -v : v;
  }
  /// Round to nearest, ties to the even code (finite results only: the test's values are < 10).
  [[nodiscard]] uint16_t round(float x) const {
    const double a = std::fabs(double(x));
    const auto hi = std::lower_bound(values.begin(), values.end(), a);
    EXPECT_NE(hi, values.end()) << x << " is past the format's range";
    auto code = static_cast<uint16_t>(hi - values.begin());
    if (*hi != a && code > 0) {
      const double up = *hi - a;
      const double down = a - values[code - 1];
      if (down < up || (down == up && (code & 1u))) --code;
    }
    return static_cast<uint16_t>(code | (std::signbit(x) ? 0x8000u : 0u));
  }
};

struct ActCase {
  bool prefill = false;
  KVLayout layout = KVLayout::kHND;
  int32_t group = 1;
  DType dtype = DType::kF32;  // K/V storage
  int32_t block_size = 16;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 64;
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
};

PagedScenario scenario_for(const ActCase& c) {
  const std::vector<SeqSpec> seqs = c.prefill
                                        ? std::vector<SeqSpec>{{40, 9}, {16, 16}, {5, 1}, {33, 2}}
                                        : std::vector<SeqSpec>{{37, 1}, {0, 1}, {16, 1}, {70, 1}};
  return scenario_from_case(c, seqs, 17u + uint32_t(c.group) * 3u + uint32_t(c.dtype));
}

/// Runs the ActivationView overload of the case's entry point.
void run_typed(const ActCase& c, const PagedScenario& s, ActivationView q,
               MutableActivationView out) {
  if (c.prefill) {
    paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, q, out);
  } else {
    paged_decode_attention(s.params, s.layer(), s.view(), q, out);
  }
}

std::vector<float> run_fp32(const ActCase& c, const PagedScenario& s, const std::vector<float>& q) {
  std::vector<float> out(q.size(), -7.0f);
  if (c.prefill) {
    paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, q, out);
  } else {
    paged_decode_attention(s.params, s.layer(), s.view(), q, out);
  }
  return out;
}

/// One (q dtype, out dtype) combination: q rounded into q_dtype (kept fp32 for kF32), the typed
/// call against the fp32 call on the widened q, its output rounded by Format16.
void check_combination(const ActCase& c, const PagedScenario& s, DType q_dtype, DType out_dtype) {
  SCOPED_TRACE(std::string("q ") + std::string(dtype_name(q_dtype)) + ", out " +
               std::string(dtype_name(out_dtype)));
  std::vector<uint16_t> q16(s.q.size());
  std::vector<float> q_wide = s.q;  // what the kernel must see
  if (q_dtype != DType::kF32) {
    const Format16 f(q_dtype);
    for (size_t i = 0; i < s.q.size(); ++i) {
      q16[i] = f.round(s.q[i]);
      q_wide[i] = static_cast<float>(f.decode(q16[i]));
    }
  }
  const std::vector<float> expected = run_fp32(c, s, q_wide);
  const ActivationView q = q_dtype == DType::kF32 ? ActivationView{s.q.data(), s.q.size(), q_dtype}
                                                  : ActivationView{q16.data(), q16.size(), q_dtype};
  if (out_dtype == DType::kF32) {
    std::vector<float> out(s.q.size(), -7.0f);
    run_typed(c, s, q, {out.data(), out.size(), out_dtype});
    EXPECT_EQ(out, expected);
    return;
  }
  std::vector<uint16_t> out(s.q.size(), 0xABCDu);
  run_typed(c, s, q, {out.data(), out.size(), out_dtype});
  const Format16 f(out_dtype);
  int64_t mismatches = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != f.round(expected[i]) && mismatches++ < 5) {
      ADD_FAILURE() << "element " << i << ": got bits " << out[i] << ", expected "
                    << f.round(expected[i]) << " (fp32 " << expected[i] << ")";
    }
  }
  EXPECT_EQ(mismatches, 0);
}

class ActivationDTypes : public ::testing::TestWithParam<ActCase> {};

TEST_P(ActivationDTypes, EqualFp32KernelOnWidenedQRounded) {
  const ActCase& c = GetParam();
  const PagedScenario s = scenario_for(c);
  check_combination(c, s, DType::kF16, DType::kF16);
  check_combination(c, s, DType::kBF16, DType::kBF16);
  check_combination(c, s, DType::kBF16, DType::kF32);
  check_combination(c, s, DType::kF32, DType::kF16);
  check_combination(c, s, DType::kF32, DType::kF32);
}

std::vector<ActCase> cases() {
  std::vector<ActCase> out;
  for (bool prefill : {false, true}) {
    for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
      for (int32_t group : {1, 4}) {
        for (DType dtype : {DType::kF32, DType::kBF16, DType::kFP8E4M3, DType::kInt8}) {
          out.push_back({.prefill = prefill, .layout = layout, .group = group, .dtype = dtype});
        }
      }
    }
  }
  // A sliding window with sinks, so masked rows round too.
  out.push_back(
      {.prefill = true, .group = 2, .dtype = DType::kF16, .window_left = 7, .sink_tokens = 2});
  return out;
}

std::string case_name(const ::testing::TestParamInfo<ActCase>& info) {
  const ActCase& c = info.param;
  std::string name = std::string(c.prefill ? "prefill_" : "decode_") +
                     (c.layout == KVLayout::kNHD ? "nhd_" : "hnd_") + "gqa" +
                     std::to_string(c.group) + "_" + std::string(dtype_name(c.dtype));
  if (c.window_left >= 0) name += "_win" + std::to_string(c.window_left);
  return name;
}

INSTANTIATE_TEST_SUITE_P(Grid, ActivationDTypes, ::testing::ValuesIn(cases()), case_name);

TEST(ActivationDTypes, HandWorkedRounding) {
  // The oracle itself: 1 + 2^-11 is halfway between fp16 1 and 1 + 2^-10 (ties to even: 1);
  // 1 + 3 * 2^-11 rounds up to 1 + 2^-9 (even code); bf16 1 + 2^-8 ties to 1.
  const Format16 f16(DType::kF16);
  const Format16 bf16(DType::kBF16);
  EXPECT_EQ(f16.round(1.0f + 0x1p-11f), 0x3C00u);
  EXPECT_EQ(f16.round(1.0f + 3 * 0x1p-11f), 0x3C02u);
  EXPECT_EQ(f16.round(-2.0f), 0xC000u);
  EXPECT_EQ(bf16.round(1.0f + 0x1p-8f), 0x3F80u);
  EXPECT_EQ(bf16.round(1.0f + 3 * 0x1p-8f), 0x3F82u);
  EXPECT_EQ(f16.decode(0x0001u), 0x1p-24);
}

TEST(ActivationDTypes, BadDTypeOrSizeThrowsAndLeavesOutAsItWas) {
  const ActCase c{.group = 2};
  const PagedScenario s = scenario_for(c);
  std::vector<uint16_t> q(s.q.size(), 0x3C00u);
  std::vector<uint16_t> out(s.q.size(), 0xABCDu);
  const auto run = [&](ActivationView qv, MutableActivationView ov) {
    return message_of([&] { run_typed(c, s, qv, ov); });
  };
  EXPECT_THAT(run({q.data(), q.size(), DType::kFP8E4M3}, {out.data(), out.size(), DType::kF16}),
              HasSubstr("paged_decode_attention: q dtype fp8_e4m3 is not fp32, fp16 or bf16"));
  EXPECT_THAT(run({q.data(), q.size(), DType::kF16}, {out.data(), out.size(), DType::kInt8}),
              HasSubstr("out dtype int8 is not fp32, fp16 or bf16"));
  EXPECT_THAT(run({q.data(), q.size() - 1, DType::kF16}, {out.data(), out.size(), DType::kBF16}),
              HasSubstr("q has " + std::to_string(q.size() - 1) + " elements, expected " +
                        std::to_string(q.size())));
  EXPECT_THAT(run({q.data(), q.size(), DType::kBF16}, {out.data(), out.size() + 1, DType::kF16}),
              HasSubstr("out has " + std::to_string(out.size() + 1) + " elements"));
  EXPECT_THAT(run({nullptr, q.size(), DType::kBF16}, {out.data(), out.size(), DType::kF16}),
              HasSubstr("q is null with " + std::to_string(q.size()) + " elements"));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint16_t b) { return b == 0xABCDu; }));
  const ActCase p{.prefill = true};
  const PagedScenario sp = scenario_for(p);
  std::vector<uint16_t> qp(sp.q.size(), 0x3C00u);
  std::vector<uint16_t> op(sp.q.size(), 0xABCDu);
  EXPECT_THAT(message_of([&] {
                paged_prefill_attention(sp.params, sp.layer(), sp.view(), sp.query_start,
                                        {qp.data(), qp.size(), DType::kFP8E5M2},
                                        {op.data(), op.size(), DType::kBF16});
              }),
              HasSubstr("paged_prefill_attention: q dtype fp8_e5m2"));
  EXPECT_TRUE(std::all_of(op.begin(), op.end(), [](uint16_t b) { return b == 0xABCDu; }));
}

}  // namespace
}  // namespace pagedkv
