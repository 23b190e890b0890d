// Tests for include/pagedkv/prefix_cache.hpp and the manager's automatic prefix caching: exact
// block ids and hit counts on hand-worked prompts, content confirmation on key collisions,
// LRU eviction order (tail blocks first), events, reset, and the boundary lengths at match time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

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

// add_sequence followed by the prefill's forward step: every prompt token is written, so its
// full blocks are published (commit).
std::optional<AddResult> add_written(KVCacheManager& m, SeqId seq, std::span<const TokenId> prompt,
                                     uint64_t extra_key = 0) {
  std::optional<AddResult> r = m.add_sequence(seq, prompt, extra_key);
  if (r) m.commit(seq, m.num_tokens(seq));
  return r;
}

KVCacheManagerConfig cached_config(int32_t num_blocks, int32_t block_size) {
  return {.num_blocks = num_blocks, .block_size = block_size, .enable_prefix_caching = true};
}

TEST(BlockHash, DeterministicAndChained) {
  const std::vector<TokenId> a{1, 2, 3, 4};
  const std::vector<TokenId> b{5, 6, 7, 8};
  const BlockHash ha = block_hash(kRootBlockHash, a, 0);
  EXPECT_EQ(ha, block_hash(kRootBlockHash, a, 0));
  EXPECT_NE(ha, block_hash(kRootBlockHash, b, 0));
  EXPECT_NE(ha, block_hash(kRootBlockHash, a, 7));                    // extra key separates caches
  EXPECT_NE(block_hash(ha, b, 0), block_hash(kRootBlockHash, b, 0));  // depends on the prefix
  // Order of tokens matters.
  EXPECT_NE(ha, block_hash(kRootBlockHash, std::vector<TokenId>{4, 3, 2, 1}, 0));
}

TEST(PrefixCache, ConstructorRejectsAnEmptyPoolOrBlock) {
  EXPECT_THAT([] { PrefixCache(0, 4); },
              ThrowsMessage<Error>(HasSubstr("PrefixCache: num_blocks must be >= 1, got 0")));
  EXPECT_THAT([] { PrefixCache(4, 0); },
              ThrowsMessage<Error>(HasSubstr("PrefixCache: block_size must be >= 1, got 0")));
  EXPECT_NO_THROW(PrefixCache(1, 1));
}

TEST(PrefixCache, LookupConfirmsContentOnKeyMatch) {
  PrefixCache c(4, 2);
  const std::vector<TokenId> t{10, 11};
  const uint64_t s = c.insert(3, {.hash = 42, .parent_hash = kRootBlockHash}, t);
  EXPECT_GE(s, 1u);
  EXPECT_EQ(c.lookup(42, 0, 0, t), std::optional<BlockId>(3));
  // Same key, different content: a collision must be a miss, never a wrong share.
  EXPECT_EQ(c.lookup(42, 0, 0, std::vector<TokenId>{10, 12}), std::nullopt);
  EXPECT_EQ(c.lookup(42, 0, 1, t), std::nullopt);   // other extra key
  EXPECT_EQ(c.lookup(42, 99, 0, t), std::nullopt);  // other parent entry
  EXPECT_EQ(c.lookup(43, 0, 0, t), std::nullopt);
  EXPECT_EQ(c.size(), 1);
  EXPECT_THAT([&] { c.insert(1, {.hash = 42}, t); },
              ThrowsMessage<Error>(HasSubstr("already registered")));
  EXPECT_THAT([&] { c.insert(3, {.hash = 7}, t); },
              ThrowsMessage<Error>(HasSubstr("block 3 already registered")));
  EXPECT_THAT([&] { c.insert(1, {.hash = 7}, std::vector<TokenId>{1}); },
              ThrowsMessage<Error>(HasSubstr("1 tokens, expected a full block of 2")));
  EXPECT_THAT([&] { (void)c.entry(4); },
              ThrowsMessage<Error>(HasSubstr("block id 4 out of range")));
  auto e = c.erase(3);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->serial, s);
  EXPECT_EQ(c.lookup(42, 0, 0, t), std::nullopt);
  EXPECT_EQ(c.erase(3), std::nullopt);
  // Serials are never reused.
  EXPECT_GT(c.insert(3, {.hash = 42}, t), s);
}

