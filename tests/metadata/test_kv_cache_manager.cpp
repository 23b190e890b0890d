// Tests for include/pagedkv/metadata/kv_cache_manager.hpp: exact slots and block ids on hand-worked
// examples, all-or-nothing appends, copy-on-write, batch metadata, invariants after every step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

#include "common/batch_metadata_expect.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

std::vector<BlockId> table_of(const KVCacheManager& m, SeqId s) {
  auto t = m.block_table(s);
  return {t.begin(), t.end()};
}

TEST(KVCacheManager, DocExampleSlotsAndCopyOnWrite) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4});
  m.add_sequence(7);
  auto r = m.append_slots(7, 6);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(r->copies, IsEmpty());
  EXPECT_THAT(table_of(m, 7), ElementsAre(0, 1));
  r = m.append_slots(7, 1);
  EXPECT_THAT(r->slots, ElementsAre(6));
  m.fork(7, 8);
  EXPECT_EQ(m.allocator().ref_count(0), 2);
  EXPECT_EQ(m.allocator().ref_count(1), 2);
  EXPECT_EQ(m.num_free_blocks(), 6);  // forking allocates nothing
  m.check_invariants();
  EXPECT_EQ(m.blocks_needed_to_append(8, 1), 1);  // the shared partial block must be copied
  r = m.append_slots(8, 1);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->copies, ElementsAre(BlockCopy{1, 2}));
  EXPECT_THAT(r->slots, ElementsAre(11));  // block 2, offset 3
  EXPECT_THAT(table_of(m, 8), ElementsAre(0, 2));
  EXPECT_THAT(table_of(m, 7), ElementsAre(0, 1));
  EXPECT_EQ(m.allocator().ref_count(1), 1);
  // The parent now owns block 1 alone: its next append writes in place, no copy.
  r = m.append_slots(7, 1);
  EXPECT_THAT(r->copies, IsEmpty());
  EXPECT_THAT(r->slots, ElementsAre(7));
  m.check_invariants();
  m.free_sequence(7);
  EXPECT_THAT(table_of(m, 8), ElementsAre(0, 2));  // the child is intact
  m.free_sequence(8);
  EXPECT_EQ(m.num_free_blocks(), 8);
  m.check_invariants();
}

TEST(KVCacheManager, AppendWithoutSlotsTakesTheSameBlocksAndReportsCopies) {
  // The doc example again with AppendOptions::return_slots = false: the same tables, ref counts
  // and copy, but no slots.
  const AppendOptions no_slots{.return_slots = false};
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  m.add_sequence(7);
  auto r = m.append_slots(7, 6, no_slots);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, IsEmpty());
  EXPECT_THAT(table_of(m, 7), ElementsAre(0, 1));
  r = m.append_tokens(7, std::vector<TokenId>{9}, no_slots);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, IsEmpty());
  m.fork(7, 8);
  r = m.append_slots(8, 1, no_slots);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->copies, ElementsAre(BlockCopy{1, 2}));
  EXPECT_THAT(r->slots, IsEmpty());
  EXPECT_THAT(table_of(m, 8), ElementsAre(0, 2));
  EXPECT_EQ(m.allocator().ref_count(1), 1);
  EXPECT_EQ(m.num_tokens(8), 8);
  // A prompt: the hits and the blocks are those of the default, the slots are not built.
  const std::vector<TokenId> p{1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto added = m.add_sequence(3, p, AddOptions{.return_slots = false});
  ASSERT_TRUE(added);
  EXPECT_EQ(added->num_computed_tokens, 0);
  EXPECT_THAT(added->append.slots, IsEmpty());
  EXPECT_THAT(table_of(m, 3), ElementsAre(3, 4, 5));
  m.commit(3, 9);
  added = m.add_sequence(4, p, AddOptions{.return_slots = false});
  ASSERT_TRUE(added);
  EXPECT_EQ(added->num_computed_tokens, 8);
  EXPECT_THAT(added->append.slots, IsEmpty());
  EXPECT_THAT(table_of(m, 4), ElementsAre(3, 4, 6));
  m.check_invariants();
}

TEST(KVCacheManager, ForkAtExactBlockMultipleNeverCopiesFullBlocks) {
  KVCacheManager m({.num_blocks = 4, .block_size = 4});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 8));
  m.fork(1, 2);
  auto r = m.append_slots(2, 1);  // last block full: a new block, no copy
  ASSERT_TRUE(r);
  EXPECT_THAT(r->copies, IsEmpty());
  EXPECT_THAT(r->slots, ElementsAre(8));
  EXPECT_THAT(table_of(m, 2), ElementsAre(0, 1, 2));
  m.check_invariants();
}

