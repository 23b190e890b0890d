// Device queries (every build, with or without CUDA or a GPU) and the owning buffers.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cuda {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

using testing::message_of;

TEST(CudaDevice, RequireDeviceAgreesWithDeviceAvailable) {
  if (device_available()) {
    EXPECT_NO_THROW(require_device());
  } else {
    // The one line `pagedkv generate --device cuda` prints on a machine without a GPU.
    const std::string msg = message_of([] { require_device(); });
    EXPECT_THAT(msg, StartsWith("no CUDA device: "));
    std::printf("require_device() without a GPU: %s\n", msg.c_str());
#if !PAGEDKV_WITH_CUDA
    EXPECT_THAT(msg, HasSubstr("built without CUDA"));
#endif
    EXPECT_THAT(message_of([] { (void)device_info(); }), StartsWith("no CUDA device: "));
  }
}

#if PAGEDKV_WITH_CUDA

TEST(CudaDevice, NegativeSizesAreRejectedWithoutADevice) {
  EXPECT_THAT(message_of([] { DeviceBuffer b(-5); }), HasSubstr("size must be >= 0, got -5 bytes"));
  EXPECT_THAT(message_of([] { PinnedHostBuffer b(-1); }), HasSubstr("size must be >= 0"));
  DeviceBuffer empty(0);  // no allocation, no device call
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.bytes(), 0);
}

TEST(CudaDevice, InfoDescribesTheDevice) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const DeviceInfo info = device_info();
  std::printf("device: %s, sm_%d, %d SMs, %.1f GiB, L2 %.1f MiB\n", info.name.c_str(),
              info.compute_capability, info.sm_count,
              static_cast<double>(info.global_memory_bytes) / (1 << 30),
              static_cast<double>(info.l2_cache_bytes) / (1 << 20));
  EXPECT_FALSE(info.name.empty());
  EXPECT_GE(info.compute_capability, 80) << "the kernels are built for sm_80 and sm_90";
  EXPECT_GE(info.sm_count, 1);
}

TEST(CudaDevice, BufferRoundTripAndBounds) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  std::vector<int32_t> host(1000);
  std::iota(host.begin(), host.end(), -500);
  DeviceBuffer buffer(4000);
  buffer.upload(std::span<const int32_t>(host));
  std::vector<int32_t> back(1000, 0);
  buffer.download(std::span<int32_t>(back));
  EXPECT_EQ(back, host);
  buffer.zero();
  buffer.download(back.data(), 400, 0);
  EXPECT_EQ(back[0], 0);
  EXPECT_EQ(back[99], 0);
  EXPECT_THAT(message_of([&] { buffer.upload(host.data(), 8, 3996); }),
              HasSubstr("range [3996, 4004) outside the buffer's 4000 bytes"));
  DeviceBuffer moved = std::move(buffer);
  EXPECT_EQ(moved.bytes(), 4000);
  EXPECT_EQ(buffer.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  PinnedHostBuffer pinned(64);
  EXPECT_NE(pinned.data(), nullptr);
  EXPECT_EQ(pinned.data()[63], std::byte{0});
}

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
