// The free functions over layer views: reshape_and_cache (kv_write.hpp) and copy_blocks
// (kv_layer_view.hpp). reshape_and_cache over memory the caller owns (an engine's pools
// described by pointers and strides): exact element offsets in both layouts and in a strided pool
// with gaps, fp16 rounding, padding slots skipped, and every documented error leaving the pools
// untouched.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"
#include "pagedkv/storage/kv_write.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using F = std::vector<float>;

// A view over caller-owned float pools: 2 blocks of 4 tokens, 2 kv heads of 2 dims.
KVLayerView view_over(std::vector<float>& k, std::vector<float>& v, KVLayout layout) {
  KVLayerView view{k.data(), v.data(), DType::kF32, 2, 4, 2, 2, 0, 0, 0};
  layout_strides(layout, 4, 2, 2, &view.block_stride, &view.head_stride, &view.token_stride);
  return view;
}

TEST(WriteKV, NhdPutsEachHeadOfEachTokenAtItsSlot) {
  std::vector<float> k(2 * 4 * 2 * 2, -1.0f), v(k.size(), -1.0f);
  const KVLayerView view = view_over(k, v, KVLayout::kNHD);
  // Token 0 -> slot 5 (block 1, token 1), token 1 is padding, token 2 -> slot 0.
  reshape_and_cache(view, std::vector<Slot>{5, -1, 0}, F{1, 2, 3, 4, 9, 9, 9, 9, 5, 6, 7, 8},
                    F{10, 20, 30, 40, 9, 9, 9, 9, 50, 60, 70, 80});
  // NHD element offset of (block b, token t, head h) = ((b * 4 + t) * 2 + h) * 2.
  const int64_t slot5 = (1 * 4 + 1) * 2 * 2;
  EXPECT_EQ((std::vector<float>(k.begin() + slot5, k.begin() + slot5 + 4)),
            (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ((std::vector<float>(v.begin() + slot5, v.begin() + slot5 + 4)),
            (std::vector<float>{10, 20, 30, 40}));
  EXPECT_EQ((std::vector<float>(k.begin(), k.begin() + 4)), (std::vector<float>{5, 6, 7, 8}));
  int written = 0;
  for (float x : k) written += x != -1.0f;
  EXPECT_EQ(written, 8);  // nothing else touched, the padding token skipped
}

TEST(WriteKV, HndAndAStridedPoolWithGaps) {
  std::vector<float> k(2 * 2 * 4 * 2, 0.0f), v(k.size(), 0.0f);
  const KVLayerView hnd = view_over(k, v, KVLayout::kHND);
  reshape_and_cache(hnd, std::vector<Slot>{6}, F{1, 2, 3, 4}, F{5, 6, 7, 8});
  // HND offset of (block 1, head h, token 2) = ((1 * 2 + h) * 4 + 2) * 2.
  EXPECT_EQ(k[((1 * 2 + 0) * 4 + 2) * 2 + 1], 2.0f);
  EXPECT_EQ(k[((1 * 2 + 1) * 4 + 2) * 2 + 0], 3.0f);
  EXPECT_EQ(v[((1 * 2 + 1) * 4 + 2) * 2 + 1], 8.0f);
  // A pool whose blocks are 100 elements apart (a slice of a larger tensor): only the strides
  // say where a slot is.
  std::vector<float> big(2 * 100, 0.0f), bigv(big.size(), 0.0f);
  KVLayerView gap = view_over(big, bigv, KVLayout::kNHD);
  gap.block_stride = 100;
  reshape_and_cache(gap, std::vector<Slot>{4}, F{1, 2, 3, 4}, F{0, 0, 0, 0});
  EXPECT_EQ((std::vector<float>(big.begin() + 100, big.begin() + 104)),
            (std::vector<float>{1, 2, 3, 4}));
}

TEST(WriteKV, Fp16RoundsToNearestEven) {
  std::vector<uint16_t> k(2 * 4 * 2 * 2, 0), v(k.size(), 0);
  KVLayerView view{k.data(), v.data(), DType::kF16, 2, 4, 2, 2, 0, 0, 0};
  layout_strides(KVLayout::kNHD, 4, 2, 2, &view.block_stride, &view.head_stride,
                 &view.token_stride);
  // 1 + 2^-11 is halfway between fp16 1 and 1 + 2^-10: ties go to the even one, 1.0 (0x3C00).
  reshape_and_cache(view, std::vector<Slot>{0}, F{1.0f + 0x1p-11f, 2, 0.5f, -1}, F{0, 0, 0, 0});
  EXPECT_EQ(k[0], 0x3C00);
  EXPECT_EQ(k[1], 0x4000);  // 2.0
  EXPECT_EQ(k[2], 0x3800);  // 0.5
  EXPECT_EQ(k[3], 0xBC00);  // -1.0
}

TEST(WriteKV, ErrorsNameTheValueAndWriteNothing) {
  std::vector<float> k(2 * 4 * 2 * 2, 0.0f), v(k.size(), 0.0f);
  const KVLayerView view = view_over(k, v, KVLayout::kNHD);
  const std::vector<float> four(4, 7.0f), eight(8, 7.0f);
  EXPECT_THAT(
      [&] {
        reshape_and_cache(view, std::vector<Slot>{0, 8}, eight, eight);
      },
      ThrowsMessage<Error>(HasSubstr("slot 8 of token 1 out of range [0, 8)")));
  EXPECT_THAT([&] { reshape_and_cache(view, std::vector<Slot>{0}, eight, four); },
              ThrowsMessage<Error>(HasSubstr("k has 8 elements, expected 4")));
  EXPECT_THAT([&] { reshape_and_cache(view, std::vector<Slot>{0}, four, eight); },
              ThrowsMessage<Error>(HasSubstr("v has 8 elements, expected 4")));
  KVLayerView null_v = view;
  null_v.v = nullptr;
  EXPECT_THAT([&] { reshape_and_cache(null_v, std::vector<Slot>{0}, four, four); },
              ThrowsMessage<Error>(HasSubstr("null K or V pool (k=0x")));
  EXPECT_THAT([&] { reshape_and_cache(null_v, std::vector<Slot>{0}, four, four); },
              ThrowsMessage<Error>(HasSubstr(", v=0x0)")));
  // 2 heads of 3 dims: the message names heads and dims apart.
  KVLayerView odd = view;
  odd.head_dim = 3;
  EXPECT_THAT([&] { reshape_and_cache(odd, std::vector<Slot>{0}, eight, eight); },
              ThrowsMessage<Error>(HasSubstr("k has 8 elements, expected 6 (1 tokens x 2 kv "
                                             "heads x 3 dims)")));
  EXPECT_THAT([&] { reshape_and_cache(odd, std::vector<Slot>{0}, F(6), eight); },
              ThrowsMessage<Error>(HasSubstr("v has 8 elements, expected 6 (1 tokens x 2 kv "
                                             "heads x 3 dims)")));
  KVLayerView no_heads = view;
  no_heads.num_kv_heads = 0;
  EXPECT_THAT([&] { reshape_and_cache(no_heads, std::vector<Slot>{}, F{}, F{}); },
              ThrowsMessage<Error>(HasSubstr("num_kv_heads 0")));
  for (float x : k) EXPECT_EQ(x, 0.0f);  // the slot 0 of the first call was not written
}

// A pool of `blocks` blocks of 4 tokens, 2 kv heads of 2 dims, element i = i + base.
struct Pool {
  std::vector<float> k, v;
  KVLayerView view;
  Pool(int32_t blocks, KVLayout layout, float base) : k(blocks * 16), v(blocks * 16) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = base + static_cast<float>(i);
      v[i] = -base - static_cast<float>(i);
    }
    view = KVLayerView{k.data(), v.data(), DType::kF32, blocks, 4, 2, 2, 0, 0, 0};
    layout_strides(layout, 4, 2, 2, &view.block_stride, &view.head_stride, &view.token_stride);
  }
  float at(bool value, int64_t block, int64_t head, int64_t token, int64_t d) const {
    return (value ? v : k)[view.offset(block, head, token) + d];
  }
};

