// Issue 16, items 3, 4 and 6-8 of the KVCacheManager: "never" vs "later" (constructor,
// admission with max_new_tokens, append_admission, swap admissions), look-ahead slots,
// read-only lookup_prefix, truncate (rollback, copy-on-write safe) and chunked prefill. Exact
// block ids and counts, worked out by hand in the comments.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/manager_snapshot.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using testing::iota_tokens;
using testing::observable;
using testing::table_of;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

// ---- item 3: never vs later -------------------------------------------------------------------

TEST(ManagerNever, ConstructorRejectsUnreachableMaxModelLen) {
  // 8 blocks of 4 tokens hold 32 tokens.
  EXPECT_NO_THROW(KVCacheManager({.num_blocks = 8, .block_size = 4, .max_model_len = 32}));
  EXPECT_THAT([] { KVCacheManager({.num_blocks = 8, .block_size = 4, .max_model_len = 33}); },
              ThrowsMessage<Error>(HasSubstr(
                  "max_model_len 33 needs 9 blocks of 4 tokens (eviction 'none'), more than "
                  "num_blocks 8")));
  // A sliding window of 4 holds at most 2 blocks of 4 at any length (worked out in
  // MinBlocksHeldFollowsThePolicy): any max_model_len fits 2 blocks, none fits 1.
  const EvictionPolicyConfig window{.kind = EvictionKind::kSlidingWindow, .window = 4};
  EXPECT_NO_THROW(KVCacheManager(
      {.num_blocks = 2, .block_size = 4, .max_model_len = 1'000'000, .eviction = window}));
  EXPECT_THAT(
      [&] {
        KVCacheManager({.num_blocks = 1, .block_size = 4, .max_model_len = 5, .eviction = window});
      },
      ThrowsMessage<Error>(HasSubstr("max_model_len 5 needs 2 blocks of 4 tokens (eviction "
                                     "'window'), more than num_blocks 1")));
}

