// Tests for include/pagedkv/metadata/kv_cache_manager.hpp, admission and swap: can_admit's
// ok / later / never with the watermark, swap-out needing host room, swap-in admission counting the
// blocks the look-ahead append releases, and the swap counters over round trips.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(KVCacheManager, AdmissionOkLaterNeverWithWatermark) {
  // 8 blocks of 4 tokens, watermark 0.25 -> 2 blocks kept free at admission; max_model_len 32
  // is the most the pool can hold (40 is rejected: test ConstructorRejectsUnreachableLength).
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .watermark = 0.25, .max_model_len = 32});
  EXPECT_EQ(m.watermark_blocks(), 2);
  std::vector<TokenId> p24(24, 1), p25(25, 1), p33(33, 1), p8(8, 1);
  EXPECT_EQ(m.can_add_sequence(p24), Admission::kOk);     // 6 blocks, 2 left
  EXPECT_EQ(m.can_add_sequence(p25), Admission::kNever);  // 7 blocks > 8 - 2
  EXPECT_EQ(m.can_add_sequence(p33), Admission::kNever);  // > max_model_len
  ASSERT_TRUE(m.add_sequence(1, p8));                     // 2 blocks, 6 left
  EXPECT_EQ(m.can_add_sequence(p24), Admission::kLater);  // would leave 0 < 2
  EXPECT_EQ(m.add_sequence(2, p24), std::nullopt);
  EXPECT_FALSE(m.has_sequence(2));
  EXPECT_EQ(m.can_add_sequence(p8), Admission::kOk);  // leaves exactly the watermark
  // Appends ignore the watermark: running sequences may use the reserve.
  EXPECT_TRUE(m.can_append(1, 24));
  ASSERT_TRUE(m.add_sequence(3, p8));  // 4 blocks left
  EXPECT_TRUE(m.can_append(1, 16));
  EXPECT_FALSE(m.can_append(1, 17));
  EXPECT_EQ(m.append_admission(1, 17), Admission::kLater);  // 7 blocks: fits once 3 is gone
  EXPECT_THAT([&] { (void)m.can_append(1, 25); },
              ThrowsMessage<Error>(HasSubstr("8 + 25 tokens exceed max_model_len 32")));
  m.check_invariants();
}

TEST(KVCacheManager, PoolOfOneBlockAdmission) {
  KVCacheManager m({.num_blocks = 1, .block_size = 2});
  std::vector<TokenId> p2(2, 5), p3(3, 5);
  EXPECT_EQ(m.can_add_sequence(p3), Admission::kNever);
  ASSERT_TRUE(m.add_sequence(1, p2));
  EXPECT_EQ(m.can_add_sequence(p2), Admission::kLater);
  EXPECT_EQ(m.can_add_sequence({}), Admission::kOk);  // an empty prompt takes no block
  EXPECT_FALSE(m.can_append(1, 1));
  m.check_invariants();
}

TEST(KVCacheManager, SwapNeedsHostRoomAndRespectsWatermark) {
  KVCacheManager m({.num_blocks = 4, .block_size = 2, .num_host_blocks = 1, .watermark = 0.25});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 4));  // 2 blocks
  EXPECT_FALSE(m.can_swap_out(1));
  EXPECT_EQ(m.swap_out(1), std::nullopt);
  EXPECT_FALSE(m.is_swapped(1));
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 1));
  ASSERT_TRUE(m.swap_out(2));
  m.add_sequence(3);
  ASSERT_TRUE(m.append_slots(3, 3));  // 2 blocks: pool full (1 + 2 + ... = 4)
  EXPECT_FALSE(m.can_swap_in(2));
  m.free_sequence(3);
  // 2 blocks available, 1 needed, watermark 1: ok.
  EXPECT_TRUE(m.can_swap_in(2));
  m.free_sequence(2);  // a swapped sequence can be dropped: its host block is released
  EXPECT_EQ(m.stats().host_used_blocks, 0);
  KVCacheManager no_host({.num_blocks = 2, .block_size = 2});
  no_host.add_sequence(1);
  EXPECT_FALSE(no_host.can_swap_out(1));
  m.check_invariants();
}

TEST(KVCacheManager, SwapCountersAccumulateOverRoundTrips) {
  // 3 tokens at block_size 2 = 2 blocks; each round trip copies 2 blocks each way.
  KVCacheManager m({.num_blocks = 4, .block_size = 2, .num_host_blocks = 2});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 3));
  for (int round = 1; round <= 2; ++round) {
    ASSERT_TRUE(m.swap_out(1));
    ASSERT_TRUE(m.swap_in(1));
    EXPECT_EQ(m.stats().swapped_out_blocks, 2 * round);
    EXPECT_EQ(m.stats().swapped_in_blocks, 2 * round);
  }
  m.check_invariants();
}

