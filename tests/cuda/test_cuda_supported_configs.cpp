// The one list of supported CUDA decode configurations: lookups and rejection messages.
// Pure host code: runs on every machine, with or without CUDA or a GPU.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "common/error_message.hpp"
#include "pagedkv/cuda/supported_configs.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cuda {
namespace {

using ::testing::HasSubstr;

using testing::message_of;

TEST(SupportedConfigs, EveryListedCombinationIsSupported) {
  int count = 0;
  for (DType dtype : kDecodeDTypes) {
    for (int32_t d : kDecodeHeadDims) {
      EXPECT_TRUE(is_supported_decode_config(dtype, d)) << dtype_name(dtype) << " d" << d;
      for (int32_t bs : kDecodeBlockSizes) {
        EXPECT_TRUE(is_supported_decode_config(dtype, d, bs));
        EXPECT_NO_THROW(check_decode_config(dtype, d, bs));
        ++count;
      }
    }
  }
  EXPECT_EQ(count, 6 * 3 * 8);
}

TEST(SupportedConfigs, EveryHeadDimUpToTheMaximumRuns) {
  // The fast list and the generic kernel together: 1 .. kDecodeMaxHeadDim, every dtype.
  for (DType dtype : kDecodeDTypes) {
    for (int32_t d = 1; d <= kDecodeMaxHeadDim; ++d) {
      EXPECT_TRUE(is_supported_decode_config(dtype, d, 16)) << dtype_name(dtype) << " d" << d;
    }
  }
}

TEST(SupportedConfigs, ListsMatchTheIssue) {
  EXPECT_THAT(kDecodeHeadDims, ::testing::ElementsAre(64, 128, 256));
  EXPECT_EQ(kDecodeMaxHeadDim, 256);
  EXPECT_THAT(kDecodeBlockSizes, ::testing::ElementsAre(1, 2, 4, 8, 16, 32, 64, 128));
  EXPECT_THAT(kDecodeDTypes,
              ::testing::ElementsAre(DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3,
                                     DType::kFP8E5M2, DType::kInt8));
  EXPECT_EQ(
      supported_decode_configs(),
      "dtype {fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8} x head_dim {1..256; fast kernel: 64, "
      "128, 256} x block_size {1, 2, 4, 8, 16, 32, 64, 128}");
}

TEST(SupportedConfigs, BlockSizesArePowersOfTwo) {
  for (int32_t bs : kDecodeBlockSizes) EXPECT_EQ(bs & (bs - 1), 0) << bs;
}

TEST(SupportedConfigs, UnsupportedHeadDimNamesValueAndSet) {
  for (int32_t d : {-8, 0, 257, 320, 512}) {
    EXPECT_FALSE(is_supported_decode_config(DType::kF16, d, 16));
    EXPECT_EQ(message_of([&] { check_decode_config(DType::kF16, d, 16); }),
              "CUDA decode attention: head_dim " + std::to_string(d) +
                  " is not supported (supported: 1..256; fast kernel: 64, 128, 256)");
  }
}

TEST(SupportedConfigs, UnsupportedBlockSizeNamesValueAndSet) {
  for (int32_t bs : {-16, 0, 3, 7, 24, 256}) {
    EXPECT_FALSE(is_supported_decode_config(DType::kBF16, 128, bs));
    EXPECT_EQ(message_of([&] { check_decode_config(DType::kBF16, 128, bs); }),
              "CUDA decode attention: block_size " + std::to_string(bs) +
                  " is not supported (supported: 1, 2, 4, 8, 16, 32, 64, 128)");
  }
}

TEST(SupportedConfigs, UnsupportedDTypeNamesSet) {
  const auto bogus = static_cast<DType>(7);
  EXPECT_FALSE(is_supported_decode_config(bogus, 128));
  EXPECT_THAT(
      message_of([&] { check_decode_config(bogus, 128, 16); }),
      HasSubstr(
          "dtype 7 is not supported (supported: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8)"));
}

TEST(SupportedConfigs, ContiguousCheckIgnoresBlockSize) {
  EXPECT_NO_THROW(check_decode_config(DType::kF32, 64));
  EXPECT_NO_THROW(check_decode_config(DType::kF32, 72));  // the generic kernel
  EXPECT_THROW(check_decode_config(DType::kF32, 300), Error);
}

}  // namespace
}  // namespace pagedkv::cuda