TEST(ManagerNever, MinBlocksHeldFollowsThePolicy) {
  KVCacheManager none({.num_blocks = 8, .block_size = 4});
  EXPECT_EQ(none.min_blocks_held(0), 0);
  EXPECT_EQ(none.min_blocks_held(1), 1);
  EXPECT_EQ(none.min_blocks_held(9), 3);
  // Window 4, block_size 4: after appending position p the sequence holds ceil((p + 1) / 4)
  // blocks minus the released ones (blocks wholly before position p - 3): p 0..3 -> 1,
  // p 4..6 -> 2, p 7 -> 1 (block 0 released), p 8..10 -> 2, p 11 -> 1, ... peak 2.
  KVCacheManager window({.num_blocks = 8,
                         .block_size = 4,
                         .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 4}});
  EXPECT_EQ(window.min_blocks_held(4), 1);
  EXPECT_EQ(window.min_blocks_held(5), 2);
  EXPECT_EQ(window.min_blocks_held(1'000'000'000), 2);
  // Heavy hitters keep at most recent + heavy = 4 tokens once decoding: at least one block.
  KVCacheManager h2o({.num_blocks = 8,
                      .block_size = 4,
                      .eviction = {.kind = EvictionKind::kHeavyHitters, .recent = 2, .heavy = 2}});
  EXPECT_EQ(h2o.min_blocks_held(100), 1);
  EXPECT_THAT([&] { (void)none.min_blocks_held(-1); },
              ThrowsMessage<Error>(HasSubstr("num_tokens must be >= 0, got -1")));
}

TEST(ManagerContracts, NegativeCountsAndWatermarksNameTheValue) {
  // The bounds themselves (mutants moving them by one survived the sampled mutation run).
  EXPECT_THAT([] { KVCacheManager m({.num_blocks = 8, .block_size = 4, .watermark = -0.5}); },
              ThrowsMessage<Error>(HasSubstr("watermark must be in [0, 1), got -0.5")));
  KVCacheManager m({.num_blocks = 8, .block_size = 4});
  m.add_sequence(1);
  EXPECT_THAT([&] { (void)m.append_slots(1, -1); },
              ThrowsMessage<Error>(HasSubstr("token count must be >= 0, got -1")));
  EXPECT_EQ(m.num_tokens(1), 0);
}

TEST(ManagerNever, AdmissionCountsMaxNewTokens) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .watermark = 0.25});  // watermark 2
  const std::vector<TokenId> p8 = iota_tokens(8);
  EXPECT_EQ(m.can_add_sequence(p8, AddOptions{.max_new_tokens = 24}), Admission::kOk);  // 8 blocks
  EXPECT_EQ(m.can_add_sequence(p8, AddOptions{.max_new_tokens = 25}), Admission::kNever);
  // The prompt is admitted above the watermark, its growth may use the reserve: 6 + 2 blocks.
  EXPECT_EQ(m.can_add_sequence(iota_tokens(24), AddOptions{.max_new_tokens = 8}), Admission::kOk);
  EXPECT_EQ(m.can_add_sequence(iota_tokens(25), AddOptions{}), Admission::kNever);
  const std::string before = observable(m);
  EXPECT_EQ(m.add_sequence(1, p8, AddOptions{.max_new_tokens = 25}), std::nullopt);
  EXPECT_FALSE(m.has_sequence(1));
  EXPECT_EQ(observable(m), before);
  ASSERT_TRUE(m.add_sequence(1, iota_tokens(16)));  // 4 blocks, 4 left
  // Not now (2 blocks needed, 4 - 2 would dip into the watermark), but it fits an empty pool.
  EXPECT_EQ(m.can_add_sequence(iota_tokens(12), AddOptions{.max_new_tokens = 20}),
            Admission::kLater);
  EXPECT_THAT([&] { (void)m.can_add_sequence(p8, AddOptions{.max_new_tokens = -1}); },
              ThrowsMessage<Error>(HasSubstr("max_new_tokens must be >= 0, got -1")));

  KVCacheManager capped({.num_blocks = 8, .block_size = 4, .max_model_len = 20});
  EXPECT_EQ(capped.can_add_sequence(p8, AddOptions{.max_new_tokens = 12}), Admission::kOk);
  EXPECT_EQ(capped.can_add_sequence(p8, AddOptions{.max_new_tokens = 13}), Admission::kNever);
}

TEST(ManagerNever, AppendAdmissionTellsNeverFromLater) {
  KVCacheManager m({.num_blocks = 4, .block_size = 2});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 2));  // {0}
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 4));                       // {1, 2}; block 3 free
  EXPECT_EQ(m.append_admission(1, 2), Admission::kOk);     // 1 block, 1 free
  EXPECT_EQ(m.append_admission(1, 4), Admission::kLater);  // 3 blocks in all: once 2 is gone
  EXPECT_FALSE(m.can_append(1, 4));
  EXPECT_EQ(m.append_admission(1, 7), Admission::kNever);  // 9 tokens = 5 blocks > pool of 4
  m.free_sequence(2);
  EXPECT_EQ(m.append_admission(1, 4), Admission::kOk);
  EXPECT_EQ(m.append_admission(1, 7), Admission::kNever);

  // A sliding window grows forever in a pool of 2 blocks, one token at a time.
  KVCacheManager w({.num_blocks = 2,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 2}});
  w.add_sequence(1);
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(w.append_admission(1, 1), Admission::kOk) << "token " << i;
    ASSERT_TRUE(w.append_slots(1, 1)) << "token " << i;
  }
  w.check_invariants();
}

TEST(ManagerNever, SwapOutWithoutHostPoolIsNever) {
  KVCacheManager none({.num_blocks = 4, .block_size = 2});
  none.add_sequence(1);
  ASSERT_TRUE(none.append_slots(1, 3));
  EXPECT_FALSE(none.can_swap_out(1));
  EXPECT_EQ(none.swap_out_admission(1), Admission::kNever);

  KVCacheManager m({.num_blocks = 8, .block_size = 2, .num_host_blocks = 2});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 5));  // 3 blocks > the whole host pool
  EXPECT_EQ(m.swap_out_admission(1), Admission::kNever);
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 2));  // 1 block
  m.add_sequence(3);
  ASSERT_TRUE(m.append_slots(3, 4));  // 2 blocks
  EXPECT_EQ(m.swap_out_admission(2), Admission::kOk);
  ASSERT_TRUE(m.swap_out(2));  // 1 host block left
  EXPECT_EQ(m.swap_out_admission(3), Admission::kLater);
  m.free_sequence(2);
  EXPECT_EQ(m.swap_out_admission(3), Admission::kOk);
}

