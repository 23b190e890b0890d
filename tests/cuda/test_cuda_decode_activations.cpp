// CUDA decode attention with fp16 / bf16 queries and outputs (an engine's activations): the
// host rejects a non-activation dtype or a wrong element count before any CUDA call (no GPU
// needed); on a GPU, every (q dtype, out dtype) pair against the CPU kernel on the widened q,
// one pass and split-K, within the fp32 bound plus one rounding of the output.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/attention_bound.hpp"
#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
#include "common/paged_scenario.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/dtype.hpp"

#if PAGEDKV_WITH_CUDA
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

using ::testing::HasSubstr;
using testing::message_of;

// ---- rejection on the host (no GPU needed: the pointers are fake and never dereferenced) -----

struct FakeCall {
  KVLayerView view;
  AttentionParams params;
  int32_t table[1] = {0};
  int32_t ctx[1] = {1};
  BlockTableView tables{table, ctx, 1, 1, 16, 4};
  void* q = reinterpret_cast<void*>(uintptr_t{0x10000});
  void* out = reinterpret_cast<void*>(uintptr_t{0x20000});

  FakeCall() {
    view.k = reinterpret_cast<void*>(uintptr_t{0x30000});
    view.v = reinterpret_cast<void*>(uintptr_t{0x40000});
    view.dtype = DType::kBF16;
    view.num_blocks = 4;
    view.block_size = 16;
    view.num_kv_heads = 2;
    view.head_dim = 128;
    layout_strides(KVLayout::kHND, 16, 2, 128, &view.block_stride, &view.head_stride,
                   &view.token_stride);
    params.num_heads = 8;
    params.num_kv_heads = 2;
    params.head_dim = 128;
  }
  std::string run(DType q_dtype, size_t q_size, DType out_dtype, size_t out_size) {
    return message_of([&] {
      cuda::paged_decode_attention(params, view, tables, ActivationView{q, q_size, q_dtype},
                                   MutableActivationView{out, out_size, out_dtype});
    });
  }
};

TEST(DecodeActivations, NonActivationDtypesAndWrongSizesFailOnTheHost) {
  FakeCall f;
  const size_t n = 1 * 8 * 128;  // 1 sequence x 8 heads x 128 dims
  EXPECT_THAT(f.run(DType::kFP8E4M3, n, DType::kBF16, n),
              HasSubstr("q dtype fp8_e4m3 is not an activation dtype (fp32, fp16 or bf16)"));
  EXPECT_THAT(f.run(DType::kBF16, n, DType::kInt8, n),
              HasSubstr("out dtype int8 is not an activation dtype"));
  EXPECT_THAT(f.run(DType::kF16, n - 1, DType::kF16, n),
              HasSubstr("q has 1023 elements, expected 1024 (1 sequences x 8 heads x 128 dims)"));
  EXPECT_THAT(f.run(DType::kF16, n, DType::kF32, 2 * n),
              HasSubstr("out has 2048 elements, expected 1024"));
}

// ---- on a GPU: against the CPU kernel --------------------------------------------------------

