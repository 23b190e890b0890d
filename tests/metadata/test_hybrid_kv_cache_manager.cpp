// Tests for include/pagedkv/metadata/hybrid_kv_cache_manager.hpp: KV cache groups over one pool.
// Hand-worked releases at exact window and chunk boundaries (block size 4), sinks, an append
// that fits only through its own releases, copy-on-write per group, truncate, per-group batch
// metadata, failed operations that change nothing, and random workloads against an independent
// model of which entries each group must keep.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/hybrid_groups.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using testing::N;

using testing::chunked;
using testing::full;
using testing::window;

int64_t live(std::span<const BlockId> table) {
  return std::count_if(table.begin(), table.end(), [](BlockId b) { return b != N; });
}

TEST(HybridKVCacheManager, Window8ReleasesAtExactPositions) {
  HybridKVCacheManager m({.num_blocks = 16, .block_size = 4, .groups = {full(), window(8)}});
  m.add_sequence(1);
  const auto prefill = m.append_slots(1, 8);
  ASSERT_TRUE(prefill);
  EXPECT_THAT(m.block_table(1, 0), ElementsAre(1, 2));
  EXPECT_THAT(m.block_table(1, 1), ElementsAre(3, 4));
  // One token at a time at positions 8..20. The query at p sees p-7..p, so logical block e
  // (positions 4e..4e+3) goes at the append of p = 4e + 11: blocks 3, 4, 6 at p = 11, 15, 19.
  const std::map<int64_t, BlockId> released_at = {{11, 3}, {15, 4}, {19, 6}};
  // Live window blocks after the append of p (tokens p + 1), worked out by hand.
  const int64_t live_after[] = {3, 3, 3, 2, 3, 3, 3, 2, 3, 3, 3, 2, 3};
  for (int64_t p = 8; p <= 20; ++p) {
    const auto r = m.append_slots(1, 1);
    ASSERT_TRUE(r) << p;
    const auto it = released_at.find(p);
    if (it == released_at.end()) {
      EXPECT_TRUE(r->released[1].empty()) << p;
    } else {
      EXPECT_THAT(r->released[1], ElementsAre(it->second)) << p;
    }
    EXPECT_TRUE(r->released[0].empty()) << "the full group never releases";
    EXPECT_EQ(live(m.block_table(1, 1)), live_after[p - 8]) << p;
    m.check_invariants();
  }
  EXPECT_THAT(m.block_table(1, 0), ElementsAre(1, 2, 5, 7, 9, 11));
  EXPECT_THAT(m.block_table(1, 1), ElementsAre(N, N, N, 8, 10, 12));
  // 1 null + 6 full + 3 window blocks in use of 16.
  EXPECT_EQ(m.num_free_blocks(), 16 - 1 - 6 - 3);
  EXPECT_EQ(m.blocks_in_tables(0), 6);
  EXPECT_EQ(m.blocks_in_tables(1), 3);
}

TEST(HybridKVCacheManager, Chunk8ReleasesWhenTheNextChunkStarts) {
  HybridKVCacheManager m({.num_blocks = 16, .block_size = 4, .groups = {chunked(8)}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 8));        // chunk 0: blocks 1, 2
  const auto first = m.append_slots(1, 1);  // position 8 starts chunk 1
  ASSERT_TRUE(first);
  EXPECT_THAT(first->released[0], ElementsAre(1, 2));
  EXPECT_THAT(m.block_table(1, 0), ElementsAre(N, N, 3));
  for (int p = 9; p < 16; ++p) {
    const auto r = m.append_slots(1, 1);
    ASSERT_TRUE(r);
    EXPECT_TRUE(r->released[0].empty()) << p;
  }
  const auto second = m.append_slots(1, 1);  // position 16 starts chunk 2
  ASSERT_TRUE(second);
  // Blocks 3 (positions 8..11) and 4 (12..15, taken from the free list's head) go; 1 and 2,
  // released at position 8, wait at its tail, so position 16 gets block 5.
  EXPECT_THAT(second->released[0], ElementsAre(3, 4));
  EXPECT_THAT(m.block_table(1, 0), ElementsAre(N, N, N, N, 5));
  m.check_invariants();
}