TEST(PrefixCache, WorkedExampleOfTheHeader) {
  PrefixCache c(4, 2);
  EXPECT_EQ(c.insert(3, {.hash = 42, .parent_hash = kRootBlockHash}, std::vector<TokenId>{10, 11}),
            1u);
  EXPECT_EQ(c.lookup(42, 0, 0, std::vector<TokenId>{10, 11}), std::optional<BlockId>(3));
  EXPECT_EQ(c.lookup(42, 0, 0, std::vector<TokenId>{10, 12}), std::nullopt);
  EXPECT_THAT(c.tokens(3), ElementsAre(10, 11));
  EXPECT_THAT(c.tokens(2), IsEmpty());
  const std::optional<PrefixCache::Entry> e = c.erase(3);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->serial, 1u);
  EXPECT_EQ(e->hash, 42u);
  EXPECT_EQ(e->parent_hash, kRootBlockHash);
  EXPECT_EQ(c.entry(3), nullptr);
  EXPECT_THAT(c.tokens(3), IsEmpty());
  EXPECT_THAT([&] { (void)c.tokens(4); },
              ThrowsMessage<Error>(HasSubstr("PrefixCache::tokens: block id 4 out of range")));
  c.check_invariants();
}

TEST(PrefixCache, RecordsGrowToTheHighestBlockAndKeepEveryEntry) {
  // The records and token rows cover block ids up to the highest registered one: a low block
  // first (64 records), then one past that (grown), then the last block of the pool (capped at
  // num_blocks). Every entry, link and token row must survive each growth.
  PrefixCache c(1000, 3);
  const std::vector<TokenId> t0{1, 2, 3}, t1{4, 5, 6}, t2{7, 8, 9};
  const uint64_t s0 = c.insert(5, {.hash = 100, .parent_hash = kRootBlockHash}, t0);
  const uint64_t s1 =
      c.insert(70, {.hash = 200, .parent_hash = 100, .parent_serial = s0, .extra_key = 9}, t1);
  const uint64_t s2 = c.insert(999, {.hash = 300, .parent_hash = 200, .parent_serial = s1}, t2);
  EXPECT_EQ(std::vector<uint64_t>({s0, s1, s2}), std::vector<uint64_t>({1, 2, 3}));
  EXPECT_THAT(c.tokens(5), ElementsAre(1, 2, 3));
  EXPECT_THAT(c.tokens(70), ElementsAre(4, 5, 6));
  EXPECT_THAT(c.tokens(999), ElementsAre(7, 8, 9));
  EXPECT_EQ(c.lookup(200, s0, 9, t1), std::optional<BlockId>(70));
  EXPECT_EQ(c.lookup(300, s1, 0, t2), std::optional<BlockId>(999));
  std::vector<BlockId> kids;
  c.children(5, kids);
  c.children(70, kids);
  EXPECT_THAT(kids, ElementsAre(70, 999));
  EXPECT_EQ(c.entry(998), nullptr);
  EXPECT_EQ(c.size(), 3);
  c.check_invariants();
  // A failed insert (block already registered, key taken, short block) changes nothing.
  EXPECT_THROW(c.insert(70, {.hash = 400}, t0), Error);
  EXPECT_THROW(c.insert(6, {.hash = 300}, t0), Error);
  EXPECT_THROW(c.insert(6, {.hash = 400}, std::vector<TokenId>{1, 2}), Error);
  EXPECT_EQ(c.size(), 3);
  EXPECT_EQ(c.entry(6), nullptr);
  EXPECT_EQ(c.insert(6, {.hash = 400}, t0), 4u);  // the next serial was not used up
  // Erasing the middle entry detaches its child; the first entry's child list empties.
  ASSERT_TRUE(c.erase(70));
  kids.clear();
  c.children(5, kids);
  EXPECT_THAT(kids, IsEmpty());
  EXPECT_EQ(c.lookup(300, s1, 0, t2), std::optional<BlockId>(999));  // still registered
  c.check_invariants();
}

