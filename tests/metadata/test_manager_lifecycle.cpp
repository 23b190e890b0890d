// Issue 16, items 1 and 2: blocks are findable only once their K/V are written (commit), and the
// prefix index never holds an entry a lookup cannot reach (no orphans after reset_prefix_cache,
// after a swapped-out sequence's parent was evicted, or below an evicted parent). The two
// scripts of the issue, run through the manager, with exact block ids, events and counts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <vector>

#include "common/manager_snapshot.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"

namespace pagedkv {
namespace {

using testing::iota_tokens;
using testing::table_of;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

using Kind = KVCacheEvent::Kind;

// Issue 16, first script: a request aborted before its prefill ran leaves nothing to hit.
TEST(ManagerLifecycle, IssueScriptAbortBeforePrefillGivesNoHit) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  const std::vector<TokenId> p = iota_tokens(9);
  std::optional<AddResult> r = m.add_sequence(1, p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 0);
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1, 2));
  EXPECT_EQ(m.num_committed_tokens(1), 0);
  EXPECT_EQ(m.prefix_cache().size(), 0);  // nothing published at add
  m.free_sequence(1);                     // aborted: its blocks are plain free blocks
  EXPECT_EQ(m.stats().cached_blocks, 0);
  r = m.add_sequence(2, p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 0);  // was 8 when add published
  // Free ring after the abort: 3..7, then 2, 1, 0 (released tail first).
  EXPECT_THAT(table_of(m, 2), ElementsAre(3, 4, 5));
  EXPECT_EQ(m.stats().prefix_hits, 0);
  m.check_invariants();
}

TEST(ManagerLifecycle, OnlyCommittedFullBlocksArePublished) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  const std::vector<TokenId> p = iota_tokens(9);
  ASSERT_TRUE(m.add_sequence(1, p));
  EXPECT_EQ(m.commit(1, 4), 1);  // block 0 written: published
  EXPECT_EQ(m.commit(1, 7), 0);  // block 1 only partly written
  EXPECT_EQ(m.num_committed_tokens(1), 7);
  EXPECT_EQ(m.commit(1, 3), 0);  // commits are monotone
  EXPECT_EQ(m.num_committed_tokens(1), 7);
  EXPECT_TRUE(m.allocator().is_cached(0));
  EXPECT_FALSE(m.allocator().is_cached(1));
  m.free_sequence(1);  // block 0 to the LRU, blocks 2 and 1 to the free ring
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(0));
  const PrefixLookup look = m.lookup_prefix(p);
  EXPECT_EQ(look.num_computed_tokens, 4);
  EXPECT_THAT(look.blocks, ElementsAre(0));
  std::optional<AddResult> r = m.add_sequence(2, p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 4);
  EXPECT_THAT(table_of(m, 2), ElementsAre(0, 3, 4));
  EXPECT_THAT(r->append.slots, ElementsAre(12, 13, 14, 15, 16));
  EXPECT_EQ(m.num_committed_tokens(2), 4);  // the hit counts as written
  m.check_invariants();
}

TEST(ManagerLifecycle, AppendedTokensArePublishedOnCommit) {
  KVCacheManager m(
      {.num_blocks = 4, .block_size = 2, .enable_prefix_caching = true, .enable_events = true});
  ASSERT_TRUE(m.add_sequence(1, std::vector<TokenId>{5, 6, 7}));
  ASSERT_TRUE(m.append_tokens(1, std::vector<TokenId>{8, 9}));  // blocks 0, 1 full; 2 partial
  EXPECT_THAT(m.take_events(), IsEmpty());
  EXPECT_EQ(m.commit(1, 5), 2);
  const std::vector<KVCacheEvent> ev = m.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, Kind::kStored);
  EXPECT_EQ(ev[0].block, 0);
  EXPECT_EQ(ev[0].parent_hash, kRootBlockHash);
  EXPECT_THAT(ev[0].tokens, ElementsAre(5, 6));
  EXPECT_EQ(ev[1].block, 1);
  EXPECT_EQ(ev[1].parent_hash, ev[0].hash);
  EXPECT_THAT(ev[1].tokens, ElementsAre(7, 8));
  m.check_invariants();
}

