#pragma once
// The tensor-core decode kernel (decode_mma.cu), run when DecodeLaunch::use_tensor_cores is
// set. Private to cuda/kernels; nvcc only.

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::cuda::detail {

/// Query heads of one kv head per CTA of the tensor-core kernel: the M dimension of mma.sync
/// m16n8k16 (a larger GQA group takes ceil(group / 16) CTAs per kv head).
inline constexpr int kDecodeMmaRows = 16;

/// Launches the tensor-core decode kernel (no merge: the caller runs the split-K merge when
/// problem.num_splits > 1). dtype fp16 or bf16, head_dim in kDecodeHeadDims, both checked by
/// the host before. Throws on a launch error.
/// KV: PagedKV or ContiguousKV (instantiated for both in decode_mma.cu).
template <typename KV>
void launch_mma_decode(DType dtype, int32_t head_dim, const DecodeProblem& problem, const KV& kv,
                       cudaStream_t stream);

}  // namespace pagedkv::cuda::detail