// ---- item 4: look-ahead slots -----------------------------------------------------------------

// ---- item 9: a request for 2^31 tokens is an error naming the cap, not an allocation --------

TEST(ManagerCallCap, AppendOfTwoToThe31TokensIsRefusedBeforeAllocating) {
  // 2^18 blocks of 2^16 tokens hold 2^34 tokens: the pool alone would not refuse 2^31.
  KVCacheManager m({.num_blocks = 1 << 18, .block_size = 1 << 16});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 5));
  const std::string before = observable(m);
  const int64_t n = int64_t{1} << 31;
  const auto names_cap = ThrowsMessage<Error>(
      HasSubstr("2147483648 tokens in one call exceed kMaxTokensPerCall 16777216"));
  EXPECT_THAT([&] { (void)m.append_slots(1, n); }, names_cap);
  EXPECT_THAT([&] { (void)m.can_append(1, n); }, names_cap);
  EXPECT_THAT([&] { (void)m.blocks_needed_to_append(1, n); }, names_cap);
  EXPECT_THAT([&] { (void)m.append_admission(1, n); }, names_cap);
  EXPECT_THAT([&] { (void)m.can_append(1, 1, KVCacheManager::kMaxTokensPerCall); },
              ThrowsMessage<Error>(HasSubstr("1 + 16777216 look-ahead tokens exceed")));
  EXPECT_EQ(observable(m), before);
  // At the cap itself the call is an ordinary one: 2^24 tokens need 256 blocks, the pool has them.
  EXPECT_EQ(m.blocks_needed_to_append(1, KVCacheManager::kMaxTokensPerCall), 256);
  EXPECT_TRUE(m.can_append(1, KVCacheManager::kMaxTokensPerCall - 1, 1));
}

TEST(ManagerLookahead, CanAppendCountsTheLookaheadSlots) {
  KVCacheManager m({.num_blocks = 4, .block_size = 2, .max_model_len = 8});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 3));  // {0, 1}, 2 free
  EXPECT_TRUE(m.can_append(1, 1));
  EXPECT_TRUE(m.can_append(1, 1, 2));   // 6 tokens: 3 blocks, 1 fresh
  EXPECT_TRUE(m.can_append(1, 1, 4));   // 8 tokens: 4 blocks, 2 fresh
  EXPECT_TRUE(m.can_append(1, 1, 99));  // past max_model_len 8 the slots are not counted
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 1));  // {2}, 1 free
  EXPECT_TRUE(m.can_append(1, 1, 2));
  EXPECT_FALSE(m.can_append(1, 1, 4));
  EXPECT_THAT([&] { (void)m.can_append(1, 1, -1); },
              ThrowsMessage<Error>(HasSubstr("num_lookahead_slots must be >= 0, got -1")));
}

TEST(ManagerLookahead, TheAppendQueriesCountTheSameLookahead) {
  // 4 blocks of 2 tokens; sequence 1 holds 4 tokens in blocks {0, 1}, 2 blocks free.
  KVCacheManager m({.num_blocks = 4, .block_size = 2});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 4));
  // 1 + 2 look-ahead: 7 tokens, 4 blocks: 2 new, both free.
  EXPECT_EQ(m.blocks_needed_to_append(1, 1, 2), 2);
  EXPECT_TRUE(m.can_append(1, 1, 2));
  EXPECT_EQ(m.append_admission(1, 1, 2), Admission::kOk);
  // 1 + 4: 9 tokens, 5 blocks: 3 new, and 5 > the pool of 4 (never, not later).
  EXPECT_EQ(m.blocks_needed_to_append(1, 1, 4), 3);
  EXPECT_FALSE(m.can_append(1, 1, 4));
  EXPECT_EQ(m.append_admission(1, 1, 4), Admission::kNever);
  // With block 2 taken by another sequence, 1 + 2 needs 2 new blocks and 1 is free: later.
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 1));
  EXPECT_EQ(m.append_admission(1, 1, 2), Admission::kLater);
  EXPECT_EQ(m.append_admission(1, 1), Admission::kOk);
}

