#pragma once
// CUDA runtime error checks for the host side of the CUDA backend (cuda/host/*.cpp).
// Only included when PAGEDKV_WITH_CUDA is 1. Not installed.

#include <cuda_runtime_api.h>

#include "cuda/launch.hpp"

/// Throws pagedkv::Error naming the CUDA error and the failed expression.
#define PAGEDKV_CUDA_CHECK(expr)                                                            \
  do {                                                                                      \
    const cudaError_t pagedkv_cuda_err_ = (expr);                                           \
    if (pagedkv_cuda_err_ != cudaSuccess) {                                                 \
      ::pagedkv::cuda::detail::throw_cuda_error(static_cast<int>(pagedkv_cuda_err_), #expr, \
                                                __FILE__, __LINE__);                        \
    }                                                                                       \
  } while (0)
