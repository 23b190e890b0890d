// DeviceBatchMetadata: capacity checks (no GPU needed), padded upload, CUB-built CSR tables and
// slot mappings against the host builders, and a decode step captured once in a CUDA graph and
// replayed with new metadata.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/attention_bound.hpp"
#include "common/cuda_test_util.hpp"
#include "common/error_message.hpp"
#include "common/paged_scenario.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/device_batch_metadata.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"

#if PAGEDKV_WITH_CUDA
#include <cuda_runtime_api.h>

#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::cuda {
namespace {

#if PAGEDKV_WITH_CUDA

using ::testing::HasSubstr;

using testing::message_of;

template <typename T>
std::vector<T> download(const T* device, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  if (n > 0) {
    EXPECT_EQ(
        cudaMemcpy(host.data(), device, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost),
        cudaSuccess);
  }
  return host;
}

TEST(DeviceBatchMetadataErrors, CapacityIsCheckedBeforeAnyDeviceCall) {
  EXPECT_THAT(message_of([] {
                DeviceBatchMetadata m({0, 4, 4});
              }),
              HasSubstr("max_seqs must be >= 1, got 0"));
  EXPECT_THAT(message_of([] {
                DeviceBatchMetadata m({4, 0, 4});
              }),
              HasSubstr("max_blocks_per_seq must be >= 1, got 0"));
  EXPECT_THAT(message_of([] {
                DeviceBatchMetadata m({4, 4, 0});
              }),
              HasSubstr("max_tokens must be >= 1, got 0"));
  EXPECT_THAT(message_of([] {
                DeviceBatchMetadata m({1 << 20, 1 << 12, 4});
              }),
              HasSubstr("exceed 2^31 - 1 table entries"));
}

/// Three sequences over scattered blocks (block_size 4), the tables a manager would produce.
struct HostBatch {
  int32_t block_size = 4;
  std::vector<std::vector<BlockId>> tables = {{9, 2, 7}, {}, {0, 5, 11, 3, 8}};
  std::vector<int32_t> context_lens = {10, 0, 17};
  std::vector<int32_t> num_new = {2, 0, 1};