TEST(ManagerNever, AppendInsideTheLastBlockStillStopsAtMaxModelLen) {
  // 6 tokens in blocks of 4: one more fits the last block but not max_model_len 6. The append
  // that only fills the last block must check the limit like any other, and change nothing.
  KVCacheManager m({.num_blocks = 4, .block_size = 4, .max_model_len = 6});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 5));
  ASSERT_TRUE(m.append_slots(1, 1));  // 6 tokens: in the last block, at the limit
  EXPECT_THAT([&] { (void)m.append_slots(1, 1); },
              ThrowsMessage<Error>(HasSubstr("6 + 1 tokens exceed max_model_len 6")));
  EXPECT_THAT([&] { (void)m.append_tokens(1, std::vector<TokenId>{9}); },
              ThrowsMessage<Error>(HasSubstr("6 + 1 tokens exceed max_model_len 6")));
  EXPECT_EQ(m.num_tokens(1), 6);
  EXPECT_EQ(m.num_free_blocks(), 2);
  m.check_invariants();
}

TEST(ManagerNever, AppendPastMaxModelLenIsNeverForTheQueryAndAnErrorForTheAppend) {
  KVCacheManager m({.num_blocks = 16, .block_size = 2, .max_model_len = 8});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 7));
  EXPECT_EQ(m.append_admission(1, 2), Admission::kNever);  // 9 > 8: no wait helps
  EXPECT_EQ(m.append_admission(1, 1), Admission::kOk);
  EXPECT_THAT([&] { (void)m.can_append(1, 2); },
              ThrowsMessage<Error>(HasSubstr("7 + 2 tokens exceed max_model_len 8")));
  EXPECT_THAT([&] { (void)m.append_slots(1, 2); },
              ThrowsMessage<Error>(HasSubstr("7 + 2 tokens exceed max_model_len 8")));
  // Look-ahead past max_model_len is not counted: 8 tokens fill block 3, nothing new.
  EXPECT_EQ(m.blocks_needed_to_append(1, 1, 3), 0);
  EXPECT_TRUE(m.can_append(1, 1, 3));
  EXPECT_EQ(m.num_tokens(1), 7);
}

