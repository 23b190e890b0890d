// HostKVCache: memory size, layout addresses, write/read per dtype and layout, padding slots,
// copy_blocks, fill_blocks, block_bytes, and every documented error.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

struct StorageCase {
  DType dtype;
  KVLayout layout;
};

std::string storage_name(const ::testing::TestParamInfo<StorageCase>& info) {
  return std::string(dtype_name(info.param.dtype)) +
         (info.param.layout == KVLayout::kHND ? "_hnd" : "_nhd");
}

class HostKVCacheTest : public ::testing::TestWithParam<StorageCase> {
 protected:
  /// 3 layers, 6 blocks of 4 tokens, 2 kv heads, head_dim 5: small, and no size is a power of
  /// two except block_size, so stride mix-ups show. Separate K and V pools, the placement of
  /// DESIGN.md's worked examples (interleaved: test_kv_placement.cpp).
  static KVCacheConfig config() {
    KVCacheConfig c;
    c.num_layers = 3;
    c.num_blocks = 6;
    c.block_size = 4;
    c.num_kv_heads = 2;
    c.head_dim = 5;
    c.dtype = GetParam().dtype;
    c.layout = GetParam().layout;
    c.placement = KVPlacement::kSeparate;
    return c;
  }
  /// Value x rounded to the storage dtype, as read() must return it.
  static float rounded(float x) {
    float buf[1];
    store_from_f32(buf, GetParam().dtype, 0, x);
    return load_as_f32(buf, GetParam().dtype, 0);
  }
  static std::vector<float> random_tokens(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n * 2 * 5));
    for (float& e : x) e = uni(rng);
    return x;
  }
};

TEST_P(HostKVCacheTest, BytesEqualFormula) {
  const HostKVCache cache(config());
  // 2 (K, V) x 3 layers x 24 token slots x 2 heads x 5 dims x sizeof(dtype).
  EXPECT_EQ(cache.bytes(), 2 * 3 * 24 * 2 * 5 * dtype_size(GetParam().dtype));
  EXPECT_EQ(cache.bytes(), kv_cache_bytes(config()));
}

TEST_P(HostKVCacheTest, ArenaIsAlignedAndZeroed) {
  const HostKVCache cache(config());
  for (int32_t l = 0; l < 3; ++l) {
    // Every pool starts on a cache line (fp16 pools here are 480 bytes: padded to 512).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(cache.layer(l).k) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(cache.layer(l).v) % 64, 0u);
    for (Slot s = 0; s < 24; ++s) {
      for (int32_t h = 0; h < 2; ++h) {
        for (float x : cache.read(l, s, h, false)) ASSERT_EQ(x, 0.0f);
        for (float x : cache.read(l, s, h, true)) ASSERT_EQ(x, 0.0f);
      }
    }
  }
}

TEST_P(HostKVCacheTest, LayerViewMatchesLayout) {
  const HostKVCache cache(config());
  const KVLayerView v = cache.layer(2);
  EXPECT_EQ(v.dtype, GetParam().dtype);
  EXPECT_EQ(v.num_blocks, 6);
  EXPECT_EQ(v.block_size, 4);
  EXPECT_EQ(v.num_kv_heads, 2);
  EXPECT_EQ(v.head_dim, 5);
  EXPECT_EQ(v.block_stride, 40);
  if (GetParam().layout == KVLayout::kHND) {
    EXPECT_EQ(v.head_stride, 20);
    EXPECT_EQ(v.token_stride, 5);
  } else {
    EXPECT_EQ(v.head_stride, 5);
    EXPECT_EQ(v.token_stride, 10);
  }
  // Pools follow each other in the order K0 V0 K1 V1 K2 V2, each 240 elements rounded up to a
  // 64-byte line: 960 bytes (fp32) or 480 -> 512 bytes (fp16/bf16).
  const auto* base = static_cast<const std::byte*>(cache.layer(0).k);
  const int64_t pool = GetParam().dtype == DType::kF32 ? 960 : 512;
  EXPECT_EQ(static_cast<const std::byte*>(cache.layer(0).v) - base, pool);
  EXPECT_EQ(static_cast<const std::byte*>(v.k) - base, 4 * pool);
  EXPECT_EQ(static_cast<const std::byte*>(v.v) - base, 5 * pool);
}