TEST(ManagerLifecycle, CommitErrorsNameTheValues) {
  KVCacheManager m({.num_blocks = 4, .block_size = 2, .num_host_blocks = 2});
  ASSERT_TRUE(m.add_sequence(1, std::vector<TokenId>{1, 2, 3}));
  EXPECT_THAT([&] { m.commit(1, 4); },
              ThrowsMessage<Error>(HasSubstr("4 tokens for sequence 1, which holds 3")));
  EXPECT_THAT([&] { m.commit(1, -1); },
              ThrowsMessage<Error>(HasSubstr("-1 tokens for sequence 1, which holds 3")));
  EXPECT_THAT([&] { m.commit(9, 0); }, ThrowsMessage<Error>(HasSubstr("unknown sequence 9")));
  ASSERT_TRUE(m.swap_out(1));
  EXPECT_THAT([&] { m.commit(1, 3); }, ThrowsMessage<Error>(HasSubstr("sequence 1 is swapped")));
  EXPECT_EQ(m.num_committed_tokens(1), 0);
  // Without prefix caching a commit only records the count.
  ASSERT_TRUE(m.swap_in(1));
  EXPECT_EQ(m.commit(1, 3), 0);
  EXPECT_EQ(m.num_committed_tokens(1), 3);
  m.check_invariants();
}

// Issue 16, second script: after reset_prefix_cache, a block of a running sequence that fills
// up is not registered under the parent the reset removed, so the same content can be cached
// again by the next request that computes it.
TEST(ManagerLifecycle, IssueScriptResetThenFillRegistersNoOrphan) {
  KVCacheManager m(
      {.num_blocks = 8, .block_size = 2, .enable_prefix_caching = true, .enable_events = true});
  std::optional<AddResult> r = m.add_sequence(1, std::vector<TokenId>{1, 2, 3});
  ASSERT_TRUE(r);
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1));
  EXPECT_EQ(m.commit(1, 3), 1);  // the prefill ran: block 0 = {1, 2} published
  EXPECT_EQ(m.reset_prefix_cache(), 1);
  std::vector<KVCacheEvent> ev = m.take_events();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].kind, Kind::kStored);
  EXPECT_EQ(ev[1].kind, Kind::kRemoved);
  EXPECT_EQ(ev[1].block, 0);
  EXPECT_EQ(ev[1].hash, ev[0].hash);
  EXPECT_EQ(ev[2].kind, Kind::kAllCleared);  // the reset's last event
  EXPECT_EQ(ev[2].block, -1);
  std::optional<AppendResult> a = m.append_tokens(1, std::vector<TokenId>{4});
  ASSERT_TRUE(a);
  EXPECT_THAT(a->slots, ElementsAre(3));
  EXPECT_EQ(m.commit(1, 4), 0);  // block 1 = {3, 4}: its parent is gone, nothing published
  EXPECT_THAT(m.take_events(), IsEmpty());
  EXPECT_EQ(m.prefix_cache().size(), 0);
  m.free_sequence(1);  // free ring: 2..7, 1, 0
  r = m.add_sequence(2, iota_tokens(5));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 0);
  EXPECT_THAT(table_of(m, 2), ElementsAre(2, 3, 4));
  EXPECT_EQ(m.commit(2, 5), 2);
  ev = m.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].block, 2);
  EXPECT_EQ(ev[0].parent_hash, kRootBlockHash);
  EXPECT_EQ(ev[1].block, 3);
  EXPECT_EQ(ev[1].parent_hash, ev[0].hash);  // every stored event names a stored parent
  m.free_sequence(2);
  r = m.add_sequence(3, iota_tokens(5));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 4);  // was 2 with the orphan holding the key of {3, 4}
  EXPECT_THAT(table_of(m, 3), ElementsAre(2, 3, 5));
  m.check_invariants();
}

// K/V computed before a reset are never published after it, even a block that was not full at
// the reset (its first half was computed before).
TEST(ManagerLifecycle, NothingComputedBeforeResetIsPublishedAfter) {
  KVCacheManager m({.num_blocks = 8, .block_size = 2, .enable_prefix_caching = true});
  ASSERT_TRUE(m.add_sequence(1, std::vector<TokenId>{1}));
  EXPECT_EQ(m.commit(1, 1), 0);
  ASSERT_TRUE(m.add_sequence(2, std::vector<TokenId>{1, 2, 3}));  // not run yet: committed 0
  EXPECT_EQ(m.reset_prefix_cache(), 0);
  ASSERT_TRUE(m.append_tokens(1, std::vector<TokenId>{2, 3}));
  EXPECT_EQ(m.commit(1, 3), 0);  // block 0 holds position 0 from before the reset
  EXPECT_EQ(m.commit(2, 3), 1);  // sequence 2 computed everything after the reset
  EXPECT_EQ(m.prefix_cache().size(), 1);
  EXPECT_NE(m.prefix_cache().entry(m.block_table(2)[0]), nullptr);
  m.check_invariants();
}