TEST(HybridKVCacheManager, SinkBlocksAreNeverReleased) {
  HybridKVCacheManager m({.num_blocks = 16, .block_size = 2, .groups = {window(4, 2)}});
  m.add_sequence(1);
  for (int p = 0; p < 12; ++p) ASSERT_TRUE(m.append_slots(1, 1));
  // The last append (p = 11) saw 8..11 and the sinks 0, 1: entries 0 (sinks), 4 (positions 8,
  // 9) and 5 (10, 11) are live, 1..3 released.
  const auto t = m.block_table(1, 0);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_NE(t[0], N);
  EXPECT_THAT(std::vector<bool>({t[1] == N, t[2] == N, t[3] == N, t[4] == N, t[5] == N}),
              ElementsAre(true, true, true, false, false));
  EXPECT_EQ(m.batch_metadata(std::vector<SeqId>{1})[0].mask.sink_tokens, 2);
  m.check_invariants();
}

TEST(HybridKVCacheManager, AppendFitsOnlyThroughItsOwnRelease) {
  // 2 usable blocks; window 3: the query at 4 sees 2..4, so block 0 goes before block 2 comes.
  HybridKVCacheManager m({.num_blocks = 3, .block_size = 2, .groups = {window(3)}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 4));
  EXPECT_EQ(m.num_free_blocks(), 0);
  EXPECT_EQ(m.blocks_needed(1, 1), 0);  // one new block, one released
  EXPECT_TRUE(m.can_append(1, 1));
  const auto r = m.append_slots(1, 1);
  ASSERT_TRUE(r);
  EXPECT_THAT(m.block_table(1, 0), ElementsAre(N, 2, 1));
  EXPECT_THAT(r->slots[0], ElementsAre(1 * 2 + 0));
  // A window of 3 grows forever in these 2 blocks.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(m.append_slots(1, 1)) << i;
  m.check_invariants();
}

TEST(HybridKVCacheManager, ExhaustedPoolChangesNothing) {
  HybridKVCacheManager m({.num_blocks = 6, .block_size = 4, .groups = {full(), window(4)}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 8));  // 2 + 2 blocks of 5 usable
  EXPECT_FALSE(m.can_append(1, 5));   // full needs 2 more, window releases 1, takes 2
  const auto before_table0 =
      std::vector<BlockId>(m.block_table(1, 0).begin(), m.block_table(1, 0).end());
  const auto before_table1 =
      std::vector<BlockId>(m.block_table(1, 1).begin(), m.block_table(1, 1).end());
  const int32_t free_before = m.num_free_blocks();
  EXPECT_FALSE(m.append_slots(1, 5));
  EXPECT_THAT(m.block_table(1, 0), ElementsAreArray(before_table0));
  EXPECT_THAT(m.block_table(1, 1), ElementsAreArray(before_table1));
  EXPECT_EQ(m.num_free_blocks(), free_before);
  EXPECT_EQ(m.num_tokens(1), 8);
  EXPECT_TRUE(m.can_append(1, 4));
  m.check_invariants();
}

TEST(HybridKVCacheManager, ForkCopiesOnWritePerGroup) {
  HybridKVCacheManager m({.num_blocks = 16, .block_size = 4, .groups = {full(), window(8)}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 6));  // g0 {1, 2}, g1 {3, 4}
  m.fork(1, 2);
  EXPECT_EQ(m.allocator().ref_count(2), 2);
  const auto r = m.append_slots(2, 1);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->copies, ElementsAre(BlockCopy{2, 5}, BlockCopy{4, 6}));
  EXPECT_THAT(r->copy_groups, ElementsAre(0, 1));
  EXPECT_THAT(m.block_table(2, 0), ElementsAre(1, 5));
  EXPECT_THAT(m.block_table(2, 1), ElementsAre(3, 6));
  EXPECT_THAT(r->slots[0], ElementsAre(5 * 4 + 2));
  EXPECT_THAT(r->slots[1], ElementsAre(6 * 4 + 2));
  EXPECT_THAT(m.block_table(1, 0), ElementsAre(1, 2));
  EXPECT_EQ(m.allocator().ref_count(1), 2);
  EXPECT_EQ(m.allocator().ref_count(2), 1);
  m.check_invariants();
  m.free_sequence(1);
  m.free_sequence(2);
  EXPECT_EQ(m.num_free_blocks(), 15);
  m.check_invariants();
}