TEST_P(HostKVCacheTest, WriteLandsAtTheDocumentedAddress) {
  // Slot 13 = block 3, token 1. HND: 3 x 40 + head 1 x 20 + token 1 x 5 + dim 2 = 147;
  // NHD: 3 x 40 + token 1 x 10 + head 1 x 5 + dim 2 = 137.
  HostKVCache cache(config());
  std::vector<float> k(10, 0.0f), v(10, 0.0f);
  k[1 * 5 + 2] = 0.75f;  // head 1, dim 2 (exact in every dtype)
  v[1 * 5 + 2] = -0.5f;
  const std::vector<Slot> slots = {13};
  cache.write(1, slots, k, v);
  const KVLayerView view = cache.layer(1);
  const int64_t expected = GetParam().layout == KVLayout::kHND ? 147 : 137;
  EXPECT_EQ(view.slot_offset(13, 1) + 2, expected);
  EXPECT_EQ(load_as_f32(view.k, GetParam().dtype, expected), 0.75f);
  EXPECT_EQ(load_as_f32(view.v, GetParam().dtype, expected), -0.5f);
  // The only nonzero element of the layer's K pool.
  int nonzero = 0;
  for (int64_t i = 0; i < 240; ++i) nonzero += load_as_f32(view.k, GetParam().dtype, i) != 0.0f;
  EXPECT_EQ(nonzero, 1);
}

TEST_P(HostKVCacheTest, WriteReadRoundTripSkipsNegativeSlots) {
  HostKVCache cache(config());
  // 5 tokens; token 2 is padding (slot -1) and must not land anywhere.
  const std::vector<Slot> slots = {22, 3, -1, 8, 17};
  const std::vector<float> k = random_tokens(5, 1), v = random_tokens(5, 2);
  cache.write(2, slots, k, v);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    for (int32_t h = 0; h < 2; ++h) {
      const std::vector<float> kr = cache.read(2, slots[t], h, false);
      const std::vector<float> vr = cache.read(2, slots[t], h, true);
      for (int32_t d = 0; d < 5; ++d) {
        EXPECT_EQ(kr[d], rounded(k[(t * 2 + h) * 5 + d])) << "token " << t << " head " << h;
        EXPECT_EQ(vr[d], rounded(v[(t * 2 + h) * 5 + d]));
      }
    }
  }
  // Every other slot of every layer is still zero: the padding token was skipped and the other
  // layers were not touched.
  for (int32_t l = 0; l < 3; ++l) {
    for (Slot s = 0; s < 24; ++s) {
      if (l == 2 && (s == 22 || s == 3 || s == 8 || s == 17)) continue;
      for (int32_t h = 0; h < 2; ++h) {
        for (float x : cache.read(l, s, h, false)) ASSERT_EQ(x, 0.0f) << l << " " << s;
        for (float x : cache.read(l, s, h, true)) ASSERT_EQ(x, 0.0f) << l << " " << s;
      }
    }
  }
}

TEST_P(HostKVCacheTest, CopyBlocksCopiesEveryLayerInOrder) {
  HostKVCache cache(config());
  for (int32_t l = 0; l < 3; ++l) {
    std::vector<Slot> slots;
    for (Slot s = 0; s < 24; ++s) slots.push_back(s);
    cache.write(l, slots, random_tokens(24, 10 + l), random_tokens(24, 20 + l));
  }
  const std::vector<std::byte> b1 = cache.block_bytes(1), b2 = cache.block_bytes(2);
  const std::vector<std::byte> b0 = cache.block_bytes(0), b5 = cache.block_bytes(5);
  // In order: 1 -> 3, then 3 -> 4 (so 4 receives block 1's data), then 2 -> 2 (no-op).
  const std::vector<BlockCopy> pairs = {{1, 3}, {3, 4}, {2, 2}};
  cache.copy_blocks(pairs);
  EXPECT_EQ(cache.block_bytes(3), b1);
  EXPECT_EQ(cache.block_bytes(4), b1);
  EXPECT_EQ(cache.block_bytes(1), b1);
  EXPECT_EQ(cache.block_bytes(2), b2);
  EXPECT_EQ(cache.block_bytes(0), b0);
  EXPECT_EQ(cache.block_bytes(5), b5);
  // And read() agrees, token by token, in the last layer's V.
  for (int32_t t = 0; t < 4; ++t) {
    EXPECT_EQ(cache.read(2, 4 * 4 + t, 1, true), cache.read(2, 1 * 4 + t, 1, true));
  }
}

