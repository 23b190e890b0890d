// Tests for the KV events of include/pagedkv/metadata/hybrid_kv_cache_manager.hpp
// (HybridKVCacheManagerConfig::enable_events, take_events): hand-worked with exact block ids
// (block size 4, a full and a window-8 group, 6 usable blocks): commit stores each full block
// once per group, in (block, group) order with the chain of parent hashes; a prompt that
// needs every block evicts the cached ones in LRU order, each an event of its group; nothing
// is recorded with events off.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "common/hybrid_groups.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;

using testing::full;
using testing::window;

std::vector<TokenId> ids(int32_t first, int32_t n) {
  std::vector<TokenId> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

HybridKVCacheManager make(bool events) {
  return HybridKVCacheManager({.num_blocks = 7,
                               .block_size = 4,
                               .groups = {full(), window(8)},
                               .enable_prefix_caching = true,
                               .enable_events = events});
}

using Kind = KVCacheEvent::Kind;

TEST(HybridKVEvents, StoredPerGroupThenEvictedInLruOrder) {
  HybridKVCacheManager m = make(true);
  // 9 tokens: 3 entries per group. One allocation of 6, the full group first: {1, 2, 3} and
  // the window group {4, 5, 6} (the query at 8 still sees position 1, so nothing is released).
  ASSERT_TRUE(m.add_sequence(1, ids(100, 9)));
  ASSERT_THAT(m.block_table(1, 0), ElementsAre(1, 2, 3));
  ASSERT_THAT(m.block_table(1, 1), ElementsAre(4, 5, 6));
  EXPECT_TRUE(m.take_events().empty()) << "nothing is published before commit";

  EXPECT_EQ(m.commit(1, 9), 4);  // full blocks 0 and 1 in both groups; block 2 is partial
  const std::vector<KVCacheEvent> stored = m.take_events();
  ASSERT_EQ(stored.size(), 4u);
  const BlockId want_block[] = {1, 4, 2, 5};
  const int32_t want_group[] = {0, 1, 0, 1};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(stored[i].kind, Kind::kStored) << i;
    EXPECT_EQ(stored[i].block, want_block[i]) << i;
    EXPECT_EQ(stored[i].group, want_group[i]) << i;
    EXPECT_EQ(stored[i].hash, m.prefix_cache(want_group[i]).entry(want_block[i])->hash) << i;
    EXPECT_EQ(stored[i].extra_key, 0u);
  }
  // One key per block position, stored under each group; the chain starts at the root.
  EXPECT_EQ(stored[0].hash, stored[1].hash);
  EXPECT_EQ(stored[2].hash, stored[3].hash);
  EXPECT_NE(stored[0].hash, stored[2].hash);
  EXPECT_EQ(stored[0].parent_hash, kRootBlockHash);
  EXPECT_EQ(stored[2].parent_hash, stored[0].hash);
  EXPECT_THAT(stored[1].tokens, ElementsAre(100, 101, 102, 103));
  EXPECT_THAT(stored[3].tokens, ElementsAre(104, 105, 106, 107));
  EXPECT_TRUE(m.take_events().empty()) << "take_events clears";

  // Freed tail first over the groups: 3 and 6 (partial, never published) go to the free list,
  // then 2, 5, 1, 4 to the LRU. Another 9-token prompt takes the 2 free blocks, then evicts all
  // 4 cached ones oldest first.
  m.free_sequence(1);
  EXPECT_TRUE(m.take_events().empty()) << "a release to the LRU is not an eviction";
  ASSERT_TRUE(m.add_sequence(2, ids(500, 9)));
  const std::vector<KVCacheEvent> evicted = m.take_events();
  ASSERT_EQ(evicted.size(), 4u);
  const BlockId lru_block[] = {2, 5, 1, 4};
  const int32_t lru_group[] = {0, 1, 0, 1};
  const BlockHash lru_hash[] = {stored[2].hash, stored[2].hash, stored[0].hash, stored[0].hash};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(evicted[i].kind, Kind::kEvicted) << i;
    EXPECT_EQ(evicted[i].block, lru_block[i]) << i;
    EXPECT_EQ(evicted[i].group, lru_group[i]) << i;
    EXPECT_EQ(evicted[i].hash, lru_hash[i]) << i;
    EXPECT_TRUE(evicted[i].tokens.empty()) << i;
  }
  m.check_invariants();
}

TEST(HybridKVEvents, NothingIsRecordedWithEventsOff) {
  HybridKVCacheManager m = make(false);
  ASSERT_TRUE(m.add_sequence(1, ids(100, 9)));
  EXPECT_EQ(m.commit(1, 9), 4);
  m.free_sequence(1);
  ASSERT_TRUE(m.add_sequence(2, ids(500, 9)));
  EXPECT_TRUE(m.take_events().empty());
}

}  // namespace
}  // namespace pagedkv
