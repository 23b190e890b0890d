// Tests for prefix caching, commit and preemption of include/pagedkv/metadata/
// hybrid_kv_cache_manager.hpp (issue 17 item 2), hand-worked with exact block ids and hit
// lengths (block size 4): a hit valid for the full group but not the window group and the
// reverse give the intersection; a window group needs only the blocks in view, a chunked group
// only its current chunk, sinks stay needed; LRU eviction of cached blocks and key reset on
// reuse; commit publishes only written full blocks; preempt then re-add; swap round trips;
// exhausted pools change nothing (whole state compared).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "common/hybrid_groups.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::N;

using testing::chunked;
using testing::full;
using testing::window;

/// Token ids first, first + 1, ..., n of them.
std::vector<TokenId> ids(int32_t first, int32_t n) {
  std::vector<TokenId> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<BlockId> table(const HybridKVCacheManager& m, SeqId seq, int32_t g) {
  const auto t = m.block_table(seq, g);
  return {t.begin(), t.end()};
}

HybridKVCacheManager make(int32_t num_blocks, std::vector<KVCacheGroupSpec> groups,
                          int32_t host = 0) {
  return HybridKVCacheManager({.num_blocks = num_blocks,
                               .block_size = 4,
                               .groups = std::move(groups),
                               .enable_prefix_caching = true,
                               .num_host_blocks = host});
}

/// The whole observable state: sequences and tables, ref counts, free list, LRU, keys.
std::string state(const HybridKVCacheManager& m) {
  std::ostringstream o;
  for (SeqId s : m.sequences()) {
    o << "seq " << s << " tokens " << m.num_tokens(s) << " committed " << m.num_committed_tokens(s)
      << " swapped " << m.is_swapped(s) << ":";
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      o << " [";
      for (BlockId b : m.block_table(s, g)) o << b << ' ';
      o << ']';
    }
    o << '\n';
  }
  const BlockAllocator& a = m.allocator();
  for (BlockId b = 0; b < a.num_blocks(); ++b) {
    o << b << ':' << a.ref_count(b) << (a.is_cached(b) ? "c" : "");
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      if (const PrefixCache::Entry* e = m.prefix_cache(g).entry(b)) o << "k" << g << '=' << e->hash;
    }
    o << ' ';
  }
  o << "\nfree";
  for (BlockId b : a.free_list()) o << ' ' << b;
  o << "\nlru";
  for (BlockId b : a.cached_lru()) o << ' ' << b;
  if (const BlockAllocator* h = m.host_allocator()) {
    o << "\nhost";
    for (BlockId b : h->free_list()) o << ' ' << b;
  }
  return o.str();
}

// The prompt of most cases: 17 tokens, at most (17 - 1) / 4 = 4 hit blocks.
const std::vector<TokenId> kPrompt = ids(100, 17);

