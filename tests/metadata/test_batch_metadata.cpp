// Tests for include/pagedkv/batch_metadata.hpp: both formats element by element on a
// hand-computed example, slot arithmetic in int64, the documented errors, and random batches of
// a manager (KVCacheManager::batch_metadata) and of the builders against a model written here
// from the tables and the formulas of the header, element by element.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>

#include "pagedkv/error.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// Hand-worked example, block_size 4:
//   seq 0: context 6  -> blocks {5, 2}        (2 blocks, last page holds 2 tokens)
//   seq 1: context 0  -> padding row           (no blocks)
//   seq 2: context 9  -> blocks {7, 0, 3}      (3 blocks, last page holds 1 token)
//   seq 3: context 4  -> blocks {1, 6}          (only 1 in use: the spare block is not listed)
struct Example {
  std::vector<BlockId> t0{5, 2}, t1{}, t2{7, 0, 3}, t3{1, 6};
  std::vector<std::span<const BlockId>> tables{t0, t1, t2, t3};
  std::vector<int32_t> lens{6, 0, 9, 4};
};

TEST(BatchMetadata, PaddedFormatElementByElement) {
  Example ex;
  PaddedBlockTables p = build_padded_block_tables(ex.tables, ex.lens, 4);
  EXPECT_EQ(p.num_seqs, 4);
  EXPECT_EQ(p.max_blocks_per_seq, 3);
  EXPECT_THAT(p.block_tables, ElementsAre(5, 2, -1,    //
                                          -1, -1, -1,  //
                                          7, 0, 3,     //
                                          1, -1, -1));
  EXPECT_THAT(p.context_lens, ElementsAre(6, 0, 9, 4));
  BlockTableView v = p.view();
  EXPECT_EQ(v.num_seqs, 4);
  EXPECT_EQ(v.max_blocks_per_seq, 3);
  EXPECT_EQ(v.block_tables[2 * 3 + 2], 3);
}

TEST(BatchMetadata, CsrFormatElementByElement) {
  Example ex;
  CsrBlockTables c = build_csr_block_tables(ex.tables, ex.lens, 4);
  EXPECT_THAT(c.indptr, ElementsAre(0, 2, 2, 5, 6));
  EXPECT_THAT(c.indices, ElementsAre(5, 2, 7, 0, 3, 1));
  EXPECT_THAT(c.last_page_len, ElementsAre(2, 0, 1, 4));
}

TEST(BatchMetadata, OutputParameterFormsMatchAndReuseStorage) {
  Example ex;
  // A larger batch first, as an earlier serving step: its storage is reused for the example.
  std::vector<BlockId> big{9, 8, 7, 6, 5, 4};
  std::vector<std::span<const BlockId>> big_tables{big, big, big};
  std::vector<int32_t> big_lens{24, 21, 17};
  PaddedBlockTables p;
  CsrBlockTables c;
  build_padded_block_tables(big_tables, big_lens, 4, p);
  build_csr_block_tables(big_tables, big_lens, 4, c);
  EXPECT_THAT(c.indices, ElementsAre(9, 8, 7, 6, 5, 4, 9, 8, 7, 6, 5, 4, 9, 8, 7, 6, 5));
  const int32_t* padded_storage = p.block_tables.data();
  const int32_t* csr_storage = c.indices.data();

  build_padded_block_tables(ex.tables, ex.lens, 4, p);
  build_csr_block_tables(ex.tables, ex.lens, 4, c);
  const PaddedBlockTables p_ref = build_padded_block_tables(ex.tables, ex.lens, 4);
  const CsrBlockTables c_ref = build_csr_block_tables(ex.tables, ex.lens, 4);
  EXPECT_EQ(p.num_seqs, p_ref.num_seqs);
  EXPECT_EQ(p.max_blocks_per_seq, p_ref.max_blocks_per_seq);
  EXPECT_EQ(p.block_tables, p_ref.block_tables);
  EXPECT_EQ(p.context_lens, p_ref.context_lens);
  EXPECT_EQ(c.indptr, c_ref.indptr);
  EXPECT_EQ(c.indices, c_ref.indices);
  EXPECT_EQ(c.last_page_len, c_ref.last_page_len);
  EXPECT_EQ(p.block_tables.data(), padded_storage);
  EXPECT_EQ(c.indices.data(), csr_storage);

  // A throwing call leaves the output as it was.
  std::vector<int32_t> too_long{6, 0, 13, 4};
  EXPECT_THAT([&] { build_csr_block_tables(ex.tables, too_long, 4, c); },
              ThrowsMessage<Error>(HasSubstr("sequence 2 has context length 13 (needs 4 blocks)")));
  EXPECT_THAT([&] { build_padded_block_tables(ex.tables, too_long, 4, p); },
              ThrowsMessage<Error>(HasSubstr("sequence 2 has context length 13 (needs 4 blocks)")));
  EXPECT_EQ(c.indices, c_ref.indices);
  EXPECT_EQ(p.block_tables, p_ref.block_tables);
}