TEST(KVCacheManager, AllocatesOnlyWhenTheLastBlockIsFull) {
  KVCacheManager m({.num_blocks = 10, .block_size = 16});
  m.add_sequence(0);
  for (int i = 0; i < 16; ++i) {
    ASSERT_TRUE(m.append_slots(0, 1));
    EXPECT_EQ(m.block_table(0).size(), 1u);
  }
  ASSERT_TRUE(m.append_slots(0, 1));
  EXPECT_EQ(m.block_table(0).size(), 2u);
  EXPECT_EQ(m.num_tokens(0), 17);
  m.check_invariants();
}

TEST(KVCacheManager, EmptyPromptTakesNoBlock) {
  KVCacheManager m({.num_blocks = 2, .block_size = 16});
  m.add_sequence(3);
  auto r = m.append_slots(3, 0);
  ASSERT_TRUE(r);
  EXPECT_THAT(r->slots, IsEmpty());
  EXPECT_THAT(table_of(m, 3), IsEmpty());
  EXPECT_EQ(m.num_free_blocks(), 2);
  EXPECT_DOUBLE_EQ(m.usage(), 0.0);
}

TEST(KVCacheManager, AppendIsAllOrNothing) {
  KVCacheManager m({.num_blocks = 3, .block_size = 4});
  m.add_sequence(1);
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(1, 5));  // blocks {0, 1}
  EXPECT_TRUE(m.can_append(2, 4));
  EXPECT_FALSE(m.can_append(2, 5));  // would need 2 blocks, 1 left
  EXPECT_EQ(m.append_slots(2, 5), std::nullopt);
  EXPECT_EQ(m.num_tokens(2), 0);
  EXPECT_THAT(table_of(m, 2), IsEmpty());
  EXPECT_EQ(m.num_free_blocks(), 1);
  // The partially filled block still has room for 3 tokens without a new block.
  EXPECT_TRUE(m.can_append(1, 3));
  EXPECT_EQ(m.blocks_needed_to_append(1, 3), 0);
  m.check_invariants();
}

TEST(KVCacheManager, PoolOfOneBlock) {
  KVCacheManager m({.num_blocks = 1, .block_size = 2});
  m.add_sequence(0);
  EXPECT_TRUE(m.append_slots(0, 2));
  EXPECT_FALSE(m.can_append(0, 1));
  EXPECT_EQ(m.append_slots(0, 1), std::nullopt);
  m.fork(0, 1);
  EXPECT_EQ(m.num_free_blocks(), 0);
  m.free_sequence(0);
  m.free_sequence(1);
  EXPECT_EQ(m.num_free_blocks(), 1);
  m.check_invariants();
}

TEST(KVCacheManager, BatchMetadataWithPaddingRow) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4});
  m.add_sequence(10);
  m.add_sequence(20);
  ASSERT_TRUE(m.append_slots(10, 6));  // blocks {0, 1}
  ASSERT_TRUE(m.append_slots(20, 3));  // block {2}
  ASSERT_TRUE(m.append_slots(10, 1));  // slot 6
  ASSERT_TRUE(m.append_slots(20, 1));  // slot 11
  std::vector<SeqId> seqs{10, kPaddingSeq, 20};
  std::vector<int64_t> n_new{1, 0, 1};
  BatchMetadata meta = m.batch_metadata(seqs, n_new);
  EXPECT_EQ(meta.block_size, 4);
  EXPECT_EQ(meta.padded.max_blocks_per_seq, 2);
  EXPECT_THAT(meta.padded.block_tables, ElementsAre(0, 1, -1, -1, 2, -1));
  EXPECT_THAT(meta.padded.context_lens, ElementsAre(7, 0, 4));
  EXPECT_THAT(meta.csr.indptr, ElementsAre(0, 2, 2, 3));
  EXPECT_THAT(meta.csr.indices, ElementsAre(0, 1, 2));
  EXPECT_THAT(meta.csr.last_page_len, ElementsAre(3, 0, 4));
  EXPECT_THAT(meta.slot_mapping, ElementsAre(6, 11));
  EXPECT_THAT(meta.query_start, ElementsAre(0, 1, 1, 2));
  // A prefill batch: all of sequence 20's tokens are new.
  std::vector<SeqId> one{20};
  std::vector<int64_t> all{4};
  EXPECT_THAT(m.batch_metadata(one, all).slot_mapping, ElementsAre(8, 9, 10, 11));

  // The output-parameter form, one object reused across steps (the prefill, then the decode
  // batch): the same contents as the returned metadata.
  BatchMetadata reused;
  m.batch_metadata(one, all, reused);
  EXPECT_THAT(reused.slot_mapping, ElementsAre(8, 9, 10, 11));
  m.batch_metadata(seqs, n_new, reused);
  testing::expect_same_metadata(reused, meta);
  // A contract violation anywhere in the batch leaves it as it was.
  std::vector<SeqId> bad{10, 42};
  std::vector<int64_t> bad_new{1, 1};
  EXPECT_THAT([&] { m.batch_metadata(bad, bad_new, reused); },
              ThrowsMessage<Error>(HasSubstr("unknown sequence 42")));
  EXPECT_EQ(reused.slot_mapping, meta.slot_mapping);
  EXPECT_EQ(reused.query_start, meta.query_start);
  EXPECT_EQ(reused.csr.indices, meta.csr.indices);
}

