// Tests for group_layers (pagedkv/metadata/kv_cache_groups.hpp): the page-size rule worked by
// hand on Gemma 3's pattern, close counts, one kind, and errors naming the layer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "common/hybrid_groups.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_groups.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using testing::window;

TEST(KVCacheGroups, Gemma3PadsTheWindowKindToGroupsOfTen) {
  // 62 layers, layer i full when (i + 1) % 6 == 0: 10 full, 52 window-1024 layers. G = 10;
  // the window kind (first at layer 0) fills groups 0..5 (60 slots, 8 padded), full group 6.
  std::vector<KVCacheGroupSpec> layers(62, window(1024));
  for (int32_t i = 5; i < 62; i += 6) layers[static_cast<size_t>(i)] = KVCacheGroupSpec{};
  const KVCacheGroupLayout g = group_layers(layers);
  EXPECT_EQ(g.layers_per_group, 10);
  ASSERT_EQ(g.groups.size(), 7u);
  EXPECT_EQ(g.padded_layers, 8);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(g.groups[static_cast<size_t>(i)].num_layers, 10);
  EXPECT_EQ(g.groups[5].num_layers, 2);
  EXPECT_EQ(g.groups[5].kind, GroupAttention::kSlidingWindow);
  EXPECT_EQ(g.groups[6].kind, GroupAttention::kFull);
  EXPECT_EQ(g.groups[6].num_layers, 10);
  // Layer 0: window layer #0 -> group 0 slot 0; layer 12: window layer #10 (0-4, 6-10, 12) ->
  // group 1 slot 0; layer 61: window layer #51 -> group 5 slot 1; layer 5: full #0 -> group 6
  // slot 0; layer 59: full #9 -> group 6 slot 9.
  EXPECT_EQ(g.layers[0].group, 0);
  EXPECT_EQ(g.layers[0].slot, 0);
  EXPECT_EQ(g.layers[12].group, 1);
  EXPECT_EQ(g.layers[12].slot, 0);
  EXPECT_EQ(g.layers[61].group, 5);
  EXPECT_EQ(g.layers[61].slot, 1);
  EXPECT_EQ(g.layers[5].group, 6);
  EXPECT_EQ(g.layers[5].slot, 0);
  EXPECT_EQ(g.layers[59].group, 6);
  EXPECT_EQ(g.layers[59].slot, 9);
}

TEST(KVCacheGroups, CloseCountsTakeTheLargerKind) {
  // 4 full + 5 window: 2 x 5 < 3 x 4, so G = 5: the full kind is padded by one slot.
  std::vector<KVCacheGroupSpec> layers = {KVCacheGroupSpec{}, window(8), KVCacheGroupSpec{},
                                          window(8),          window(8), KVCacheGroupSpec{},
                                          window(8),          window(8), KVCacheGroupSpec{}};
  const KVCacheGroupLayout g = group_layers(layers);
  EXPECT_EQ(g.layers_per_group, 5);
  ASSERT_EQ(g.groups.size(), 2u);
  EXPECT_EQ(g.padded_layers, 1);
  EXPECT_EQ(g.groups[0].kind, GroupAttention::kFull);
  EXPECT_EQ(g.groups[0].num_layers, 4);
  EXPECT_EQ(g.layers[8].slot, 3);
  // Windows of other lengths are other kinds.
  layers[1] = window(16);
  EXPECT_EQ(group_layers(layers).groups.size(), 9u);  // 4 F, 4 W8, 1 W16: G = 1, 9 groups
}

TEST(KVCacheGroups, OneKindIsOneGroupOfAllLayers) {
  const KVCacheGroupLayout g = group_layers(std::vector<KVCacheGroupSpec>(32, KVCacheGroupSpec{}));
  EXPECT_EQ(g.layers_per_group, 32);
  ASSERT_EQ(g.groups.size(), 1u);
  EXPECT_EQ(g.padded_layers, 0);
  EXPECT_EQ(g.layers[31].slot, 31);
}

TEST(KVCacheGroups, ErrorsNameTheLayer) {
  EXPECT_THAT([] { (void)group_layers({}); }, ThrowsMessage<Error>(HasSubstr("no layer")));
  std::vector<KVCacheGroupSpec> layers = {KVCacheGroupSpec{}, KVCacheGroupSpec{}, window(0)};
  EXPECT_THAT([&] { (void)group_layers(layers); },
              ThrowsMessage<Error>(HasSubstr("layer 2 (sliding_window)")));
}

}  // namespace
}  // namespace pagedkv