TEST(PrefixCache, BlockZeroIsAChildLikeAnyOther) {
  // Block ids start at 0: a child in block 0 is listed, unlinked and detached like any other.
  PrefixCache c(4, 1);
  const uint64_t sp = c.insert(3, {.hash = 10}, std::vector<TokenId>{1});
  (void)c.insert(0, {.hash = 20, .parent_hash = 10, .parent_serial = sp}, std::vector<TokenId>{2});
  (void)c.insert(2, {.hash = 30, .parent_hash = 10, .parent_serial = sp}, std::vector<TokenId>{3});
  std::vector<BlockId> kids;
  c.children(3, kids);
  EXPECT_THAT(kids, ::testing::UnorderedElementsAre(0, 2));
  c.check_invariants();
  ASSERT_TRUE(c.erase(0));
  kids.clear();
  c.children(3, kids);
  EXPECT_THAT(kids, ElementsAre(2));
  c.check_invariants();
  (void)c.insert(0, {.hash = 40, .parent_hash = 10, .parent_serial = sp}, std::vector<TokenId>{4});
  ASSERT_TRUE(c.erase(3));  // both children lose their parent link
  c.check_invariants();
  kids.clear();
  c.children(0, kids);
  c.children(2, kids);
  EXPECT_THAT(kids, IsEmpty());
}

TEST(PrefixCache, PrefetchEraseChangesNothing) {
  PrefixCache empty(8, 2);
  empty.prefetch_erase(std::vector<BlockId>{-1, 0, 7, 8});  // nothing allocated yet
  EXPECT_EQ(empty.size(), 0);
  PrefixCache c(8, 2);
  const std::vector<TokenId> t{5, 6};
  (void)c.insert(2, {.hash = 77}, t);
  c.prefetch_erase(std::vector<BlockId>{-3, 2, 3, 8, 1000});
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(c.find(77), std::optional<BlockId>(2));
  EXPECT_THAT(c.tokens(2), ElementsAre(5, 6));
  c.check_invariants();
}

TEST(PrefixCache, EraseDetachesChildrenSoAReusedParentBlockKeepsItsNewChildren) {
  // Block 1 holds A and block 2 its child B. Erasing A must detach B: block 1 then holds a new
  // first block C with child D in block 3, and erasing B (no parent any more) must leave C's
  // child list {3}. A stale link from B to block 1 would unlink B from C's list and lose D.
  PrefixCache c(4, 2);
  const std::vector<TokenId> ta{1, 2}, tb{3, 4}, tc{5, 6}, td{7, 8};
  const BlockHash ha = block_hash(kRootBlockHash, ta, 0);
  const uint64_t sa = c.insert(1, {.hash = ha, .parent_hash = kRootBlockHash}, ta);
  c.insert(2, {.hash = block_hash(ha, tb, 0), .parent_hash = ha, .parent_serial = sa}, tb);
  std::vector<BlockId> kids;
  c.children(1, kids);
  ASSERT_THAT(kids, ElementsAre(2));
  ASSERT_TRUE(c.erase(1));
  c.check_invariants();  // block 2 names no parent any more
  const BlockHash hc = block_hash(kRootBlockHash, tc, 0);
  const uint64_t sc = c.insert(1, {.hash = hc, .parent_hash = kRootBlockHash}, tc);
  c.insert(3, {.hash = block_hash(hc, td, 0), .parent_hash = hc, .parent_serial = sc}, td);
  ASSERT_TRUE(c.erase(2));
  kids.clear();
  c.children(1, kids);
  EXPECT_THAT(kids, ElementsAre(3));
  kids.clear();
  c.children(2, kids);
  EXPECT_THAT(kids, IsEmpty());
}