using testing::expect_same_metadata;

TEST(KVCacheManager, ReusedBatchMetadataMatchesTheReturningFormUnderRandomBatches) {
  // One BatchMetadata reused over thousands of random batches (growing and shrinking, with
  // padding rows, repeated sequences, empty batches, and tables with entries released by
  // token eviction) must always equal a freshly returned one: nothing of a bigger earlier batch
  // may leak. Batches the returning form rejects (unknown or finished sequences, padding rows
  // with new tokens, too many new tokens, a released position, mismatched sizes) must throw
  // from the output form too and leave the reused object exactly as it was.
  const EvictionPolicyConfig policies[] = {
      {},
      {.kind = EvictionKind::kSlidingWindow, .window = 6},
      {.kind = EvictionKind::kAttentionSinks, .window = 5, .sinks = 2},
  };
  for (const EvictionPolicyConfig& policy : policies) {
    SCOPED_TRACE(eviction_kind_name(policy.kind));
    KVCacheManager m({.num_blocks = 48, .block_size = 4, .eviction = policy});
    std::mt19937 rng(41);
    std::vector<SeqId> live;
    SeqId next = 0;
    BatchMetadata reused;
    int accepted = 0;
    int rejected = 0;
    int released_rows = 0;  // batch rows whose table has entries released by token eviction
    for (int step = 0; step < 3000; ++step) {
      SCOPED_TRACE(step);
      const int op = static_cast<int>(rng() % 6);
      if (op == 0 || live.empty()) {
        m.add_sequence(next);
        live.push_back(next++);
      } else if (op == 1 && live.size() > 1) {
        const size_t i = rng() % live.size();
        m.free_sequence(live[i]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op == 2) {
        (void)m.append_slots(live[rng() % live.size()], 1 + static_cast<int64_t>(rng() % 9));
      }
      // A random batch, mostly valid: live sequences (some repeated), padding rows, and now
      // and then an id that never existed or a count that cannot be right.
      const size_t n = rng() % 7;
      std::vector<SeqId> seqs;
      std::vector<int64_t> n_new;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t kind = rng() % 20;
        if (kind == 0) {
          seqs.push_back(kPaddingSeq);
          n_new.push_back(rng() % 4 == 0 ? 1 : 0);
        } else if (kind == 1) {
          seqs.push_back(next + 1000);  // unknown
          n_new.push_back(0);
        } else {
          const SeqId s = live[rng() % live.size()];
          seqs.push_back(s);
          const int64_t tokens = m.num_tokens(s);
          n_new.push_back(kind == 2 ? tokens + 1 : std::min<int64_t>(tokens, rng() % 3));
        }
      }
      if (rng() % 25 == 0) n_new.push_back(0);  // size mismatch
      for (SeqId s : seqs) {
        if (s == kPaddingSeq || !m.has_sequence(s)) continue;
        const std::span<const BlockId> t = m.block_table(s);
        if (std::find(t.begin(), t.end(), KVCacheManager::kNoBlock) != t.end()) ++released_rows;
      }
      std::optional<BatchMetadata> fresh;
      try {
        fresh = m.batch_metadata(seqs, n_new);
      } catch (const Error&) {
      }
      if (fresh) {
        ++accepted;
        m.batch_metadata(seqs, n_new, reused);
        expect_same_metadata(reused, *fresh);
        if (::testing::Test::HasFailure()) return;
      } else {
        ++rejected;
        const BatchMetadata before = reused;
        EXPECT_THROW(m.batch_metadata(seqs, n_new, reused), Error);
        expect_same_metadata(reused, before);
        if (::testing::Test::HasFailure()) return;
      }
    }
    // Both paths were exercised many times.
    EXPECT_GT(accepted, 500);
    EXPECT_GT(rejected, 100);
    if (policy.kind != EvictionKind::kNone) EXPECT_GT(released_rows, 500);
    m.check_invariants();
  }
}

