#pragma once
// Test helpers of the CUDA backend's tests (tests/cuda/test_cuda_*.cpp): the device guard, the
// precision bounds of DESIGN.md, and a NaN-filled output buffer.

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "pagedkv/config.hpp"
#include "pagedkv/cuda/device.hpp"

/// Skips the current test unless a CUDA device is usable; gtest prints "Skipped" and the
/// reason "no CUDA device" (CI has nvcc but no GPU).
#define PAGEDKV_REQUIRE_CUDA_DEVICE()           \
  do {                                          \
    if (!::pagedkv::cuda::device_available()) { \
      GTEST_SKIP() << "no CUDA device";         \
    }                                           \
  } while (0)

namespace pagedkv::testing {

/// DESIGN.md "Precision": fp32 max abs error; fp16/bf16 relative error (max-norm ratio).
inline constexpr double kCudaF32MaxAbs = 1e-5;
inline constexpr double kCudaLowPrecisionRel = 2e-2;

/// Output buffer filled with NaN, so a row a kernel forgets to write fails every comparison.
inline std::vector<float> nan_filled(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace pagedkv::testing