TEST(PrefixCache, RandomInsertEraseMatchesAMapModel) {
  // The key index is open addressing with backward-shift erase and entries are kept dense by
  // moving the last one into a freed place; a std::map model checks every key and block after
  // each step. Keys come from a small set with patterned values (multiples of 2^32, small
  // integers), so probe runs collide, wrap around and grow the table.
  constexpr int32_t kBlocks = 300;
  PrefixCache c(kBlocks, 1);
  std::map<BlockId, BlockHash> model;  // block -> key
  std::mt19937_64 rng(17);
  auto key_of = [](uint64_t k) { return k % 2 == 0 ? (k << 32) : k; };
  for (int step = 0; step < 20000; ++step) {
    const auto block = static_cast<BlockId>(rng() % kBlocks);
    const BlockHash key = key_of(rng() % 400);
    const TokenId token = static_cast<TokenId>(key % 1000);
    if (rng() % 2 == 0) {
      const bool key_taken =
          std::any_of(model.begin(), model.end(), [&](const auto& kv) { return kv.second == key; });
      if (model.contains(block) || key_taken) continue;
      (void)c.insert(block, {.hash = key}, std::vector<TokenId>{token});
      model[block] = key;
    } else {
      const std::optional<PrefixCache::Entry> e = c.erase(block);
      ASSERT_EQ(e.has_value(), model.contains(block)) << "step " << step;
      if (e) {
        EXPECT_EQ(e->hash, model[block]);
        model.erase(block);
      }
    }
    ASSERT_EQ(c.size(), static_cast<int32_t>(model.size()));
    if (step % 97 != 0) continue;  // the full sweep below is O(kBlocks)
    for (BlockId b = 0; b < kBlocks; ++b) {
      const PrefixCache::Entry* e = c.entry(b);
      ASSERT_EQ(e != nullptr, model.contains(b)) << "block " << b << " step " << step;
      if (e == nullptr) continue;
      ASSERT_EQ(e->hash, model[b]);
      ASSERT_EQ(c.find(e->hash), b);
      const TokenId t = static_cast<TokenId>(e->hash % 1000);
      ASSERT_EQ(c.lookup(e->hash, 0, 0, std::vector<TokenId>{t}), b);
    }
  }
  for (uint64_t k = 0; k < 400; ++k) {
    const bool present = std::any_of(model.begin(), model.end(),
                                     [&](const auto& kv) { return kv.second == key_of(k); });
    EXPECT_EQ(c.find(key_of(k)).has_value(), present) << "key " << key_of(k);
  }
}

