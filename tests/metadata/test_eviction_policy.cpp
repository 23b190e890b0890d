// Tests for include/pagedkv/metadata/eviction_policy.hpp and token eviction in the manager: policy
// rules on hand-worked positions, blocks released, kept sets and scores. Attention under each
// policy against the reference is tests/integration/test_token_eviction.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pagedkv/error.hpp"
#include "pagedkv/metadata/eviction_policy.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

// ---- policy rules ------------------------------------------------------------------------------

TEST(EvictionPolicy, SlidingWindowRule) {
  SlidingWindowPolicy p(4);
  AttentionParams params;
  p.set_attention_mask(params);
  EXPECT_EQ(params.window_left, 4);
  EXPECT_EQ(params.sink_tokens, 0);
  // Query 9 sees 6..9.
  EXPECT_FALSE(p.is_visible(5, 9));
  EXPECT_TRUE(p.is_visible(6, 9));
  EXPECT_TRUE(p.is_visible(9, 9));
  EXPECT_FALSE(p.is_visible(10, 9));
  // Before appending position 9: positions < 6 are never needed again.
  EXPECT_FALSE(p.is_needed(5, 9));
  EXPECT_TRUE(p.is_needed(6, 9));
  EXPECT_THAT([] { SlidingWindowPolicy(0); }, ThrowsMessage<Error>(HasSubstr("got 0")));
}

TEST(EvictionPolicy, AttentionSinksRule) {
  AttentionSinksPolicy p(2, 3);
  AttentionParams params;
  p.set_attention_mask(params);
  EXPECT_EQ(params.window_left, 3);
  EXPECT_EQ(params.sink_tokens, 2);
  EXPECT_TRUE(p.is_visible(0, 10));
  EXPECT_TRUE(p.is_visible(1, 10));
  EXPECT_FALSE(p.is_visible(2, 10));
  EXPECT_FALSE(p.is_visible(7, 10));
  EXPECT_TRUE(p.is_visible(8, 10));
  EXPECT_TRUE(p.is_needed(1, 100));
  EXPECT_FALSE(p.is_needed(2, 100));
  EXPECT_THAT([] { AttentionSinksPolicy(0, 3); }, ThrowsMessage<Error>(HasSubstr("sinks")));
  EXPECT_THAT([] { AttentionSinksPolicy(2, 0); },
              ThrowsMessage<Error>(HasSubstr("window must be >= 1 token, got 0")));
}

TEST(EvictionPolicy, HeavyHitterVictimsHandWorked) {
  HeavyHitterPolicy p(2, 2);  // budget 4
  EXPECT_EQ(p.budget(), 4);
  std::vector<KeptTokenScore> kept{{0, 5.0}, {1, 0.5}, {2, 3.0}, {3, 0.5}, {4, 1.0}};
  // Appending position 5: recent window = {4, 5}; candidates 0..3; kept 5 + 1 - 4 = 2 evicted:
  // the two lowest scores (0.5 at 1 and 3, ties by older position first).
  EXPECT_THAT(p.select_victims(kept, 5, 1), ElementsAre(1, 3));
  // Within budget: nothing.
  EXPECT_THAT(p.select_victims(std::span(kept).first(3), 3, 1), IsEmpty());
  // Under budget with every kept token older than the recent window: still nothing (2 kept + 1
  // new = 3 < 4; positions 0 and 1 are candidates, but no token is in excess).
  const std::vector<KeptTokenScore> two{{0, 1.0}, {1, 2.0}};
  EXPECT_THAT(p.select_victims(two, 10, 1), IsEmpty());
  // A prompt longer than the budget (nothing kept yet) evicts nothing: prefill is exact.
  EXPECT_THAT(p.select_victims({}, 0, 10), IsEmpty());
  // Only candidates (outside the recent window) can go: a 3-token append with 4 kept tokens
  // (positions 0..3) leaves positions 4, 5 recent plus 6 new; 3 of the candidates must go.
  std::vector<KeptTokenScore> four{{0, 1.0}, {1, 2.0}, {2, 3.0}, {3, 4.0}};
  EXPECT_THAT(p.select_victims(four, 4, 3), ElementsAre(0, 1, 2));
  // Victims come back ascending, not in score order: recent 1 + heavy 1 = budget 2, appending
  // position 3 to kept {0, 1, 2}: excess 3 + 1 - 2 = 2, candidates all three (recent window
  // {3}); by score 1 (1.0), 0 (2.0), 2 (5.0) -> the first two, reported as {0, 1}.
  const HeavyHitterPolicy p11(1, 1);
  const std::vector<KeptTokenScore> mixed{{0, 2.0}, {1, 1.0}, {2, 5.0}};
  EXPECT_THAT(p11.select_victims(mixed, 3, 1), ElementsAre(0, 1));
  EXPECT_THAT([] { HeavyHitterPolicy(0, 1); }, ThrowsMessage<Error>(HasSubstr("recent")));
  EXPECT_EQ(eviction_kind_name(EvictionKind::kHeavyHitters), "h2o");
}

