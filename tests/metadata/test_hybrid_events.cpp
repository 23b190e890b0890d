// Tests for the KV events and stats of include/pagedkv/metadata/hybrid_kv_cache_manager.hpp
// (HybridKVCacheManagerConfig::enable_events, take_events, stats): hand-worked with exact
// block ids (block size 4, a full and a window-8 group, 6 usable blocks): commit stores each
// full block once per group, in (block, group) order with the chain of parent hashes; a prompt
// that needs every block evicts the cached ones in LRU order, each an event of its group;
// nothing is recorded with events off; the counters of queries, hits, misses, evictions and
// preemptions through the same sequence of operations.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(HybridKVStats, CountsQueriesHitsMissesEvictionsAndPreemptions) {
  HybridKVCacheManager m = make(false);
  auto expect_pool = [&](int32_t used, int32_t cached, int32_t free) {
    const KVCacheStats st = m.stats();
    EXPECT_EQ(st.total_blocks, 7);
    EXPECT_EQ(st.used_blocks, used) << "the null block counts as used";
    EXPECT_EQ(st.cached_blocks, cached);
    EXPECT_EQ(st.free_blocks, free);
    EXPECT_DOUBLE_EQ(st.usage, used / 7.0);
  };
  expect_pool(1, 0, 6);
  ASSERT_TRUE(m.add_sequence(1, ids(100, 9)));  // (9 - 1) / 4 = 2 eligible blocks, no hit
  EXPECT_EQ(m.stats().prefix_query_tokens, 9);
  EXPECT_EQ(m.stats().prefix_misses, 2);
  expect_pool(7, 0, 0);
  EXPECT_EQ(m.commit(1, 9), 4);
  EXPECT_EQ(m.stats().prefix_cached_entries, 4);  // 2 keys x 2 groups
  m.free_sequence(1);
  expect_pool(1, 4, 2);
  ASSERT_TRUE(m.add_sequence(2, ids(500, 9)));  // evicts the 4 cached blocks
  KVCacheStats st = m.stats();
  EXPECT_EQ(st.prefix_query_tokens, 18);
  EXPECT_EQ(st.prefix_misses, 4);
  EXPECT_EQ(st.prefix_evictions, 4);
  EXPECT_EQ(st.prefix_cached_entries, 0);
  EXPECT_EQ(m.commit(2, 9), 4);
  m.free_sequence(2);
  // The same prompt again: a 2-block hit (8 tokens). The window group's query at 8 sees 1..8,
  // so it needs both hit blocks too: 4 retained, 2 fresh for entry 2.
  ASSERT_TRUE(m.add_sequence(3, ids(500, 9)));
  st = m.stats();
  EXPECT_EQ(st.prefix_query_tokens, 27);
  EXPECT_EQ(st.prefix_hits, 2);
  EXPECT_EQ(st.prefix_hit_tokens, 8);
  EXPECT_EQ(st.prefix_misses, 4);
  EXPECT_DOUBLE_EQ(st.prefix_hit_rate(), 8.0 / 27.0);
  expect_pool(7, 0, 0);
  EXPECT_EQ(st.num_sequences, 1);
  (void)m.preempt(3);
  EXPECT_EQ(m.stats().preemptions, 1);
  EXPECT_EQ(m.stats().num_sequences, 0);
  EXPECT_EQ(m.stats().released_blocks, 0);
  m.check_invariants();
}

TEST(HybridKVStats, SwapCountsLiveEntries) {
  HybridKVCacheManager m(
      {.num_blocks = 16, .block_size = 4, .groups = {full(), window(4)}, .num_host_blocks = 8});
  m.add_sequence(1);
  // 12 tokens one at a time: the full group holds 3 entries; the window group only entry 2
  // (the append of position 11, whose query sees 8..11, released entries 0 and 1).
  for (int p = 0; p < 12; ++p) ASSERT_TRUE(m.append_slots(1, 1));
  const auto live = [&](int32_t g) {
    const auto t = m.block_table(1, g);
    return std::count_if(t.begin(), t.end(), [](BlockId b) { return b != testing::N; });
  };
  const int64_t entries = live(0) + live(1);
  ASSERT_EQ(entries, 3 + 1);
  ASSERT_TRUE(m.swap_out(1));
  KVCacheStats st = m.stats();
  EXPECT_EQ(st.preemptions, 1);
  EXPECT_EQ(st.swapped_out_blocks, entries);
  EXPECT_EQ(st.host_used_blocks, entries) << "the host pool's reserved block 0 is not counted";
  EXPECT_EQ(st.num_swapped_sequences, 1);
  ASSERT_TRUE(m.swap_in(1));
  st = m.stats();
  EXPECT_EQ(st.swapped_in_blocks, entries);
  EXPECT_EQ(st.host_used_blocks, 0);
  EXPECT_EQ(st.num_swapped_sequences, 0);
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