TEST(PrefixCache, KeysSharingOneHomeCellMatchAMapModel) {
  // Keys built so that every one lands in the same home cell of the key index (or in the last
  // cell, so probe runs wrap around), whatever the table size: the worst case of linear probing
  // and of backward-shift erase. The index multiplies keys by the 64-bit Fibonacci constant and
  // keeps the top bits, so key = x * inverse(constant) has home x >> (64 - log2(capacity)):
  // x < 2^50 gives cell 0, x > 2^64 - 2^50 the last cell, for every capacity up to 2^14.
  constexpr uint64_t kFib = 0x9E3779B97F4A7C15ull;
  uint64_t inv = kFib;  // Newton's iteration for the inverse mod 2^64: correct bits double
  for (int i = 0; i < 6; ++i) inv *= 2 - kFib * inv;
  ASSERT_EQ(kFib * inv, 1u);
  constexpr int kKeys = 600;
  std::vector<BlockHash> keys;
  for (uint64_t i = 0; i < kKeys; ++i) {
    const uint64_t x = i % 2 == 0 ? i : ~uint64_t{0} - i;
    keys.push_back(x * inv);
  }
  constexpr int32_t kBlocks = 400;
  constexpr int32_t kBlockSize = 3;
  auto tokens_of = [](BlockHash key) {
    const auto t = static_cast<TokenId>(key & 0xFFFF);
    return std::vector<TokenId>{t, t + 1, t + 2};
  };
  PrefixCache c(kBlocks, kBlockSize);
  std::map<BlockId, size_t> model;  // block -> index into keys
  std::map<BlockId, uint64_t> serials;
  std::vector<bool> key_used(kKeys, false);
  uint64_t last_serial = 0;
  std::mt19937_64 rng(29);
  for (int step = 0; step < 6000; ++step) {
    const auto block = static_cast<BlockId>(rng() % kBlocks);
    // Grow towards a full pool first, then churn around half of it.
    const bool insert = step < 1500 ? rng() % 5 != 0 : rng() % 2 == 0;
    if (insert) {
      const size_t k = rng() % kKeys;
      if (model.contains(block) || key_used[k]) continue;
      const uint64_t serial = c.insert(
          block, {.hash = keys[k], .parent_serial = k, .extra_key = k % 3}, tokens_of(keys[k]));
      ASSERT_GT(serial, last_serial) << "serials must never repeat";
      last_serial = serial;
      model[block] = k;
      serials[block] = serial;
      key_used[k] = true;
    } else {
      const std::vector<TokenId> held(c.tokens(block).begin(), c.tokens(block).end());
      const std::optional<PrefixCache::Entry> e = c.erase(block);
      ASSERT_EQ(e.has_value(), model.contains(block)) << "step " << step;
      EXPECT_THAT(c.tokens(block), IsEmpty());
      if (e) {
        const size_t k = model[block];
        EXPECT_EQ(e->hash, keys[k]);
        EXPECT_EQ(e->serial, serials[block]);
        EXPECT_EQ(held, tokens_of(keys[k]));
        key_used[k] = false;
        model.erase(block);
        serials.erase(block);
      }
    }
    ASSERT_EQ(c.size(), static_cast<int32_t>(model.size()));
    if (step % 11 != 0) continue;
    for (size_t k = 0; k < kKeys; ++k) {
      const std::optional<BlockId> found = c.find(keys[k]);
      ASSERT_EQ(found.has_value(), static_cast<bool>(key_used[k]))
          << "key " << k << " step " << step;
      if (!found) continue;
      ASSERT_EQ(model.at(*found), k);
      ASSERT_EQ(c.lookup(keys[k], k, k % 3, tokens_of(keys[k])), found);
      ASSERT_EQ(c.lookup(keys[k], k + 1, k % 3, tokens_of(keys[k])), std::nullopt);
      const PrefixCache::Entry* e = c.entry(*found);
      ASSERT_NE(e, nullptr);
      ASSERT_EQ(e->serial, serials.at(*found));
      ASSERT_EQ(e->parent_serial, k);
    }
  }
}

TEST(KVCacheManagerPrefix, HandWorkedHitsAndComputedTokens) {
  KVCacheManager m(cached_config(10, 4));
  const auto p1 = iota_tokens(10);  // blocks [1..4] [5..8] [9 10]
  auto r = add_written(m, 1, p1);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 0);
  EXPECT_THAT(r->append.slots, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1, 2));
  EXPECT_TRUE(m.allocator().is_cached(0));
  EXPECT_TRUE(m.allocator().is_cached(1));
  EXPECT_FALSE(m.allocator().is_cached(2));  // partial blocks are never keyed

  // Same first 8 tokens: both full blocks hit.
  std::vector<TokenId> p2 = iota_tokens(8);
  p2.push_back(20);
  p2.push_back(21);
  EXPECT_EQ(m.can_add_sequence(p2), Admission::kOk);
  r = add_written(m, 2, p2);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 8);
  EXPECT_THAT(r->append.slots, ElementsAre(12, 13));
  EXPECT_THAT(r->append.copies, IsEmpty());
  EXPECT_THAT(table_of(m, 2), ElementsAre(0, 1, 3));
  EXPECT_EQ(m.allocator().ref_count(0), 2);

  // A prompt of exactly 2 blocks: only 1 block may hit, one token is always left to compute;
  // the last block is recomputed into a fresh block (same content as block 1: not registered
  // twice).
  r = add_written(m, 3, iota_tokens(8));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 4);
  EXPECT_THAT(table_of(m, 3), ElementsAre(0, 4));
  EXPECT_FALSE(m.allocator().is_cached(4));

  const KVCacheStats st = m.stats();
  EXPECT_EQ(st.prefix_query_tokens, 28);
  EXPECT_EQ(st.prefix_hit_tokens, 12);
  EXPECT_EQ(st.prefix_hits, 3);
  EXPECT_EQ(st.prefix_misses, 2 + 0 + 0);  // first prompt: 2 eligible blocks, both missed
  EXPECT_DOUBLE_EQ(st.prefix_hit_rate(), 12.0 / 28.0);
  EXPECT_EQ(st.prefix_cached_entries, 2);
  m.check_invariants();
}

