// DeviceKVCache: construction errors (some need no GPU), host mirror round trip, layer views,
// writes from host memory, copy-on-write copies and swap out/in, bit-identical against
// HostKVCache.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

using ::testing::HasSubstr;

using testing::message_of;

constexpr KVPlacement kPlacements[] = {KVPlacement::kSeparate, KVPlacement::kInterleaved};

using testing::fill_random;
using testing::placement_name;

KVCacheConfig config_of(DType dtype, KVLayout layout = KVLayout::kHND,
                        KVPlacement placement = KVPlacement::kInterleaved) {
  KVCacheConfig c;
  c.num_layers = 3;
  c.num_blocks = 16;
  c.block_size = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.dtype = dtype;
  c.layout = layout;
  c.placement = placement;
  return c;
}

TEST(DeviceKVCacheErrors, InvalidArgumentsBeforeAnyDeviceCall) {
  KVCacheConfig bad = config_of(DType::kF16);
  bad.num_blocks = 0;
  EXPECT_THROW(DeviceKVCache{bad}, Error);
  EXPECT_THAT(message_of([] { DeviceKVCache cache(config_of(DType::kF16), -1); }),
              HasSubstr("num_host_blocks must be >= 0, got -1"));
}

TEST(DeviceKVCacheErrors, NoDeviceIsAClearError) {
  if (device_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THAT(message_of([] { DeviceKVCache cache(config_of(DType::kF16)); }),
              HasSubstr("no CUDA device"));
}

TEST(DeviceKVCache, GeometryMatchesHost) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
    for (KVPlacement placement : kPlacements) {
      SCOPED_TRACE(std::string(placement_name(placement)));
      const KVCacheConfig c = config_of(DType::kBF16, layout, placement);
      DeviceKVCache device(c, 4);
      HostKVCache host(c);
      EXPECT_EQ(device.bytes(), host.bytes());
      EXPECT_EQ(device.pool_block_bytes(), 8 * 2 * 64 * 2);
      EXPECT_EQ(device.block_bytes(), 2 * 3 * device.pool_block_bytes());
      EXPECT_EQ(static_cast<int64_t>(host.block_bytes(0).size()), device.block_bytes());
      const bool interleaved = placement == KVPlacement::kInterleaved;
      EXPECT_EQ(device.num_copy_pools(), interleaved ? 3 : 6);
      EXPECT_EQ(device.copy_block_bytes(), (interleaved ? 2 : 1) * device.pool_block_bytes());
      for (int32_t l = 0; l < c.num_layers; ++l) {
        const KVLayerView d = device.layer(l);
        const KVLayerView h = host.layer(l);
        EXPECT_EQ(d.block_stride, h.block_stride);
        EXPECT_EQ(d.head_stride, h.head_stride);
        EXPECT_EQ(d.token_stride, h.token_stride);
        EXPECT_EQ(static_cast<std::byte*>(d.v) - static_cast<std::byte*>(d.k),
                  static_cast<std::byte*>(h.v) - static_cast<std::byte*>(h.k));
      }
      EXPECT_THAT(message_of([&] { (void)device.layer(3); }),
                  HasSubstr("layer 3 out of range [0, 3)"));
    }
  }
}

TEST(DeviceKVCache, UploadDownloadRoundTrip) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (KVPlacement placement : kPlacements) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::string(placement_name(placement)));
      const KVCacheConfig c = config_of(dtype, KVLayout::kHND, placement);
      HostKVCache host(c);
      fill_random(host, 3);
      DeviceKVCache device(c);
      device.upload(host);
      HostKVCache back(c);
      device.download(back);
      for (BlockId b = 0; b < c.num_blocks; ++b)
        EXPECT_EQ(back.block_bytes(b), host.block_bytes(b));
      KVCacheConfig other = c;
      other.head_dim = 128;
      HostKVCache wrong(other);
      EXPECT_THAT(message_of([&] { device.upload(wrong); }), HasSubstr("head_dim 64 != 128"));
      KVCacheConfig other_placement = c;
      other_placement.placement =
          placement == KVPlacement::kSeparate ? KVPlacement::kInterleaved : KVPlacement::kSeparate;
      HostKVCache mismatched(other_placement);
      EXPECT_THAT(message_of([&] { device.upload(mismatched); }), HasSubstr("placement"));
    }
  }
}

