// KVPlacement::kInterleaved (a block's K and V adjacent, FlashInfer's [pages, 2, ...]): the
// documented addresses, the same contents as separate pools under any sequence of operations,
// identical attention through the view, and the documented errors.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

KVCacheConfig small(DType dtype, KVLayout layout, KVPlacement placement) {
  // 3 layers, 6 blocks of 4 tokens, 2 kv heads, head_dim 5 (as test_host_kv_cache.cpp).
  return {.num_layers = 3,
          .num_blocks = 6,
          .block_size = 4,
          .num_kv_heads = 2,
          .head_dim = 5,
          .dtype = dtype,
          .layout = layout,
          .placement = placement};
}

TEST(KVPlacement, DefaultIsInterleaved) {
  // The documented default (kv_cache_config.hpp): the placement that meets the paged/contiguous
  // decode target in docs/benchmarks.md.
  EXPECT_EQ(KVCacheConfig{}.placement, KVPlacement::kInterleaved);
  const HostKVCache cache(KVCacheConfig{.num_blocks = 3});
  EXPECT_EQ(cache.layer(0).block_stride, 2 * 16 * 64);
}

TEST(KVPlacement, InterleavedAddressesAreTheDocumentedOnes) {
  HostKVCache cache(small(DType::kF32, KVLayout::kHND, KVPlacement::kInterleaved));
  const KVLayerView v1 = cache.layer(1);
  // A block of one kind is 4 x 2 x 5 = 40 elements; K and V alternate: block stride 80.
  EXPECT_EQ(v1.block_stride, 80);
  EXPECT_EQ(v1.head_stride, 20);
  EXPECT_EQ(v1.token_stride, 5);
  EXPECT_EQ(static_cast<const std::byte*>(v1.v) - static_cast<const std::byte*>(v1.k), 40 * 4);
  // Layers are regions of two pools (240 fp32 = 960 bytes each).
  EXPECT_EQ(static_cast<const std::byte*>(v1.k) - static_cast<const std::byte*>(cache.layer(0).k),
            2 * 960);
  // Slot 13 = block 3, token 1; head 1, dim 2: K at 3 x 80 + 20 + 5 + 2 = 267 elements from the
  // layer's first byte, V 40 further (block 3's V follows block 3's K).
  std::vector<float> k(10, 0.0f), v(10, 0.0f);
  k[7] = 0.75f;
  v[7] = -0.5f;
  const std::vector<Slot> slots = {13};
  cache.write(1, slots, k, v);
  const auto* layer = static_cast<const float*>(v1.k);
  EXPECT_EQ(layer[267], 0.75f);
  EXPECT_EQ(layer[307], -0.5f);
  EXPECT_EQ(std::count_if(layer, layer + 480, [](float x) { return x != 0.0f; }), 2);
  EXPECT_EQ(cache.bytes(), kv_cache_bytes(cache.config()));
}

class SameAsSeparate : public ::testing::TestWithParam<std::pair<DType, KVLayout>> {};

