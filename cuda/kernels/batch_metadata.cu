// Device-side builders of batch metadata: CSR page tables and slot mappings, from the padded
// tables already in device memory, with CUB exclusive scans (no host round trip, graph
// capturable). Inputs were validated by cuda/host/device_batch_metadata.cpp.

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/device/device_scan.cuh>

#include "cuda/launch.hpp"
#include "dispatch.cuh"

namespace pagedkv::cuda::detail {
namespace {

// context_lens: [n]; counts: [n + 1], counts[i] = ceil(context_lens[i] / block_size), counts[n] = 0
// grid: (ceil((n + 1) / 256)); block: 256
__global__ void count_blocks_kernel(const int32_t* __restrict__ context_lens, int32_t n,
                                    int32_t block_size, int32_t* __restrict__ counts) {
  const int32_t i = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) counts[i] = (context_lens[i] + block_size - 1) / block_size;
  if (i == n) counts[i] = 0;
}

// num_new: [n]; counts: [n + 1], counts[i] = num_new[i], counts[n] = 0
// grid: (ceil((n + 1) / 256)); block: 256
__global__ void copy_counts_kernel(const int32_t* __restrict__ num_new, int32_t n,
                                   int32_t* __restrict__ counts) {
  const int32_t i = static_cast<int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) counts[i] = num_new[i];
  if (i == n) counts[i] = 0;
}

// tables:        [n, stride] (-1 padded)
// context_lens:  [n]
// indptr:        [n + 1] (exclusive scan of blocks per row)
// indices:       [indptr[n]] out
// last_page_len: [n] out
// grid: (n); block: 128 threads striding over the row's blocks
__global__ void scatter_csr_kernel(const int32_t* __restrict__ tables, int32_t stride,
                                   const int32_t* __restrict__ context_lens, int32_t block_size,
                                   const int32_t* __restrict__ indptr,
                                   int32_t* __restrict__ indices,
                                   int32_t* __restrict__ last_page_len) {
  const int32_t i = static_cast<int32_t>(blockIdx.x);
  const int32_t begin = indptr[i];
  const int32_t count = indptr[i + 1] - begin;
  const int32_t* row = tables + static_cast<int64_t>(i) * stride;
  for (int32_t j = static_cast<int32_t>(threadIdx.x); j < count; j += blockDim.x) {
    indices[begin + j] = row[j];
  }
  if (threadIdx.x == 0) {
    const int32_t ctx = context_lens[i];
    last_page_len[i] = ctx == 0 ? 0 : (ctx - 1) % block_size + 1;
  }
}

// tables:       [n, stride]
// context_lens: [n]
// num_new:      [n]; row i writes its last num_new[i] positions
// query_start:  [n + 1] (exclusive scan of num_new)
// slots:        [max_tokens] out, int64
// grid: (n); block: 128 threads striding over the row's new tokens
__global__ void slot_mapping_kernel(const int32_t* __restrict__ tables, int32_t stride,
                                    const int32_t* __restrict__ context_lens, int32_t block_size,
                                    const int32_t* __restrict__ num_new,
                                    const int32_t* __restrict__ query_start,
                                    int64_t* __restrict__ slots) {
  const int32_t i = static_cast<int32_t>(blockIdx.x);
  const int32_t n_new = num_new[i];
  const int64_t first_pos = static_cast<int64_t>(context_lens[i]) - n_new;
  const int32_t* row = tables + static_cast<int64_t>(i) * stride;
  for (int32_t j = static_cast<int32_t>(threadIdx.x); j < n_new; j += blockDim.x) {
    const int64_t pos = first_pos + j;
    slots[query_start[i] + j] =
        static_cast<int64_t>(row[pos / block_size]) * block_size + pos % block_size;
  }
}

// total: [1] = query_start[n]; slots: [max_tokens], entries >= total set to -1
// grid: (min(ceil(max_tokens / 256), 1024)); block: 256, grid-stride
__global__ void pad_slots_kernel(const int32_t* __restrict__ total, int64_t* __restrict__ slots,
                                 int64_t max_tokens) {
  const int64_t start = *total;
  for (int64_t t = start + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       t < max_tokens; t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    slots[t] = -1;
  }
}

unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

int64_t scan_temp_bytes(int32_t n) {
  size_t bytes = 0;
  check_cuda(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), n),
             "cub::DeviceScan::ExclusiveSum (size query)");
  return static_cast<int64_t>(bytes);
}

void launch_build_csr(const MetadataBuffers& m, int32_t block_size, int32_t* indptr,
                      int32_t* indices, int32_t* last_page_len, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int32_t n = m.max_seqs;
  count_blocks_kernel<<<blocks_for(n + 1, 256), 256, 0, s>>>(m.context_lens, n, block_size,
                                                             m.counts);
  check_launch("count_blocks_kernel launch");
  auto temp_bytes = static_cast<size_t>(m.cub_temp_bytes);
  check_cuda(cub::DeviceScan::ExclusiveSum(m.cub_temp, temp_bytes, m.counts, indptr, n + 1, s),
             "cub::DeviceScan::ExclusiveSum (csr indptr)");
  scatter_csr_kernel<<<static_cast<unsigned>(n), 128, 0, s>>>(
      m.block_tables, m.stride, m.context_lens, block_size, indptr, indices, last_page_len);
  check_launch("scatter_csr_kernel launch");
}

void launch_build_slot_mapping(const MetadataBuffers& m, const int32_t* num_new_tokens,
                               int32_t block_size, int32_t* query_start, int64_t* slot_mapping,
                               int64_t max_tokens, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const int32_t n = m.max_seqs;
  copy_counts_kernel<<<blocks_for(n + 1, 256), 256, 0, s>>>(num_new_tokens, n, m.counts);
  check_launch("copy_counts_kernel launch");
  auto temp_bytes = static_cast<size_t>(m.cub_temp_bytes);
  check_cuda(cub::DeviceScan::ExclusiveSum(m.cub_temp, temp_bytes, m.counts, query_start, n + 1, s),
             "cub::DeviceScan::ExclusiveSum (query_start)");
  slot_mapping_kernel<<<static_cast<unsigned>(n), 128, 0, s>>>(
      m.block_tables, m.stride, m.context_lens, block_size, num_new_tokens, query_start,
      slot_mapping);
  check_launch("slot_mapping_kernel launch");
  const unsigned pad_blocks =
      blocks_for(max_tokens, 256) < 1024 ? blocks_for(max_tokens, 256) : 1024;
  pad_slots_kernel<<<pad_blocks, 256, 0, s>>>(query_start + n, slot_mapping, max_tokens);
  check_launch("pad_slots_kernel launch");
}

}  // namespace pagedkv::cuda::detail
