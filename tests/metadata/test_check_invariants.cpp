// Tests of the oracle: KVCacheManager::check_invariants() (with BlockAllocator's and
// PrefixCache's) is what the manager tests and the fuzz targets trust, so each test here breaks
// one piece of a healthy manager through tests/common/manager_corruptor.hpp (a ref count, a
// free-list entry, an LRU link, a cached flag, a prefix-index entry, a parent link, a table
// entry, a token count, a host block, a heavy-hitter kept token) and expects the check naming
// exactly that to fire.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "common/manager_corruptor.hpp"
#include "common/manager_snapshot.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using test_hooks::ManagerCorruptor;
using ::testing::HasSubstr;
using testing::iota_tokens;
using testing::table_of;
using ::testing::ThrowsMessage;

/// A manager with every kind of state: sequence 2 shares two registered blocks of sequence 1's
/// prompt; sequence 1 is gone, so its two other registered blocks are cached (the LRU list);
/// sequence 3 is swapped out to the host pool; the rest of the pool is free.
KVCacheManager healthy() {
  KVCacheManager m(
      {.num_blocks = 10, .block_size = 2, .enable_prefix_caching = true, .num_host_blocks = 4});
  EXPECT_TRUE(m.add_sequence(1, iota_tokens(8)));
  m.commit(1, 8);
  EXPECT_TRUE(m.add_sequence(2, iota_tokens(5)));
  m.free_sequence(1);
  EXPECT_TRUE(m.add_sequence(3, iota_tokens(3, 100)));
  EXPECT_TRUE(m.swap_out(3));
  return m;
}

struct Facts {
  std::vector<BlockId> table2;  // sequence 2's table
  std::vector<BlockId> free;    // free list, head first
  std::vector<BlockId> lru;     // cached ref-0 blocks, least recently released first
};

Facts facts(const KVCacheManager& m) {
  return {table_of(m, 2), m.allocator().free_list(), m.allocator().cached_lru()};
}

std::string s(int64_t v) { return std::to_string(v); }

/// A prefix key as the checks print it: {:#018x}.
std::string fmt_key(BlockHash key) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(key));
  return buf;
}

/// Runs `corrupt` on a fresh healthy manager; it returns what check_invariants must then say.
void expect_fires(const std::function<std::string(KVCacheManager&, const Facts&)>& corrupt) {
  KVCacheManager m = healthy();
  const Facts f = facts(m);
  const std::string what = corrupt(m, f);
  EXPECT_THAT([&] { m.check_invariants(); }, ThrowsMessage<Error>(HasSubstr(what)));
}

using C = ManagerCorruptor;

TEST(CheckInvariants, TheHealthyStateHasEveryKindOfBlock) {
  KVCacheManager m = healthy();
  m.check_invariants();
  const Facts f = facts(m);
  ASSERT_EQ(f.table2.size(), 3u);
  EXPECT_EQ(m.allocator().ref_count(f.table2[0]), 1);
  EXPECT_TRUE(m.allocator().is_cached(f.table2[0]));   // held and registered
  EXPECT_FALSE(m.allocator().is_cached(f.table2[2]));  // the partial last block
  ASSERT_EQ(f.lru.size(), 2u);
  ASSERT_GE(f.free.size(), 2u);
  EXPECT_EQ(m.prefix_cache().size(), 4);
  ASSERT_NE(m.host_allocator(), nullptr);
  EXPECT_EQ(m.host_allocator()->num_used(), 2);
  // The prefix chain: table2[1]'s entry hangs under table2[0]'s, lru[0]'s under table2[1]'s.
  const PrefixCache& p = m.prefix_cache();
  EXPECT_EQ(p.find(p.entry(f.table2[1])->parent_hash), f.table2[0]);
}

// ---- the pool ----------------------------------------------------------------------------------

TEST(CheckInvariants, RefCountOfAHeldBlock) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_ref_count(C::device_pool(m), f.table2[1], 3);
    return "block " + s(f.table2[1]) + " has ref count 3 but 1 tables hold it";
  });
}

TEST(CheckInvariants, RefCountOfAFreeBlock) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_ref_count(C::device_pool(m), f.free[0], 1);
    return "free-list entry 0 is block " + s(f.free[0]) + " with ref count 1 and cached flag false";
  });
}

TEST(CheckInvariants, NegativeRefCount) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_ref_count(C::device_pool(m), f.table2[2], -1);
    return "block " + s(f.table2[2]) + " has ref count -1";
  });
}