TEST(HybridPrefix, WindowReleasedBeforeCommitShrinksTheHit) {
  // (a) The full group is valid for 16 tokens, the window group released entries 2 and 3 before
  // they were committed: only a hit of 8 (window entries {0, 1}) is valid for both.
  HybridKVCacheManager m = make(32, {full(), window(8)});
  const auto add = m.add_sequence(1, kPrompt);
  ASSERT_TRUE(add);
  EXPECT_EQ(add->num_computed_tokens, 0);
  EXPECT_THAT(table(m, 1, 0), ElementsAre(1, 2, 3, 4, 5));
  EXPECT_THAT(table(m, 1, 1), ElementsAre(6, 7, 8, 9, 10));
  EXPECT_EQ(m.commit(1, 8), 4);  // entries 0, 1 of both groups
  // p = 17: the window releases entries 0, 1 (published: cached, LRU {6, 7}); one block more.
  ASSERT_TRUE(m.append_tokens(1, ids(117, 6)));
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(6, 7));
  // p = 23: the query sees 16..23, entries 2, 3 (never committed) go to the free list.
  ASSERT_TRUE(m.append_tokens(1, ids(123, 1)));
  EXPECT_THAT(table(m, 1, 0), ElementsAre(1, 2, 3, 4, 5, 11));
  EXPECT_THAT(table(m, 1, 1), ElementsAre(N, N, N, N, 10, 12));
  EXPECT_EQ(m.commit(1, 24), 6);  // full entries 2..5, window entries 4, 5
  m.check_invariants();

  const HybridPrefixLookup hit = m.lookup_prefix(kPrompt);
  EXPECT_EQ(hit.num_computed_tokens, 8);  // 16 needs window {2, 3}, 12 needs {1, 2}
  EXPECT_THAT(hit.blocks[0], ElementsAre(1, 2));
  EXPECT_THAT(hit.blocks[1], ElementsAre(6, 7));
  // The window needs only its view: 25 tokens, h = 24 needs window entries {4, 5} alone.
  std::vector<TokenId> longer = ids(100, 24);
  longer.push_back(999);
  const HybridPrefixLookup far = m.lookup_prefix(longer);
  EXPECT_EQ(far.num_computed_tokens, 24);
  EXPECT_THAT(far.blocks[0], ElementsAre(1, 2, 3, 4, 5, 11));
  EXPECT_THAT(far.blocks[1], ElementsAre(N, N, N, N, 10, 12));

  // The add takes what the lookup said: 6 and 7 leave the LRU, 2 x 3 fresh blocks.
  EXPECT_EQ(m.can_add_sequence(kPrompt), Admission::kOk);
  const auto second = m.add_sequence(2, kPrompt);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->num_computed_tokens, 8);
  EXPECT_THAT(table(m, 2, 0), ElementsAre(1, 2, 13, 14, 15));
  EXPECT_THAT(table(m, 2, 1), ElementsAre(6, 7, 16, 17, 18));
  EXPECT_THAT(second->append.slots[0], ElementsAre(52, 53, 54, 55, 56, 57, 58, 59, 60));
  EXPECT_EQ(m.num_cached_blocks(), 0);
  EXPECT_EQ(m.allocator().ref_count(6), 1);
  EXPECT_EQ(m.allocator().ref_count(1), 2);
  EXPECT_EQ(m.num_committed_tokens(2), 8);
  m.check_invariants();
}

TEST(HybridPrefix, WindowLostItsRecentBlockFullDidNot) {
  // (a) by eviction, groups {window 8, full}: a tail-first free puts each entry's window block
  // into the LRU before its full block, so the first eviction takes window entry 3.
  HybridKVCacheManager m = make(12, {window(8), full()});
  ASSERT_TRUE(m.add_sequence(1, kPrompt));  // window {1..5}, full {6..10}, free {11}
  EXPECT_EQ(m.commit(1, 17), 8);
  m.free_sequence(1);
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(4, 9, 3, 8, 2, 7, 1, 6));
  EXPECT_THAT(m.allocator().free_list(), ElementsAre(11, 5, 10));
  ASSERT_TRUE(m.add_sequence(2, ids(200, 5)));  // 4 blocks: 11, 5, 10, evicts 4
  EXPECT_THAT(table(m, 2, 0), ElementsAre(11, 5));
  EXPECT_THAT(table(m, 2, 1), ElementsAre(10, 4));
  EXPECT_EQ(m.prefix_cache(0).entry(4), nullptr) << "a reused block's key is reset";
  EXPECT_FALSE(m.allocator().is_cached(4));
  const HybridPrefixLookup hit = m.lookup_prefix(kPrompt);
  EXPECT_EQ(hit.num_computed_tokens, 12);  // window at 12 needs {1, 2}; full has all 4
  EXPECT_THAT(hit.blocks[0], ElementsAre(N, 2, 3));
  EXPECT_THAT(hit.blocks[1], ElementsAre(6, 7, 8));
  m.check_invariants();
}