/// `x` rounded to `dtype` (fp32, fp16, bf16) as bytes, and back to fp32 exactly.
std::vector<uint8_t> to_bytes(const std::vector<float>& x, DType dtype) {
  std::vector<uint8_t> out(x.size() * static_cast<size_t>(dtype_size(dtype)));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

std::vector<float> widen(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t n = bytes.size() / static_cast<size_t>(dtype_size(dtype));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h = 0;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = dtype == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return out;
}

/// Half an ulp of the output's rounding, relative (0 for fp32 outputs).
double rounding_of(DType dtype) {
  return dtype == DType::kF16    ? std::ldexp(1.0, -11)
         : dtype == DType::kBF16 ? std::ldexp(1.0, -8)
                                 : 0.0;
}

struct ActCase {
  DType q;
  DType out;
};

class CudaDecodeActivations : public ::testing::TestWithParam<ActCase> {};

TEST_P(CudaDecodeActivations, MatchesCpuOnTheWidenedQuery) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const ActCase c = GetParam();
  struct Geometry {
    DType dtype = DType::kBF16;
    int32_t head_dim = 128;
    int32_t block_size = 16;
    int32_t num_kv_heads = 2;
    int32_t group = 4;
    KVLayout layout = KVLayout::kHND;
    int32_t window_left = -1;
    int32_t sink_tokens = 0;
  } g;
  const testing::PagedScenario s =
      testing::scenario_from_case(g, {{1, 1}, {17, 1}, {1031, 1}, {4097, 1}}, 77u);
  // The reference: the CPU kernel on q as the device sees it (rounded to c.q, widened).
  const std::vector<uint8_t> q_bytes = to_bytes(s.q, c.q);
  const std::vector<float> q_seen = widen(q_bytes, c.q);
  std::vector<float> ref(s.q.size());
  pagedkv::paged_decode_attention(s.params, s.layer(), s.view(), q_seen, ref);

  DeviceKVCache device(s.config);
  device.upload(*s.cache);
  DeviceBuffer q(static_cast<int64_t>(q_bytes.size()));
  q.upload(q_bytes.data(), static_cast<int64_t>(q_bytes.size()));
  DeviceBuffer tables(static_cast<int64_t>(s.padded.size() * 4));
  tables.upload(std::span<const int32_t>(s.padded));
  DeviceBuffer lens(static_cast<int64_t>(s.context_lens.size() * 4));
  lens.upload(std::span<const int32_t>(s.context_lens));
  BlockTableView dev_tables = s.view();
  dev_tables.block_tables = tables.as<int32_t>();
  dev_tables.context_lens = lens.as<int32_t>();

  const size_t out_bytes = s.q.size() * static_cast<size_t>(dtype_size(c.out));
  const int64_t max_ctx = *std::max_element(s.context_lens.begin(), s.context_lens.end());
  for (const DecodePlan& plan : {DecodePlan{}, make_split_plan(max_ctx, 13)}) {
    DeviceBuffer out(static_cast<int64_t>(out_bytes));
    const std::vector<uint8_t> poison(out_bytes, 0xFF);  // NaN in fp32, fp16 and bf16
    out.upload(poison.data(), static_cast<int64_t>(out_bytes));
    const int64_t ws_bytes =
        decode_workspace_bytes(s.view().num_seqs, s.params.num_heads, s.params.head_dim, plan);
    DeviceBuffer workspace(std::max<int64_t>(ws_bytes, 256));
    DecodeLaunch launch{plan, workspace.data(), workspace.bytes(), nullptr};
    cuda::paged_decode_attention(s.params, device.layer(testing::PagedScenario::kLayer), dev_tables,
                                 ActivationView{q.data(), s.q.size(), c.q},
                                 MutableActivationView{out.data(), s.q.size(), c.out}, launch);
    synchronize(nullptr);
    std::vector<uint8_t> got_bytes(out_bytes);
    out.download(got_bytes.data(), static_cast<int64_t>(out_bytes));
    const std::vector<float> got = widen(got_bytes, c.out);
    const double rel = rounding_of(c.out);
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
      if (!(err <= testing::kAttentionMaxAbs + rel * std::fabs(ref[i]))) ++bad;
    }
    EXPECT_EQ(bad, 0) << dtype_name(c.q) << " -> " << dtype_name(c.out) << ", " << plan.num_splits
                      << " splits";
  }
}

INSTANTIATE_TEST_SUITE_P(Pairs, CudaDecodeActivations,
                         ::testing::Values(ActCase{DType::kBF16, DType::kBF16},
                                           ActCase{DType::kF16, DType::kF16},
                                           ActCase{DType::kBF16, DType::kF32},
                                           ActCase{DType::kF32, DType::kBF16},
                                           ActCase{DType::kF32, DType::kF32}),
                         [](const ::testing::TestParamInfo<ActCase>& info) {
                           return std::string(dtype_name(info.param.q)) + "_to_" +
                                  std::string(dtype_name(info.param.out));
                         });

#else  // !PAGEDKV_WITH_CUDA

TEST(CudaDecodeActivations, SkippedWithoutCuda) {
  GTEST_SKIP() << "no CUDA device (built without CUDA)";
}

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