TEST(CheckInvariants, AFreeListEntryOutOfRange) {
  for (const BlockId bad : {-3, -1, 10, 11}) {  // a pool of 10 blocks: both edges and past them
    expect_fires([bad](KVCacheManager& m, const Facts&) {
      C::set_free_entry(C::device_pool(m), 0, bad);
      return "free-list entry 0 is block id " + s(bad) + " out of range";
    });
  }
}

TEST(CheckInvariants, ABlockTwiceOnTheFreeList) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_free_entry(C::device_pool(m), 1, f.free[0]);  // free[1] is lost, free[0] doubled
    return "block " + s(f.free[0]) + " is on the free list twice (entry 1)";
  });
}

TEST(CheckInvariants, AHeldBlockOnTheFreeList) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_free_entry(C::device_pool(m), 0, f.table2[2]);
    return "free-list entry 0 is block " + s(f.table2[2]) +
           " with ref count 1 and cached flag false";
  });
}

TEST(CheckInvariants, ALeakedBlock) {
  // A held block whose holders all vanished without the pool hearing of it: ref count 0, on
  // no list (the table check would name it too, but the pool's own check comes first).
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_ref_count(C::device_pool(m), f.table2[2], 0);
    return "block " + s(f.table2[2]) +
           " has ref count 0 but is on neither the free nor the LRU list (cached flag false)";
  });
}

TEST(CheckInvariants, ACycleInTheLru) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_lru_next(C::device_pool(m), f.lru[1], f.lru[0]);
    return "LRU block " + s(f.lru[0]) + " is already on the LRU list";
  });
}

TEST(CheckInvariants, ABrokenLruBackLink) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_lru_prev(C::device_pool(m), f.lru[1], -1);
    return "LRU block " + s(f.lru[1]) + " links back to -1 but follows " + s(f.lru[0]);
  });
}

TEST(CheckInvariants, AnLruHeadWithABackLink) {
  // The head links back to a real block (an id above the -1 it should hold): any back link
  // other than the block it follows is wrong, larger ones as much as smaller ones.
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_lru_prev(C::device_pool(m), f.lru[0], f.lru[1]);
    return "LRU block " + s(f.lru[0]) + " links back to " + s(f.lru[1]) + " but follows -1";
  });
}

TEST(CheckInvariants, AnLruBlockThatLostItsCachedFlag) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_cached_flag(C::device_pool(m), f.lru[0], false);
    return "LRU block " + s(f.lru[0]) + " has ref count 0 and cached flag false";
  });
}

TEST(CheckInvariants, HostPoolRefCount) {
  expect_fires([](KVCacheManager& m, const Facts&) {
    const BlockId h = m.block_table(3)[0];  // a host block id: sequence 3 is swapped out
    C::set_ref_count(C::host_pool(m), h, 2);
    return "host block " + s(h) + " has ref count 2 but 1 tables hold it";
  });
}

// ---- the prefix index --------------------------------------------------------------------------

TEST(CheckInvariants, AnEntryWhoseKeyFindsNothing) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_entry_hash(C::prefix(m), f.lru[0], 0x1234);
    return "prefix key 0x0000000000001234 of block " + s(f.lru[0]) + " finds block -1";
  });
}

TEST(CheckInvariants, AKeyThatFindsAnUnregisteredBlock) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    PrefixCache& p = C::prefix(m);
    const BlockHash key = p.entry(f.lru[0])->hash;
    C::set_key_block(p, key, f.free[0]);
    return "prefix key " + fmt_key(key) + " of block " + s(f.lru[0]) + " finds block " +
           s(f.free[0]);
  });
}

TEST(CheckInvariants, AKeyThatFindsAnotherRegisteredBlock) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    PrefixCache& p = C::prefix(m);
    const BlockHash key = p.entry(f.lru[0])->hash;
    C::set_key_block(p, key, f.table2[0]);
    return "prefix key " + fmt_key(key) + " of block " + s(f.lru[0]) + " finds block " +
           s(f.table2[0]);
  });
}

TEST(CheckInvariants, AKeyThatFindsABlockOutOfRange) {
  // A negative block reads as an empty cell: the key finds nothing.
  for (const BlockId bad : {-5, -1, 10, 11}) {
    expect_fires([bad](KVCacheManager& m, const Facts& f) {
      PrefixCache& p = C::prefix(m);
      const BlockHash key = p.entry(f.lru[0])->hash;
      C::set_key_block(p, key, bad);
      return "prefix key " + fmt_key(key) + " of block " + s(f.lru[0]) + " finds block " +
             s(bad < 0 ? -1 : bad);
    });
  }
}