TEST(HybridPrefix, FullLostABlockWindowKeptItsRecentOnes) {
  // (b) groups {full, window 8}: the first eviction takes full entry 3 (block 4); the window
  // group alone would serve 16 (entries {2, 3} = {8, 9} cached), the full group only 12.
  HybridKVCacheManager m = make(12, {full(), window(8)});
  ASSERT_TRUE(m.add_sequence(1, kPrompt));
  EXPECT_EQ(m.commit(1, 17), 8);
  m.free_sequence(1);
  ASSERT_TRUE(m.add_sequence(2, ids(200, 5)));  // evicts block 4
  EXPECT_EQ(m.prefix_cache(0).entry(4), nullptr);
  EXPECT_NE(m.prefix_cache(1).entry(9), nullptr);
  const HybridPrefixLookup hit = m.lookup_prefix(kPrompt);
  EXPECT_EQ(hit.num_computed_tokens, 12);
  EXPECT_THAT(hit.blocks[0], ElementsAre(1, 2, 3));
  EXPECT_THAT(hit.blocks[1], ElementsAre(N, 7, 8));
  EXPECT_EQ(m.can_add_sequence(kPrompt), Admission::kLater)
      << "5 hit blocks leave the LRU and 2 x 2 are fresh: 9 blocks, 7 available";
  // Next in LRU order: 9, 3, 8: evicting three more leaves the full group 2 blocks, the window
  // {6, 7} for h = 8.
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(9, 3, 8, 2, 7, 1, 6));
  ASSERT_TRUE(m.append_tokens(2, ids(205, 4)));  // 9 tokens: 2 fresh blocks, evicts 9 and 3
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(8, 2, 7, 1, 6));
  EXPECT_EQ(m.lookup_prefix(kPrompt).num_computed_tokens, 8);
  // The add retains the hits (2, 1 and 7, 6 leave the LRU) before it allocates: needs 2 x 3
  // fresh blocks but only 8 is left: later.
  EXPECT_EQ(m.can_add_sequence(kPrompt), Admission::kLater);
  const std::string before = state(m);
  EXPECT_FALSE(m.add_sequence(3, kPrompt));
  EXPECT_EQ(state(m), before) << "a refused add changes nothing";
  m.check_invariants();
}

TEST(HybridPrefix, WindowNeedsTheLastWMinusOnePositionsExactly) {
  // At h = 16 a window W needs positions [17 - W, 16): W = 6 needs 11..15 (entries 2, 3), W = 5
  // needs 12..15 (entry 3 only). The window group keeps only entry 3 (block 9) cached here.
  for (const auto& [w, want] : std::vector<std::pair<int32_t, int64_t>>{{6, 0}, {5, 16}}) {
    HybridKVCacheManager m = make(12, {full(), window(w)});
    ASSERT_TRUE(m.add_sequence(1, kPrompt));  // full {1..5}, window {6..10}, free {11}
    EXPECT_EQ(m.commit(1, 17), 8);
    ASSERT_TRUE(m.append_tokens(1, ids(117, 1)));  // p = 17 sees 12 or 13 on: entries 0..2 go
    EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(6, 7, 8)) << w;
    ASSERT_TRUE(m.add_sequence(2, ids(200, 5)));  // 11, then evicts 6, 7, 8
    EXPECT_THAT(table(m, 2, 1), ElementsAre(7, 8)) << w;
    const HybridPrefixLookup hit = m.lookup_prefix(kPrompt);
    EXPECT_EQ(hit.num_computed_tokens, want) << "window " << w;
    if (want == 16) EXPECT_THAT(hit.blocks[1], ElementsAre(N, N, N, 9));
    m.check_invariants();
  }
}

TEST(HybridPrefix, LocalGroupsShrinkTheHitToAFixpoint) {
  // Groups {chunk 8, window 8, full}. The keys of entries 0..2 stay on the blocks sequence 1
  // had before a swap (cached in the LRU); the decode after the swap-in releases its local
  // entries unpublished, so: window keys {1, 2}, chunk key {2}, full keys {0..3}.
  HybridKVCacheManager m = make(40, {chunked(8), window(8), full()}, 16);
  ASSERT_TRUE(m.add_sequence(1, ids(100, 11)));  // chunk {1,2,3}, window {4,5,6}, full {7,8,9}
  ASSERT_TRUE(m.append_tokens(1, ids(111, 1)));  // p = 11: chunk 1, 2 and window 4 freed
  EXPECT_EQ(m.commit(1, 12), 6);                 // chunk 3, window 5, 6, full 7, 8, 9
  ASSERT_TRUE(m.swap_out(1));
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(3, 6, 9, 5, 8, 7));
  ASSERT_TRUE(m.swap_in(1));
  EXPECT_THAT(table(m, 1, 1), ElementsAre(N, 11, 12));
  for (int32_t t = 112; t < 124; ++t) ASSERT_TRUE(m.append_tokens(1, ids(t, 1)));
  EXPECT_THAT(table(m, 1, 0), ElementsAre(N, N, N, N, 19, 22));
  EXPECT_THAT(table(m, 1, 1), ElementsAre(N, N, N, N, 20, 23));  // entry 3 went at p = 23
  EXPECT_EQ(m.commit(1, 16), 1);  // full entry 3 only, chained on block 9's entry
  // Full: 16. Window: 16 needs {2, 3} -> 12 ({1, 2}). Chunk: 12 needs {2}: cached (block 3).
  EXPECT_EQ(m.lookup_prefix(kPrompt).num_computed_tokens, 12);
  ASSERT_TRUE(m.add_sequence(2, ids(500, 32)));  // 24 blocks: the 23 free ones, then evicts 3
  EXPECT_EQ(m.prefix_cache(0).entry(3), nullptr);
  // Now chunk: 12 -> 8 (a chunk start needs nothing). Window again: 8 needs {0, 1}, 4 needs
  // {0}: 0. One pass over the groups would stop at 12 (or 8).
  EXPECT_EQ(m.lookup_prefix(kPrompt).num_computed_tokens, 0);
  m.check_invariants();
}