TEST(KVCacheManagerPrefix, BoundaryLengthsAtMatchTime) {
  // block_size 4; a cached chain of 3 full blocks (12 tokens + 1).
  const int32_t bs = 4;
  for (int len : {0, 1, bs - 1, bs, bs + 1, 2 * bs, 3 * bs, 3 * bs + 1}) {
    KVCacheManager m(cached_config(16, bs));
    ASSERT_TRUE(add_written(m, 1, iota_tokens(3 * bs + 1)));
    auto r = add_written(m, 2, iota_tokens(len));
    ASSERT_TRUE(r) << "len " << len;
    // At most (len - 1) / bs blocks hit.
    const int64_t expect_hits = len == 0 ? 0 : std::min<int64_t>((len - 1) / bs, 3);
    EXPECT_EQ(r->num_computed_tokens, expect_hits * bs) << "len " << len;
    EXPECT_EQ(static_cast<int64_t>(r->append.slots.size()), len - expect_hits * bs);
    EXPECT_EQ(m.num_tokens(2), len);
    EXPECT_EQ(static_cast<int64_t>(m.block_table(2).size()), blocks_for_tokens(len, bs));
    m.check_invariants();
    m.free_sequence(1);
    m.free_sequence(2);
    EXPECT_EQ(m.num_free_blocks(), 16);
    m.check_invariants();
  }
}

TEST(KVCacheManagerPrefix, ExtraKeySeparatesCaches) {
  KVCacheManager m(cached_config(8, 2));
  ASSERT_TRUE(add_written(m, 1, iota_tokens(5), /*extra_key=*/7));
  auto r = add_written(m, 2, iota_tokens(5), /*extra_key=*/8);
  EXPECT_EQ(r->num_computed_tokens, 0);
  r = add_written(m, 3, iota_tokens(5), 7);
  EXPECT_EQ(r->num_computed_tokens, 4);
  m.check_invariants();
}

TEST(KVCacheManagerPrefix, DifferentEarlierBlockMeansNoLaterHit) {
  // Block 2 holds the same tokens in both prompts, but its prefix differs: the chained key
  // (and the parent check) must not share it.
  KVCacheManager m(cached_config(8, 2));
  ASSERT_TRUE(add_written(m, 1, std::vector<TokenId>{1, 2, 3, 4, 9}));
  auto r = add_written(m, 2, std::vector<TokenId>{7, 7, 3, 4, 9});
  EXPECT_EQ(r->num_computed_tokens, 0);
  m.check_invariants();
}

TEST(KVCacheManagerPrefix, AppendTokensKeysBlocksAsTheyFill) {
  KVCacheManager m(cached_config(8, 2));
  ASSERT_TRUE(add_written(m, 1, std::vector<TokenId>{1, 2, 3}));  // blocks 0 (full), 1
  EXPECT_FALSE(m.allocator().is_cached(1));
  ASSERT_TRUE(m.append_tokens(1, std::vector<TokenId>{4}));  // block 1 is now full
  EXPECT_FALSE(m.allocator().is_cached(1));                  // but not written yet
  EXPECT_EQ(m.commit(1, 4), 1);                              // written: keyed
  EXPECT_TRUE(m.allocator().is_cached(1));
  m.free_sequence(1);
  EXPECT_EQ(m.stats().cached_blocks, 2);
  auto r = add_written(m, 2, std::vector<TokenId>{1, 2, 3, 4, 5});
  EXPECT_EQ(r->num_computed_tokens, 4);
  // Tokens appended without ids stop the keying.
  ASSERT_TRUE(m.append_slots(2, 1));  // position 5 fills block 2 with an unknown token
  EXPECT_FALSE(m.allocator().is_cached(table_of(m, 2)[2]));
  m.check_invariants();
}