TEST(HybridKVCacheManager, AppendWithoutSlotsReleasesAndCopiesTheSame) {
  // ForkCopiesOnWritePerGroup and a window release with AppendOptions::return_slots = false:
  // the same blocks, copies and released ids, no slots.
  const AppendOptions no_slots{.return_slots = false};
  HybridKVCacheManager m({.num_blocks = 16, .block_size = 4, .groups = {full(), window(8)}});
  m.add_sequence(1);
  auto r = m.append_slots(1, 6, no_slots);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, IsEmpty());
  m.fork(1, 2);
  r = m.append_slots(2, 1, no_slots);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->copies, ElementsAre(BlockCopy{2, 5}, BlockCopy{4, 6}));
  EXPECT_THAT(r->copy_groups, ElementsAre(0, 1));
  EXPECT_THAT(r->slots, IsEmpty());
  EXPECT_THAT(m.block_table(2, 0), ElementsAre(1, 5));
  EXPECT_THAT(m.block_table(2, 1), ElementsAre(3, 6));
  // Sequence 1 grows to 13 tokens: its window-8 group drops block 3 (positions 0..3) at the
  // append of position 12 (the query at 12 sees 5..12).
  r = m.append_tokens(1, std::vector<TokenId>{1, 2, 3, 4, 5, 6}, no_slots);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, IsEmpty());
  r = m.append_slots(1, 1, no_slots);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->released.size(), 2u);
  EXPECT_THAT(r->released[0], IsEmpty());
  EXPECT_THAT(r->released[1], ElementsAre(3));
  EXPECT_THAT(r->slots, IsEmpty());
  EXPECT_EQ(m.num_tokens(1), 13);
  m.check_invariants();
}

TEST(HybridKVCacheManager, TruncateCannotBringReleasedBlocksBack) {
  HybridKVCacheManager m({.num_blocks = 16, .block_size = 4, .groups = {full(), window(8)}});
  m.add_sequence(1);
  for (int p = 0; p < 20; ++p) ASSERT_TRUE(m.append_slots(1, 1));
  // Window entries 0, 1, 2 released (at p = 11, 15, 19); the query at 13 would see 6..13.
  const int32_t free_before = m.num_free_blocks();
  EXPECT_ERROR(m.truncate(1, 13),
               "truncate: sequence 1 group 1 (sliding_window) already released block 1 "
               "(positions 4..7), which the query at position 13 needs");
  EXPECT_EQ(m.num_tokens(1), 20);
  EXPECT_EQ(m.num_free_blocks(), free_before);
  // The query at 16 sees 9..16: entries 2.. are needed, entry 2 is gone too.
  EXPECT_ERROR(m.truncate(1, 16), "released block 2");
  // Keeping 19 tokens needs entries >= (19 - 7) / 4 = 3: allowed; nothing to free (5 blocks).
  m.truncate(1, 19);
  EXPECT_EQ(m.num_tokens(1), 19);
  EXPECT_EQ(m.block_table(1, 0).size(), 5u);
  m.check_invariants();
  EXPECT_ERROR(m.truncate(1, 20), "has 19 tokens, cannot keep 20");
  EXPECT_ERROR(m.truncate(1, -1), "cannot keep -1");
}

// A truncate back to a chunk boundary keeps the released entries below it and drops the
// entries above, so the scan that releases a finished chunk must start below the old mark.
TEST(HybridKVCacheManager, TruncateToAChunkBoundaryThenReleaseTheNextChunk) {
  HybridKVCacheManager m({.num_blocks = 16, .block_size = 4, .groups = {chunked(8)}});
  m.add_sequence(1);
  for (int p = 0; p < 20; ++p) ASSERT_TRUE(m.append_slots(1, 1));
  // Chunks 0 and 1 released (at p = 8, 16): entries 0..3 null, entry 4 (positions 16..19) live.
  EXPECT_EQ(live(m.block_table(1, 0)), 1);
  // Keeping 8 tokens needs nothing of chunk 1 (the query at 8 starts it): allowed, 2 entries.
  m.truncate(1, 8);
  EXPECT_THAT(m.block_table(1, 0), ElementsAre(N, N));
  m.check_invariants();
  ASSERT_TRUE(m.append_slots(1, 8));  // chunk 1 again: entries 2, 3
  EXPECT_EQ(live(m.block_table(1, 0)), 2);
  const int32_t free_before = m.num_free_blocks();
  const auto r = m.append_slots(1, 1);  // position 16 starts chunk 2: entries 2, 3 go
  ASSERT_TRUE(r);
  EXPECT_EQ(r->released[0].size(), 2u);
  EXPECT_EQ(live(m.block_table(1, 0)), 1);
  EXPECT_EQ(m.num_free_blocks(), free_before + 2 - 1);
  m.check_invariants();
}