TEST(CopyBlocks, InOrderWithinOnePool) {
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    Pool p(5, layout, 0);
    const Pool before = p;
    copy_blocks(p.view, p.view, std::vector<BlockCopy>{{1, 3}, {3, 4}, {2, 2}});
    for (int64_t e = 0; e < 16; ++e) {
      EXPECT_EQ(p.k[3 * 16 + e], before.k[1 * 16 + e]);
      EXPECT_EQ(p.k[4 * 16 + e], before.k[1 * 16 + e]);  // {3, 4} after {1, 3}: block 1's data
      EXPECT_EQ(p.v[4 * 16 + e], before.v[1 * 16 + e]);
      EXPECT_EQ(p.k[2 * 16 + e], before.k[2 * 16 + e]);  // src == dst: unchanged
      EXPECT_EQ(p.k[0 * 16 + e], before.k[0 * 16 + e]);
    }
  }
}

TEST(CopyBlocks, BetweenPoolsOfDifferentLayouts) {
  Pool device(3, KVLayout::kNHD, 0), host(2, KVLayout::kHND, 1000);
  copy_blocks(device.view, host.view, std::vector<BlockCopy>{{2, 0}, {0, 1}});
  for (int h = 0; h < 2; ++h) {
    for (int t = 0; t < 4; ++t) {
      for (int d = 0; d < 2; ++d) {
        EXPECT_EQ(host.at(false, 0, h, t, d), device.at(false, 2, h, t, d));
        EXPECT_EQ(host.at(true, 0, h, t, d), device.at(true, 2, h, t, d));
        EXPECT_EQ(host.at(true, 1, h, t, d), device.at(true, 0, h, t, d));
      }
    }
  }
}