TEST_P(HostKVCacheTest, BlockBytesRoundTrip) {
  HostKVCache cache(config());
  std::vector<Slot> slots = {4, 5, 6, 7};  // all of block 1
  for (int32_t l = 0; l < 3; ++l) {
    cache.write(l, slots, random_tokens(4, 30 + l), random_tokens(4, 40 + l));
  }
  const std::vector<std::byte> bytes = cache.block_bytes(1);
  // K and V of 3 layers, 4 tokens x 2 heads x 5 dims each.
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), 2 * 3 * 40 * dtype_size(GetParam().dtype));
  cache.set_block_bytes(5, bytes);
  EXPECT_EQ(cache.block_bytes(5), bytes);
  for (int32_t l = 0; l < 3; ++l) {
    for (int32_t t = 0; t < 4; ++t) {
      EXPECT_EQ(cache.read(l, 20 + t, 0, false), cache.read(l, 4 + t, 0, false));
      EXPECT_EQ(cache.read(l, 20 + t, 1, true), cache.read(l, 4 + t, 1, true));
    }
  }
  // Layout of the bytes: layer 0 K first, so its first element is K(layer 0, slot 4, head 0).
  HostKVCache other(config());
  other.set_block_bytes(0, bytes);
  EXPECT_EQ(other.read(0, 0, 0, false), cache.read(0, 4, 0, false));
}

TEST_P(HostKVCacheTest, FillBlocksPoisonsOnlyThoseBlocks) {
  HostKVCache cache(config());
  const std::vector<BlockId> blocks = {4, 1};
  cache.fill_blocks(blocks, std::numeric_limits<float>::quiet_NaN());
  for (int32_t l = 0; l < 3; ++l) {
    for (Slot s = 0; s < 24; ++s) {
      const bool poisoned = s / 4 == 1 || s / 4 == 4;
      for (bool value : {false, true}) {
        for (float x : cache.read(l, s, 1, value)) {
          ASSERT_EQ(std::isnan(x), poisoned) << "layer " << l << " slot " << s;
        }
      }
    }
  }
  const std::vector<BlockId> one = {2};
  cache.fill_blocks(one, 0.375f);
  EXPECT_EQ(cache.read(1, 9, 0, true), std::vector<float>(5, 0.375f));
}