TEST(ManagerLookahead, SwapInReservesRoomForTheStepsAppend) {
  KVCacheManager m({.num_blocks = 4, .block_size = 2, .num_host_blocks = 4});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 4));  // {0, 1}, full
  ASSERT_TRUE(m.swap_out(1));
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 3));  // 2 blocks, 2 free
  EXPECT_TRUE(m.can_swap_in(1));
  // The next step appends 1 token to sequence 1: a third block. Without the look-ahead the
  // swap-in would succeed and the append would fail in the same step.
  EXPECT_FALSE(m.can_swap_in(1, 1));
  EXPECT_EQ(m.swap_in_admission(1, 1), Admission::kLater);
  EXPECT_EQ(m.swap_in_admission(1, 5), Admission::kNever);  // 9 tokens: 5 blocks > 4
  const std::string before = observable(m);
  EXPECT_EQ(m.swap_in(1, 1), std::nullopt);
  EXPECT_TRUE(m.is_swapped(1));
  EXPECT_EQ(observable(m), before);
  m.free_sequence(2);
  std::optional<SwapResult> in = m.swap_in(1, 1);
  ASSERT_TRUE(in);
  EXPECT_TRUE(m.can_append(1, 1));  // guaranteed by the look-ahead
  ASSERT_TRUE(m.append_slots(1, 1));
  EXPECT_THAT([&] { (void)m.can_swap_in(1, 0); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 is not swapped out")));
  m.check_invariants();
}

// ---- item 6: read-only lookup -----------------------------------------------------------------

TEST(ManagerLookup, LookupIsReadOnlyAndAgreesWithAdd) {
  KVCacheManager m({.num_blocks = 6, .block_size = 2, .enable_prefix_caching = true});
  ASSERT_TRUE(m.add_sequence(1, iota_tokens(5)));  // {0, 1, 2}
  EXPECT_EQ(m.commit(1, 5), 2);
  m.free_sequence(1);  // block 2 free; 1 then 0 into the LRU
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(1, 0));
  const std::string before = observable(m);
  PrefixLookup l = m.lookup_prefix(std::vector<TokenId>{1, 2, 3, 4, 9});
  EXPECT_EQ(l.num_computed_tokens, 4);
  EXPECT_THAT(l.blocks, ElementsAre(0, 1));
  l = m.lookup_prefix(std::vector<TokenId>{1, 2, 3, 4});  // one token is always left to compute
  EXPECT_EQ(l.num_computed_tokens, 2);
  EXPECT_THAT(l.blocks, ElementsAre(0));
  EXPECT_EQ(m.lookup_prefix(iota_tokens(5), /*extra_key=*/5).num_computed_tokens, 0);
  EXPECT_EQ(m.lookup_prefix(std::vector<TokenId>{}).num_computed_tokens, 0);
  EXPECT_EQ(m.lookup_prefix(std::vector<TokenId>{1, 7, 3, 4, 5}).num_computed_tokens, 0);
  EXPECT_EQ(observable(m), before);  // no LRU touch, no ref count, no stats
  std::optional<AddResult> r = m.add_sequence(2, std::vector<TokenId>{1, 2, 3, 4, 9});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 4);
  EXPECT_THAT(table_of(m, 2), ElementsAre(0, 1, 3));

  KVCacheManager off({.num_blocks = 6, .block_size = 2});
  EXPECT_EQ(off.lookup_prefix(iota_tokens(5)).num_computed_tokens, 0);
  EXPECT_THAT(off.lookup_prefix(iota_tokens(5)).blocks, IsEmpty());
}

// ---- item 7: truncate -------------------------------------------------------------------------

TEST(ManagerTruncate, ReleasesTheBlocksPastTheNewEnd) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 10));  // {0, 1, 2}
  m.truncate(1, 5);
  EXPECT_EQ(m.num_tokens(1), 5);
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1));
  EXPECT_EQ(m.num_free_blocks(), 6);
  std::optional<AppendResult> r = m.append_slots(1, 1);  // position 5: block 1, offset 1
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, ElementsAre(5));
  EXPECT_THAT(r->copies, IsEmpty());
  m.truncate(1, 6);  // no-op
  m.truncate(1, 0);
  EXPECT_THAT(table_of(m, 1), IsEmpty());
  EXPECT_EQ(m.num_free_blocks(), 8);
  m.check_invariants();
}

TEST(ManagerTruncate, PublishedTailIsCopiedNotWrittenAndStaysFindable) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  const std::vector<TokenId> p = iota_tokens(9);
  ASSERT_TRUE(m.add_sequence(1, p));  // {0, 1, 2}
  EXPECT_EQ(m.commit(1, 9), 2);       // blocks 0 and 1 published
  m.truncate(1, 6);                   // speculative decoding rejected positions 6..8
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1));
  EXPECT_EQ(m.num_committed_tokens(1), 6);
  EXPECT_TRUE(m.allocator().is_cached(1));  // still published: its 4 tokens are valid K/V
  // Writing position 6 into block 1 would corrupt what the index promises: copy-on-write.
  std::optional<AppendResult> r = m.append_tokens(1, std::vector<TokenId>{70});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->copies.size(), 1u);
  EXPECT_EQ(r->copies[0].src, 1);
  EXPECT_EQ(r->copies[0].dst, 3);  // free ring 3..7, then 2
  EXPECT_THAT(r->slots, ElementsAre(14));
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 3));
  EXPECT_EQ(m.allocator().ref_count(1), 0);
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(1));
  EXPECT_EQ(m.lookup_prefix(p).num_computed_tokens, 8);
  // The copy now holds {5, 6, 70, ...}: published only once full and committed.
  ASSERT_TRUE(m.append_tokens(1, std::vector<TokenId>{71}));
  EXPECT_EQ(m.commit(1, 8), 1);
  EXPECT_TRUE(m.allocator().is_cached(3));
  m.check_invariants();
}