TEST(CopyBlocks, SameIdsAcrossPoolsAndAPoolWithGaps) {
  // Pair (1, 1) between two pools copies (only within one pool is it a no-op).
  Pool a(2, KVLayout::kNHD, 0), b(2, KVLayout::kNHD, 500);
  copy_blocks(a.view, b.view, std::vector<BlockCopy>{{1, 1}});
  EXPECT_EQ(std::vector<float>(b.k.begin() + 16, b.k.end()),
            std::vector<float>(a.k.begin() + 16, a.k.end()));
  EXPECT_EQ(b.k[0], 500.0f);
  // Tokens 5 elements apart (a row of 4 plus a gap): only the rows move, never the gaps.
  std::vector<float> gk(2 * 4 * 5, 7.0f), gv(gk.size(), 7.0f);
  for (int i = 0; i < 20; ++i) gk[i] = gv[i] = static_cast<float>(i);
  KVLayerView gap{gk.data(), gv.data(), DType::kF32, 2, 4, 2, 2, 20, 2, 5};
  copy_blocks(gap, gap, std::vector<BlockCopy>{{0, 1}});
  for (int t = 0; t < 4; ++t) {
    for (int e = 0; e < 4; ++e) EXPECT_EQ(gk[20 + t * 5 + e], gk[t * 5 + e]);
    EXPECT_EQ(gk[20 + t * 5 + 4], 7.0f);  // the gap of block 1 kept its value
  }
}

TEST(CopyBlocks, ErrorsNameTheValueAndCopyNothing) {
  Pool a(2, KVLayout::kNHD, 0), b(3, KVLayout::kNHD, 100);
  const Pool before = b;
  EXPECT_THAT(
      [&] {
        copy_blocks(a.view, b.view, std::vector<BlockCopy>{{0, 1}, {2, 0}});
      },
      ThrowsMessage<Error>(HasSubstr("pair 1 (2, 0) out of range: src blocks [0, 2), dst "
                                     "blocks [0, 3)")));
  EXPECT_THAT(
      [&] {
        copy_blocks(a.view, b.view, std::vector<BlockCopy>{{0, 3}});
      },
      ThrowsMessage<Error>(HasSubstr("pair 0 (0, 3)")));
  EXPECT_THAT(
      [&] {
        copy_blocks(a.view, b.view, std::vector<BlockCopy>{{-1, 0}});
      },
      ThrowsMessage<Error>(HasSubstr("pair 0 (-1, 0)")));
  EXPECT_THAT(
      [&] {
        copy_blocks(a.view, b.view, std::vector<BlockCopy>{{0, -1}});
      },
      ThrowsMessage<Error>(HasSubstr("pair 0 (0, -1)")));
  KVLayerView other = b.view;
  other.head_dim = 1;
  EXPECT_THAT(
      [&] {
        copy_blocks(a.view, other, std::vector<BlockCopy>{{0, 0}});
      },
      ThrowsMessage<Error>(HasSubstr("src is fp32 [block_size 4, 2 kv heads, head_dim 2] "
                                     "but dst is fp32 [block_size 4, 2 kv heads, "
                                     "head_dim 1]")));
  other = b.view;
  other.dtype = DType::kF16;
  EXPECT_THAT(
      [&] {
        copy_blocks(a.view, other, std::vector<BlockCopy>{{0, 0}});
      },
      ThrowsMessage<Error>(HasSubstr("but dst is fp16")));
  other = b.view;
  other.k = nullptr;
  EXPECT_THAT(
      [&] {
        copy_blocks(a.view, other, std::vector<BlockCopy>{{0, 0}});
      },
      ThrowsMessage<Error>(HasSubstr("copy_blocks(dst): the view has a null K")));
  EXPECT_EQ(b.k, before.k);
  EXPECT_EQ(b.v, before.v);
}