TEST(BatchMetadata, EmptyBatch) {
  PaddedBlockTables p = build_padded_block_tables({}, {}, 16);
  EXPECT_EQ(p.num_seqs, 0);
  EXPECT_EQ(p.max_blocks_per_seq, 0);
  CsrBlockTables c = build_csr_block_tables({}, {}, 16);
  EXPECT_THAT(c.indptr, ElementsAre(0));
}

TEST(BatchMetadata, SlotForPositionIsBlockTimesSizePlusOffset) {
  std::vector<BlockId> table{7, 0, 3};
  EXPECT_EQ(slot_for_position(table, 0, 4), 28);
  EXPECT_EQ(slot_for_position(table, 3, 4), 31);
  EXPECT_EQ(slot_for_position(table, 4, 4), 0);
  EXPECT_EQ(slot_for_position(table, 9, 4), 13);
  // block_size 1: the slot is the block id itself.
  EXPECT_EQ(slot_for_position(table, 2, 1), 3);
  // Positions before the table's first token are refused, not read from its first block.
  EXPECT_THAT([&] { (void)slot_for_position(table, -1, 4); },
              ThrowsMessage<Error>(HasSubstr("position -1 outside a table of 3 blocks")));
  // int64: block 2^30 - 1 with block_size 128 is past 2^31.
  std::vector<BlockId> big{(1 << 30) - 1};
  EXPECT_EQ(slot_for_position(big, 127, 128), int64_t{(1 << 30) - 1} * 128 + 127);
}

// The block-by-block form against slot_for_position at every start and length over a table
// of 3 blocks of 1, 3 and 4 tokens, plus the header's worked example; out's contents are kept.
TEST(BatchMetadata, PositionSlotsEqualSlotForPositionOfEach) {
  std::vector<BlockId> example{7, 3};
  std::vector<Slot> got{-5};
  append_position_slots(example, 2, 4, 4, got);
  EXPECT_THAT(got, ElementsAre(-5, 30, 31, 12, 13));
  std::vector<BlockId> table{7, 0, 3};
  for (int32_t bs : {1, 3, 4}) {  // 1: the one-token-per-block path
    for (int64_t first = 0; first <= 3 * bs; ++first) {
      for (int64_t n = 0; first + n <= 3 * bs; ++n) {
        std::vector<Slot> want;
        for (int64_t p = first; p < first + n; ++p) want.push_back(slot_for_position(table, p, bs));
        std::vector<Slot> out;
        append_position_slots(table, first, n, bs, out);
        EXPECT_EQ(out, want) << "bs " << bs << ": " << first << " + " << n;
      }
    }
  }
  std::vector<Slot> untouched{1, 2};
  EXPECT_THAT([&] { append_position_slots(table, 10, 3, 4, untouched); },
              ThrowsMessage<Error>(HasSubstr("position 12 outside a table of 3 blocks of 4")));
  EXPECT_THAT([&] { append_position_slots(table, -1, 1, 4, untouched); },
              ThrowsMessage<Error>(HasSubstr("first -1 and n 1 must be >= 0")));
  EXPECT_THAT([&] { append_position_slots(table, 0, 1, 0, untouched); },
              ThrowsMessage<Error>(HasSubstr("block_size must be >= 1, got 0")));
  EXPECT_THAT(untouched, ElementsAre(1, 2));
}