TEST_P(SameAsSeparate, EveryOperationGivesTheSameContents) {
  const auto [dtype, layout] = GetParam();
  HostKVCache separate(small(dtype, layout, KVPlacement::kSeparate));
  HostKVCache interleaved(small(dtype, layout, KVPlacement::kInterleaved));
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  for (int step = 0; step < 300; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {  // write 1-5 tokens (some padding) to a random layer
      const int32_t n = 1 + static_cast<int32_t>(rng() % 5);
      std::vector<Slot> slots(static_cast<size_t>(n));
      for (Slot& s : slots) s = static_cast<Slot>(rng() % 25) - 1;  // -1 = padding
      std::vector<float> k(static_cast<size_t>(n) * 10), v(k.size());
      for (float& x : k) x = uni(rng);
      for (float& x : v) x = uni(rng);
      const auto layer = static_cast<int32_t>(rng() % 3);
      separate.write(layer, slots, k, v);
      interleaved.write(layer, slots, k, v);
    } else if (op == 1) {
      const std::vector<BlockCopy> pairs = {
          {static_cast<BlockId>(rng() % 6), static_cast<BlockId>(rng() % 6)},
          {static_cast<BlockId>(rng() % 6), static_cast<BlockId>(rng() % 6)}};
      separate.copy_blocks(pairs);
      interleaved.copy_blocks(pairs);
    } else if (op == 2) {
      const std::vector<BlockId> ids = {static_cast<BlockId>(rng() % 6)};
      const float value = uni(rng);
      separate.fill_blocks(ids, value);
      interleaved.fill_blocks(ids, value);
    } else {  // swap-style restore of one block's bytes into another
      const auto from = static_cast<BlockId>(rng() % 6);
      const auto to = static_cast<BlockId>(rng() % 6);
      const std::vector<std::byte> bytes = separate.block_bytes(from);
      separate.set_block_bytes(to, bytes);
      interleaved.set_block_bytes(to, bytes);
    }
  }
  for (BlockId b = 0; b < 6; ++b) {
    ASSERT_EQ(interleaved.block_bytes(b), separate.block_bytes(b)) << "block " << b;
  }
  for (int32_t l = 0; l < 3; ++l) {
    for (Slot s = 0; s < 24; ++s) {
      for (int32_t h = 0; h < 2; ++h) {
        ASSERT_EQ(interleaved.read(l, s, h, false), separate.read(l, s, h, false));
        ASSERT_EQ(interleaved.read(l, s, h, true), separate.read(l, s, h, true));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, SameAsSeparate,
                         ::testing::Values(std::pair{DType::kF32, KVLayout::kHND},
                                           std::pair{DType::kF16, KVLayout::kHND},
                                           std::pair{DType::kBF16, KVLayout::kHND},
                                           std::pair{DType::kF32, KVLayout::kNHD},
                                           std::pair{DType::kBF16, KVLayout::kNHD}));

TEST(KVPlacement, AttentionThroughTheViewIsBitIdentical) {
  // 3 sequences (contexts 1, 37, 150) over shuffled blocks of 16, 4 kv heads, GQA 2, d 64,
  // bf16: decode and a 5-token prefill chunk give the same bits through either placement (the
  // same kernel on the same values; the separate placement is checked against the reference by
  // test_attention*.cpp).
  for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
    KVCacheConfig c{.num_layers = 1,
                    .num_blocks = 20,
                    .block_size = 16,
                    .num_kv_heads = 4,
                    .head_dim = 64,
                    .dtype = DType::kBF16,
                    .layout = layout};
    HostKVCache separate(c);
    c.placement = KVPlacement::kInterleaved;
    HostKVCache interleaved(c);
    const std::vector<int32_t> lens = {1, 37, 150};
    const int32_t max_blocks = 10;
    std::vector<int32_t> ids(20);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(3));
    std::vector<int32_t> table(3 * max_blocks, -1);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    int next = 0;
    for (int32_t s = 0; s < 3; ++s) {
      const int32_t blocks = (lens[s] + 15) / 16;
      for (int32_t j = 0; j < blocks; ++j) table[s * max_blocks + j] = ids[next++];
      std::vector<Slot> slots;
      for (int32_t p = 0; p < lens[s]; ++p) {
        slots.push_back(int64_t{table[s * max_blocks + p / 16]} * 16 + p % 16);
      }
      std::vector<float> k(slots.size() * 4 * 64), v(k.size());
      for (float& x : k) x = uni(rng);
      for (float& x : v) x = uni(rng);
      separate.write(0, slots, k, v);
      interleaved.write(0, slots, k, v);
    }
    const BlockTableView tables{table.data(), lens.data(), 3, max_blocks, 16};
    const AttentionParams params{.num_heads = 8, .num_kv_heads = 4, .head_dim = 64};
    std::vector<float> q(3 * 8 * 64);
    for (float& x : q) x = uni(rng);
    std::vector<float> out_s(q.size()), out_i(q.size());
    paged_decode_attention(params, separate.layer(0), tables, q, out_s);
    paged_decode_attention(params, interleaved.layer(0), tables, q, out_i);
    EXPECT_EQ(out_s, out_i);
    EXPECT_TRUE(std::any_of(out_s.begin(), out_s.end(), [](float x) { return x != 0.0f; }));

    const std::vector<int32_t> query_start = {0, 1, 3, 8};  // 1, 2 and 5 new tokens
    std::vector<float> pq(8 * 8 * 64);
    for (float& x : pq) x = uni(rng);
    std::vector<float> pout_s(pq.size()), pout_i(pq.size());
    paged_prefill_attention(params, separate.layer(0), tables, query_start, pq, pout_s);
    paged_prefill_attention(params, interleaved.layer(0), tables, query_start, pq, pout_i);
    EXPECT_EQ(pout_s, pout_i);
  }
}

TEST(KVPlacement, UnknownPlacementNamesTheValue) {
  KVCacheConfig c = small(DType::kF32, KVLayout::kHND, KVPlacement::kSeparate);
  c.placement = static_cast<KVPlacement>(7);
  EXPECT_THAT([&] { validate(c); }, ThrowsMessage<Error>(HasSubstr("unknown placement value 7")));
  EXPECT_THAT([&] { HostKVCache cache(c); },
              ThrowsMessage<Error>(HasSubstr("unknown placement value 7")));
}

}  // namespace
}  // namespace pagedkv