TEST(EvictionPolicy, EveryPolicyAnswersTheSameQuestions) {
  // The uniform interface the manager calls, on the header's worked example.
  const SlidingWindowPolicy window(4);
  EXPECT_EQ(window.attention_mask().window_left, 4);
  EXPECT_EQ(window.attention_mask().sink_tokens, 0);
  EXPECT_EQ(window.released_positions(9).begin, 0);
  EXPECT_EQ(window.released_positions(9).end, 6);
  EXPECT_EQ(window.released_positions(2).end, 0);  // nothing yet
  EXPECT_FALSE(window.scores_tokens());
  const AttentionSinksPolicy sinks(3, 2);
  EXPECT_EQ(sinks.attention_mask().window_left, 2);
  EXPECT_EQ(sinks.attention_mask().sink_tokens, 3);
  EXPECT_EQ(sinks.released_positions(12).begin, 3);
  EXPECT_EQ(sinks.released_positions(12).end, 11);
  EXPECT_FALSE(sinks.released_positions(4).contains(3));  // empty: [3, 3)
  const HeavyHitterPolicy h2o(2, 2);
  EXPECT_LT(h2o.attention_mask().window_left, 0);
  EXPECT_FALSE(h2o.released_positions(100).contains(0));
  EXPECT_TRUE(h2o.scores_tokens());
  const NoEviction none;
  EXPECT_LT(none.attention_mask().window_left, 0);
  EXPECT_TRUE(none.is_visible(0, 1000));
  EXPECT_TRUE(none.is_needed(0, 1000));
  EXPECT_THAT(none.select_victims({}, 0, 5), IsEmpty());
  // An unbounded mask leaves the caller's params as they were.
  AttentionParams params;
  params.window_left = 7;
  h2o.set_attention_mask(params);
  EXPECT_EQ(params.window_left, 7);
}

TEST(EvictionPolicy, KindNamesRoundTrip) {
  for (EvictionKind k : {EvictionKind::kNone, EvictionKind::kSlidingWindow,
                         EvictionKind::kAttentionSinks, EvictionKind::kHeavyHitters}) {
    EXPECT_EQ(parse_eviction_kind(eviction_kind_name(k)), k);
  }
  EXPECT_EQ(parse_eviction_kind("lru"), std::nullopt);
  EXPECT_EQ(eviction_kind_name(static_cast<EvictionKind>(99)), "unknown");
}

TEST(EvictionPolicy, ManagerReleasesWholeBlocksOutsideTheWindow) {
  // Worked example of SlidingWindowPolicy: W 4, block_size 2.
  KVCacheManager m({.num_blocks = 8,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 4}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 9));  // positions 0..8, blocks 0..4
  EXPECT_THAT(std::vector<BlockId>(m.block_table(1).begin(), m.block_table(1).end()),
              ElementsAre(0, 1, 2, 3, 4));
  // Before position 9: positions < 6 are dead, so logical blocks 0, 1, 2 go.
  EXPECT_EQ(m.blocks_needed_to_append(1, 1), 0);
  auto r = m.append_slots(1, 1);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, ElementsAre(9));
  const BlockId no = KVCacheManager::kNoBlock;
  EXPECT_THAT(std::vector<BlockId>(m.block_table(1).begin(), m.block_table(1).end()),
              ElementsAre(no, no, no, 3, 4));
  EXPECT_EQ(m.num_free_blocks(), 6);
  EXPECT_EQ(m.stats().released_blocks, 3);
  // The kernel table holds the old ids as placeholders, never -1.
  std::vector<SeqId> seqs{1};
  std::vector<int64_t> n{1};
  BatchMetadata meta = m.batch_metadata(seqs, n);
  EXPECT_THAT(meta.padded.block_tables, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(meta.slot_mapping, ElementsAre(9));
  KeptTokens kept = m.kept_tokens(seqs);
  EXPECT_THAT(kept.positions, ElementsAre(6, 7, 8, 9));
  EXPECT_THAT(kept.slots, ElementsAre(6, 7, 8, 9));
  m.check_invariants();
  // A full pool still appends when the release covers the new block.
  KVCacheManager tight({.num_blocks = 2,
                        .block_size = 2,
                        .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 2}});
  tight.add_sequence(1);
  ASSERT_TRUE(tight.append_slots(1, 4));
  EXPECT_EQ(tight.num_free_blocks(), 0);
  EXPECT_EQ(tight.blocks_needed_to_append(1, 1), 1);
  EXPECT_TRUE(tight.can_append(1, 1));  // block 0 (positions 0, 1) is released first
  ASSERT_TRUE(tight.append_slots(1, 1));
  EXPECT_THAT(std::vector<BlockId>(tight.block_table(1).begin(), tight.block_table(1).end()),
              ElementsAre(no, 1, 0));
  tight.check_invariants();
}

