#pragma once
// Private interface between the host side of the CUDA backend (cuda/host/*.cpp, compiled by the
// C++ compiler: every check and error message lives there) and the kernels (cuda/kernels/*.cu,
// compiled by nvcc: kernels and thin launch functions only, which trust their arguments).
// No CUDA header: streams are void*. The argument structs are trivially copyable and passed to
// kernels by value; their address helpers are __host__ __device__ so the host tests can check
// the index math without a GPU. Not installed.

#include <cstdint>

#include "pagedkv/attention_params.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv::cuda::detail {

/// Threads per decode CTA (4 warps).
inline constexpr int32_t kDecodeThreads = 128;

// Decode pipeline shape (cuda/kernels/decode_attention.cu), with kHeadsPerCta
// (decode_attention.hpp). Chosen on an H200 among 9 shapes (docs/cuda.md, "Tuning"); the macros
// exist so that scripts/gpu_tune.sh can build the alternatives, not for users.
#ifndef PAGEDKV_DECODE_STAGES
#define PAGEDKV_DECODE_STAGES 3
#endif
#ifndef PAGEDKV_DECODE_TILE_BYTES
#define PAGEDKV_DECODE_TILE_BYTES 8192
#endif
#ifndef PAGEDKV_DECODE_MIN_CTAS_PER_SM
#define PAGEDKV_DECODE_MIN_CTAS_PER_SM 4
#endif
/// Shared-memory tiles of K (and as many of V) per CTA; kDecodeStages - 1 are in flight while
/// one is computed.
inline constexpr int kDecodeStages = PAGEDKV_DECODE_STAGES;
/// Bytes of K per tile (as many of V).
inline constexpr int kDecodeTileBytes = PAGEDKV_DECODE_TILE_BYTES;
/// Occupancy floor handed to ptxas (__launch_bounds__). With 4 heads per CTA the fp16/bf16
/// kernels fit in 128 registers at 4 (8-16 bytes of spills in the paged ones), which is what
/// lets 4 CTAs share an H100/H200 SM (~49 KiB of shared memory each); with 8 heads they need
/// ~220 and run 2 per SM. An A100 (164 KiB of shared memory per SM) fits 3 of these CTAs.
inline constexpr int kDecodeMinCtasPerSm = PAGEDKV_DECODE_MIN_CTAS_PER_SM;

/// Everything of a decode launch except the K/V addressing. All pointers are device pointers.
struct DecodeProblem {
  const void* q = nullptr;                // [num_seqs, num_heads, head_dim] of q_dtype
  void* out = nullptr;                    // [num_seqs, num_heads, head_dim] of out_dtype
  DType q_dtype = DType::kF32;            // kF32, kF16 or kBF16 (widened to fp32 on load)
  DType out_dtype = DType::kF32;          // kF32, kF16 or kBF16 (rounded to nearest even)
  float* partial_o = nullptr;             // [num_seqs, num_heads, num_splits, head_dim] (split-K)
  float* partial_lse = nullptr;           // [num_seqs, num_heads, num_splits], log2 domain
  const int32_t* context_lens = nullptr;  // [num_seqs], tokens
  int32_t num_seqs = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t group = 1;        // num_heads / num_kv_heads
  int32_t head_chunks = 1;  // ceil(group / kHeadsPerCta): CTAs per kv head
  int32_t num_splits = 1;
  int32_t chunk_tokens = 0;
  float scale_log2 = 0.0f;  // softmax scale * log2(e): scores live in the log2 domain
  int32_t window_left = -1;
  int32_t sink_tokens = 0;
  int32_t chunk_size = 0;          // chunked local attention, tokens; 0 = none
  const float* k_scale = nullptr;  // [num_kv_heads], 8-bit dtypes only: x = stored * scale
  const float* v_scale = nullptr;  // [num_kv_heads], 8-bit dtypes only
  bool tensor_cores = false;       // DecodeLaunch::use_tensor_cores: the kernel of decode_mma.cu
};

/// Paged K/V addressing: position `pos` of sequence `seq` lives in block
/// block_tables[seq * max_blocks_per_seq + pos / block_size] at offset pos % block_size.
/// block_size is a power of two (supported_configs.hpp), so both are a shift and a mask.
struct PagedKV {
  const void* k = nullptr;  // [num_blocks, ...] per layout
  const void* v = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t block_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t log2_block_size = 0;

  /// Element offset of (seq, kv_head, pos, dim 0), int64 (block ids are widened before the
  /// multiply: num_blocks * block_stride overflows int32 on large pools).
  PAGEDKV_HOST_DEVICE int64_t row(int32_t seq, int32_t kv_head, int64_t pos) const {
    const int64_t block =
        block_tables[static_cast<int64_t>(seq) * max_blocks_per_seq + (pos >> log2_block_size)];
    const int64_t in_block = pos & ((int64_t{1} << log2_block_size) - 1);
    return block * block_stride + kv_head * head_stride + in_block * token_stride;
  }
};