TEST(CheckInvariants, AnEntrySerialNotHandedOut) {
  for (const uint64_t past_next : {uint64_t{0}, uint64_t{5}}) {  // 0 = the next serial itself
    expect_fires([=](KVCacheManager& m, const Facts& f) {
      const uint64_t next = C::next_serial(C::prefix(m));
      C::set_entry_serial(C::prefix(m), f.lru[0], next + past_next);
      return "prefix entry of block " + s(f.lru[0]) + " has serial " +
             std::to_string(next + past_next) + " (next " + std::to_string(next) + ")";
    });
  }
}

TEST(CheckInvariants, AChildWhoseSerialSaysUnregistered) {
  // Serial 0 marks a block unregistered: lru[0] (block 3) hangs under lru[1] (block 2), whose
  // child list then holds a block that is not a registered child.
  expect_fires([](KVCacheManager& m, const Facts& f) {
    EXPECT_EQ(m.prefix_cache().entry(f.lru[0])->parent_hash,
              m.prefix_cache().entry(f.lru[1])->hash);
    C::set_entry_serial(C::prefix(m), f.lru[0], 0);
    return "block " + s(f.lru[0]) + " in the child list of block " + s(f.lru[1]) +
           " (after -1) is not a registered child linked back to it";
  });
}

TEST(CheckInvariants, AnUnregisteredBlockWithAParentLink) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_parent_of(C::prefix(m), f.free[0], f.lru[1]);
    return "unregistered block " + s(f.free[0]) + " has a parent or children";
  });
}

TEST(CheckInvariants, AChildThatLostItsParentLink) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_parent_of(C::prefix(m), f.table2[1], -1);
    return "block " + s(f.table2[1]) + " in the child list of block " + s(f.table2[0]) +
           " (after -1) is not a registered child linked back to it";
  });
}

// ---- the tables --------------------------------------------------------------------------------

TEST(CheckInvariants, ATableEntryOutOfRange) {
  expect_fires([](KVCacheManager& m, const Facts&) {
    C::set_table_entry(m, 2, 1, 99);
    return "sequence 2 holds block id 99 out of range";
  });
}

TEST(CheckInvariants, ATableEntryPointingAtAFreeBlock) {
  expect_fires([](KVCacheManager& m, const Facts& f) {
    C::set_table_entry(m, 2, 2, f.free[0]);
    // Blocks are checked in id order: the first of the two mismatches is named.
    const BlockId first = std::min(f.free[0], f.table2[2]);
    return "block " + s(first) + " has ref count " + s(first == f.free[0] ? 0 : 1) + " but " +
           s(first == f.free[0] ? 1 : 0) + " tables hold it";
  });
}

TEST(CheckInvariants, ATokenCountThatDisagreesWithTheTable) {
  expect_fires([](KVCacheManager& m, const Facts&) {
    C::set_num_tokens(m, 2, 9);
    return "sequence 2 has 9 tokens but 3 blocks (expected 5)";
  });
}

// ---- heavy-hitter kept sets --------------------------------------------------------------------

/// bs 2, recent 1, heavy 2: positions 0..4 scored, then position 5 evicts 0, 2, 4 (the hand-worked
/// example of test_eviction_policy): kept 1 (block 0), 3 (block 1), 5 (block 0, slot 0).
KVCacheManager sparse_h2o() {
  KVCacheManager m({.num_blocks = 8,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kHeavyHitters, .recent = 1, .heavy = 2}});
  m.add_sequence(1);
  EXPECT_TRUE(m.append_slots(1, 5));
  m.accumulate_attention(1, std::vector<float>{0.1f, 0.9f, 0.2f, 0.8f, 0.0f});
  EXPECT_TRUE(m.append_slots(1, 1));
  const SeqId one[] = {1};
  EXPECT_EQ(m.kept_tokens(one).positions, (std::vector<int64_t>{1, 3, 5}));
  m.check_invariants();
  return m;
}

TEST(CheckInvariants, AKeptTokenInAReleasedBlock) {
  KVCacheManager m = sparse_h2o();
  C::set_table_entry(m, 1, 1, KVCacheManager::kNoBlock);  // the block of position 3
  EXPECT_THAT([&] { m.check_invariants(); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 keeps position 3 in a released or "
                                             "missing block")));
}

