#pragma once
// Test helper: field-by-field equality of two BatchMetadata objects (the struct has no
// operator==), as GoogleTest expectations so a mismatch names the field.

#include <gtest/gtest.h>

#include "pagedkv/metadata/batch_metadata.hpp"

namespace pagedkv::testing {

inline void expect_same_metadata(const BatchMetadata& a, const BatchMetadata& b) {
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.padded.num_seqs, b.padded.num_seqs);
  EXPECT_EQ(a.padded.max_blocks_per_seq, b.padded.max_blocks_per_seq);
  EXPECT_EQ(a.padded.block_tables, b.padded.block_tables);
  EXPECT_EQ(a.padded.context_lens, b.padded.context_lens);
  EXPECT_EQ(a.csr.indptr, b.csr.indptr);
  EXPECT_EQ(a.csr.indices, b.csr.indices);
  EXPECT_EQ(a.csr.last_page_len, b.csr.last_page_len);
  EXPECT_EQ(a.slot_mapping, b.slot_mapping);
  EXPECT_EQ(a.query_start, b.query_start);
}

}  // namespace pagedkv::testing
