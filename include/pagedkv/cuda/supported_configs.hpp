#pragma once
/// @file supported_configs.hpp
/// THE list of configurations the CUDA decode attention kernels are compiled for. Every
/// dispatch in cuda/ and every check at the public boundary is derived from these three arrays;
/// no other file lists a head size, block size or dtype. Host-only; no CUDA headers.
///
/// Adding a head_dim here adds one kernel instantiation per dtype and per layout (paged,
/// contiguous) and per architecture in CMAKE_CUDA_ARCHITECTURES: watch the CI compile time.
/// block_size is a runtime parameter of the kernel (a power of two, so position -> block is a
/// shift), so adding one costs no compile time.

#include <array>
#include <cstdint>
#include <string>

#include "pagedkv/dtype.hpp"

namespace pagedkv::cuda {

/// K/V storage dtypes of the decode kernels (queries and outputs are always fp32). The 8-bit
/// ones are widened in registers and scaled by the view's k_scale / v_scale (dtype.hpp).
inline constexpr std::array<DType, 6> kDecodeDTypes = {
    DType::kF32, DType::kF16, DType::kBF16, DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt8};
/// Head dimensions (elements) the decode kernels are instantiated for.
inline constexpr std::array<int32_t, 3> kDecodeHeadDims = {64, 128, 256};
/// Paged block sizes (tokens) the decode kernels accept; each a power of two.
inline constexpr std::array<int32_t, 3> kDecodeBlockSizes = {8, 16, 32};

/// True when (dtype, head_dim) is in the lists above (the contiguous decode kernel's check).
[[nodiscard]] bool is_supported_decode_config(DType dtype, int32_t head_dim) noexcept;
/// True when (dtype, head_dim, block_size) is in the lists above (the paged kernel's check).
[[nodiscard]] bool is_supported_decode_config(DType dtype, int32_t head_dim,
                                              int32_t block_size) noexcept;

/// Throws pagedkv::Error unless (dtype, head_dim) is supported. The message names the first
/// offending value and the supported set, e.g. "CUDA decode attention: head_dim 96 is not
/// supported (supported: 64, 128, 256)". Pure host code: runs before any CUDA call, so it works
/// (and is tested) on machines without a GPU.
void check_decode_config(DType dtype, int32_t head_dim);
/// Throws pagedkv::Error unless (dtype, head_dim, block_size) is supported. As the two-argument
/// check, plus block_size; for example "CUDA decode attention: block_size 64 is not supported
/// (supported: 8, 16, 32)".
void check_decode_config(DType dtype, int32_t head_dim, int32_t block_size);

/// One line listing the supported set: "dtype {fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8} x
/// head_dim {64, 128, 256} x block_size {8, 16, 32}".
[[nodiscard]] std::string supported_decode_configs();

}  // namespace pagedkv::cuda