TEST(ManagerTruncate, SharedTailIsCopiedForTheWriter) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 8));  // {0, 1}
  m.fork(1, 2);
  m.truncate(2, 6);  // the child rejects 2 drafts: block 1 stays shared
  EXPECT_EQ(m.allocator().ref_count(1), 2);
  std::optional<AppendResult> r = m.append_slots(2, 1);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->copies.size(), 1u);
  EXPECT_EQ(r->copies[0].src, 1);
  EXPECT_EQ(r->copies[0].dst, 2);
  EXPECT_THAT(r->slots, ElementsAre(10));
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1));  // the parent's data untouched
  m.check_invariants();
}

TEST(ManagerTruncate, ToZeroUnderAWindowReleasesOnlyTheBlocksStillHeld) {
  // Window 4, blocks of 2: after 20 one-token appends the table's first entries were released
  // by the window (kNoBlock); truncating to 0 releases the live ones and skips those.
  const EvictionPolicyConfig window{.kind = EvictionKind::kSlidingWindow, .window = 4};
  KVCacheManager m({.num_blocks = 8, .block_size = 2, .eviction = window});
  m.add_sequence(1);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(m.append_slots(1, 1));
  const auto table = table_of(m, 1);
  ASSERT_EQ(table.size(), 10u);
  EXPECT_EQ(table[0], KVCacheManager::kNoBlock);
  const auto live = std::count_if(table.begin(), table.end(), [](BlockId b) { return b >= 0; });
  EXPECT_EQ(m.allocator().num_free(), 8 - live);
  m.truncate(1, 0);
  EXPECT_EQ(m.num_tokens(1), 0);
  EXPECT_THAT(table_of(m, 1), IsEmpty());
  EXPECT_EQ(m.allocator().num_free(), 8);
  m.check_invariants();
}

