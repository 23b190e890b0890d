// Tests for include/pagedkv/block_allocator.hpp: exact ids on hand-worked sequences, reference
// counts, the cached/LRU state, conservation after every step, and every documented error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <random>
#include <set>

#include "pagedkv/error.hpp"
#include "pagedkv/metadata/block_allocator.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void expect_conserved(const BlockAllocator& a) {
  EXPECT_EQ(a.num_free() + a.num_used() + a.num_cached(), a.num_blocks());
  EXPECT_EQ(static_cast<int32_t>(a.free_list().size()), a.num_free());
  EXPECT_EQ(static_cast<int32_t>(a.cached_lru().size()), a.num_cached());
}

#define EXPECT_ERROR(stmt, needle) \
  EXPECT_THAT([&] { stmt; }, ::testing::ThrowsMessage<Error>(HasSubstr(needle)))

TEST(BlockAllocator, ReleaseTableGoesLastEntryFirstAndSkipsEmptyEntries) {
  // Blocks 0..5; a table {0, 1, -1, 2, 3} where 1 and 3 are cached and 2 is shared (ref 2):
  // released 3, 2, 1, 0, so 3 then 1 join the LRU, 0 the free list, and 2 stays in use.
  BlockAllocator a(6);
  ASSERT_TRUE(a.allocate(6));
  for (BlockId b : {4, 5}) ASSERT_TRUE(a.release(b));
  a.retain(2);
  a.set_cached(1, true);
  a.set_cached(3, true);
  const std::vector<BlockId> table{0, 1, -1, 2, 3};
  EXPECT_EQ(a.release_table(table), 3);
  EXPECT_THAT(a.free_list(), ElementsAre(4, 5, 0));
  EXPECT_THAT(a.cached_lru(), ElementsAre(3, 1));
  EXPECT_EQ(a.ref_count(2), 1);
  EXPECT_EQ(a.num_used(), 1);
  EXPECT_EQ(a.release_table(std::vector<BlockId>{}), 0);
  expect_conserved(a);
  a.check_invariants();
}

TEST(BlockAllocator, FailedReleaseTableChangesNothing) {
  // {0, 1, 0}: released 0, 1, then 0 again (now free): the call throws and undoes both
  // releases, so the free list, the LRU and the ref counts are as before.
  BlockAllocator a(4);
  ASSERT_TRUE(a.allocate(3));
  a.set_cached(1, true);
  const std::vector<BlockId> free_before = a.free_list();
  EXPECT_ERROR(a.release_table(std::vector<BlockId>{0, 1, 0}),
               "BlockAllocator::release: block 0 is not allocated (double free?)");
  EXPECT_EQ(a.free_list(), free_before);
  EXPECT_TRUE(a.cached_lru().empty());
  EXPECT_EQ(a.ref_count(0), 1);
  EXPECT_EQ(a.ref_count(1), 1);
  EXPECT_TRUE(a.is_cached(1));
  a.check_invariants();
  EXPECT_ERROR(a.release_table(std::vector<BlockId>{4, 2}),
               "BlockAllocator::release: block id 4 out of range [0, 4)");
  // Far out of range: refused by the range check, never read as a ref count.
  EXPECT_ERROR(a.release_table(std::vector<BlockId>{1 << 28}),
               "BlockAllocator::release: block id 268435456 out of range [0, 4)");
  EXPECT_ERROR(a.release_table(std::vector<BlockId>{3, 2}),
               "BlockAllocator::release: block 3 is not allocated (double free?)");
  EXPECT_EQ(a.ref_count(2), 1);
  EXPECT_EQ(a.num_used(), 3);
  a.check_invariants();
}

TEST(BlockAllocator, HandWorkedSequenceGivesExactIds) {
  BlockAllocator a(3);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), 1);
  expect_conserved(a);
  EXPECT_TRUE(a.release(0));  // 0 goes to the tail of the free list
  EXPECT_THAT(a.free_list(), ElementsAre(2, 0));
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), std::nullopt);
  EXPECT_EQ(a.num_used(), 3);
  EXPECT_EQ(a.num_free(), 0);
  expect_conserved(a);
}

