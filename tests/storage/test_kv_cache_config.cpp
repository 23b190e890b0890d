// KVCacheConfig validation, the memory formula on hand values, layout strides, and int64
// offsets on a pool of more than 2^32 elements (computed, not allocated).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "pagedkv/error.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

KVCacheConfig valid() {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_blocks = 10;
  c.block_size = 16;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.dtype = DType::kF16;
  return c;
}

TEST(KVCacheConfig, ValidConfigsPassWithTheirSizes) {
  // Every dtype, layout and placement enumerator is accepted (the range checks end at the last
  // one), and the sizes follow: 2 layers x 2 pools x (10 x 16 x 4 x 128 = 81920) elements.
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (KVLayout layout : {KVLayout::kHND, KVLayout::kNHD}) {
      for (KVPlacement placement : {KVPlacement::kSeparate, KVPlacement::kInterleaved}) {
        KVCacheConfig c = valid();
        c.dtype = dtype;
        c.layout = layout;
        c.placement = placement;
        EXPECT_NO_THROW(validate(c));
        EXPECT_EQ(pool_elements(c), 81920);
        EXPECT_EQ(kv_cache_bytes(c), dtype == DType::kF32 ? 1310720 : 655360);
      }
    }
  }
  // Every field at its minimum 1: one fp32 element per pool, 2 pools = 8 bytes.
  const KVCacheConfig one{.num_layers = 1,
                          .num_blocks = 1,
                          .block_size = 1,
                          .num_kv_heads = 1,
                          .head_dim = 1,
                          .dtype = DType::kF32};
  EXPECT_NO_THROW(validate(one));
  EXPECT_EQ(kv_cache_bytes(one), 8);
}

TEST(KVCacheConfig, EachFieldBelowOneIsNamed) {
  auto expect_error = [](KVCacheConfig c, const char* message) {
    EXPECT_THAT([&] { validate(c); }, ThrowsMessage<Error>(HasSubstr(message)));
  };
  KVCacheConfig c = valid();
  c.num_layers = 0;
  expect_error(c, "num_layers must be >= 1, got 0");
  c = valid();
  c.num_blocks = -5;
  expect_error(c, "num_blocks must be >= 1, got -5");
  c = valid();
  c.block_size = 0;
  expect_error(c, "block_size must be >= 1, got 0");
  c = valid();
  c.num_kv_heads = -1;
  expect_error(c, "num_kv_heads must be >= 1, got -1");
  c = valid();
  c.head_dim = 0;
  expect_error(c, "head_dim must be >= 1, got 0");
  c = valid();
  c.dtype = static_cast<DType>(9);
  expect_error(c, "unknown dtype value 9");
  c = valid();
  c.layout = static_cast<KVLayout>(7);
  expect_error(c, "unknown layout value 7");
}

TEST(KVCacheConfig, ElementOverflowIsRejected) {
  KVCacheConfig c = valid();
  c.num_blocks = std::numeric_limits<int32_t>::max();
  c.block_size = std::numeric_limits<int32_t>::max();
  c.num_kv_heads = std::numeric_limits<int32_t>::max();
  c.head_dim = 2;
  EXPECT_THAT([&] { validate(c); },
              ThrowsMessage<Error>(HasSubstr("2147483647 blocks x 2147483647 tokens")));
}

TEST(KVCacheConfig, ByteOverflowIsRejected) {
  // 2^61 elements fit int64, but 1 layer x 2 pools x 2^61 x 2 bytes = 2^63 does not.
  KVCacheConfig c = valid();
  c.num_layers = 1;
  c.num_blocks = 1 << 30;
  c.block_size = 1 << 30;
  c.num_kv_heads = 2;
  c.head_dim = 1;
  c.dtype = DType::kBF16;
  EXPECT_EQ(pool_elements(c), int64_t{1} << 61);
  EXPECT_THAT([&] { validate(c); },
              ThrowsMessage<Error>(HasSubstr("2305843009213693952 elements of bf16")));
  c.num_kv_heads = 1;  // 2^62 bytes: representable
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(kv_cache_bytes(c), int64_t{1} << 62);
}

