// DeviceDecodeRunner: the host-span attention a CLI uses. prefill() (decode rows per query token)
// against the CPU paged_prefill_attention, and the host-side errors of decode().

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/attention_bound.hpp"
#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
#include "common/paged_scenario.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/cuda/device_decode_runner.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

using ::testing::HasSubstr;
using testing::make_scenario;
using testing::PagedScenario;
using testing::SeqSpec;

using testing::message_of;

PagedScenario prefill_scenario(DType dtype, int32_t head_dim, int32_t block_size,
                               int32_t window_left = -1) {
  KVCacheConfig geometry;
  geometry.block_size = block_size;
  geometry.num_kv_heads = 2;
  geometry.head_dim = head_dim;
  geometry.dtype = dtype;
  AttentionParams params;
  params.num_heads = 6;
  params.num_kv_heads = 2;
  params.head_dim = head_dim;
  params.window_left = window_left;
  // A chunk after a cached prefix, a whole prompt, a decode row and an empty padding row.
  return make_scenario(geometry, params, {{1031, 19}, {40, 40}, {21, 1}, {0, 0}}, 5);
}

TEST(DeviceDecodeRunner, PrefillMatchesCpuPrefill) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (auto [dtype, d, bs, window] :
       {std::tuple{DType::kF16, 128, 16, -1}, std::tuple{DType::kF32, 64, 8, -1},
        std::tuple{DType::kBF16, 256, 32, 30}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " d" + std::to_string(d));
    const PagedScenario s = prefill_scenario(dtype, d, bs, window);
    std::vector<float> cpu(s.q.size());
    paged_prefill_attention(s.params, s.layer(), s.view(), s.query_start, s.q, cpu);
    DeviceKVCache device(s.config);
    device.upload(*s.cache);
    DeviceDecodeRunner runner;
    std::vector<float> gpu = testing::nan_filled(s.q.size());
    runner.prefill(s.params, device.layer(PagedScenario::kLayer), s.view(), s.query_start, s.q,
                   gpu);
    // The CPU kernel read the cache the device copy came from (same stored K/V; q and out fp32
    // on both sides): the fp32 bound for every dtype, element by element.
    EXPECT_TRUE(testing::attention_within(gpu, cpu, int64_t{s.params.num_heads} * d));
  }
}

TEST(DeviceDecodeRunner, DecodeChecksTablesOnTheHost) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  KVCacheConfig c;
  c.num_blocks = 4;
  c.block_size = 8;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.dtype = DType::kF16;
  DeviceKVCache device(c);
  DeviceDecodeRunner runner;
  AttentionParams params;
  params.head_dim = 64;
  std::vector<float> q(64), out(64);
  int32_t table[2] = {1, 4};
  int32_t ctx[1] = {9};
  EXPECT_THAT(message_of([&] {
                runner.decode(params, device.layer(0), {table, ctx, 1, 2}, q, out);
              }),
              HasSubstr("block id 4 (sequence 0, logical block 1) out of range [0, 4)"));
  ctx[0] = 17;
  EXPECT_THAT(message_of([&] {
                runner.decode(params, device.layer(0), {table, ctx, 1, 2}, q, out);
              }),
              HasSubstr("context length 17 of sequence 0 outside [0, max_blocks_per_seq 2"));
  ctx[0] = 3;
  std::vector<float> short_q(10);
  EXPECT_THAT(message_of([&] {
                runner.decode(params, device.layer(0), {table, ctx, 1, 2}, short_q, out);
              }),
              HasSubstr("q has 10 elements, expected 64"));
  KVCacheConfig bad = c;
  bad.block_size = 12;
  DeviceKVCache unsupported(bad);
  EXPECT_THAT(message_of([&] {
                runner.decode(params, unsupported.layer(0), {table, ctx, 1, 2}, q, out);
              }),
              HasSubstr("block_size 12 is not supported (supported: 1, 2, 4, 8, 16, 32, 64, 128)"));
}

#else  // !PAGEDKV_WITH_CUDA

TEST(DeviceDecodeRunner, SkippedWithoutCuda) {
  GTEST_SKIP() << "no CUDA device (built without CUDA)";
}

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