TEST(DeviceKVCache, SwapRoundTripIsBitIdenticalAtNewIds) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
      for (KVPlacement placement : kPlacements) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) +
                     (layout == KVLayout::kHND ? " HND " : " NHD ") +
                     std::string(placement_name(placement)));
        const KVCacheConfig c = config_of(dtype, layout, placement);
        HostKVCache original(c);
        fill_random(original, 21);
        DeviceKVCache device(c, /*num_host_blocks=*/6);
        device.upload(original);

        // Blocks 3, 4, 5 (one run: one 2D copy per pool) and 9 go to host blocks 0..3.
        const std::vector<BlockCopy> out = {{3, 0}, {4, 1}, {5, 2}, {9, 3}};
        device.swap_out(out);
        synchronize(nullptr);
        for (const BlockCopy& p : out) {
          const std::span<const std::byte> swapped = device.host_block(p.dst);
          const std::vector<std::byte> expected = original.block_bytes(p.src);
          EXPECT_TRUE(std::equal(swapped.begin(), swapped.end(), expected.begin(), expected.end()))
              << "host block " << p.dst;
        }

        // Preemption frees the device blocks; they come back at other ids.
        device.zero();
        const std::vector<BlockCopy> in = {{0, 12}, {1, 13}, {2, 14}, {3, 1}};
        device.swap_in(in);
        synchronize(nullptr);
        HostKVCache back(c);
        device.download(back);
        const std::vector<std::byte> zeros(static_cast<size_t>(device.block_bytes()), std::byte{0});
        for (BlockId b = 0; b < c.num_blocks; ++b) {
          BlockId from = -1;
          for (size_t i = 0; i < in.size(); ++i) {
            if (in[i].dst == b) from = out[static_cast<size_t>(in[i].src)].src;
          }
          EXPECT_EQ(back.block_bytes(b), from < 0 ? zeros : original.block_bytes(from))
              << "device block " << b;
        }
      }
    }
  }
}

TEST(DeviceKVCache, SwapRejectsBadPairsAndChangesNothing) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const KVCacheConfig c = config_of(DType::kF16);
  HostKVCache original(c);
  fill_random(original, 31);
  DeviceKVCache device(c, 2);
  device.upload(original);
  // Known bytes in both host blocks (device blocks 5 and 7), so a partial copy of a rejected
  // batch would show in the host pool as well as in the device pool.
  device.swap_out(std::vector<BlockCopy>{{5, 0}, {7, 1}});
  synchronize(nullptr);
  auto host_bytes = [&](BlockId j) {
    const std::span<const std::byte> h = device.host_block(j);
    return std::vector<std::byte>(h.begin(), h.end());
  };
  ASSERT_EQ(host_bytes(0), original.block_bytes(5));
  ASSERT_EQ(host_bytes(1), original.block_bytes(7));
  // Every rejected batch has a valid pair first: checks must run before any copy.
  EXPECT_THAT(message_of([&] {
                device.swap_out(std::vector<BlockCopy>{{1, 0}, {16, 1}});
              }),
              HasSubstr("source device block 16 out of range [0, 16)"));
  EXPECT_THAT(message_of([&] {
                device.swap_out(std::vector<BlockCopy>{{1, 0}, {2, 2}});
              }),
              HasSubstr("destination host block 2 out of range [0, 2)"));
  EXPECT_THAT(message_of([&] {
                device.swap_out(std::vector<BlockCopy>{{1, 0}, {2, 0}});
              }),
              HasSubstr("destination host block 0 appears twice"));
  EXPECT_THAT(message_of([&] {
                device.swap_in(std::vector<BlockCopy>{{0, 3}, {2, 4}});
              }),
              HasSubstr("source host block 2 out of range [0, 2)"));
  EXPECT_THAT(message_of([&] {
                device.swap_in(std::vector<BlockCopy>{{0, 3}, {1, 16}});
              }),
              HasSubstr("destination device block 16 out of range [0, 16)"));
  EXPECT_THAT(message_of([&] {
                device.swap_in(std::vector<BlockCopy>{{0, 3}, {1, 3}});
              }),
              HasSubstr("destination device block 3 appears twice"));
  EXPECT_THAT(message_of([&] { (void)device.host_block(2); }),
              HasSubstr("block 2 out of range [0, 2)"));
  // Read both pools back: nothing of any rejected batch was copied.
  synchronize(nullptr);
  HostKVCache back(c);
  device.download(back);
  for (BlockId b = 0; b < c.num_blocks; ++b) {
    EXPECT_EQ(back.block_bytes(b), original.block_bytes(b)) << "device block " << b;
  }
  EXPECT_EQ(host_bytes(0), original.block_bytes(5)) << "host block 0";
  EXPECT_EQ(host_bytes(1), original.block_bytes(7)) << "host block 1";
}