TEST(BatchMetadata, ErrorsNameTheValue) {
  Example ex;
  std::vector<int32_t> short_lens{6, 0, 9};
  EXPECT_THAT([&] { (void)build_padded_block_tables(ex.tables, short_lens, 4); },
              ThrowsMessage<Error>(HasSubstr("4 block tables but 3 context lengths")));
  std::vector<int32_t> too_long{6, 0, 13, 4};
  EXPECT_THAT([&] { (void)build_csr_block_tables(ex.tables, too_long, 4); },
              ThrowsMessage<Error>(HasSubstr("sequence 2 has context length 13 (needs 4 blocks)")));
  std::vector<int32_t> negative{6, -1, 9, 4};
  EXPECT_THAT([&] { (void)build_padded_block_tables(ex.tables, negative, 4); },
              ThrowsMessage<Error>(HasSubstr("negative context length -1")));
  EXPECT_THAT([&] { (void)build_padded_block_tables(ex.tables, ex.lens, 0); },
              ThrowsMessage<Error>(HasSubstr("block_size must be >= 1, got 0")));
  EXPECT_THAT([&] { (void)slot_for_position(ex.t0, 8, 4); },
              ThrowsMessage<Error>(HasSubstr("position 8 outside a table of 2 blocks")));
}

TEST(BatchMetadata, CsrRejectsMoreBlocksThanInt32IndptrHolds) {
  // Two sequences of 2^30 + 1 one-token blocks: 2^31 + 2 blocks in all, past int32. The tables
  // are views of an untouched, unreserved mapping (4 GiB of address space, no memory): the check
  // reads only their sizes and must throw before reading any id or writing `out`.
  constexpr int32_t kLen = (1 << 30) + 1;
  const size_t bytes = static_cast<size_t>(kLen) * sizeof(BlockId);
  void* region =
      mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) GTEST_SKIP() << "cannot map 4 GiB of address space";
  const std::span<const BlockId> huge(static_cast<const BlockId*>(region), kLen);
  const std::vector<std::span<const BlockId>> tables{huge, huge};
  const std::vector<int32_t> lens{kLen, kLen};
  Example ex;
  CsrBlockTables out = build_csr_block_tables(ex.tables, ex.lens, 4);
  const CsrBlockTables before = out;
  EXPECT_THAT([&] { build_csr_block_tables(tables, lens, 1, out); },
              ThrowsMessage<Error>(HasSubstr("2147483650 blocks in the batch overflow the int32")));
  EXPECT_EQ(out.indptr, before.indptr);
  EXPECT_EQ(out.indices, before.indices);
  EXPECT_EQ(out.last_page_len, before.last_page_len);
  munmap(region, bytes);
}

// ---- random batches against an independent model -----------------------------------------------

/// What batch metadata must hold for one batch, worked out from per-row tables and the header's
/// formulas: position p of a row lives at slot table[p / bs] * bs + p % bs; a row of context L
/// uses ceil(L / bs) blocks; its last page holds L - (blocks - 1) * bs tokens (0 when L = 0).
struct ModelRow {
  std::vector<BlockId> table;  // the ids the kernels see (released entries: the id they had)
  std::vector<BlockId> live;   // the manager's table (kNoBlock where released); empty for padding
  int64_t len = 0;
  int64_t n_new = 0;
};