/// Contiguous K/V addressing of a contiguous_paged_view (storage/contiguous_paged_view.hpp):
/// sequence `seq` owns block `seq`, so a position is an offset in it without a block-table read.
struct ContiguousKV {
  const void* k = nullptr;  // [num_seqs, ...] per layout
  const void* v = nullptr;
  int64_t seq_stride = 0;  // the view's block_stride
  int64_t head_stride = 0;
  int64_t token_stride = 0;

  PAGEDKV_HOST_DEVICE int64_t row(int32_t seq, int32_t kv_head, int64_t pos) const {
    return seq * seq_stride + kv_head * head_stride + pos * token_stride;
  }
};

/// The contiguous addressing of a layer view in which sequence i is block i.
inline ContiguousKV contiguous_kv(const KVLayerView& view) {
  return {view.k, view.v, view.block_stride, view.head_stride, view.token_stride};
}

/// Launches the decode kernel for (dtype, head_dim) (both from supported_configs.hpp, already
/// checked) and, when problem.num_splits > 1, the merge kernel. Throws on a launch error.
void launch_paged_decode(DType dtype, int32_t head_dim, const DecodeProblem& problem,
                         const PagedKV& kv, void* stream);
void launch_contiguous_decode(DType dtype, int32_t head_dim, const DecodeProblem& problem,
                              const ContiguousKV& kv, void* stream);
/// Resident decode CTAs per multiprocessor for the paged kernel of (dtype, head_dim).
int32_t decode_ctas_per_sm(DType dtype, int32_t head_dim);

/// Geometry of a reshape_and_cache launch (pools of `dtype`, inputs of src_dtype).
struct CacheWrite {
  const void* k = nullptr;                // [num_tokens, num_kv_heads, head_dim] of src_dtype
  const void* v = nullptr;                // same
  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  void* k_cache = nullptr;                // [num_blocks, ...] per layout, dtype
  void* v_cache = nullptr;
  int64_t num_tokens = 0;
  int64_t block_stride = 0;
  int64_t head_stride = 0;
  int64_t token_stride = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  DType src_dtype = DType::kF32;
  DType dtype = DType::kF32;
  const float* k_scale = nullptr;  // [num_kv_heads], 8-bit dtype only: stored = Q(x / scale)
  const float* v_scale = nullptr;
};
void launch_reshape_and_cache(const CacheWrite& args, void* stream);

/// One launch: grid (num_pairs, num_pools).
void launch_copy_blocks(void* const* pools, int32_t num_pools, int64_t block_bytes,
                        const BlockCopy* pairs, int32_t num_pairs, void* stream);

/// Device tables of a DeviceBatchMetadata (see device_batch_metadata.hpp for shapes).
struct MetadataBuffers {
  const int32_t* block_tables = nullptr;  // [max_seqs, stride]
  const int32_t* context_lens = nullptr;  // [max_seqs]
  int32_t max_seqs = 0;
  int32_t stride = 0;         // max_blocks_per_seq
  int32_t* counts = nullptr;  // [max_seqs + 1] scratch
  void* cub_temp = nullptr;
  int64_t cub_temp_bytes = 0;
};
/// CUB temporary bytes of an exclusive scan over n int32 items.
int64_t scan_temp_bytes(int32_t n);
void launch_build_csr(const MetadataBuffers& m, int32_t block_size, int32_t* indptr,
                      int32_t* indices, int32_t* last_page_len, void* stream);
void launch_build_slot_mapping(const MetadataBuffers& m, const int32_t* num_new_tokens,
                               int32_t block_size, int32_t* query_start, int64_t* slot_mapping,
                               int64_t max_tokens, void* stream);

/// check_attention_params for a view of device pools (storage/kv_layer_view.hpp): the shape
/// checks, and for an 8-bit dtype non-null, 4-byte aligned k_scale / v_scale (DEVICE arrays
/// [num_kv_heads]; their values were checked by DeviceKVCache::set_scales, the host cannot read
/// them). `fn` names the entry point. Defined in cuda/host/decode_attention.cpp.
void check_device_attention_params(const char* fn, const AttentionParams& params,
                                   const KVLayerView& cache);

/// Throws pagedkv::Error "CUDA error <name> (<code>): <string> in <what> at <file>:<line>".
/// Defined in cuda/host/runtime.cpp (C++ side, where fmt is available).
[[noreturn]] void throw_cuda_error(int code, const char* what, const char* file, int line);

}  // namespace pagedkv::cuda::detail