TEST(HybridKVCacheManager, BatchMetadataPerGroup) {
  HybridKVCacheManager m({.num_blocks = 32, .block_size = 4, .groups = {full(), window(8)}});
  m.add_sequence(7);
  m.add_sequence(9);
  ASSERT_TRUE(m.append_slots(7, 5));  // g0 {1, 2}, g1 {3, 4}
  for (int p = 0; p < 13; ++p) ASSERT_TRUE(m.append_slots(9, 1));
  const std::vector<SeqId> batch = {9, 7};
  const auto md = m.batch_metadata(batch);
  ASSERT_EQ(md.size(), 2u);
  EXPECT_EQ(md[0].mask.window_left, -1);
  EXPECT_EQ(md[1].mask.window_left, 8);
  EXPECT_THAT(md[1].padded.context_lens, ElementsAre(13, 5));
  EXPECT_EQ(md[1].padded.max_blocks_per_seq, 4);
  const auto t9 = m.block_table(9, 1);
  EXPECT_EQ(t9[0], N);  // released at p = 11
  EXPECT_THAT(md[1].padded.block_tables, ElementsAre(t9[0], t9[1], t9[2], t9[3], 3, 4, -1, -1));
  EXPECT_THAT(md[1].csr.indptr, ElementsAre(0, 4, 6));
  EXPECT_THAT(md[1].csr.last_page_len, ElementsAre(1, 1));
  EXPECT_EQ(md[0].padded.num_blocks, 32);
  EXPECT_ERROR((void)m.batch_metadata(std::vector<SeqId>{3}), "batch_metadata: unknown sequence 3");
}

TEST(HybridKVCacheManager, InvalidConfigurationsAndIdsAreNamed) {
  EXPECT_ERROR(HybridKVCacheManager({.num_blocks = 1, .block_size = 4, .groups = {full()}}),
               "num_blocks must be >= 2 (block 0 is the null block), got 1");
  EXPECT_ERROR(HybridKVCacheManager({.num_blocks = 8, .block_size = 0, .groups = {full()}}),
               "block_size must be >= 1, got 0");
  EXPECT_ERROR(HybridKVCacheManager({.num_blocks = 8, .block_size = 4, .groups = {}}),
               "at least one KV cache group");
  EXPECT_ERROR(HybridKVCacheManager({.num_blocks = 8, .block_size = 4, .groups = {window(0)}}),
               "group 0 needs window >= 1");
  EXPECT_ERROR(
      HybridKVCacheManager({.num_blocks = 8, .block_size = 4, .groups = {full(), chunked(0)}}),
      "chunked group 1 needs chunk >= 1");
  KVCacheGroupSpec no_layers = full();
  no_layers.num_layers = 0;
  EXPECT_ERROR(HybridKVCacheManager({.num_blocks = 8, .block_size = 4, .groups = {no_layers}}),
               "group 0 layers must be >= 1, got 0");
  HybridKVCacheManager m({.num_blocks = 8, .block_size = 4, .groups = {full()}});
  m.add_sequence(1);
  EXPECT_ERROR(m.add_sequence(1), "sequence 1 already exists");
  EXPECT_ERROR((void)m.append_slots(2, 1), "append_slots: unknown sequence 2");
  EXPECT_ERROR((void)m.append_slots(1, -1), "tokens must be >= 0, got -1");
  EXPECT_ERROR((void)m.block_table(1, 1), "group 1 not in [0, 1)");
  EXPECT_ERROR(m.fork(1, 1), "fork: sequence 1 already exists");
  EXPECT_ERROR(m.free_sequence(5), "free_sequence: unknown sequence 5");
}

// Independent model: per sequence and group, which logical entries are live, by the release
// rule applied to the append positions alone.
struct ModelSeq {
  int64_t tokens = 0;
  std::vector<std::vector<bool>> live;  // [group][entry]
};