void expect_matches_model(const BatchMetadata& meta, const std::vector<ModelRow>& rows,
                          int64_t bs) {
  const auto num = static_cast<int32_t>(rows.size());
  int64_t width = num > 0 ? 1 : 0;
  for (const ModelRow& r : rows) width = std::max(width, (r.len + bs - 1) / bs);
  EXPECT_EQ(meta.block_size, bs);
  ASSERT_EQ(meta.padded.num_seqs, num);
  ASSERT_EQ(meta.padded.max_blocks_per_seq, width);
  ASSERT_EQ(meta.padded.block_tables.size(), static_cast<size_t>(num * width));
  ASSERT_EQ(meta.padded.context_lens.size(), rows.size());
  ASSERT_EQ(meta.csr.indptr.size(), rows.size() + 1);
  ASSERT_EQ(meta.csr.last_page_len.size(), rows.size());
  ASSERT_EQ(meta.query_start.size(), rows.size() + 1);
  EXPECT_EQ(meta.csr.indptr[0], 0);
  EXPECT_EQ(meta.query_start[0], 0);
  size_t slot_at = 0;
  int64_t csr_at = 0;
  int64_t q_at = 0;
  for (int32_t i = 0; i < num; ++i) {
    const ModelRow& r = rows[i];
    const int64_t used = (r.len + bs - 1) / bs;
    EXPECT_EQ(meta.padded.context_lens[i], r.len) << "row " << i;
    for (int64_t j = 0; j < width; ++j) {
      const BlockId want = j < used ? r.table[j] : -1;
      EXPECT_EQ(meta.padded.block_tables[i * width + j], want) << "row " << i << " block " << j;
    }
    EXPECT_EQ(meta.csr.indptr[i + 1], csr_at + used) << "row " << i;
    for (int64_t j = 0; j < used && csr_at + j < static_cast<int64_t>(meta.csr.indices.size());
         ++j) {
      EXPECT_EQ(meta.csr.indices[csr_at + j], r.table[j]) << "row " << i << " block " << j;
    }
    csr_at += used;
    EXPECT_EQ(meta.csr.last_page_len[i], r.len == 0 ? 0 : r.len - (used - 1) * bs) << "row " << i;
    q_at += r.n_new;
    EXPECT_EQ(meta.query_start[i + 1], q_at) << "row " << i;
    for (int64_t p = r.len - r.n_new; p < r.len; ++p, ++slot_at) {
      ASSERT_LT(slot_at, meta.slot_mapping.size());
      EXPECT_EQ(meta.slot_mapping[slot_at], int64_t{r.live[p / bs]} * bs + p % bs)
          << "row " << i << " position " << p;
    }
  }
  EXPECT_EQ(meta.csr.indices.size(), static_cast<size_t>(csr_at));
  EXPECT_EQ(meta.slot_mapping.size(), slot_at);
}