TEST(BlockAllocator, ExhaustionChangesNothing) {
  BlockAllocator a(4);
  auto first = a.allocate(3);
  ASSERT_TRUE(first);
  EXPECT_THAT(*first, ElementsAre(0, 1, 2));
  const auto free_before = a.free_list();
  EXPECT_EQ(a.allocate(2), std::nullopt);  // only one left: all or nothing
  EXPECT_EQ(a.free_list(), free_before);
  EXPECT_EQ(a.num_free(), 1);
  auto zero = a.allocate(0);
  ASSERT_TRUE(zero);
  EXPECT_TRUE(zero->empty());
  expect_conserved(a);
}

TEST(BlockAllocator, ReferenceCountsShareAndFreeOnLastRelease) {
  BlockAllocator a(2);
  const BlockId b = *a.allocate();
  a.retain(b);
  a.retain(b);
  EXPECT_EQ(a.ref_count(b), 3);
  EXPECT_FALSE(a.release(b));
  EXPECT_FALSE(a.release(b));
  EXPECT_EQ(a.num_used(), 1);
  EXPECT_TRUE(a.release(b));
  EXPECT_TRUE(a.is_free(b));
  EXPECT_EQ(a.num_free(), 2);
  expect_conserved(a);
}

TEST(BlockAllocator, CachedBlocksAreEvictedLruOnlyWhenNoFreeBlockIsLeft) {
  BlockAllocator a(3);
  std::vector<BlockId> evicted;
  auto ids = *a.allocate(2);  // {0, 1}
  a.set_cached(ids[0], true);
  a.set_cached(ids[1], true);
  a.release(ids[1]);  // released first: least recently used
  a.release(ids[0]);
  EXPECT_EQ(a.num_cached(), 2);
  EXPECT_THAT(a.cached_lru(), ElementsAre(1, 0));
  expect_conserved(a);
  EXPECT_EQ(a.allocate(evicted), 2);  // the free block goes first
  EXPECT_TRUE(evicted.empty());
  EXPECT_EQ(a.allocate(evicted), 1);  // then the LRU cached block, reported to the caller
  EXPECT_THAT(evicted, ElementsAre(1));
  EXPECT_FALSE(a.is_cached(1));
  // A prefix hit revives the remaining cached block instead of evicting it.
  a.retain(0);
  EXPECT_EQ(a.ref_count(0), 1);
  EXPECT_EQ(a.num_cached(), 0);
  EXPECT_EQ(a.allocate(evicted), std::nullopt);
  EXPECT_THAT(evicted, ElementsAre(1));
  expect_conserved(a);
}

TEST(BlockAllocator, DocWorkedExample) {
  BlockAllocator a(3);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), 1);
  EXPECT_TRUE(a.release(0));
  EXPECT_EQ(a.allocate(), 2);
  EXPECT_EQ(a.allocate(), 0);
  EXPECT_EQ(a.allocate(), std::nullopt);
  a.set_cached(2, true);
  EXPECT_TRUE(a.release(2));
  std::vector<BlockId> ev;
  EXPECT_EQ(a.allocate(ev), 2);
  EXPECT_THAT(ev, ElementsAre(2));
  expect_conserved(a);
}

TEST(BlockAllocator, AllocateManyReportsEveryEvictionInLruOrder) {
  BlockAllocator a(4);
  auto ids = *a.allocate(4);
  for (BlockId id : {2, 0, 3}) {
    a.set_cached(id, true);
    a.release(id);
  }
  std::vector<BlockId> evicted{7};  // earlier contents stay
  // Only 3 available: all or nothing, and the list is untouched on failure.
  EXPECT_EQ(a.allocate(4, evicted), std::nullopt);
  EXPECT_THAT(evicted, ElementsAre(7));
  EXPECT_EQ(a.num_cached(), 3);
  a.release(ids[1]);  // block 1 becomes free: it goes before any cached block
  const auto got = a.allocate(3, evicted);
  ASSERT_TRUE(got.has_value());
  EXPECT_THAT(*got, ElementsAre(1, 2, 0));
  EXPECT_THAT(evicted, ElementsAre(7, 2, 0));
  // Without a list the eviction happens all the same, unreported.
  EXPECT_EQ(a.allocate(), 3);
  EXPECT_EQ(a.num_cached(), 0);
  expect_conserved(a);
  // allocate(n) without a list: the free blocks first, then the LRU head, in that order.
  for (BlockId id : {3, 1}) {
    a.set_cached(id, true);
    a.release(id);
  }
  a.release(2);  // free (not cached)
  EXPECT_THAT(a.allocate(2), ::testing::Optional(ElementsAre(2, 3)));
  EXPECT_THAT(a.cached_lru(), ElementsAre(1));
  EXPECT_FALSE(a.is_cached(3));
  EXPECT_EQ(a.ref_count(3), 1);
  a.check_invariants();
}