// Item 2, the swap case: a swapped-out sequence's published parent is evicted while it is out;
// after the swap-in, the block that fills up is not published (its parent entry is gone).
TEST(ManagerLifecycle, SwapInAfterParentEvictedRegistersNoOrphan) {
  KVCacheManager m({.num_blocks = 4,
                    .block_size = 2,
                    .enable_prefix_caching = true,
                    .num_host_blocks = 4,
                    .enable_events = true});
  ASSERT_TRUE(m.add_sequence(1, std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(m.commit(1, 3), 1);  // block 0 = {1, 2}
  (void)m.take_events();
  std::optional<SwapResult> out = m.swap_out(1);
  ASSERT_TRUE(out);
  ASSERT_EQ(out->copies.size(), 2u);
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(0));  // still published
  EXPECT_THAT(m.allocator().free_list(), ElementsAre(2, 3, 1));
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 8));  // 2, 3, 1, then block 0 evicted
  EXPECT_THAT(table_of(m, 2), ElementsAre(2, 3, 1, 0));
  std::vector<KVCacheEvent> ev = m.take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, Kind::kEvicted);
  EXPECT_EQ(ev[0].block, 0);
  m.free_sequence(2);  // free ring: 0, 1, 3, 2
  std::optional<SwapResult> in = m.swap_in(1);
  ASSERT_TRUE(in);
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1));
  ASSERT_TRUE(m.append_tokens(1, std::vector<TokenId>{4}));
  EXPECT_EQ(m.commit(1, 4), 0);  // {3, 4} would hang under the evicted {1, 2}
  EXPECT_THAT(m.take_events(), IsEmpty());
  EXPECT_EQ(m.prefix_cache().size(), 0);
  m.free_sequence(1);
  ASSERT_TRUE(m.add_sequence(3, iota_tokens(5)));
  EXPECT_EQ(m.commit(3, 5), 2);
  m.free_sequence(3);
  std::optional<AddResult> r = m.add_sequence(4, iota_tokens(5));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 4);
  m.check_invariants();
}

// Evicting a parent drops every entry below it (kRemoved), even one whose block is in use: a
// lookup walks from the root and could never reach it.
TEST(ManagerLifecycle, EvictedParentTakesItsSubtreeAlong) {
  KVCacheManager m(
      {.num_blocks = 6, .block_size = 2, .enable_prefix_caching = true, .enable_events = true});
  ASSERT_TRUE(m.add_sequence(1, std::vector<TokenId>{1, 2, 3}));  // {0, 1}
  ASSERT_TRUE(m.add_sequence(2, iota_tokens(5)));                 // {2, 3, 4}: nothing to hit
  EXPECT_EQ(m.commit(1, 3), 1);                                   // block 0 = {1, 2}
  // Block 2 holds the same {1, 2}: the key is taken, sequence 2 chains on block 0's entry, and
  // its block 3 = {3, 4} is published under it.
  EXPECT_EQ(m.commit(2, 5), 1);
  std::vector<KVCacheEvent> ev = m.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].block, 0);
  EXPECT_EQ(ev[1].block, 3);
  EXPECT_EQ(ev[1].parent_hash, ev[0].hash);
  m.free_sequence(1);  // block 1 free, block 0 cached with ref 0
  m.add_sequence(3);
  ASSERT_TRUE(m.append_slots(3, 6));  // blocks 5, 1, then block 0 evicted
  EXPECT_THAT(table_of(m, 3), ElementsAre(5, 1, 0));
  ev = m.take_events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, Kind::kRemoved);  // the child first, then its evicted parent
  EXPECT_EQ(ev[0].block, 3);
  EXPECT_EQ(ev[1].kind, Kind::kEvicted);
  EXPECT_EQ(ev[1].block, 0);
  EXPECT_EQ(m.prefix_cache().size(), 0);
  EXPECT_EQ(m.allocator().ref_count(3), 1);  // still sequence 2's, unshareable
  EXPECT_FALSE(m.allocator().is_cached(3));
  ASSERT_TRUE(m.append_tokens(2, std::vector<TokenId>{6}));
  EXPECT_EQ(m.commit(2, 6), 0);  // the chain stays broken
  m.check_invariants();
  m.free_sequence(2);
  m.free_sequence(3);
  EXPECT_EQ(m.num_free_blocks(), 6);
  EXPECT_EQ(m.stats().cached_blocks, 0);
  m.check_invariants();
}

// Forks share the committed state; either may publish the shared full blocks.
TEST(ManagerLifecycle, ForkCopiesTheCommittedCount) {
  KVCacheManager m({.num_blocks = 8, .block_size = 2, .enable_prefix_caching = true});
  ASSERT_TRUE(m.add_sequence(1, iota_tokens(5)));  // {0, 1, 2}
  EXPECT_EQ(m.commit(1, 2), 1);
  m.fork(1, 2);
  EXPECT_EQ(m.num_committed_tokens(2), 2);
  EXPECT_EQ(m.commit(2, 4), 1);  // block 1, shared with 1 (ref 2), published by the child
  EXPECT_TRUE(m.allocator().is_cached(1));
  EXPECT_EQ(m.commit(1, 4), 0);  // same content, already published
  EXPECT_EQ(m.prefix_cache().size(), 2);
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