TEST(KVCacheManager, ScatteredBlocksAfterChurn) {
  KVCacheManager m({.num_blocks = 6, .block_size = 2});
  for (SeqId s = 0; s < 3; ++s) {
    m.add_sequence(s);
    ASSERT_TRUE(m.append_slots(s, 2));  // seq s -> block s
  }
  m.free_sequence(1);                 // free list: 3, 4, 5, 1
  ASSERT_TRUE(m.append_slots(0, 4));  // seq 0 takes 3, 4
  ASSERT_TRUE(m.append_slots(2, 4));  // seq 2 takes 5, 1
  EXPECT_THAT(table_of(m, 0), ElementsAre(0, 3, 4));
  EXPECT_THAT(table_of(m, 2), ElementsAre(2, 5, 1));
  std::vector<SeqId> seqs{2};
  std::vector<int64_t> n{4};
  EXPECT_THAT(m.batch_metadata(seqs, n).slot_mapping, ElementsAre(10, 11, 2, 3));
  m.check_invariants();
}

TEST(KVCacheManager, RandomScenarioConservesBlocks) {
  KVCacheManager m({.num_blocks = 32, .block_size = 5});
  std::mt19937 rng(11);
  std::vector<SeqId> live;
  SeqId next = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = rng() % 10;
    if (op < 2 || live.empty()) {
      m.add_sequence(next);
      live.push_back(next++);
    } else if (op < 7) {
      const SeqId s = live[rng() % live.size()];
      const int64_t n = rng() % 12;
      const bool predicted = m.can_append(s, n);
      const int32_t free_before = m.num_free_blocks();
      const int64_t tokens_before = m.num_tokens(s);
      auto r = m.append_slots(s, n);
      ASSERT_EQ(r.has_value(), predicted) << "can_append disagreed with append_slots";
      if (!r) {
        ASSERT_EQ(m.num_free_blocks(), free_before);
        ASSERT_EQ(m.num_tokens(s), tokens_before);
      } else {
        ASSERT_EQ(static_cast<int64_t>(r->slots.size()), n);
      }
    } else if (op < 8) {
      const SeqId s = live[rng() % live.size()];
      m.fork(s, next);
      live.push_back(next++);
    } else {
      const size_t i = rng() % live.size();
      m.free_sequence(live[i]);
      live.erase(live.begin() + i);
    }
    ASSERT_NO_THROW(m.check_invariants()) << "step " << step;
  }
  for (SeqId s : live) m.free_sequence(s);
  EXPECT_EQ(m.num_free_blocks(), 32);
  EXPECT_EQ(m.allocator().num_used(), 0);
}

TEST(KVCacheManager, ErrorsNameTheValueAndChangeNothing) {
  EXPECT_THAT([] { KVCacheManager({.num_blocks = 0, .block_size = 4}); },
              ThrowsMessage<Error>(HasSubstr("num_blocks must be >= 1, got 0")));
  EXPECT_THAT([] { KVCacheManager({.num_blocks = 4, .block_size = -3}); },
              ThrowsMessage<Error>(HasSubstr("block_size must be >= 1, got -3")));
  // block_size 0 is the manager's error, not one of a member it would build from the config
  // (the prefix cache rejects it too, under its own name).
  EXPECT_THAT([] { KVCacheManager({.num_blocks = 4, .block_size = 0}); },
              ThrowsMessage<Error>(HasSubstr("KVCacheManager: block_size must be >= 1, got 0")));
  KVCacheManager m({.num_blocks = 4, .block_size = 4});
  m.add_sequence(1);
  EXPECT_THAT([&] { m.add_sequence(1); }, ThrowsMessage<Error>(HasSubstr("sequence 1 already")));
  EXPECT_THAT([&] { m.add_sequence(kPaddingSeq); },
              ThrowsMessage<Error>(HasSubstr("id -1 is reserved")));
  EXPECT_THAT([&] { m.free_sequence(42); }, ThrowsMessage<Error>(HasSubstr("unknown sequence 42")));
  EXPECT_THAT([&] { (void)m.append_slots(42, 1); },
              ThrowsMessage<Error>(HasSubstr("unknown sequence 42")));
  EXPECT_THAT([&] { (void)m.append_slots(1, -2); }, ThrowsMessage<Error>(HasSubstr("got -2")));
  EXPECT_THAT([&] { m.fork(9, 2); }, ThrowsMessage<Error>(HasSubstr("unknown sequence 9")));
  EXPECT_THAT([&] { m.fork(1, 1); }, ThrowsMessage<Error>(HasSubstr("sequence 1 already")));
  std::vector<SeqId> seqs{1};
  std::vector<int64_t> too_many{3};
  EXPECT_THAT([&] { (void)m.batch_metadata(seqs, too_many); },
              ThrowsMessage<Error>(HasSubstr("sequence 1 has 0 tokens, cannot write 3")));
  std::vector<SeqId> pad{kPaddingSeq};
  std::vector<int64_t> one{1};
  EXPECT_THAT([&] { (void)m.batch_metadata(pad, one); },
              ThrowsMessage<Error>(HasSubstr("padding row 0 must have 0 new tokens, got 1")));
  EXPECT_EQ(m.num_sequences(), 1);
  EXPECT_EQ(m.num_free_blocks(), 4);
  m.check_invariants();
}

