// Tests for the device side of src/model/kv_backend.hpp (kv_backend_cuda.cpp): device names,
// the errors every build gives (another mode on the device, no device), and, on a GPU, the
// paged mode on the device against the CPU paged mode on a head_dim-64 model. The GPU cases
// skip with "no CUDA device" where none is usable (CI, or a build without CUDA).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/generate.hpp"
#include "model/kv_backend.hpp"
#include "model/llama.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

/// 2 query heads of head_dim elements (dim 2 x head_dim), 1 kv head (GQA 2); head64() is a size of
/// the fast decode kernel, the others run the generic one.
LlamaConfig heads_of(int32_t head_dim) {
  LlamaConfig c;
  c.dim = 2 * head_dim;
  c.hidden_dim = 192;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 300;
  c.seq_len = 64;
  c.shared_classifier = false;
  return c;
}
LlamaConfig head64() { return heads_of(64); }

KVBackendConfig geometry(int32_t head_dim, int32_t block_size) {
  KVBackendConfig g;
  g.num_layers = 2;
  g.num_heads = 2;
  g.num_kv_heads = 1;
  g.head_dim = head_dim;
  g.block_size = block_size;
  g.num_blocks = 8;
  return g;
}

TEST(Device, NamesRoundTrip) {
  for (const Device d : {Device::kCpu, Device::kCuda}) {
    EXPECT_EQ(parse_device(device_name(d)), d);
  }
  EXPECT_EQ(device_name(Device::kCuda), "cuda");
  EXPECT_EQ(parse_device("gpu"), std::nullopt);
  EXPECT_EQ(parse_device("CUDA"), std::nullopt);
  EXPECT_EQ(parse_device(""), std::nullopt);
}

TEST(Device, OnlyPagedRunsOnTheDevice) {
  for (const CacheMode m : {CacheMode::kContiguous, CacheMode::kNone}) {
    EXPECT_THAT([&] { (void)make_kv_backend(m, geometry(64, 16), Device::kCuda); },
                ThrowsMessage<Error>(AllOf(HasSubstr(std::string(cache_mode_name(m))),
                                           HasSubstr("no CUDA version"))));
  }
}

TEST(Device, NoDeviceIsOneLineNamingCuda) {
  if (cuda::device_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    (void)make_kv_backend(CacheMode::kPaged, geometry(64, 16), Device::kCuda);
    FAIL() << "no error without a device";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_THAT(what, HasSubstr("no CUDA device"));
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(Device, NoDeviceFromGenerate) {
  if (cuda::device_available()) GTEST_SKIP() << "a CUDA device is present";
  LlamaModel model(random_weights(head64(), 3));
  GenerateOptions opt;
  opt.steps = 8;
  opt.device = Device::kCuda;
  EXPECT_THAT(
      [&] {
        (void)generate(model, {{kBos, 5}}, CacheMode::kPaged, opt);
      },
      ThrowsMessage<Error>(HasSubstr("no CUDA device")));
}

TEST(DeviceGpu, UnsupportedGeometryNamesValueAndSet) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  // Past the generic kernel's largest head_dim; a block size that is not a power of two.
  EXPECT_THAT([] { (void)make_cuda_paged_backend(geometry(320, 16)); },
              ThrowsMessage<Error>(AllOf(HasSubstr("head_dim 320"), HasSubstr("1..256"))));
  EXPECT_THAT([] { (void)make_cuda_paged_backend(geometry(64, 12)); },
              ThrowsMessage<Error>(
                  AllOf(HasSubstr("block_size 12"), HasSubstr("1, 2, 4, 8, 16, 32, 64, 128"))));
}

struct GpuCase {
  const char* name;
  int32_t block_size;
  float temperature;
  int32_t head_dim = 64;
};

class DeviceAgrees : public ::testing::TestWithParam<GpuCase> {};

TEST_P(DeviceAgrees, PagedOnDeviceMatchesPagedOnCpu) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  LlamaModel model(random_weights(heads_of(GetParam().head_dim), 7));
  // Lengths 1, 5 and 19: uneven blocks, a multi-row prefill, then decode steps.
  const std::vector<std::vector<TokenId>> prompts = {
      {kBos},
      {kBos, 50, 60, 70, 80},
      {kBos, 9, 8, 7, 6, 5, 4, 3, 2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}};
  GenerateOptions opt;
  opt.steps = 48;
  opt.block_size = GetParam().block_size;
  opt.temperature = GetParam().temperature;
  opt.record_logits = true;
  const auto cpu = generate(model, prompts, CacheMode::kPaged, opt);
  opt.device = Device::kCuda;
  const auto gpu = generate(model, prompts, CacheMode::kPaged, opt);
  EXPECT_EQ(gpu.stats.device, Device::kCuda);
  const Agreement g = compare_runs(gpu, cpu);
  EXPECT_TRUE(g.same_tokens) << "seq " << g.diverge_seq << " index " << g.diverge_index;
  EXPECT_GT(g.positions_compared, 3 * 20);
  EXPECT_LE(g.max_abs_logit_diff, 1e-3);  // the CLI's agreement tolerance
  EXPECT_GE(g.max_abs_logit_diff, 0.0);
  EXPECT_EQ(gpu.stats.kv_bytes_in_use, cpu.stats.kv_bytes_in_use);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DeviceAgrees,
    ::testing::Values(GpuCase{"bs8_greedy", 8, 0.0f}, GpuCase{"bs16_greedy", 16, 0.0f},
                      GpuCase{"bs32_t08", 32, 0.8f},
                      // Page sizes 1 and 128; the generic kernel's
                      // head sizes (stories260K's 8, 96, 80).
                      GpuCase{"bs1_greedy", 1, 0.0f}, GpuCase{"bs128_t08", 128, 0.8f},
                      GpuCase{"d8_bs1_greedy", 1, 0.0f, 8}, GpuCase{"d8_bs16_t08", 16, 0.8f, 8},
                      GpuCase{"d96_bs64_greedy", 64, 0.0f, 96},
                      GpuCase{"d80_bs16_greedy", 16, 0.0f, 80}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pagedkv::model