TEST(HybridPrefix, ChunkedGroupNeedsOnlyTheCurrentChunk) {
  // (c) groups {full, chunk 8}: at h the chunked group needs [floor(h / 8) x 8, h): nothing at
  // h = 16 or 8, entry 2 at h = 12.
  HybridKVCacheManager m = make(12, {full(), chunked(8)});
  ASSERT_TRUE(m.add_sequence(1, kPrompt));  // full {1..5}, chunk {6..10}, free {11}
  EXPECT_EQ(m.commit(1, 17), 8);
  ASSERT_TRUE(m.append_tokens(1, ids(117, 1)));  // p = 17: chunk entries 0..3 released
  EXPECT_THAT(table(m, 1, 1), ElementsAre(N, N, N, N, 10));
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(6, 7, 8, 9));
  ASSERT_TRUE(m.add_sequence(2, ids(200, 5)));  // 11, then evicts 6, 7, 8
  EXPECT_THAT(table(m, 2, 0), ElementsAre(11, 6));
  EXPECT_THAT(table(m, 2, 1), ElementsAre(7, 8));
  // 15 tokens: at most 3 blocks; h = 12 needs chunk entry 2 (evicted), h = 8 needs none.
  const HybridPrefixLookup short_hit = m.lookup_prefix(ids(100, 15));
  EXPECT_EQ(short_hit.num_computed_tokens, 8);
  EXPECT_THAT(short_hit.blocks[0], ElementsAre(1, 2));
  EXPECT_THAT(short_hit.blocks[1], ElementsAre(N, N));
  // 17 tokens: h = 16 starts a chunk, the chunked group needs nothing.
  const HybridPrefixLookup hit = m.lookup_prefix(kPrompt);
  EXPECT_EQ(hit.num_computed_tokens, 16);
  EXPECT_THAT(hit.blocks[1], ElementsAre(N, N, N, N));
  // Adding it needs 2 fresh blocks; only 9 is available.
  EXPECT_EQ(m.can_add_sequence(kPrompt), Admission::kLater);
  m.free_sequence(2);  // unpublished: free list {6, 8, 11, 7} (tail first), LRU {9}
  const auto add = m.add_sequence(3, kPrompt);
  ASSERT_TRUE(add);
  EXPECT_EQ(add->num_computed_tokens, 16);
  EXPECT_THAT(table(m, 3, 0), ElementsAre(1, 2, 3, 4, 6));
  EXPECT_THAT(table(m, 3, 1), ElementsAre(N, N, N, N, 8));
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(9)) << "free blocks go before cached ones";
  m.check_invariants();
}

TEST(HybridPrefix, SinkBlocksAreNeededAtEveryHit) {
  // (d) window 4 with 4 sinks (1 sink block): at h = 16 the window needs entries {0, 3}.
  HybridKVCacheManager m = make(32, {full(), window(4, 4)});
  ASSERT_TRUE(m.add_sequence(1, kPrompt));  // full {1..5}, window {6..10}
  EXPECT_EQ(m.commit(1, 17), 8);
  ASSERT_TRUE(m.append_tokens(1, ids(117, 1)));  // p = 17 sees 14..17: entries 1, 2 go
  EXPECT_THAT(table(m, 1, 1), ElementsAre(6, N, N, 9, 10));
  const HybridPrefixLookup hit = m.lookup_prefix(kPrompt);
  EXPECT_EQ(hit.num_computed_tokens, 16);
  EXPECT_THAT(hit.blocks[1], ElementsAre(6, N, N, 9));
  m.free_sequence(1);
  const auto add = m.add_sequence(2, kPrompt);
  ASSERT_TRUE(add);
  EXPECT_THAT(table(m, 2, 1), ElementsAre(6, N, N, 9, 12));
  EXPECT_EQ(m.allocator().ref_count(6), 1);
  m.check_invariants();
}

