// CUDA reshape_and_cache and copy_blocks: host-side rejections (no GPU needed), and on a GPU
// bit-identical agreement with HostKVCache::write / HostKVCache::copy_blocks.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

#if PAGEDKV_WITH_CUDA
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

using ::testing::HasSubstr;

using testing::message_of;

KVLayerView fake_view() {
  KVLayerView v;
  v.k = reinterpret_cast<void*>(uintptr_t{0x10000});
  v.v = reinterpret_cast<void*>(uintptr_t{0x20000});
  v.dtype = DType::kF16;
  v.num_blocks = 4;
  v.block_size = 16;
  v.num_kv_heads = 2;
  v.head_dim = 64;
  layout_strides(KVLayout::kHND, 16, 2, 64, &v.block_stride, &v.head_stride, &v.token_stride);
  return v;
}

TEST(CacheOpsRejection, ReshapeAndCacheChecksOnTheHost) {
  NewKV in;
  in.num_tokens = -1;
  EXPECT_THAT(message_of([&] { reshape_and_cache(fake_view(), in); }),
              HasSubstr("num_tokens -1 outside [0, 2^31 - 1]"));
  in.num_tokens = 3;
  EXPECT_THAT(message_of([&] { reshape_and_cache(fake_view(), in); }),
              HasSubstr("null input for 3 tokens"));
  KVLayerView bad = fake_view();
  bad.block_size = 0;
  EXPECT_THAT(message_of([&] { reshape_and_cache(bad, in); }), HasSubstr("invalid cache view"));
  in.num_tokens = 0;
  EXPECT_NO_THROW(reshape_and_cache(fake_view(), in));  // nothing to do, nothing launched
}

TEST(CacheOpsRejection, CopyBlocksChecksOnTheHost) {
  EXPECT_THAT(message_of([] { copy_blocks(nullptr, 70000, 16, nullptr, 1); }),
              HasSubstr("num_pools 70000 outside [0, 65535]"));
  EXPECT_THAT(message_of([] { copy_blocks(nullptr, 2, 16, nullptr, -1); }),
              HasSubstr("num_pairs must be >= 0, got -1"));
  EXPECT_THAT(message_of([] { copy_blocks(nullptr, 2, 0, nullptr, 1); }),
              HasSubstr("block_bytes must be >= 1, got 0"));
  EXPECT_THAT(message_of([] { copy_blocks(nullptr, 2, 16, nullptr, 1); }),
              HasSubstr("null pools or pairs"));
  EXPECT_NO_THROW(copy_blocks(nullptr, 2, 16, nullptr, 0));
}

// ---- GPU ---------------------------------------------------------------------------------------

struct WriteCase {
  DType dtype;
  KVLayout layout;
  DType src_dtype;
  KVPlacement placement;
};

KVCacheConfig small_config(DType dtype, KVLayout layout,
                           KVPlacement placement = KVPlacement::kInterleaved) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_blocks = 20;
  c.block_size = 16;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.dtype = dtype;
  c.layout = layout;
  c.placement = placement;
  return c;
}

using testing::all_bytes;
using testing::fill_random;
using testing::placement_name;

class CudaReshapeAndCache : public ::testing::TestWithParam<WriteCase> {};

