#pragma once
/// @file supported_configs.hpp
/// THE list of configurations the CUDA decode attention kernels are compiled for. Every
/// dispatch in cuda/ and every check at the public boundary is derived from these arrays; no
/// other file lists a head size, block size or dtype. Host-only; no CUDA headers.
///
/// Head sizes: those of kDecodeHeadDims run the fast kernel (compile-time head_dim); any other
/// head_dim in [1, kDecodeMaxHeadDim] runs the generic kernel (run-time head_dim, one warp per
/// query head, element-wise loads: correct, several times slower; cuda/kernels/decode_generic.cu),
/// so every model runs, stories260K's head_dim 8 included. Adding a head_dim to kDecodeHeadDims
/// adds one fast kernel instantiation per dtype, per layout (paged, contiguous) and per
/// architecture in CMAKE_CUDA_ARCHITECTURES: watch the CI compile time; the fast kernel also
/// needs head_dim * sizeof(dtype) to split into 16-byte chunks over 2^k lanes (64, 128, 256 do;
/// 80 and 96 do not).
/// block_size is a runtime parameter of both kernels (a power of two, so position -> block is a
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
/// Head dimensions (elements) the fast decode kernel is instantiated for.
inline constexpr std::array<int32_t, 3> kDecodeHeadDims = {64, 128, 256};
/// Largest head_dim (elements) of the decode kernels; every head_dim in [1, this] runs (the
/// fast kernel for kDecodeHeadDims, the generic one for the rest).
inline constexpr int32_t kDecodeMaxHeadDim = 256;
/// Paged block sizes (tokens) the decode kernels accept; each a power of two. 1 is SGLang's
/// token-granular pool, 16 vLLM's default, 64 and 128 TensorRT-LLM's.
inline constexpr std::array<int32_t, 8> kDecodeBlockSizes = {1, 2, 4, 8, 16, 32, 64, 128};

/// True when dtype is listed and head_dim is in [1, kDecodeMaxHeadDim] (the contiguous decode
/// kernels' check).
[[nodiscard]] bool is_supported_decode_config(DType dtype, int32_t head_dim) noexcept;
/// As above, and block_size listed (the paged decode kernels' check).
[[nodiscard]] bool is_supported_decode_config(DType dtype, int32_t head_dim,
                                              int32_t block_size) noexcept;

/// Throws pagedkv::Error unless (dtype, head_dim) is supported. The message names the first
/// offending value and the supported set, e.g. "CUDA decode attention: head_dim 320 is not
/// supported (supported: 1..256; fast kernel: 64, 128, 256)". Pure host code: runs before any
/// CUDA call, so it works (and is tested) on machines without a GPU.
void check_decode_config(DType dtype, int32_t head_dim);
/// Throws pagedkv::Error unless (dtype, head_dim, block_size) is supported. As the two-argument
/// check, plus block_size; for example "CUDA decode attention: block_size 12 is not supported
/// (supported: 1, 2, 4, 8, 16, 32, 64, 128)".
void check_decode_config(DType dtype, int32_t head_dim, int32_t block_size);

/// One line listing the supported set: "dtype {fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, int8} x
/// head_dim {1..256; fast kernel: 64, 128, 256} x block_size {1, 2, 4, 8, 16, 32, 64, 128}".
[[nodiscard]] std::string supported_decode_configs();

}  // namespace pagedkv::cuda