TEST(KVCacheConfig, BytesFormulaOnHandValues) {
  // 2 layers x 10 blocks x 16 tokens = 160 token slots; per slot per layer K+V:
  // 2 x 4 heads x 128 dims x 2 bytes = 2048 bytes; total 2 x 160 x 2048 = 655360.
  const KVCacheConfig c = valid();
  EXPECT_EQ(pool_elements(c), 10 * 16 * 4 * 128);
  EXPECT_EQ(kv_cache_bytes(c), 655360);
  // Llama-2-7B: 32 layers, 32 kv heads, head_dim 128, fp16 -> 2 x 32 x 32 x 128 x 2 = 0.5 MiB
  // per token (Kwon et al. 2023 quote ~0.8 MB for the 13B model; same formula).
  EXPECT_EQ(kv_bytes_for_tokens(32, 32, 128, DType::kF16, 1), 524288);
  EXPECT_EQ(kv_bytes_for_tokens(32, 32, 128, DType::kF16, 4096), int64_t{2} << 30);  // 2 GiB
  EXPECT_EQ(kv_bytes_for_tokens(1, 1, 1, DType::kF32, 0), 0);
}

TEST(KVLayerView, StridesWorkedExample) {
  int64_t block = 0, head = 0, token = 0;
  layout_strides(KVLayout::kHND, 16, 4, 128, &block, &head, &token);
  EXPECT_EQ(block, 8192);
  EXPECT_EQ(head, 2048);
  EXPECT_EQ(token, 128);
  layout_strides(KVLayout::kNHD, 16, 4, 128, &block, &head, &token);
  EXPECT_EQ(block, 8192);
  EXPECT_EQ(head, 128);
  EXPECT_EQ(token, 512);
}

TEST(KVLayerView, DocsWorkedAddressExample) {
  // docs/storage-and-attention.md: slot 83 = block 5, token 3; K of head 2, dim 7.
  KVLayerView v;
  v.block_size = 16;
  layout_strides(KVLayout::kHND, 16, 4, 128, &v.block_stride, &v.head_stride, &v.token_stride);
  EXPECT_EQ(v.slot_offset(83, 2) + 7, 45447);  // 5*8192 + 2*2048 + 3*128 + 7
  layout_strides(KVLayout::kNHD, 16, 4, 128, &v.block_stride, &v.head_stride, &v.token_stride);
  EXPECT_EQ(v.slot_offset(83, 2) + 7, 42759);  // 5*8192 + 3*512 + 2*128 + 7
}

/// A pool of 100000 blocks x 32 tokens x 8 kv heads x 256 dims = 6,553,600,000 elements
/// (> 2^32 = 4,294,967,296): the offset of its last element must be computed in int64.
KVLayerView big_view(KVLayout layout) {
  KVCacheConfig c;
  c.num_blocks = 100000;
  c.block_size = 32;
  c.num_kv_heads = 8;
  c.head_dim = 256;
  c.layout = layout;
  validate(c);
  EXPECT_EQ(pool_elements(c), int64_t{6553600000});
  EXPECT_GT(pool_elements(c), int64_t{1} << 32);
  KVLayerView v;  // no memory: only the address arithmetic is under test
  v.num_blocks = c.num_blocks;
  v.block_size = c.block_size;
  v.num_kv_heads = c.num_kv_heads;
  v.head_dim = c.head_dim;
  layout_strides(layout, c.block_size, c.num_kv_heads, c.head_dim, &v.block_stride, &v.head_stride,
                 &v.token_stride);
  return v;
}

TEST(KVLayerView, LastElementOffsetOfPoolBeyond2To32IsInt64HND) {
  const KVLayerView v = big_view(KVLayout::kHND);
  // HND: block 99999 x 65536 + head 7 x 8192 + token 31 x 256 + dim 255
  //    = 6553534464 + 57344 + 7936 + 255 = 6553599999 = elements - 1.
  EXPECT_EQ(v.offset(99999, 7, 31) + 255, int64_t{6553599999});
  const Slot last_slot = int64_t{100000} * 32 - 1;  // 3199999
  EXPECT_EQ(v.slot_offset(last_slot, 7) + 255, int64_t{6553599999});
  // A slot whose block offset alone exceeds 2^31 elements.
  EXPECT_EQ(v.slot_offset(int64_t{40000} * 32, 0), int64_t{40000} * 65536);
}

TEST(KVLayerView, LastElementOffsetOfPoolBeyond2To32IsInt64NHD) {
  const KVLayerView v = big_view(KVLayout::kNHD);
  // NHD: block 99999 x 65536 + token 31 x 2048 + head 7 x 256 + dim 255
  //    = 6553534464 + 63488 + 1792 + 255 = 6553599999.
  EXPECT_EQ(v.offset(99999, 7, 31) + 255, int64_t{6553599999});
  EXPECT_EQ(v.slot_offset(int64_t{100000} * 32 - 1, 7) + 255, int64_t{6553599999});
}

}  // namespace
}  // namespace pagedkv