TEST_P(CudaReshapeAndCache, BitIdenticalToHostWrite) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const WriteCase& wc = GetParam();
  const KVCacheConfig config = small_config(wc.dtype, wc.layout, wc.placement);
  const int64_t row = int64_t{config.num_kv_heads} * config.head_dim;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  // 50 tokens to scattered slots, every 7th is padding (-1), one hits the last slot.
  std::vector<Slot> slots;
  std::vector<int32_t> order(static_cast<size_t>(config.num_blocks * config.block_size));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int i = 0; i < 50; ++i) slots.push_back(i % 7 == 3 ? -1 : order[static_cast<size_t>(i)]);
  slots.back() = int64_t{config.num_blocks} * config.block_size - 1;
  std::vector<float> k(static_cast<size_t>(50 * row));
  std::vector<float> v(k.size());
  for (float& x : k) x = uni(rng);
  for (float& x : v) x = uni(rng);

  // Inputs in src_dtype: the host writes the same values (already rounded to src_dtype).
  std::vector<std::byte> k_src(k.size() * static_cast<size_t>(dtype_size(wc.src_dtype)));
  std::vector<std::byte> v_src(k_src.size());
  for (size_t i = 0; i < k.size(); ++i) {
    store_from_f32(k_src.data(), wc.src_dtype, static_cast<int64_t>(i), k[i]);
    store_from_f32(v_src.data(), wc.src_dtype, static_cast<int64_t>(i), v[i]);
    k[i] = load_as_f32(k_src.data(), wc.src_dtype, static_cast<int64_t>(i));
    v[i] = load_as_f32(v_src.data(), wc.src_dtype, static_cast<int64_t>(i));
  }
  HostKVCache host(config);
  host.write(1, slots, k, v);

  DeviceKVCache device(config);
  DeviceBuffer d_k(static_cast<int64_t>(k_src.size()));
  DeviceBuffer d_v(static_cast<int64_t>(v_src.size()));
  DeviceBuffer d_slots(static_cast<int64_t>(slots.size() * sizeof(Slot)));
  d_k.upload(std::span<const std::byte>(k_src));
  d_v.upload(std::span<const std::byte>(v_src));
  d_slots.upload(std::span<const Slot>(slots));
  NewKV in;
  in.k = d_k.data();
  in.v = d_v.data();
  in.dtype = wc.src_dtype;
  in.slot_mapping = d_slots.as<const int64_t>();
  in.num_tokens = static_cast<int64_t>(slots.size());
  device.write(1, in);
  HostKVCache back(config);
  device.download(back);
  EXPECT_EQ(all_bytes(back), all_bytes(host));
}

std::string write_name(const ::testing::TestParamInfo<WriteCase>& info) {
  return std::string(dtype_name(info.param.dtype)) +
         (info.param.layout == KVLayout::kHND ? "_hnd" : "_nhd") + "_from_" +
         std::string(dtype_name(info.param.src_dtype)) + "_" +
         std::string(placement_name(info.param.placement));
}

std::vector<WriteCase> write_cases() {
  std::vector<WriteCase> cases;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
      for (DType src : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (KVPlacement placement : {KVPlacement::kSeparate, KVPlacement::kInterleaved}) {
          cases.push_back({dtype, layout, src, placement});
        }
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, CudaReshapeAndCache, ::testing::ValuesIn(write_cases()), write_name);

TEST(CudaCopyBlocks, BitIdenticalToHostCopyBlocks) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (KVPlacement placement : {KVPlacement::kSeparate, KVPlacement::kInterleaved}) {
      KVCacheConfig config = small_config(dtype, KVLayout::kHND, placement);
      config.num_layers = 3;
      HostKVCache host(config);
      fill_random(host, 11);
      DeviceKVCache device(config);
      device.upload(host);
      const std::vector<BlockCopy> pairs = {{3, 10}, {4, 11}, {7, 2}, {19, 0}};
      host.copy_blocks(pairs);
      device.copy_blocks(pairs);  // one launch: 4 pairs x 6 pools (separate) or 3 (interleaved)
      EXPECT_EQ(device.num_copy_pools(), placement == KVPlacement::kSeparate ? 6 : 3);
      HostKVCache back(config);
      device.download(back);
      EXPECT_EQ(all_bytes(back), all_bytes(host))
          << dtype_name(dtype) << " " << placement_name(placement);
    }
  }
}

TEST(CudaCopyBlocks, UnalignedBlocksTakeTheBytePath) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  // fp16, block_size 1, 1 head, head_dim 3: 6-byte blocks.
  KVCacheConfig config;
  config.num_blocks = 5;
  config.block_size = 1;
  config.head_dim = 3;
  config.dtype = DType::kF16;
  HostKVCache host(config);
  fill_random(host, 5);
  DeviceKVCache device(config);
  device.upload(host);
  const std::vector<BlockCopy> pairs = {{0, 4}, {1, 3}};
  host.copy_blocks(pairs);
  device.copy_blocks(pairs);
  HostKVCache back(config);
  device.download(back);
  EXPECT_EQ(all_bytes(back), all_bytes(host));
}

#else  // !PAGEDKV_WITH_CUDA

TEST(CudaCacheOps, SkippedWithoutCuda) { GTEST_SKIP() << "no CUDA device (built without CUDA)"; }

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
