#pragma once
// The run-time head_dim decode kernel (decode_generic.cu), for the head sizes that have no
// compile-time instantiation in kDecodeHeadDims. Private to cuda/kernels; nvcc only.

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch.hpp"
#include "pagedkv/dtype.hpp"

namespace pagedkv::cuda::detail {

/// Launches the generic decode kernel (no merge: the caller runs the split-K merge when
/// problem.num_splits > 1, as for the fast kernel). head_dim in [1, kDecodeMaxHeadDim], dtype
/// in kDecodeDTypes, both checked by the host before. Throws on a launch error.
/// KV: PagedKV or ContiguousKV (instantiated for both in decode_generic.cu).
template <typename KV>
void launch_generic_decode(DType dtype, int32_t head_dim, const DecodeProblem& problem,
                           const KV& kv, cudaStream_t stream);
/// Resident generic decode CTAs per multiprocessor for the paged kernel of dtype.
int32_t generic_decode_ctas_per_sm(DType dtype);

}  // namespace pagedkv::cuda::detail