void model_append(ModelSeq& s, const std::vector<KVCacheGroupSpec>& groups, int32_t bs, int64_t n) {
  for (size_t g = 0; g < groups.size(); ++g) {
    const KVCacheGroupSpec& spec = groups[g];
    // Positions below the first the query at `tokens` sees, other than sinks, are dead; an
    // entry dies when every position in it is dead.
    int64_t first = 0;
    if (spec.kind == GroupAttention::kSlidingWindow)
      first = std::max<int64_t>(0, s.tokens - spec.window + 1);
    if (spec.kind == GroupAttention::kChunkedLocal) first = s.tokens / spec.chunk * spec.chunk;
    for (size_t e = 0; e < s.live[g].size(); ++e) {
      const int64_t last_pos = static_cast<int64_t>(e) * bs + bs - 1;
      const bool sink = static_cast<int64_t>(e) * bs < spec.sink_tokens;
      if (!sink && last_pos < first) s.live[g][e] = false;
    }
    const int64_t want = (s.tokens + n + bs - 1) / bs;
    while (static_cast<int64_t>(s.live[g].size()) < want) s.live[g].push_back(true);
  }
  s.tokens += n;
}

void expect_matches(const HybridKVCacheManager& m, const std::map<SeqId, ModelSeq>& model) {
  std::set<BlockId> held;
  for (const auto& [id, s] : model) {
    ASSERT_EQ(m.num_tokens(id), s.tokens);
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      const auto table = m.block_table(id, g);
      ASSERT_EQ(table.size(), s.live[static_cast<size_t>(g)].size());
      for (size_t e = 0; e < table.size(); ++e) {
        ASSERT_EQ(table[e] != N, s.live[static_cast<size_t>(g)][e])
            << "seq " << id << " group " << g << " entry " << e;
        if (table[e] != N) held.insert(table[e]);
      }
    }
  }
  // Conservation: the null block, the distinct held blocks and the free ones make the pool.
  EXPECT_EQ(1 + static_cast<int32_t>(held.size()) + m.num_free_blocks(), m.config().num_blocks);
}

TEST(HybridKVCacheManager, RandomWorkloadsMatchTheModel) {
  const std::vector<std::vector<KVCacheGroupSpec>> configs = {
      {full(), window(8)}, {window(5, 3), chunked(6), full()}, {chunked(4)}, {window(1)}};
  for (size_t c = 0; c < configs.size(); ++c) {
    std::mt19937_64 rng(1234 + c);
    HybridKVCacheManager m({.num_blocks = 40, .block_size = 4, .groups = configs[c]});
    std::map<SeqId, ModelSeq> model;
    SeqId next_id = 0;
    for (int step = 0; step < 600; ++step) {
      const int op = static_cast<int>(rng() % 10);
      if (model.empty() || op == 0) {
        m.add_sequence(next_id);
        model[next_id].live.resize(configs[c].size());
        ++next_id;
      } else {
        auto it = model.begin();
        std::advance(it, static_cast<long>(rng() % model.size()));
        const SeqId id = it->first;
        if (op <= 6) {
          const int64_t n = static_cast<int64_t>(rng() % 7);
          const bool ok = m.can_append(id, n);
          const auto r = m.append_slots(id, n);
          ASSERT_EQ(ok, r.has_value()) << "can_append answers exactly";
          if (r) {
            model_append(it->second, configs[c], 4, n);
            for (const auto& group_slots : r->slots) {
              for (Slot slot : group_slots) {
                ASSERT_EQ(m.allocator().ref_count(static_cast<BlockId>(slot / 4)), 1)
                    << "a written block is private";
              }
            }
          }
        } else if (op == 7 && model.size() < 8) {
          m.fork(id, next_id);
          model[next_id] = it->second;
          ++next_id;
        } else if (op == 8) {
          const int64_t keep = it->second.tokens - static_cast<int64_t>(rng() % 3);
          if (keep >= 0) {
            try {
              m.truncate(id, keep);
              ModelSeq& s = it->second;
              for (auto& l : s.live) l.resize(static_cast<size_t>((keep + 3) / 4));
              s.tokens = keep;
            } catch (const Error&) {
              // Refused: the model keeps its state, as the manager must.
            }
          }
        } else {
          m.free_sequence(id);
          model.erase(it);
        }
      }
      m.check_invariants();
      expect_matches(m, model);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace pagedkv