TEST(KVCacheManager, SwapInAdmissionCountsBlocksTheLookAheadAppendReleases) {
  // Sliding window W 4, block_size 2 (the worked example of test_eviction_policy): 9 tokens in
  // 5 blocks; the next append releases logical blocks 0..2 (positions < 6 are dead). Swapped
  // in with 1 look-ahead slot it needs 5 blocks plus ceil(10 / 2) - 5 = 0 fresh ones, so a pool
  // of 6 admits it; counting the 3 released blocks against it would ask for 8.
  KVCacheManager m({.num_blocks = 6,
                    .block_size = 2,
                    .num_host_blocks = 5,
                    .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 4}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 9));
  ASSERT_TRUE(m.swap_out(1));
  EXPECT_TRUE(m.can_swap_in(1, 1));
  EXPECT_EQ(m.swap_in_admission(1, 1), Admission::kOk);
  ASSERT_TRUE(m.swap_in(1, 1));
  ASSERT_TRUE(m.append_slots(1, 1));  // the look-ahead slot really fits
  EXPECT_EQ(m.num_free_blocks(), 4);  // 6 - 5 + 3 released
  m.check_invariants();
}

TEST(KVCacheManager, SwapInNeedsEveryLiveBlockBeforeTheAppendReleasesAny) {
  // As above (9 tokens in 5 blocks; the look-ahead append releases 3 and takes none): the
  // swap-in itself needs all 5 blocks at once, before that append releases anything, so with 4
  // available it is kLater, whatever the append would release afterwards.
  KVCacheManager m({.num_blocks = 6,
                    .block_size = 2,
                    .num_host_blocks = 5,
                    .watermark = 0,
                    .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 4}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 9));
  ASSERT_TRUE(m.swap_out(1));
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 4));  // 2 blocks held, 4 free
  EXPECT_EQ(m.swap_in_admission(1, 1), Admission::kLater);
  EXPECT_FALSE(m.swap_in(1, 1));
  m.free_sequence(2);
  EXPECT_EQ(m.swap_in_admission(1, 1), Admission::kOk);
  m.check_invariants();
}

TEST(KVCacheManager, AddSequenceTakesMoreNewTokensThanItsPrompt) {
  // max_new_tokens sizes the token-id list ahead (prompt + new tokens) and counts in admission
  // (3 + 6 tokens: 5 of the 8 blocks); a budget larger than the prompt is the common case.
  KVCacheManager m({.num_blocks = 8, .block_size = 2, .enable_prefix_caching = true});
  const std::vector<TokenId> prompt{1, 2, 3};
  const auto added = m.add_sequence(1, prompt, AddOptions{.max_new_tokens = 6});
  ASSERT_TRUE(added);
  EXPECT_EQ(m.num_tokens(1), 3);
  ASSERT_TRUE(m.append_slots(1, 1));
  EXPECT_EQ(m.num_tokens(1), 4);
  m.check_invariants();
}

TEST(KVCacheManager, SwapInAdmissionDoesNotCountEntriesReleasedBefore) {
  // As above, then one more token: 10 tokens, entries 0..2 released (kNoBlock), blocks in
  // entries 3, 4 only. The next append's dead range (positions < 7) is logical blocks 0..2 again,
  // all released already: it frees nothing. Swapped in with 2 look-ahead slots it needs the 2
  // live blocks plus ceil(12 / 2) - 5 = 1 fresh one: 3, with 2 available (sequence 2 holds 4)
  // that is kLater; counting the 3 released entries as freed would ask for 2 and say kOk.
  KVCacheManager m({.num_blocks = 6,
                    .block_size = 2,
                    .num_host_blocks = 5,
                    .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 4}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 9));
  ASSERT_TRUE(m.append_slots(1, 1));  // releases entries 0..2
  ASSERT_TRUE(m.swap_out(1));
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 8));  // 4 blocks, 2 left
  EXPECT_EQ(m.swap_in_admission(1, 0), Admission::kOk);
  EXPECT_EQ(m.swap_in_admission(1, 2), Admission::kLater);
  EXPECT_FALSE(m.swap_in(1, 2));
  m.free_sequence(2);
  ASSERT_TRUE(m.swap_in(1, 2));
  ASSERT_TRUE(m.append_slots(1, 2));  // 12 tokens: one fresh block, nothing released
  EXPECT_EQ(m.num_free_blocks(), 3);
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