TEST(CheckInvariants, KeptPositionsOutOfOrder) {
  KVCacheManager m = sparse_h2o();
  C::set_kept_token(m, 1, 1, 0, 1, 1);  // position 3 -> 0, after position 1
  EXPECT_THAT([&] { m.check_invariants(); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 kept position 0 out of order or range")));
}

TEST(CheckInvariants, TwoKeptTokensInOneSlot) {
  KVCacheManager m = sparse_h2o();
  C::set_kept_token(m, 1, 1, 3, 0, 1);  // position 3 moves onto position 1's slot
  EXPECT_THAT([&] { m.check_invariants(); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 keeps two tokens in one slot (entry 0, "
                                             "offset 1)")));
}

/// bs 2, recent 4, heavy 4: 4 tokens and no eviction yet, so the kept set is positional: token
/// p at entry p / 2, offset p % 2.
KVCacheManager positional_h2o() {
  KVCacheManager m({.num_blocks = 8,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kHeavyHitters, .recent = 4, .heavy = 4}});
  m.add_sequence(1);
  EXPECT_TRUE(m.append_slots(1, 4));
  m.check_invariants();
  return m;
}

// Each case breaks one coordinate of one token, in one direction, and frees the slot it moves
// to, so only the positional check can see it (a weaker check would let the scan go on to
// another message, "keeps 3 of 4 tokens").
TEST(CheckInvariants, APositionalKeptTokenOneBlockTooLow) {
  KVCacheManager m = positional_h2o();
  C::erase_kept_token(m, 1, 0);         // {1 (0, 1), 2 (1, 0), 3 (1, 1)}
  C::set_kept_token(m, 1, 1, 2, 0, 0);  // position 2 at entry 0, its offset right
  EXPECT_THAT(
      [&] { m.check_invariants(); },
      ThrowsMessage<Error>(HasSubstr("positional sequence 1 keeps position 2 off its slot")));
}

TEST(CheckInvariants, APositionalKeptTokenOneBlockTooHigh) {
  KVCacheManager m = positional_h2o();
  C::erase_kept_token(m, 1, 3);         // {0 (0, 0), 1 (0, 1), 2 (1, 0)}
  C::set_kept_token(m, 1, 1, 1, 1, 1);  // position 1 at entry 1, its offset right
  EXPECT_THAT(
      [&] { m.check_invariants(); },
      ThrowsMessage<Error>(HasSubstr("positional sequence 1 keeps position 1 off its slot")));
}

TEST(CheckInvariants, APositionalKeptTokenAtALowerOffset) {
  KVCacheManager m = positional_h2o();
  C::erase_kept_token(m, 1, 0);         // {1 (0, 1), 2 (1, 0), 3 (1, 1)}
  C::set_kept_token(m, 1, 0, 1, 0, 0);  // position 1 at offset 0, its entry right
  EXPECT_THAT(
      [&] { m.check_invariants(); },
      ThrowsMessage<Error>(HasSubstr("positional sequence 1 keeps position 1 off its slot")));
}

TEST(CheckInvariants, APositionalKeptTokenAtAHigherOffset) {
  KVCacheManager m = positional_h2o();
  C::erase_kept_token(m, 1, 1);         // {0 (0, 0), 2 (1, 0), 3 (1, 1)}
  C::set_kept_token(m, 1, 0, 0, 0, 1);  // position 0 at offset 1, its entry right
  EXPECT_THAT(
      [&] { m.check_invariants(); },
      ThrowsMessage<Error>(HasSubstr("positional sequence 1 keeps position 0 off its slot")));
}

TEST(CheckInvariants, AHeldBlockWithNoKeptToken) {
  // Kept 1 (entry 0), 3 (entry 1), 5 (entry 0): without position 3, entry 1's block is held
  // for nothing; the check must look at every entry, not only the first.
  KVCacheManager m = sparse_h2o();
  const BlockId held = m.block_table(1)[1];
  C::erase_kept_token(m, 1, 1);
  EXPECT_THAT([&] { m.check_invariants(); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 holds block " + std::to_string(held) +
                                             " with no kept token")));
}

TEST(CheckInvariants, AKeptTokenOutsideItsBlock) {
  for (const int32_t offset : {-1, 2, 3}) {  // block_size 2: offsets 0 and 1 only
    KVCacheManager m = sparse_h2o();
    C::set_kept_token(m, 1, 1, 3, 1, offset);
    EXPECT_THAT([&] { m.check_invariants(); },
                ThrowsMessage<Error>(HasSubstr("sequence 1 keeps position 3 in a released or "
                                               "missing block")))
        << "offset " << offset;
  }
}

TEST(CheckInvariants, APositionalKeptSetMissingAToken) {
  KVCacheManager m({.num_blocks = 8,
                    .block_size = 2,
                    .eviction = {.kind = EvictionKind::kHeavyHitters, .recent = 4, .heavy = 4}});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 3));
  C::erase_kept_token(m, 1, 2);  // position 2, alone in block 1
  EXPECT_THAT([&] { m.check_invariants(); },
              ThrowsMessage<Error>(HasSubstr("positional sequence 1 keeps 2 of 3 tokens")));
}

}  // namespace
}  // namespace pagedkv