TEST_P(HostKVCacheTest, ErrorsNameTheValueAndChangeNothing) {
  HostKVCache cache(config());
  const std::vector<float> k = random_tokens(2, 5), v = random_tokens(2, 6);
  const std::vector<Slot> good = {0, 1}, bad = {0, 24};
  EXPECT_THAT([&] { cache.write(3, good, k, v); },
              ThrowsMessage<Error>(HasSubstr("layer 3 out of range [0, 3)")));
  // The function's own check names it (read and write also reach layer()'s check, later).
  EXPECT_THAT([&] { cache.write(-1, good, k, v); },
              ThrowsMessage<Error>(HasSubstr("HostKVCache::write: layer -1 out of range [0, 3)")));
  // Slot 24 is past 6 blocks x 4; slot 0 (checked first) must not have been written either.
  EXPECT_THAT([&] { cache.write(0, bad, k, v); },
              ThrowsMessage<Error>(HasSubstr("slot 24 of token 1 out of range [0, 24)")));
  EXPECT_EQ(cache.read(0, 0, 0, false), std::vector<float>(5, 0.0f));
  const std::vector<float> short_k(k.begin(), k.end() - 1);
  EXPECT_THAT([&] { cache.write(0, good, short_k, v); },
              ThrowsMessage<Error>(HasSubstr("k has 19 elements, expected 20")));
  EXPECT_THAT([&] { cache.write(0, good, k, short_k); },
              ThrowsMessage<Error>(HasSubstr("v has 19 elements, expected 20")));

  EXPECT_THAT([&] { (void)cache.read(0, 24, 0, false); },
              ThrowsMessage<Error>(HasSubstr("slot 24 out of range")));
  EXPECT_THAT([&] { (void)cache.read(0, -3, 0, false); },
              ThrowsMessage<Error>(HasSubstr("slot -3 out of range")));
  EXPECT_THAT([&] { (void)cache.read(0, 0, 2, false); },
              ThrowsMessage<Error>(HasSubstr("kv head 2 out of range [0, 2)")));
  EXPECT_THAT([&] { (void)cache.read(5, 0, 0, false); },
              ThrowsMessage<Error>(HasSubstr("layer 5")));
  EXPECT_THAT([&] { (void)cache.read(-1, 0, 0, false); },
              ThrowsMessage<Error>(HasSubstr("HostKVCache::read: layer -1 out of range [0, 3)")));
  EXPECT_THAT([&] { (void)cache.layer(-1); },
              ThrowsMessage<Error>(HasSubstr("HostKVCache::layer: layer -1 out of range [0, 3)")));
  EXPECT_THAT([&] { (void)cache.layer(3); }, ThrowsMessage<Error>(HasSubstr("layer 3")));

  // copy_blocks checks every pair before copying any: the valid first pair is not applied.
  cache.write(0, good, k, v);
  const std::vector<std::byte> before = cache.block_bytes(5);
  const std::vector<BlockCopy> pairs = {{0, 5}, {1, 6}};
  EXPECT_THAT([&] { cache.copy_blocks(pairs); },
              ThrowsMessage<Error>(HasSubstr("block id 6 out of range [0, 6)")));
  EXPECT_EQ(cache.block_bytes(5), before);
  const std::vector<BlockCopy> bad_src = {{-1, 0}};
  EXPECT_THAT([&] { cache.copy_blocks(bad_src); }, ThrowsMessage<Error>(HasSubstr("block id -1")));

  const std::vector<BlockId> fill = {2, 9};
  EXPECT_THAT([&] { cache.fill_blocks(fill, 1.0f); },
              ThrowsMessage<Error>(HasSubstr("block id 9")));
  EXPECT_EQ(cache.read(0, 8, 0, false), std::vector<float>(5, 0.0f));
  EXPECT_THAT([&] { (void)cache.block_bytes(6); }, ThrowsMessage<Error>(HasSubstr("block id 6")));
  const std::vector<std::byte> wrong(7);
  EXPECT_THAT([&] { cache.set_block_bytes(0, wrong); },
              ThrowsMessage<Error>(HasSubstr("got 7 bytes, a block holds")));
  EXPECT_THAT([&] { cache.set_block_bytes(8, wrong); },
              ThrowsMessage<Error>(HasSubstr("block id 8")));
}

INSTANTIATE_TEST_SUITE_P(AllStorage, HostKVCacheTest,
                         ::testing::Values(StorageCase{DType::kF32, KVLayout::kHND},
                                           StorageCase{DType::kF16, KVLayout::kHND},
                                           StorageCase{DType::kBF16, KVLayout::kHND},
                                           StorageCase{DType::kF32, KVLayout::kNHD},
                                           StorageCase{DType::kF16, KVLayout::kNHD},
                                           StorageCase{DType::kBF16, KVLayout::kNHD}),
                         storage_name);

TEST(HostKVCache, InvalidConfigThrowsNamingTheField) {
  KVCacheConfig c;  // num_blocks defaults to 0
  EXPECT_THAT([&] { HostKVCache cache(c); },
              ThrowsMessage<Error>(HasSubstr("num_blocks must be >= 1, got 0")));
}

TEST(HostKVCache, EmptyWriteIsANoOp) {
  KVCacheConfig c;
  c.num_blocks = 1;
  HostKVCache cache(c);
  cache.write(0, {}, std::span<const float>{}, std::span<const float>{});
  cache.copy_blocks({});
  EXPECT_EQ(cache.read(0, 0, 0, false), std::vector<float>(64, 0.0f));
}

}  // namespace
}  // namespace pagedkv