// check_attention_params and check_table_geometry at each bound: the value just inside passes,
// the one just outside throws naming it.
TEST(CheckAttentionParams, EachBound) {
  std::vector<float> k(64), v(64);
  const KVLayerView cache = view_over(k, v, KVLayout::kNHD);  // 2 kv heads, head_dim 2
  const AttentionParams ok{4, 2, 2, 0.0f, -1, 0};
  EXPECT_NO_THROW(check_attention_params(ok, cache));
  struct Case {
    AttentionParams p;
    const char* message;
  };
  const Case bad[] = {
      {{0, 2, 2, 0.0f, -1, 0}, "num_heads must be >= 1, got 0"},
      {{4, 0, 2, 0.0f, -1, 0}, "num_kv_heads must be >= 1, got 0"},
      {{4, 2, 0, 0.0f, -1, 0}, "head_dim must be >= 1, got 0"},
      {{3, 2, 2, 0.0f, -1, 0}, "num_heads 3 is not a multiple of num_kv_heads 2"},
      {{4, 4, 2, 0.0f, -1, 0}, "params.num_kv_heads 4 != cache num_kv_heads 2"},
      {{4, 2, 3, 0.0f, -1, 0}, "params.head_dim 3 != cache head_dim 2"},
      {{4, 2, 2, 0.0f, -2, 0}, "window_left must be -1 (unbounded) or >= 0, got -2"},
      {{4, 2, 2, 0.0f, 4, -1}, "sink_tokens must be >= 0, got -1"},
      {{4, 2, 2, INFINITY, -1, 0}, "scale must be finite"},
  };
  for (const Case& c : bad) {
    EXPECT_THAT([&] { check_attention_params(c.p, cache); },
                ThrowsMessage<Error>(HasSubstr(c.message)))
        << c.message;
  }
  EXPECT_NO_THROW(check_attention_params({4, 2, 2, 0.5f, 0, 0}, cache));  // window 0, sinks 0
  KVLayerView zero_heads = cache;  // a view of 0 kv heads and params asking for 0: still caught
  zero_heads.num_kv_heads = 0;
  EXPECT_THAT(
      [&] {
        check_attention_params({0, 0, 2, 0.0f, -1, 0}, zero_heads);
      },
      ThrowsMessage<Error>(HasSubstr("num_heads must be >= 1")));
  KVLayerView zero_dim = cache;
  zero_dim.head_dim = 0;
  EXPECT_THAT(
      [&] {
        check_attention_params({4, 2, 0, 0.0f, -1, 0}, zero_dim);
      },
      ThrowsMessage<Error>(HasSubstr("head_dim must be >= 1, got 0")));
  KVLayerView no_blocks = cache;
  no_blocks.num_blocks = 0;
  EXPECT_THAT([&] { check_attention_params(ok, no_blocks); },
              ThrowsMessage<Error>(HasSubstr("cache num_blocks must be >= 1, got 0")));
  KVLayerView no_block_size = cache;
  no_block_size.block_size = 0;
  EXPECT_THAT([&] { check_attention_params(ok, no_block_size); },
              ThrowsMessage<Error>(HasSubstr("cache block_size must be >= 1, got 0")));
  KVLayerView null_k = cache;
  null_k.k = nullptr;
  EXPECT_THAT([&] { check_attention_params(ok, null_k); },
              ThrowsMessage<Error>(HasSubstr("null K or V pool (k=0x0, v=0x")));
}

TEST(CheckTableGeometry, EachBound) {
  std::vector<float> k(64), v(64);
  const KVLayerView cache = view_over(k, v, KVLayout::kNHD);  // block_size 4, 2 blocks
  EXPECT_NO_THROW(check_table_geometry("f", cache, 4, 0));    // pool size not stated
  EXPECT_NO_THROW(check_table_geometry("f", cache, 4, 2));
  EXPECT_THAT([&] { check_table_geometry("f", cache, 4, 3); },
              ThrowsMessage<Error>(HasSubstr("f: block tables index a pool of 3 blocks but the "
                                             "cache has num_blocks 2")));
  EXPECT_THAT([&] { check_table_geometry("f", cache, 4, -1); },
              ThrowsMessage<Error>(HasSubstr("a pool of -1 blocks")));
  EXPECT_THAT([&] { check_table_geometry("f", cache, 8, 0); },
              ThrowsMessage<Error>(HasSubstr("built for block_size 8 but the cache has "
                                             "block_size 4 (the tables and the cache must come "
                                             "from one configuration)")));
  EXPECT_THAT([&] { check_table_geometry("f", cache, 0, 0); },
              ThrowsMessage<Error>(HasSubstr("; the view's block_size is unset")));
}

}  // namespace
}  // namespace pagedkv