TEST(BatchMetadata, ManagerBatchesMatchAnIndependentModel) {
  // Random appends, frees and batches (repeated rows, padding rows, prefills and decodes) under
  // each positional policy, so tables have released entries; the model keeps, per sequence,
  // the last id each table entry showed, which is what a released entry must carry.
  const EvictionPolicyConfig policies[] = {
      {},
      {.kind = EvictionKind::kSlidingWindow, .window = 5},
      {.kind = EvictionKind::kAttentionSinks, .window = 4, .sinks = 3},
  };
  for (const int32_t bs : {1, 3, 4}) {
    for (const EvictionPolicyConfig& policy : policies) {
      SCOPED_TRACE("bs " + std::to_string(bs) + " " + eviction_kind_name(policy.kind));
      KVCacheManager m({.num_blocks = 64, .block_size = bs, .eviction = policy});
      std::mt19937 rng(59 + bs);
      std::map<SeqId, std::vector<BlockId>> seen;  // per sequence: last id of each entry
      SeqId next = 0;
      int checked = 0;
      for (int step = 0; step < 600; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const uint32_t op = rng() % 8;
        if (op == 0 || seen.empty()) {
          m.add_sequence(next);
          seen[next++];
        } else if (op == 1 && seen.size() > 2) {
          auto it = std::next(seen.begin(), static_cast<long>(rng() % seen.size()));
          m.free_sequence(it->first);
          seen.erase(it);
        } else {
          auto it = std::next(seen.begin(), static_cast<long>(rng() % seen.size()));
          (void)m.append_slots(it->first, 1 + static_cast<int64_t>(rng() % 6));
        }
        for (auto& [s, ids] : seen) {
          const auto t = m.block_table(s);
          ids.resize(t.size(), -1);
          for (size_t j = 0; j < t.size(); ++j) {
            if (t[j] != KVCacheManager::kNoBlock) ids[j] = t[j];
          }
        }
        std::vector<SeqId> seqs;
        std::vector<int64_t> n_new;
        std::vector<ModelRow> rows;
        const size_t n = rng() % 6;
        for (size_t i = 0; i < n; ++i) {
          if (rng() % 6 == 0) {
            seqs.push_back(kPaddingSeq);
            n_new.push_back(0);
            rows.push_back({});
            continue;
          }
          const auto it = std::next(seen.begin(), static_cast<long>(rng() % seen.size()));
          const auto t = m.block_table(it->first);
          ModelRow r{it->second, {t.begin(), t.end()}, m.num_tokens(it->first), 0};
          // New tokens only in live blocks (the manager rejects released ones, tested elsewhere).
          const int64_t want = static_cast<int64_t>(rng() % 5);
          while (r.n_new < std::min(want, r.len) &&
                 r.live[(r.len - r.n_new - 1) / bs] != KVCacheManager::kNoBlock) {
            ++r.n_new;
          }
          seqs.push_back(it->first);
          n_new.push_back(r.n_new);
          rows.push_back(std::move(r));
        }
        expect_matches_model(m.batch_metadata(seqs, n_new), rows, bs);
        if (::testing::Test::HasFailure()) return;
        ++checked;
      }
      EXPECT_EQ(checked, 600);
    }
  }
}

TEST(BatchMetadata, BuildersMatchAnIndependentModelOnRandomTables) {
  // Tables longer than their context (extra blocks must not show), empty rows, block sizes 1..5.
  std::mt19937 rng(61);
  for (int trial = 0; trial < 500; ++trial) {
    const int32_t bs = 1 + static_cast<int32_t>(rng() % 5);
    const size_t n = rng() % 7;
    std::vector<std::vector<BlockId>> owned(n);
    std::vector<std::span<const BlockId>> tables;
    std::vector<int32_t> lens;
    std::vector<ModelRow> rows;
    for (size_t i = 0; i < n; ++i) {
      const int32_t len = static_cast<int32_t>(rng() % 23);
      const int64_t blocks = (len + bs - 1) / bs + static_cast<int64_t>(rng() % 3);
      for (int64_t j = 0; j < blocks; ++j) owned[i].push_back(static_cast<BlockId>(rng() % 1000));
      tables.emplace_back(owned[i]);
      lens.push_back(len);
      rows.push_back({owned[i], owned[i], len, 0});
    }
    BatchMetadata meta;
    meta.block_size = bs;
    meta.padded = build_padded_block_tables(tables, lens, bs);
    meta.csr = build_csr_block_tables(tables, lens, bs);
    meta.query_start.assign(n + 1, 0);  // no new tokens: the model expects zeros
    SCOPED_TRACE("trial " + std::to_string(trial));
    EXPECT_EQ(meta.padded.block_size, bs);
    expect_matches_model(meta, rows, bs);
    if (::testing::Test::HasFailure()) return;
  }
}

}  // namespace
}  // namespace pagedkv