TEST(KVCacheManager, BoundaryLengthsAtForkTime) {
  const int32_t bs = 4;
  for (int len : {0, 1, bs - 1, bs, bs + 1, 2 * bs}) {
    KVCacheManager m({.num_blocks = 8, .block_size = bs});
    m.add_sequence(1);
    ASSERT_TRUE(m.append_slots(1, len));
    m.fork(1, 2);
    const bool partial = len % bs != 0;
    // Only a shared, partially filled last block is copied, and only by the first writer.
    EXPECT_EQ(m.blocks_needed_to_append(2, 1), 1) << "len " << len;
    auto r = m.append_slots(2, 1);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->copies.size(), partial ? 1u : 0u) << "len " << len;
    if (partial) EXPECT_EQ(r->copies[0].src, m.block_table(1).back());
    r = m.append_slots(1, 1);
    ASSERT_TRUE(r);
    EXPECT_THAT(r->copies, IsEmpty()) << "len " << len;  // the parent owns its block alone now
    m.check_invariants();
    m.free_sequence(1);
    EXPECT_EQ(m.num_tokens(2), len + 1);
    m.free_sequence(2);
    EXPECT_EQ(m.num_free_blocks(), 8);
  }
}

TEST(KVCacheManager, SequencesListsIdsInAscendingOrder) {
  // Ids added out of order (and past any small-table bucket order) come back sorted.
  KVCacheManager m({.num_blocks = 4, .block_size = 2});
  for (SeqId id : {41, 7, 1000003, 3, 64, 12, 999, 5, 128, 2}) m.add_sequence(id);
  m.free_sequence(64);
  EXPECT_THAT(m.sequences(), ElementsAre(2, 3, 5, 7, 12, 41, 128, 999, 1000003));
}

TEST(KVCacheManager, StatsInvariantsHold) {
  KVCacheManager m({.num_blocks = 8, .block_size = 2, .enable_prefix_caching = true});
  std::vector<TokenId> p{1, 2, 3, 4, 5};
  ASSERT_TRUE(m.add_sequence(1, p));
  ASSERT_TRUE(m.add_sequence(2, p));
  m.free_sequence(1);
  const KVCacheStats st = m.stats();
  EXPECT_EQ(st.total_blocks, 8);
  EXPECT_EQ(st.free_blocks + st.used_blocks + st.cached_blocks, st.total_blocks);
  EXPECT_EQ(st.used_blocks, 3);
  EXPECT_EQ(st.cached_blocks, 0);  // the cached blocks are still held by sequence 2
  EXPECT_DOUBLE_EQ(st.usage, 3.0 / 8.0);
  EXPECT_EQ(st.num_sequences, 1);
  EXPECT_EQ(st.prefix_hit_tokens, st.prefix_hits * 2);
}

TEST(KVCacheManager, CopiesAreIndependentManagers) {
  KVCacheManager a({.num_blocks = 4, .block_size = 2, .enable_prefix_caching = true});
  ASSERT_TRUE(a.add_sequence(1, std::vector<TokenId>{1, 2, 3}));
  EXPECT_EQ(a.commit(1, 3), 1);  // the forward step wrote the prompt: block 0 is published
  a.free_sequence(1);
  KVCacheManager b = a;
  b.add_sequence(5);
  ASSERT_TRUE(b.append_slots(5, 8));  // evicts b's cached block through b's listener
  EXPECT_EQ(b.stats().prefix_evictions, 1);
  EXPECT_EQ(a.stats().prefix_evictions, 0);
  EXPECT_EQ(a.stats().cached_blocks, 1);
  a.check_invariants();
  b.check_invariants();
}

}  // namespace
}  // namespace pagedkv