TEST(ManagerTruncate, ErrorsNameTheValuesAndChangeNothing) {
  KVCacheManager m({.num_blocks = 8,
                    .block_size = 2,
                    .num_host_blocks = 8,
                    .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 2}});
  m.add_sequence(1);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(m.append_slots(1, 1));
  // Appending position 9 released blocks 0..3 (positions 0..7 are outside every later window).
  EXPECT_THAT(table_of(m, 1), ElementsAre(-1, -1, -1, -1, 4));
  const std::string before = observable(m);
  EXPECT_THAT([&] { m.truncate(1, 3); },
              ThrowsMessage<Error>(HasSubstr(
                  "sequence 1 to 3 tokens: block 0 (positions 0..1) was released by token "
                  "eviction and the query at position 2 would see it")));
  EXPECT_THAT([&] { m.truncate(1, 9); },
              ThrowsMessage<Error>(HasSubstr("block 3 (positions 6..7) was released")));
  EXPECT_THAT([&] { m.truncate(1, 11); },
              ThrowsMessage<Error>(HasSubstr("11 tokens for sequence 1, which holds 10")));
  EXPECT_THAT([&] { m.truncate(1, -1); },
              ThrowsMessage<Error>(HasSubstr("-1 tokens for sequence 1, which holds 10")));
  EXPECT_THAT([&] { m.truncate(5, 0); }, ThrowsMessage<Error>(HasSubstr("unknown sequence 5")));
  EXPECT_EQ(observable(m), before);
  ASSERT_TRUE(m.swap_out(1));
  EXPECT_THAT([&] { m.truncate(1, 10); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 is swapped out")));

  // Heavy hitters: once a token is evicted the table is no longer positional.
  KVCacheManager h({.num_blocks = 8,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kHeavyHitters, .recent = 1, .heavy = 0}});
  h.add_sequence(1);
  ASSERT_TRUE(h.append_slots(1, 1));
  ASSERT_TRUE(h.append_slots(1, 1));  // budget 1: position 0 evicted
  EXPECT_THAT([&] { h.truncate(1, 1); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 has evicted heavy-hitter tokens")));
}

// ---- item 8: chunked prefill ------------------------------------------------------------------

TEST(ManagerChunkedPrefill, ChunksAreAllocatedAsTheBudgetAllows) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  const std::vector<TokenId> p = iota_tokens(16);
  const std::span<const TokenId> ps(p);
  std::optional<AddResult> r = m.add_sequence(1, p, AddOptions{.first_chunk_tokens = 4});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 0);
  EXPECT_THAT(r->append.slots, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(m.num_tokens(1), 4);
  EXPECT_THAT(table_of(m, 1), ElementsAre(0));
  EXPECT_EQ(m.commit(1, 4), 1);
  std::optional<AppendResult> a = m.append_tokens(1, ps.subspan(4, 4));
  ASSERT_TRUE(a);
  EXPECT_THAT(a->slots, ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(m.commit(1, 8), 1);
  ASSERT_TRUE(m.append_tokens(1, ps.subspan(8, 8)));
  EXPECT_EQ(m.commit(1, 16), 2);
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1, 2, 3));

  // The whole prompt again: (16 - 1) / 4 = 3 blocks hit.
  r = m.add_sequence(2, p);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 12);
  EXPECT_THAT(table_of(m, 2), ElementsAre(0, 1, 2, 4));
  // Chunked: the hits are computed from the whole prompt, the first chunk follows them.
  r = m.add_sequence(3, p, AddOptions{.first_chunk_tokens = 2});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 12);
  EXPECT_EQ(m.num_tokens(3), 14);
  EXPECT_THAT(table_of(m, 3), ElementsAre(0, 1, 2, 5));
  EXPECT_THAT(r->append.slots, ElementsAre(20, 21));
  a = m.append_tokens(3, ps.subspan(14, 2));
  ASSERT_TRUE(a);
  EXPECT_THAT(a->slots, ElementsAre(22, 23));
  // first_chunk_tokens 0: only the hits.
  r = m.add_sequence(4, p, AddOptions{.first_chunk_tokens = 0});
  ASSERT_TRUE(r);
  EXPECT_EQ(m.num_tokens(4), 12);
  EXPECT_THAT(r->append.slots, IsEmpty());
  EXPECT_THAT([&] { (void)m.add_sequence(5, p, AddOptions{.first_chunk_tokens = -2}); },
              ThrowsMessage<Error>(HasSubstr("first_chunk_tokens must be >= 0")));
  m.check_invariants();
}

TEST(ManagerChunkedPrefill, AChunkFitsWhereTheWholePromptDoesNot) {
  KVCacheManager m({.num_blocks = 4, .block_size = 4});
  m.add_sequence(9);
  ASSERT_TRUE(m.append_slots(9, 12));  // {0, 1, 2}; 1 free
  const std::vector<TokenId> p = iota_tokens(16);
  EXPECT_EQ(m.can_add_sequence(p), Admission::kLater);  // 4 blocks: fits an empty pool
  EXPECT_EQ(m.can_add_sequence(p, AddOptions{.first_chunk_tokens = 4}), Admission::kOk);
  ASSERT_TRUE(m.add_sequence(1, p, AddOptions{.first_chunk_tokens = 4}));
  EXPECT_THAT(table_of(m, 1), ElementsAre(3));
  const std::span<const TokenId> rest = std::span<const TokenId>(p).subspan(4, 4);
  EXPECT_EQ(m.append_admission(1, 4), Admission::kLater);
  EXPECT_EQ(m.append_tokens(1, rest), std::nullopt);  // the next chunk waits
  m.free_sequence(9);
  ASSERT_TRUE(m.append_tokens(1, rest));
  EXPECT_THAT(table_of(m, 1), ElementsAre(3, 2));
  // A prompt longer than the pool is never, chunked or not.
  EXPECT_EQ(m.can_add_sequence(iota_tokens(17), AddOptions{.first_chunk_tokens = 1}),
            Admission::kNever);
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