TEST(KVCacheManagerPrefix, LruEvictsTailBlocksFirstOnlyWhenNoFreeBlockIsLeft) {
  KVCacheManager m(
      {.num_blocks = 4, .block_size = 2, .enable_prefix_caching = true, .enable_events = true});
  ASSERT_TRUE(add_written(m, 1, iota_tokens(7)));  // blocks 0,1,2 full+keyed, 3 partial
  EXPECT_THAT(table_of(m, 1), ElementsAre(0, 1, 2, 3));
  auto ev = m.take_events();
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].kind, KVCacheEvent::Kind::kStored);
  EXPECT_EQ(ev[0].block, 0);
  EXPECT_EQ(ev[0].parent_hash, kRootBlockHash);
  EXPECT_THAT(ev[0].tokens, ElementsAre(1, 2));
  EXPECT_EQ(ev[1].parent_hash, ev[0].hash);
  m.free_sequence(1);  // releases 3 (free), then 2, 1, 0 into the LRU in that order
  EXPECT_THAT(m.allocator().cached_lru(), ElementsAre(2, 1, 0));
  EXPECT_THAT(m.allocator().free_list(), ElementsAre(3));
  // A new, unrelated sequence takes the free block first, then evicts the tail block 2.
  m.add_sequence(9);
  auto r = m.append_slots(9, 4);
  ASSERT_TRUE(r);
  EXPECT_THAT(table_of(m, 9), ElementsAre(3, 2));
  KVCacheStats st = m.stats();
  EXPECT_EQ(st.prefix_evictions, 1);
  EXPECT_EQ(st.cached_blocks, 2);
  ev = m.take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KVCacheEvent::Kind::kEvicted);
  EXPECT_EQ(ev[0].block, 2);
  // The head of the prompt is still shareable: blocks 0 and 1 hit, the evicted one does not.
  m.free_sequence(9);
  auto again = add_written(m, 1, iota_tokens(7));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->num_computed_tokens, 4);
  EXPECT_EQ(m.block_table(1)[0], 0);
  EXPECT_EQ(m.block_table(1)[1], 1);
  EXPECT_EQ(m.stats().prefix_hits, 2);
  m.check_invariants();
}

// A reset of an empty prefix cache still says so (vLLM emits AllBlocksCleared on every
// successful reset); without enable_events it logs nothing.
TEST(KVCacheManagerPrefix, ResetOfAnEmptyCacheEmitsOnlyAllCleared) {
  KVCacheManager m(
      {.num_blocks = 4, .block_size = 2, .enable_prefix_caching = true, .enable_events = true});
  EXPECT_EQ(m.reset_prefix_cache(), 0);
  const std::vector<KVCacheEvent> ev = m.take_events();
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, KVCacheEvent::Kind::kAllCleared);
  EXPECT_EQ(event_kind_name(ev[0].kind), "all_cleared");
  EXPECT_EQ(event_kind_name(KVCacheEvent::Kind::kRemoved), "removed");
  KVCacheManager quiet({.num_blocks = 4, .block_size = 2, .enable_prefix_caching = true});
  ASSERT_TRUE(add_written(quiet, 1, iota_tokens(4)));
  EXPECT_EQ(quiet.reset_prefix_cache(), 2);
  EXPECT_TRUE(quiet.take_events().empty());
}

