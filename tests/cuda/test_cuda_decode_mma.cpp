// The tensor-core decode kernel (DecodeLaunch::use_tensor_cores, cuda/kernels/decode_mma.cu) on a
// GPU (its host rejections: test_cuda_decode_host.cpp), against a reference that does its
// arithmetic in double: q representable in the K/V dtype (so its rounding is exact), scores and
// softmax exact, each p rounded to the K/V dtype for the P.V product, l from the unrounded p.
// The bound is the fp32 one plus, per output element, one ulp of the dtype on the keys whose p
// lies within 1e-5 (relative) of a rounding boundary, where the kernel's fp32 p may round the
// other way: sum over those keys of 2^-7 (bf16; 2^-10 fp16) * p_j |v_j,d| / l. A dropped key,
// a wrong mask edge or a misplaced fragment moves an output by far more.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/attention_bound.hpp"
#include "common/attention_cases.hpp"
#include "common/cuda_test_util.hpp"
#include "common/paged_scenario.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/dtype.hpp"

#if PAGEDKV_WITH_CUDA
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

// ---- on a GPU: against the emulating reference ----------------------------------------------

/// testing::AttentionCase's geometry (bf16, head_dim 128, GQA 4 unless a case says otherwise;
/// its `context` unused) with a batch of contexts.
struct MmaCase : testing::AttentionCase {
  std::vector<int32_t> contexts = {1, 17, 4097};
  MmaCase() {
    dtype = DType::kBF16;
    head_dim = 128;
    group = 4;
  }
};

/// x rounded to `dtype` (fp16 or bf16), back in fp32.
float round_to(DType dtype, float x) {
  return dtype == DType::kF16 ? f16_to_f32(f32_to_f16(x)) : bf16_to_f32(f32_to_bf16(x));
}

struct Expected {
  std::vector<float> out;     // [num_seqs, num_heads, head_dim]
  std::vector<double> slack;  // per element: the rounding-boundary allowance of the header
};

Expected emulate(const testing::PagedScenario& s, const std::vector<float>& q) {
  const AttentionParams& a = s.params;
  const int32_t d_n = a.head_dim;
  const int32_t hkv = a.num_kv_heads;
  const int32_t group = a.num_heads / hkv;
  const DType t = s.config.dtype;
  const double ulp = t == DType::kF16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
  Expected e{std::vector<float>(q.size(), 0.0f), std::vector<double>(q.size(), 0.0)};
  for (size_t seq = 0; seq < s.seqs.size(); ++seq) {
    const int64_t ctx = s.context_lens[seq];
    if (ctx == 0) continue;
    const std::vector<float> k = s.stored(seq, false);
    const std::vector<float> v = s.stored(seq, true);
    const int64_t qpos = ctx - 1;
    const int64_t lo = AttentionParams::mask_first_visible(qpos, a.window_left, a.chunk_size);
    const int64_t sink_end =
        AttentionParams::mask_sink_end(lo, a.window_left, a.chunk_size, a.sink_tokens);
    for (int32_t h = 0; h < a.num_heads; ++h) {
      const int32_t kvh = h / group;
      const float* qh = q.data() + (seq * a.num_heads + h) * d_n;
      std::vector<int64_t> pos;
      std::vector<double> sc;  // scores, then p = exp(score - max)
      for (int64_t j = 0; j < ctx; ++j) {
        if (!(j < sink_end || (j >= lo && j <= qpos))) continue;
        const float* kj = k.data() + (j * hkv + kvh) * d_n;
        double dot = 0;
        for (int32_t d = 0; d < d_n; ++d) dot += static_cast<double>(qh[d]) * kj[d];
        pos.push_back(j);
        sc.push_back(dot * a.softmax_scale());
      }
      if (pos.empty()) continue;
      const double m = *std::max_element(sc.begin(), sc.end());
      double l = 0;
      for (double& x : sc) l += (x = std::exp(x - m));
      std::vector<double> acc(static_cast<size_t>(d_n), 0.0);
      double* slack = e.slack.data() + (seq * a.num_heads + h) * d_n;
      for (size_t i = 0; i < pos.size(); ++i) {
        const auto pf = static_cast<float>(sc[i]);
        const float pr = round_to(t, pf);
        const bool near_boundary =
            round_to(t, pf * (1 + 1e-5f)) != pr || round_to(t, pf * (1 - 1e-5f)) != pr;
        const float* vj = v.data() + (pos[i] * hkv + kvh) * d_n;
        for (int32_t d = 0; d < d_n; ++d) {
          acc[d] += pr * static_cast<double>(vj[d]) / l;
          if (near_boundary) slack[d] += ulp * sc[i] * std::fabs(vj[d]) / l;
        }
      }
      float* out = e.out.data() + (seq * a.num_heads + h) * d_n;
      for (int32_t d = 0; d < d_n; ++d) out[d] = static_cast<float>(acc[d]);
    }
  }
  return e;
}