TEST(EvictionPolicy, SinkBlocksAreNeverReleased) {
  KVCacheManager m({.num_blocks = 16,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kAttentionSinks, .window = 2, .sinks = 3}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 12));
  ASSERT_TRUE(m.append_slots(1, 1));  // before 12: needed = {0,1,2} + {11}
  const BlockId no = KVCacheManager::kNoBlock;
  EXPECT_THAT(std::vector<BlockId>(m.block_table(1).begin(), m.block_table(1).end()),
              ElementsAre(0, 1, no, no, no, 5, 6));
  std::vector<SeqId> seqs{1};
  EXPECT_THAT(m.kept_tokens(seqs).positions, ElementsAre(0, 1, 2, 11, 12));
  m.check_invariants();
}

TEST(EvictionPolicy, HeavyHittersKeepTheTopScoredTokens) {
  // bs 2, recent 1, heavy 2. Scores are set by hand through accumulate_attention.
  KVCacheManager m({.num_blocks = 8,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kHeavyHitters, .recent = 1, .heavy = 2}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 5));  // positions 0..4 in blocks 0, 1, 2
  m.accumulate_attention(1, std::vector<float>{0.1f, 0.9f, 0.2f, 0.8f, 0.0f});
  // Appending position 5 (budget 3): candidates 0..4, keep the top 2 (1 and 3) -> evict 0, 2, 4.
  auto r = m.append_slots(1, 1);
  ASSERT_TRUE(r);
  std::vector<SeqId> seqs{1};
  KeptTokens kept = m.kept_tokens(seqs);
  EXPECT_THAT(kept.positions, ElementsAre(1, 3, 5));
  // Block 2 lost its only token (position 4) and was released; position 5 fills the hole left
  // by position 0 in block 0 (slot 0).
  EXPECT_THAT(r->slots, ElementsAre(0));
  EXPECT_THAT(kept.slots, ElementsAre(1, 3, 0));
  EXPECT_EQ(m.stats().evicted_tokens, 3);
  EXPECT_EQ(m.num_free_blocks(), 6);
  EXPECT_THAT([&] { m.accumulate_attention(1, std::vector<float>{1.0f}); },
              ThrowsMessage<Error>(HasSubstr("1 weights for 3 kept tokens")));
  m.check_invariants();
  // Appending positions 6..8: excess 3 + 3 - 3 = 3, and 1, 3, 5 are all outside the recent
  // window {8}: all three go, blocks 0 and 1 empty out and are released (1 then 0, behind 2 on
  // the free list: 3 4 5 6 7 2 1 0). No hole is left, so the 3 new tokens take ceil(3 / 2) = 2
  // fresh blocks, 3 and 4, put into the released entries 0 and 1 in that order.
  r = m.append_slots(1, 3);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, ElementsAre(6, 7, 8));
  EXPECT_THAT(std::vector<BlockId>(m.block_table(1).begin(), m.block_table(1).end()),
              ElementsAre(3, 4, -1));  // entry 2: released earlier
  kept = m.kept_tokens(seqs);
  EXPECT_THAT(kept.positions, ElementsAre(6, 7, 8));
  EXPECT_THAT(kept.slots, ElementsAre(6, 7, 8));
  EXPECT_EQ(m.stats().evicted_tokens, 6);
  EXPECT_EQ(m.num_free_blocks(), 6);
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