TEST(KVCacheManagerPrefix, ResetPrefixCacheDropsEveryRegistration) {
  KVCacheManager m(
      {.num_blocks = 6, .block_size = 2, .enable_prefix_caching = true, .enable_events = true});
  ASSERT_TRUE(add_written(m, 1, iota_tokens(4)));
  ASSERT_TRUE(add_written(m, 2, iota_tokens(4, 50)));
  m.free_sequence(2);  // its 2 blocks stay cached
  const std::vector<KVCacheEvent> stored = m.take_events();
  ASSERT_EQ(stored.size(), 4u);
  EXPECT_EQ(m.stats().cached_blocks, 2);
  EXPECT_EQ(m.reset_prefix_cache(), 4);
  const KVCacheStats st = m.stats();
  EXPECT_EQ(st.cached_blocks, 0);
  EXPECT_EQ(st.free_blocks, 4);
  EXPECT_EQ(st.used_blocks, 2);  // sequence 1 keeps its blocks, unshareable now
  EXPECT_EQ(st.prefix_cached_entries, 0);
  // One kRemoved per entry in block order (blocks 0, 1 of sequence 1, 2, 3 of sequence 2),
  // each with the hash its kStored carried, then one kAllCleared naming no block.
  auto ev = m.take_events();
  ASSERT_EQ(ev.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ev[i].kind, KVCacheEvent::Kind::kRemoved) << i;
    EXPECT_EQ(ev[i].block, static_cast<BlockId>(i));
    EXPECT_EQ(stored[i].block, static_cast<BlockId>(i));
    EXPECT_EQ(ev[i].hash, stored[i].hash) << i;
  }
  EXPECT_EQ(ev[4].kind, KVCacheEvent::Kind::kAllCleared);
  EXPECT_EQ(ev[4].block, -1);
  EXPECT_EQ(ev[4].hash, BlockHash{0});
  EXPECT_TRUE(ev[4].tokens.empty());
  auto r = add_written(m, 3, iota_tokens(5));
  EXPECT_EQ(r->num_computed_tokens, 0);
  m.check_invariants();
  m.free_sequence(1);
  m.free_sequence(3);
  m.check_invariants();
}

TEST(KVCacheManagerPrefix, EventsOffByDefault) {
  KVCacheManager m(cached_config(4, 2));
  ASSERT_TRUE(add_written(m, 1, iota_tokens(4)));
  EXPECT_THAT(m.take_events(), IsEmpty());
}

TEST(KVCacheManagerPrefix, HitOnCachedRefZeroBlocksCountsAgainstAdmission) {
  // 3 blocks, bs 2. Cache a 2-block prefix, free it: both blocks cached, 1 free.
  KVCacheManager m(cached_config(3, 2));
  ASSERT_TRUE(add_written(m, 1, iota_tokens(4)));
  m.free_sequence(1);
  EXPECT_EQ(m.num_free_blocks(), 3);
  // 5 tokens = 3 blocks; the first 2 hit (cached, ref 0), 1 new: fits exactly.
  EXPECT_EQ(m.can_add_sequence(iota_tokens(5)), Admission::kOk);
  // 6 tokens = 3 blocks, but only 2 may hit ((6-1)/2 = 2) -> 1 new: fits.
  EXPECT_EQ(m.can_add_sequence(iota_tokens(6)), Admission::kOk);
  // 7 tokens = 4 blocks > pool: never.
  EXPECT_EQ(m.can_add_sequence(iota_tokens(7)), Admission::kNever);
  auto r = add_written(m, 2, iota_tokens(5));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 4);
  EXPECT_EQ(m.num_free_blocks(), 0);
  m.check_invariants();
}

TEST(KVCacheManagerPrefix, PreemptRecomputeHitsItsOwnBlocks) {
  KVCacheManager m(cached_config(8, 2));
  ASSERT_TRUE(add_written(m, 1, iota_tokens(5)));
  ASSERT_TRUE(m.append_tokens(1, std::vector<TokenId>{6, 7}));
  m.commit(1, 7);
  PreemptedSequence p = m.preempt(1);
  EXPECT_EQ(p.seq, 1);
  EXPECT_EQ(p.num_tokens, 7);
  EXPECT_THAT(p.tokens, ElementsAre(1, 2, 3, 4, 5, 6, 7));
  EXPECT_FALSE(m.has_sequence(1));
  EXPECT_EQ(m.stats().preemptions, 1);
  auto r = add_written(m, 1, p.tokens, p.extra_key);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 6);  // 3 full blocks kept cached
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