TEST(BlockAllocator, EvictAllCachedAndUncache) {
  BlockAllocator a(3);
  auto ids = *a.allocate(3);
  for (BlockId id : ids) a.set_cached(id, true);
  a.release(0);
  a.release(1);
  a.set_cached(1, false);  // uncaching a ref-0 block frees it
  EXPECT_TRUE(a.is_free(1));
  EXPECT_THAT(a.evict_all_cached(), ElementsAre(0));
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.num_used(), 1);
  expect_conserved(a);
}

TEST(BlockAllocator, ShuffledFreeListStillHandsOutEachIdOnce) {
  BlockAllocator a(64);
  a.shuffle_free_list(7);
  std::set<BlockId> seen;
  std::vector<BlockId> order;
  while (auto id = a.allocate()) {
    EXPECT_TRUE(seen.insert(*id).second) << "id " << *id << " handed out twice";
    order.push_back(*id);
  }
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_FALSE(std::is_sorted(order.begin(), order.end()));
  expect_conserved(a);
}

TEST(BlockAllocator, RandomOperationsKeepInvariants) {
  BlockAllocator a(16);
  std::mt19937 rng(3);
  std::vector<int32_t> refs(16, 0);  // the model: expected ref count per block
  for (int step = 0; step < 5000; ++step) {
    const int op = rng() % 3;
    if (op == 0) {
      auto id = a.allocate();
      const bool any_free = std::count(refs.begin(), refs.end(), 0) > 0;
      ASSERT_EQ(id.has_value(), any_free);
      if (id) {
        ASSERT_EQ(refs[*id], 0) << "handed out a used block " << *id;
        refs[*id] = 1;
      }
    } else {
      std::vector<BlockId> used;
      for (BlockId b = 0; b < 16; ++b)
        if (refs[b] > 0) used.push_back(b);
      if (used.empty()) continue;
      const BlockId b = used[rng() % used.size()];
      if (op == 1) {
        a.retain(b);
        ++refs[b];
      } else {
        EXPECT_EQ(a.release(b), refs[b] == 1);
        --refs[b];
      }
    }
    for (BlockId b = 0; b < 16; ++b) ASSERT_EQ(a.ref_count(b), refs[b]);
    ASSERT_EQ(a.num_free() + a.num_used() + a.num_cached(), 16);
  }
}

TEST(BlockAllocator, FreeListStaysFifoAcrossManyWraparounds) {
  // The free list is a ring of ids: a std::deque models its exact order while blocks are
  // allocated, released, cached, uncached and evicted for many times the pool size.
  constexpr int32_t kBlocks = 8;
  BlockAllocator a(kBlocks);
  std::deque<BlockId> free_model{0, 1, 2, 3, 4, 5, 6, 7};
  std::deque<BlockId> lru_model;
  std::vector<BlockId> held;
  std::mt19937 rng(5);
  for (int step = 0; step < 4000; ++step) {
    const int op = rng() % 4;
    if (op <= 1) {
      const std::optional<BlockId> id = a.allocate();
      if (!free_model.empty()) {
        ASSERT_EQ(id, free_model.front());
        free_model.pop_front();
      } else if (!lru_model.empty()) {
        ASSERT_EQ(id, lru_model.front());  // evicted: the least recently released cached block
        lru_model.pop_front();
      } else {
        ASSERT_EQ(id, std::nullopt);
      }
      if (id) held.push_back(*id);
    } else if (op == 2 && !held.empty()) {
      const size_t i = rng() % held.size();
      const BlockId b = held[i];
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      if (rng() % 2 == 0) a.set_cached(b, true);
      ASSERT_TRUE(a.release(b));
      (a.is_cached(b) ? lru_model : free_model).push_back(b);
    } else if (op == 3 && !lru_model.empty()) {
      const BlockId b = lru_model[rng() % lru_model.size()];
      a.set_cached(b, false);  // uncached with ref 0: to the free list's tail
      lru_model.erase(std::find(lru_model.begin(), lru_model.end(), b));
      free_model.push_back(b);
    }
    ASSERT_EQ(a.free_list(), std::vector<BlockId>(free_model.begin(), free_model.end()))
        << "step " << step;
    ASSERT_EQ(a.cached_lru(), std::vector<BlockId>(lru_model.begin(), lru_model.end()))
        << "step " << step;
    expect_conserved(a);
  }
}