TEST(DeviceKVCache, CopyBlocksRejectsOverlapsBeforeCopying) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const KVCacheConfig c = config_of(DType::kF32);
  HostKVCache host(c);
  fill_random(host, 9);
  DeviceKVCache device(c);
  device.upload(host);
  EXPECT_THAT(message_of([&] {
                device.copy_blocks(std::vector<BlockCopy>{{1, 2}, {3, 2}});
              }),
              HasSubstr("destination block 2 appears twice"));
  EXPECT_THAT(message_of([&] {
                device.copy_blocks(std::vector<BlockCopy>{{1, 2}, {2, 3}});
              }),
              HasSubstr("block 2 is both a source and a destination"));
  EXPECT_THAT(message_of([&] {
                device.copy_blocks(std::vector<BlockCopy>{{1, 16}});
              }),
              HasSubstr("destination block 16 out of range [0, 16)"));
  HostKVCache back(c);
  device.download(back);
  for (BlockId b = 0; b < c.num_blocks; ++b) EXPECT_EQ(back.block_bytes(b), host.block_bytes(b));
}

TEST(DeviceKVCache, WriteFromHostMatchesHostWriteAndChecksFirst) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  KVCacheConfig c = config_of(DType::kBF16);
  c.num_blocks = 6;  // 48 slots
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const std::vector<Slot> slots = {7, -1, 40, 0, 47};
  std::vector<float> k(slots.size() * 128);
  std::vector<float> v(k.size());
  for (float& x : k) x = uni(rng);
  for (float& x : v) x = uni(rng);
  HostKVCache host(c);
  host.write(1, slots, k, v);
  DeviceKVCache device(c);
  device.write(1, slots, k, v);
  EXPECT_THAT(message_of([&] {
                device.write(1, std::vector<Slot>{3, 48}, k, v);
              }),
              HasSubstr("k has 640 and v 640 elements, expected 256"));
  const std::vector<float> k2(256, std::numeric_limits<float>::quiet_NaN());
  EXPECT_THAT(message_of([&] {
                device.write(0, std::vector<Slot>{3, 48}, k2, k2);
              }),
              HasSubstr("slot 48 of token 1 out of range [0, 48)"));
  HostKVCache back(c);
  device.download(back);
  for (BlockId b = 0; b < c.num_blocks; ++b) EXPECT_EQ(back.block_bytes(b), host.block_bytes(b));
}

#else  // !PAGEDKV_WITH_CUDA

TEST(DeviceKVCache, SkippedWithoutCuda) { GTEST_SKIP() << "no CUDA device (built without CUDA)"; }

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