TEST(HybridPrefix, MissingSinkBlockBoundsTheHit) {
  // Window 4 with 4 sinks, groups {window, full}. The sink block's key sits on the block the
  // sequence had before a swap; swap-in gives fresh blocks (not published again), the later
  // blocks are published on them, then the old sink block is evicted: every h >= 4 needs
  // window entry 0, so nothing hits although the full group and window entries 1..3 are cached.
  HybridKVCacheManager m = make(20, {window(4, 4), full()}, 10);
  ASSERT_TRUE(m.add_sequence(1, kPrompt));  // window {1..5}, full {6..10}, free {11..19}
  EXPECT_EQ(m.commit(1, 4), 2);             // blocks 1 and 6
  ASSERT_TRUE(m.swap_out(1));
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(1, 6));
  ASSERT_TRUE(m.swap_in(1));
  EXPECT_THAT(table(m, 1, 0), ElementsAre(11, 12, 13, 14, 15));
  EXPECT_THAT(table(m, 1, 1), ElementsAre(16, 17, 18, 19, 5));
  EXPECT_EQ(m.commit(1, 17), 6);  // entries 1..3 of both groups, chained on block 6's entry
  EXPECT_EQ(m.lookup_prefix(kPrompt).num_computed_tokens, 16);
  ASSERT_TRUE(m.add_sequence(2, ids(300, 13)));  // 8 blocks: the 7 free ones, then evicts 1
  EXPECT_THAT(table(m, 2, 0), ElementsAre(10, 4, 9, 3));
  EXPECT_THAT(table(m, 2, 1), ElementsAre(8, 2, 7, 1));
  EXPECT_EQ(m.prefix_cache(0).entry(1), nullptr);
  const HybridPrefixLookup hit = m.lookup_prefix(kPrompt);
  EXPECT_EQ(hit.num_computed_tokens, 0);
  EXPECT_THAT(hit.blocks[0], ElementsAre());
  m.check_invariants();
}

TEST(HybridPrefix, CommitPublishesOnlyWrittenFullBlocks) {
  HybridKVCacheManager m = make(32, {full(), window(8)});
  ASSERT_TRUE(m.add_sequence(1, kPrompt));
  EXPECT_EQ(m.lookup_prefix(kPrompt).num_computed_tokens, 0) << "nothing before commit";
  EXPECT_EQ(m.commit(1, 7), 2);  // entry 0 of each group; positions 4..6 do not fill a block
  EXPECT_EQ(m.lookup_prefix(kPrompt).num_computed_tokens, 4);
  EXPECT_EQ(m.commit(1, 5), 0) << "commits are monotone";
  EXPECT_EQ(m.num_committed_tokens(1), 7);
  EXPECT_EQ(m.commit(1, 16), 6);
  EXPECT_EQ(m.commit(1, 17), 0) << "the partial last block is not published";
  EXPECT_TRUE(m.allocator().is_cached(4));
  EXPECT_FALSE(m.allocator().is_cached(5));
  EXPECT_ERROR(m.commit(1, 18), "commit: 18 tokens for sequence 1, which holds 17");
  EXPECT_ERROR(m.commit(9, 1), "commit: unknown sequence 9");
  // Unknown ids (append_slots) stop publishing.
  ASSERT_TRUE(m.add_sequence(2, ids(500, 3)));
  ASSERT_TRUE(m.append_slots(2, 5));
  EXPECT_EQ(m.commit(2, 8), 0);
  // A salt separates caches.
  EXPECT_EQ(m.lookup_prefix(kPrompt, 7).num_computed_tokens, 0);
  m.check_invariants();
}