TEST(BlockAllocator, EveryOperationMatchesAQueueModel) {
  // The documented contract as a model: a FIFO free list, an LRU of cached ref-0 blocks (a
  // retain takes one out of the middle), ref counts and cached marks, under every public
  // mutator: allocate(), allocate(n) (all or nothing), retain, release, set_cached both ways
  // on used and cached blocks, evict_all_cached, and shuffle_free_list; checked after every
  // step, with the evictions each call reports.
  constexpr int32_t kBlocks = 13;
  BlockAllocator a(kBlocks);
  std::deque<BlockId> free_model;
  for (BlockId b = 0; b < kBlocks; ++b) free_model.push_back(b);
  std::deque<BlockId> lru_model;
  std::vector<int32_t> refs(kBlocks, 0);
  std::vector<bool> cached(kBlocks, false);
  std::vector<BlockId> evicted;
  std::mt19937 rng(23);
  auto pick = [&](auto pred) -> std::optional<BlockId> {
    std::vector<BlockId> ids;
    for (BlockId b = 0; b < kBlocks; ++b)
      if (pred(b)) ids.push_back(b);
    if (ids.empty()) return std::nullopt;
    return ids[rng() % ids.size()];
  };
  auto model_allocate = [&]() -> std::optional<BlockId> {
    BlockId b;
    if (!free_model.empty()) {
      b = free_model.front();
      free_model.pop_front();
    } else if (!lru_model.empty()) {
      b = lru_model.front();
      lru_model.pop_front();
      cached[b] = false;
    } else {
      return std::nullopt;
    }
    refs[b] = 1;
    return b;
  };
  for (int step = 0; step < 20000; ++step) {
    SCOPED_TRACE(step);
    const int op = static_cast<int>(rng() % 8);
    if (op == 0) {
      const bool evicts = free_model.empty() && !lru_model.empty();
      evicted.clear();
      const std::optional<BlockId> expect = model_allocate();
      ASSERT_EQ(a.allocate(evicted), expect);
      // An eviction hands out the LRU head, and reports it.
      ASSERT_EQ(evicted, evicts ? std::vector<BlockId>{*expect} : std::vector<BlockId>{});
    } else if (op == 1) {
      const auto n = static_cast<int32_t>(rng() % 5);
      const auto available = static_cast<int32_t>(free_model.size() + lru_model.size());
      const size_t free_before = free_model.size();
      evicted.clear();
      const std::optional<std::vector<BlockId>> got = a.allocate(n, evicted);
      if (n > available) {
        ASSERT_EQ(got, std::nullopt);
        ASSERT_TRUE(evicted.empty());
      } else {
        std::vector<BlockId> expect;
        for (int32_t i = 0; i < n; ++i) expect.push_back(*model_allocate());
        ASSERT_EQ(got, expect);
        // Free blocks come first; every block after them was evicted, in that order.
        const size_t first_evicted = std::min(free_before, expect.size());
        ASSERT_EQ(evicted, std::vector<BlockId>(expect.begin() + first_evicted, expect.end()));
      }
    } else if (op == 2) {  // retain a used block, or a cached ref-0 one (a prefix hit)
      const std::optional<BlockId> b = pick([&](BlockId x) { return refs[x] > 0 || cached[x]; });
      if (!b) continue;
      if (refs[*b] == 0) lru_model.erase(std::find(lru_model.begin(), lru_model.end(), *b));
      ++refs[*b];
      a.retain(*b);
    } else if (op == 3 || op == 4) {
      const std::optional<BlockId> b = pick([&](BlockId x) { return refs[x] > 0; });
      if (!b) continue;
      const bool to_zero = --refs[*b] == 0;
      ASSERT_EQ(a.release(*b), to_zero);
      if (to_zero) (cached[*b] ? lru_model : free_model).push_back(*b);
    } else if (op == 5) {  // mark or unmark a used or cached block
      const std::optional<BlockId> b = pick([&](BlockId x) { return refs[x] > 0 || cached[x]; });
      if (!b) continue;
      const bool mark = rng() % 2 == 0;
      if (!mark && cached[*b] && refs[*b] == 0) {
        lru_model.erase(std::find(lru_model.begin(), lru_model.end(), *b));
        free_model.push_back(*b);
      }
      cached[*b] = mark;
      a.set_cached(*b, mark);
    } else if (op == 6) {
      if (rng() % 8 != 0) continue;  // rare: it empties the LRU
      const std::vector<BlockId> lru_before(lru_model.begin(), lru_model.end());
      ASSERT_EQ(a.evict_all_cached(), lru_before);  // reported oldest first
      for (BlockId b : lru_before) {
        cached[b] = false;
        free_model.push_back(b);
      }
      lru_model.clear();
    } else {
      if (rng() % 8 != 0) continue;
      a.shuffle_free_list(rng());
      const std::vector<BlockId> now = a.free_list();
      std::vector<BlockId> sorted_now = now;
      std::vector<BlockId> sorted_model(free_model.begin(), free_model.end());
      std::sort(sorted_now.begin(), sorted_now.end());
      std::sort(sorted_model.begin(), sorted_model.end());
      ASSERT_EQ(sorted_now, sorted_model);  // a permutation of the same ids
      free_model.assign(now.begin(), now.end());
    }
    ASSERT_EQ(a.free_list(), std::vector<BlockId>(free_model.begin(), free_model.end()));
    ASSERT_EQ(a.cached_lru(), std::vector<BlockId>(lru_model.begin(), lru_model.end()));
    for (BlockId b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(a.ref_count(b), refs[b]) << "block " << b;
      ASSERT_EQ(a.is_cached(b), cached[b]) << "block " << b;
      ASSERT_EQ(a.is_free(b), refs[b] == 0 && !cached[b]) << "block " << b;
    }
    ASSERT_EQ(a.num_free(), static_cast<int32_t>(free_model.size()));
    ASSERT_EQ(a.num_cached(), static_cast<int32_t>(lru_model.size()));
    expect_conserved(a);
  }
}