class CudaDecodeMma : public ::testing::TestWithParam<MmaCase> {};

TEST_P(CudaDecodeMma, MatchesTheEmulatedArithmetic) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const MmaCase& c = GetParam();
  std::vector<testing::SeqSpec> seqs;
  for (int32_t ctx : c.contexts) seqs.push_back({ctx, 1});
  const testing::PagedScenario s = testing::scenario_from_case(c, std::move(seqs), 4242u);
  std::vector<float> q = s.q;
  for (float& x : q) x = round_to(c.dtype, x);  // q's rounding to the K/V dtype is then exact
  const Expected want = emulate(s, q);

  DeviceKVCache device(s.config);
  device.upload(*s.cache);
  DeviceBuffer dq(static_cast<int64_t>(q.size() * 4));
  dq.upload(std::span<const float>(q));
  DeviceBuffer tables(static_cast<int64_t>(s.padded.size() * 4));
  tables.upload(std::span<const int32_t>(s.padded));
  DeviceBuffer lens(static_cast<int64_t>(s.context_lens.size() * 4));
  lens.upload(std::span<const int32_t>(s.context_lens));
  BlockTableView dev_tables = s.view();
  dev_tables.block_tables = tables.as<int32_t>();
  dev_tables.context_lens = lens.as<int32_t>();
  const int64_t max_ctx = *std::max_element(c.contexts.begin(), c.contexts.end());
  const auto num_seqs = static_cast<int32_t>(c.contexts.size());

  for (const DecodePlan& plan :
       {DecodePlan{}, make_split_plan(max_ctx, 2), make_split_plan(max_ctx, 13),
        make_decode_plan(s.params, c.dtype, num_seqs, max_ctx)}) {
    SCOPED_TRACE(std::to_string(plan.num_splits) + " splits");
    DeviceBuffer out(static_cast<int64_t>(q.size() * 4));
    out.upload(std::span<const float>(testing::nan_filled(q.size())));
    DeviceBuffer workspace(std::max<int64_t>(
        decode_workspace_bytes(num_seqs, s.params.num_heads, s.params.head_dim, plan), 256));
    DecodeLaunch launch{plan, workspace.data(), workspace.bytes(), nullptr};
    launch.use_tensor_cores = true;
    paged_decode_attention(s.params, device.layer(testing::PagedScenario::kLayer), dev_tables,
                           dq.as<const float>(), out.as<float>(), launch);
    synchronize(nullptr);
    std::vector<float> got(q.size());
    out.download(std::span<float>(got));
    int64_t bad = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - want.out[i]);
      if (!(err <= testing::kAttentionMaxAbs + want.slack[i])) {
        ++bad;
        worst = std::max(worst, std::isnan(err) ? 1e30 : err);
      }
    }
    EXPECT_EQ(bad, 0) << "worst error " << worst;
  }
}

std::vector<MmaCase> mma_cases() {
  std::vector<MmaCase> cases;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int32_t d : {64, 128, 256}) {
      for (int32_t bs : {1, 16, 128}) {
        MmaCase c;
        c.dtype = dtype;
        c.head_dim = d;
        c.block_size = bs;
        cases.push_back(c);
      }
    }
  }
  for (int32_t group : {1, 2, 5, 8, 16, 32}) {  // padding rows, one full M, two CTAs per kv head
    MmaCase c;
    c.group = group;
    c.contexts = {1, 33, 1031};
    cases.push_back(c);
  }
  for (auto [window, sinks, chunk] :
       {std::array<int32_t, 3>{100, 0, 0}, {64, 4, 0}, {0, 3, 0}, {-1, 0, 8}, {-1, 4, 512}}) {
    MmaCase c;
    c.dtype = DType::kF16;
    c.block_size = 8;
    c.window_left = window;
    c.sink_tokens = sinks;
    c.chunk_size = chunk;
    cases.push_back(c);
  }
  MmaCase nhd;
  nhd.layout = KVLayout::kNHD;
  nhd.contexts = {0, 5, 300, 32768};
  cases.push_back(nhd);
  for (MmaCase& c : cases) {
    c.name = std::string(dtype_name(c.dtype)) + "_d" + std::to_string(c.head_dim) + "_bs" +
             std::to_string(c.block_size) + "_gqa" + std::to_string(c.group) +
             (c.layout == KVLayout::kNHD ? "_nhd" : "") +
             (c.window_left >= 0 ? "_win" + std::to_string(c.window_left) : "") +
             (c.sink_tokens > 0 ? "_sink" + std::to_string(c.sink_tokens) : "") +
             (c.chunk_size > 0 ? "_chunk" + std::to_string(c.chunk_size) : "");
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecodeMma, ::testing::ValuesIn(mma_cases()),
                         [](const auto& info) { return info.param.name; });

#else  // !PAGEDKV_WITH_CUDA

TEST(CudaDecodeMma, SkippedWithoutCuda) { GTEST_SKIP() << "no CUDA device (built without CUDA)"; }

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
