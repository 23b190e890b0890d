// 8-bit pools through the manager's data movements (issue 19 item 4): copy-on-write after a
// fork, swap out and in, and decode attention over the result, on int8 and fp8 caches with
// per-head scales. Bytes are bytes: every copy must reproduce the stored codes exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "common/attention_bound.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/reference/reference_attention.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBs = 4;
constexpr int32_t kHeads = 2;
constexpr int32_t kDim = 8;

KVCacheConfig geometry(DType dtype, int32_t blocks) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_blocks = blocks;
  c.block_size = kBs;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.dtype = dtype;
  c.scale_granularity = KVScaleGranularity::kPerHead;
  return c;
}

void set_scales(HostKVCache& cache) {
  const float max = dtype_max_finite(cache.config().dtype);
  const std::vector<float> ks = {3.0f / max, 1.0f / max};
  const std::vector<float> vs = {1.0f / max, 2.0f / max};
  for (int32_t l = 0; l < cache.config().num_layers; ++l) cache.set_scales(l, ks, vs);
}

/// K/V of `n` tokens starting at position `pos0`, distinct per layer, position and element.
void write_tokens(HostKVCache& cache, std::span<const Slot> slots, int64_t pos0, float sign) {
  const int64_t row = int64_t{kHeads} * kDim;
  for (int32_t l = 0; l < 2; ++l) {
    std::vector<float> k, v;
    for (size_t t = 0; t < slots.size(); ++t) {
      for (int64_t e = 0; e < row; ++e) {
        const auto x = static_cast<float>(pos0 + static_cast<int64_t>(t) * 7 + e * 3 + l * 5);
        k.push_back(sign * std::sin(x));
        v.push_back(sign * std::cos(x));
      }
    }
    cache.write(l, slots, k, v);
  }
}

std::vector<std::vector<std::byte>> bytes_of(const HostKVCache& c, std::span<const BlockId> t) {
  std::vector<std::vector<std::byte>> out;
  for (BlockId b : t) out.push_back(c.block_bytes(b));
  return out;
}

class QuantizedPaths : public ::testing::TestWithParam<DType> {};

TEST_P(QuantizedPaths, ForkCopyOnWriteSwapAndAttend) {
  HostKVCache device(geometry(GetParam(), 8));
  HostKVCache host(geometry(GetParam(), 4));
  set_scales(device);
  set_scales(host);  // the layer's scales travel with the layer: the host pool uses the same
  KVCacheManager m({.num_blocks = 8, .block_size = kBs, .num_host_blocks = 4});

  m.add_sequence(1);
  const auto a = m.append_slots(1, 6);  // blocks 0, 1 (two tokens in the second)
  ASSERT_TRUE(a);
  write_tokens(device, a->slots, 0, 1.0f);
  const std::vector<BlockId> t1(m.block_table(1).begin(), m.block_table(1).end());
  const auto parent_bytes = bytes_of(device, t1);

  // Fork, then the child appends into the shared partial block: copy-on-write.
  m.fork(1, 2);
  const auto b = m.append_slots(2, 1);
  ASSERT_TRUE(b);
  ASSERT_EQ(b->copies.size(), 1u);
  device.copy_blocks(b->copies);
  EXPECT_EQ(device.block_bytes(b->copies[0].dst), parent_bytes[1]) << "the copy moves the codes";
  write_tokens(device, b->slots, 6, -1.0f);
  EXPECT_EQ(bytes_of(device, t1), parent_bytes) << "the parent's blocks are untouched";

  // Swap the child out and back in at new ids: the stored codes come back bit-identical.
  const std::vector<BlockId> t2(m.block_table(2).begin(), m.block_table(2).end());
  const auto child_bytes = bytes_of(device, t2);
  const auto out = m.swap_out(2);
  ASSERT_TRUE(out);
  for (const BlockCopy& c : out->copies) host.set_block_bytes(c.dst, device.block_bytes(c.src));
  m.free_sequence(1);
  device.fill_blocks(std::vector<BlockId>{0, 1, 2, 3, 4, 5, 6, 7}, 0.5f);
  const auto in = m.swap_in(2);
  ASSERT_TRUE(in);
  for (const BlockCopy& c : in->copies) device.set_block_bytes(c.dst, host.block_bytes(c.src));
  const std::vector<BlockId> t2b(m.block_table(2).begin(), m.block_table(2).end());
  EXPECT_EQ(bytes_of(device, t2b), child_bytes);

  // Decode over the swapped-in table against the reference over the dequantized values.
  AttentionParams params;
  params.num_heads = 2 * kHeads;
  params.num_kv_heads = kHeads;
  params.head_dim = kDim;
  const int32_t ctx = 7;
  std::vector<float> q(static_cast<size_t>(params.num_heads) * kDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::cos(0.3f * static_cast<float>(i));
  std::vector<int32_t> table(t2b.begin(), t2b.end());
  const std::vector<int32_t> lens = {ctx};
  const BlockTableView view{
      table.data(), lens.data(), 1, static_cast<int32_t>(table.size()), kBs, 8};
  for (int32_t l = 0; l < 2; ++l) {
    std::vector<float> ks, vs;
    for (int32_t p = 0; p < ctx; ++p) {
      const Slot slot = int64_t{table[p / kBs]} * kBs + p % kBs;
      for (int32_t h = 0; h < kHeads; ++h) {
        for (float x : device.read(l, slot, h, false)) ks.push_back(x);
        for (float x : device.read(l, slot, h, true)) vs.push_back(x);
      }
    }
    std::vector<float> out_ref(q.size()), out(q.size(), NAN);
    reference_attention(params, q, ks, vs, ctx, out_ref);
    paged_decode_attention(params, device.layer(l), view, q, out);
    EXPECT_TRUE(testing::attention_within(out, out_ref, params.num_heads * kDim)) << "layer " << l;
  }
  m.check_invariants();
}

INSTANTIATE_TEST_SUITE_P(EightBit, QuantizedPaths,
                         ::testing::Values(DType::kInt8, DType::kFP8E4M3, DType::kFP8E5M2),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace pagedkv