  [[nodiscard]] std::vector<std::span<const BlockId>> spans() const {
    return {tables.begin(), tables.end()};
  }
  [[nodiscard]] BatchMetadata metadata() const {
    BatchMetadata m;
    m.block_size = block_size;
    const auto s = spans();
    m.padded = build_padded_block_tables(s, context_lens, block_size);
    m.csr = build_csr_block_tables(s, context_lens, block_size);
    for (size_t i = 0; i < tables.size(); ++i) {
      for (int32_t j = 0; j < num_new[i]; ++j) {
        m.slot_mapping.push_back(
            slot_for_position(tables[i], context_lens[i] - num_new[i] + j, block_size));
      }
    }
    return m;
  }
};

TEST(DeviceBatchMetadata, UploadPadsToCapacity) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const HostBatch b;
  const BatchMetadata meta = b.metadata();
  DeviceBatchMetadata dev({5, 6, 8});
  dev.upload(meta);
  synchronize(nullptr);
  EXPECT_EQ(dev.num_seqs(), 3);
  EXPECT_EQ(dev.num_slots(), 3);
  const BlockTableView t = dev.tables();
  EXPECT_EQ(t.num_seqs, 5);
  EXPECT_EQ(t.max_blocks_per_seq, 6);
  EXPECT_EQ(dev.active_tables().num_seqs, 3);
  EXPECT_EQ(download(t.context_lens, 5), (std::vector<int32_t>{10, 0, 17, 0, 0}));
  const std::vector<int32_t> tables = download(t.block_tables, 30);
  EXPECT_EQ(std::vector<int32_t>(tables.begin(), tables.begin() + 6),
            (std::vector<int32_t>{9, 2, 7, -1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(tables.begin() + 12, tables.begin() + 18),
            (std::vector<int32_t>{0, 5, 11, 3, 8, -1}));
  EXPECT_TRUE(std::all_of(tables.begin() + 18, tables.end(), [](int32_t x) { return x == -1; }));
  EXPECT_EQ(download(dev.slot_mapping(), 8),
            (std::vector<int64_t>{28, 29, 32, -1, -1, -1, -1, -1}));  // blocks 7, 7, 8
}

// Issue 16: the tables' geometry travels through the device copy (tables() states the block
// size and pool size uploaded), and builders given another block size are refused.
TEST(DeviceBatchMetadata, TablesCarryTheUploadedGeometry) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  BatchMetadata meta = HostBatch{}.metadata();
  meta.padded.num_blocks = 12;
  DeviceBatchMetadata dev({5, 6, 8});
  EXPECT_EQ(dev.tables().block_size, 0);  // nothing uploaded yet: attention would refuse it
  dev.upload(meta);
  EXPECT_EQ(dev.tables().block_size, 4);
  EXPECT_EQ(dev.tables().num_blocks, 12);
  EXPECT_EQ(dev.active_tables().block_size, 4);
  EXPECT_THAT(message_of([&] { dev.build_csr(16); }),
              HasSubstr("build_csr: block_size 16 but the uploaded tables were built for "
                        "block_size 4"));
  meta.block_size = 8;
  EXPECT_THAT(message_of([&] { dev.upload(meta); }),
              HasSubstr("meta.block_size 8 != meta.padded.block_size 4"));
}

TEST(DeviceBatchMetadata, UploadRejectsWhatDoesNotFit) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const BatchMetadata meta = HostBatch{}.metadata();
  EXPECT_THAT(message_of([&] {
                DeviceBatchMetadata({2, 6, 8}).upload(meta);
              }),
              HasSubstr("3 sequences exceed the capacity of 2"));
  EXPECT_THAT(message_of([&] {
                DeviceBatchMetadata({3, 4, 8}).upload(meta);
              }),
              HasSubstr("max_blocks_per_seq 5 exceeds the capacity of 4"));
  EXPECT_THAT(message_of([&] {
                DeviceBatchMetadata({3, 6, 2}).upload(meta);
              }),
              HasSubstr("3 slots exceed the capacity of 2"));
}

TEST(DeviceBatchMetadata, CsrBuiltOnTheDeviceMatchesHost) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const HostBatch b;
  const BatchMetadata meta = b.metadata();
  DeviceBatchMetadata dev({4, 5, 4});
  dev.upload(meta);
  dev.build_csr(b.block_size);
  synchronize(nullptr);
  // Capacity row 3 is a padding row: no blocks, last_page_len 0.
  std::vector<int32_t> indptr = meta.csr.indptr;
  indptr.push_back(indptr.back());
  EXPECT_EQ(download(dev.csr_indptr(), 5), indptr);
  EXPECT_EQ(download(dev.csr_indices(), indptr.back()), meta.csr.indices);
  std::vector<int32_t> last = meta.csr.last_page_len;
  last.push_back(0);
  EXPECT_EQ(download(dev.csr_last_page_len(), 4), last);
}

TEST(DeviceBatchMetadata, SlotMappingBuiltOnTheDeviceMatchesHost) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  const HostBatch b;
  BatchMetadata meta = b.metadata();
  const std::vector<Slot> expected = meta.slot_mapping;
  meta.slot_mapping.clear();  // built on the device instead
  DeviceBatchMetadata dev({4, 5, 6});
  dev.upload(meta);
  std::vector<int32_t> num_new = b.num_new;
  num_new.push_back(0);
  DeviceBuffer d_new(16);
  d_new.upload(std::span<const int32_t>(num_new));
  dev.build_slot_mapping(d_new.as<const int32_t>(), b.block_size);
  synchronize(nullptr);
  EXPECT_EQ(download(dev.query_start(), 5), (std::vector<int32_t>{0, 2, 2, 3, 3}));
  std::vector<Slot> padded = expected;
  padded.resize(6, -1);
  EXPECT_EQ(download(dev.slot_mapping(), 6), padded);
}