TEST(HybridPrefix, PublishedLastBlockIsCopiedBeforeWriting) {
  HybridKVCacheManager m = make(32, {full(), window(8)});
  ASSERT_TRUE(m.add_sequence(1, kPrompt));
  EXPECT_EQ(m.commit(1, 17), 8);
  m.truncate(1, 14);  // entry 3 (published 4 and 9) is partial again
  EXPECT_EQ(m.num_committed_tokens(1), 14);
  const auto r = m.append_tokens(1, ids(900, 1));
  ASSERT_TRUE(r);
  EXPECT_THAT(r->copies, ElementsAre(BlockCopy{4, 11}, BlockCopy{9, 12}));
  EXPECT_THAT(r->copy_groups, ElementsAre(0, 1));
  EXPECT_THAT(table(m, 1, 0), ElementsAre(1, 2, 3, 11));
  EXPECT_TRUE(m.allocator().is_cached(4)) << "the published content stays findable";
  EXPECT_EQ(m.lookup_prefix(kPrompt).num_computed_tokens, 16);
  m.check_invariants();
}

TEST(HybridPrefix, PreemptThenReAddHitsItsOwnBlocks) {
  HybridKVCacheManager m = make(32, {full(), window(8)});
  ASSERT_TRUE(m.add_sequence(1, kPrompt, 7));
  EXPECT_EQ(m.commit(1, 17), 8);
  const PreemptedSequence p = m.preempt(1);
  EXPECT_EQ(p.seq, 1);
  EXPECT_EQ(p.num_tokens, 17);
  EXPECT_EQ(p.tokens, kPrompt);
  EXPECT_EQ(p.extra_key, 7u);
  EXPECT_FALSE(m.has_sequence(1));
  EXPECT_EQ(m.num_cached_blocks(), 8);
  EXPECT_EQ(m.num_free_blocks(), 31);
  EXPECT_EQ(m.lookup_prefix(p.tokens).num_computed_tokens, 0) << "salted";
  const auto again = m.add_sequence(1, p.tokens, p.extra_key);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->num_computed_tokens, 16);
  // Free list after the preemption: 11..31, then 5 and 10 (tail first); fresh blocks 11, 12.
  EXPECT_THAT(table(m, 1, 0), ElementsAre(1, 2, 3, 4, 11));
  EXPECT_THAT(table(m, 1, 1), ElementsAre(N, N, 8, 9, 12));
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(7, 6));
  EXPECT_THAT(again->append.slots[0], ElementsAre(44));
  EXPECT_THAT(again->append.slots[1], ElementsAre(48));
  m.check_invariants();
  EXPECT_ERROR(m.preempt(5), "preempt: unknown sequence 5");
}

TEST(HybridPrefix, SwapRoundTripKeepsEveryEntrysContent) {
  HybridKVCacheManager m = make(32, {full(), window(8)}, 8);
  ASSERT_TRUE(m.add_sequence(1, kPrompt));
  ASSERT_TRUE(m.append_tokens(1, ids(117, 1)));  // window entries 0, 1 (6, 7) freed
  const std::vector<BlockId> t0 = table(m, 1, 0);
  const std::vector<BlockId> t1 = table(m, 1, 1);
  EXPECT_THAT(t1, ElementsAre(N, N, 8, 9, 10));
  EXPECT_TRUE(m.can_swap_out(1));
  const auto out = m.swap_out(1);
  ASSERT_TRUE(out);
  EXPECT_THAT(out->copies,
              ElementsAre(BlockCopy{1, 1}, BlockCopy{2, 2}, BlockCopy{3, 3}, BlockCopy{4, 4},
                          BlockCopy{5, 5}, BlockCopy{8, 6}, BlockCopy{9, 7}, BlockCopy{10, 8}));
  EXPECT_THAT(out->copy_groups, ElementsAre(0, 0, 0, 0, 0, 1, 1, 1));
  EXPECT_TRUE(m.is_swapped(1));
  EXPECT_THAT(table(m, 1, 1), ElementsAre(N, N, 6, 7, 8)) << "host ids; null entries stay null";
  EXPECT_EQ(m.num_free_blocks(), 31);
  EXPECT_EQ(m.host_allocator()->num_free(), 0);
  m.check_invariants();
  EXPECT_ERROR((void)m.append_slots(1, 1), "append_slots: sequence 1 is swapped out");
  EXPECT_ERROR((void)m.batch_metadata(std::vector<SeqId>{1}), "sequence 1 is swapped out");
  const auto in = m.swap_in(1);
  ASSERT_TRUE(in);
  // Device free list after the swap-out: 11..31, 6, 7, then 5, 10, 4, 9, ... (tail first).
  EXPECT_THAT(in->copies,
              ElementsAre(BlockCopy{1, 11}, BlockCopy{2, 12}, BlockCopy{3, 13}, BlockCopy{4, 14},
                          BlockCopy{5, 15}, BlockCopy{6, 16}, BlockCopy{7, 17}, BlockCopy{8, 18}));
  EXPECT_THAT(in->copy_groups, ElementsAre(0, 0, 0, 0, 0, 1, 1, 1));
  // Composing the two copy lists maps every old entry to its new one.
  std::map<BlockId, BlockId> to_host;
  std::map<BlockId, BlockId> to_device;
  for (const BlockCopy& c : out->copies) to_host[c.src] = c.dst;
  for (const BlockCopy& c : in->copies) to_device[c.src] = c.dst;
  for (int32_t g = 0; g < 2; ++g) {
    const std::vector<BlockId>& old = g == 0 ? t0 : t1;
    const std::vector<BlockId> now = table(m, 1, g);
    for (size_t e = 0; e < old.size(); ++e) {
      EXPECT_EQ(now[e], old[e] == N ? N : to_device.at(to_host.at(old[e]))) << g << " " << e;
    }
  }
  EXPECT_FALSE(m.is_swapped(1));
  EXPECT_EQ(m.host_allocator()->num_free(), 8);
  ASSERT_TRUE(m.append_tokens(1, ids(118, 3)));
  m.check_invariants();
}

