// Tests for include/pagedkv/batch_metadata.hpp: both formats element by element on a
// hand-computed example, slot arithmetic in int64, and the documented errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <limits>

#include "pagedkv/error.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"

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
  // int64: block 2^30 - 1 with block_size 128 is past 2^31.
  std::vector<BlockId> big{(1 << 30) - 1};
  EXPECT_EQ(slot_for_position(big, 127, 128), int64_t{(1 << 30) - 1} * 128 + 127);
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

}  // namespace
}  // namespace pagedkv