TEST(BlockAllocator, ErrorsNameTheValue) {
  EXPECT_ERROR(BlockAllocator(0), "got 0");
  EXPECT_ERROR(BlockAllocator(-5), "got -5");
  // Past the 2^30 cap: refused before any metadata is allocated (16 bytes a block).
  EXPECT_ERROR(BlockAllocator((1 << 30) + 1), "got 1073741825");
  EXPECT_ERROR(BlockAllocator(std::numeric_limits<int32_t>::max()), "got 2147483647");
  BlockAllocator a(4);
  EXPECT_ERROR(a.release(7), "block id 7 out of range");
  EXPECT_ERROR(a.release(-1), "block id -1 out of range");
  EXPECT_ERROR(a.release(2), "block 2 is not allocated");
  const BlockId b = *a.allocate();
  a.release(b);
  EXPECT_ERROR(a.release(b), "block 0 is not allocated (double free?)");
  EXPECT_ERROR(a.retain(3), "block 3 is free");
  EXPECT_ERROR(a.set_cached(1, true), "block 1 is free");
  EXPECT_ERROR((void)a.ref_count(4), "block id 4 out of range");
  EXPECT_ERROR((void)a.allocate(-2), "got -2");
  expect_conserved(a);
  EXPECT_EQ(a.num_free(), 4);
}

}  // namespace
}  // namespace pagedkv