TEST(HybridPrefix, ShortPoolsChangeNothing) {
  HybridKVCacheManager m = make(12, {full(), window(8)}, 4);
  ASSERT_TRUE(m.add_sequence(1, kPrompt));  // 10 of 11 usable blocks
  EXPECT_EQ(m.commit(1, 17), 8);
  // Host pool short: 10 live entries, 4 host blocks.
  EXPECT_FALSE(m.can_swap_out(1));
  std::string before = state(m);
  EXPECT_FALSE(m.swap_out(1));
  EXPECT_EQ(state(m), before);
  // Device pool short for an add and a swap-in.
  EXPECT_EQ(m.can_add_sequence(ids(300, 5)), Admission::kLater);
  EXPECT_EQ(m.can_add_sequence(ids(300, 24)), Admission::kNever);  // 2 x 6 > 11 blocks
  before = state(m);
  EXPECT_FALSE(m.add_sequence(2, ids(300, 5)));
  EXPECT_EQ(state(m), before);
  m.free_sequence(1);
  ASSERT_TRUE(m.add_sequence(2, ids(300, 5)));  // 4 blocks
  m.truncate(2, 4);                             // 2 live entries
  ASSERT_TRUE(m.swap_out(2));
  ASSERT_TRUE(m.add_sequence(3, ids(400, 20)));  // 10 of the 11 usable blocks
  EXPECT_FALSE(m.can_swap_in(2));
  before = state(m);
  EXPECT_FALSE(m.swap_in(2));
  EXPECT_EQ(state(m), before);
  m.free_sequence(2);  // a swapped sequence gives its host blocks back
  EXPECT_EQ(m.host_allocator()->num_free(), 4);
  m.check_invariants();
}

TEST(HybridPrefix, ErrorsNameTheValue) {
  HybridKVCacheManager m = make(16, {full(), window(8)}, 2);
  ASSERT_TRUE(m.add_sequence(1, kPrompt));
  EXPECT_ERROR((void)m.add_sequence(1, kPrompt), "add_sequence: sequence 1 already exists");
  EXPECT_ERROR((void)m.swap_in(1), "swap_in: sequence 1 is not swapped out");
  EXPECT_ERROR((void)m.can_swap_out(4), "can_swap_out: unknown sequence 4");
  EXPECT_ERROR((void)m.prefix_cache(2), "prefix_cache: group 2 not in [0, 2)");
  EXPECT_ERROR(HybridKVCacheManager(
                   {.num_blocks = 8, .block_size = 4, .groups = {full()}, .num_host_blocks = -1}),
               "num_host_blocks must be in [0, 2^30), got -1");
  HybridKVCacheManager off({.num_blocks = 16, .block_size = 4, .groups = {full()}});
  ASSERT_TRUE(off.add_sequence(1, kPrompt));
  EXPECT_EQ(off.commit(1, 17), 0) << "prefix caching off";
  EXPECT_FALSE(off.can_swap_out(1)) << "no host pool";
  EXPECT_FALSE(off.swap_out(1));
}

}  // namespace
}  // namespace pagedkv