/// A decode step captured once in a CUDA graph, replayed for two batches whose tables,
/// lengths and sizes differ: the docs/cuda.md recipe, checked against the CPU.
TEST(DeviceBatchMetadata, GraphCapturedDecodeReplaysWithNewMetadata) {
  PAGEDKV_REQUIRE_CUDA_DEVICE();
  KVCacheConfig geometry;
  geometry.block_size = 16;
  geometry.num_kv_heads = 2;
  geometry.head_dim = 128;
  geometry.dtype = DType::kF16;
  AttentionParams params;
  params.num_heads = 8;
  params.num_kv_heads = 2;
  params.head_dim = 128;
  const testing::PagedScenario s =
      testing::make_scenario(geometry, params, {{3000, 1}, {17, 1}, {700, 1}, {1, 1}}, 99);
  DeviceKVCache device(s.config);
  device.upload(*s.cache);

  constexpr int32_t kMaxSeqs = 6;
  const int64_t row = int64_t{params.num_heads} * params.head_dim;
  DeviceBatchMetadata meta({kMaxSeqs, s.max_blocks_per_seq, kMaxSeqs});
  const DecodePlan plan = make_decode_plan(params, geometry.dtype, kMaxSeqs, 4096);
  DeviceBuffer workspace(std::max<int64_t>(
      decode_workspace_bytes(kMaxSeqs, params.num_heads, params.head_dim, plan), 1));
  DeviceBuffer q(kMaxSeqs * row * 4);
  DeviceBuffer out(kMaxSeqs * row * 4);
  q.zero();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

  // Batch = a subset of the scenario's sequences, in any order, with their q rows.
  auto batch = [&](const std::vector<int>& seqs) {
    BatchMetadata m;
    m.block_size = geometry.block_size;
    m.padded.block_size = geometry.block_size;
    m.padded.num_seqs = static_cast<int32_t>(seqs.size());
    m.padded.max_blocks_per_seq = s.max_blocks_per_seq;
    std::vector<float> qs;
    for (int i : seqs) {
      const auto* r = s.padded.data() + int64_t{i} * s.max_blocks_per_seq;
      m.padded.block_tables.insert(m.padded.block_tables.end(), r, r + s.max_blocks_per_seq);
      m.padded.context_lens.push_back(s.context_lens[static_cast<size_t>(i)]);
      qs.insert(qs.end(), s.q.begin() + i * row, s.q.begin() + (i + 1) * row);
    }
    return std::pair{m, qs};
  };

  const auto [first, first_q] = batch({0, 1, 2, 3});
  meta.upload(first, stream);
  DecodeLaunch launch{plan, workspace.data(), workspace.bytes(), stream};
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  paged_decode_attention(params, device.layer(testing::PagedScenario::kLayer), meta.tables(),
                         q.as<const float>(), out.as<float>(), launch);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (const std::vector<int>& seqs :
       {std::vector<int>{0, 1, 2, 3}, std::vector<int>{2, 3, 0}, std::vector<int>{1}}) {
    const auto [m, qs] = batch(seqs);
    meta.upload(m, stream);
    q.upload(qs.data(), static_cast<int64_t>(qs.size() * 4), 0, stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    std::vector<float> got(static_cast<size_t>(kMaxSeqs * row));
    out.download(got.data(), static_cast<int64_t>(got.size() * 4), 0, stream);
    std::vector<float> cpu(qs.size());
    paged_decode_attention(params, s.layer(), m.padded.view(), qs, cpu);
    const std::vector<float> head(got.begin(), got.begin() + static_cast<int64_t>(qs.size()));
    // Same stored K/V, fp32 q and out on both sides: the fp32 bound (common/attention_bound.hpp).
    EXPECT_TRUE(testing::attention_within(head, cpu, row));
    // Capacity rows past the batch are padding rows: zeros.
    EXPECT_TRUE(std::all_of(got.begin() + static_cast<int64_t>(qs.size()), got.end(),
                            [](float x) { return x == 0.0f; }));
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

#else  // !PAGEDKV_WITH_CUDA

TEST(DeviceBatchMetadata, SkippedWithoutCuda) {
  GTEST_SKIP() << "no CUDA device (built without CUDA)";
}

#endif  // PAGEDKV_WITH_CUDA

}  // namespace
}  // namespace pagedkv::cuda
