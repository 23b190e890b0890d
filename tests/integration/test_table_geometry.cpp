// Issue 16, item 5: geometry is checked where the tables meet the cache. A manager with
// block_size 4 and a cache with block_size 16 were accepted together by paged_decode_attention
// (the reads go wrong as soon as blocks are not contiguous); the block-table view now carries the
// block size (and pool size) it was built for, and every attention entry point refuses a cache
// of another geometry, naming both values, before writing anything.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/pagedkv.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;

constexpr AttentionParams kParams{.num_heads = 4, .num_kv_heads = 2, .head_dim = 8};

HostKVCache cache_of(int32_t num_blocks, int32_t block_size) {
  return HostKVCache({.num_layers = 1,
                      .num_blocks = num_blocks,
                      .block_size = block_size,
                      .num_kv_heads = kParams.num_kv_heads,
                      .head_dim = kParams.head_dim});
}

/// Runs `f(out)` and returns its error message; a refused call must leave `out` untouched.
template <typename F>
std::string refusal(F f, size_t rows) {
  std::vector<float> out(rows * kParams.num_heads * kParams.head_dim, 7.0f);
  try {
    f(out);
  } catch (const Error& e) {
    for (float x : out) EXPECT_EQ(x, 7.0f);
    return e.what();
  }
  ADD_FAILURE() << "no pagedkv::Error thrown";
  return "";
}

class TableGeometry : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.add_sequence(1);
    m_.add_sequence(2);
    ASSERT_TRUE(m_.append_slots(1, 6));  // blocks 0, 1
    ASSERT_TRUE(m_.append_slots(2, 9));  // blocks 2, 3, 4
    ASSERT_TRUE(m_.append_slots(1, 3));  // block 5: sequence 1's blocks are not contiguous
    meta_ = m_.batch_metadata(seqs_, decode_);
    q_.assign(2 * kParams.num_heads * kParams.head_dim, 0.5f);
  }

  std::string decode_refusal(const HostKVCache& cache, const BlockTableView& tables) {
    return refusal(
        [&](std::span<float> out) {
          paged_decode_attention(kParams, cache.layer(0), tables, q_, out);
        },
        2);
  }

  KVCacheManager m_{{.num_blocks = 8, .block_size = 4}};
  const std::vector<SeqId> seqs_{1, 2};
  const std::vector<int64_t> decode_{1, 1};
  BatchMetadata meta_;
  std::vector<float> q_;
};

TEST_F(TableGeometry, ViewsCarryTheManagersBlockSize) {
  EXPECT_EQ(meta_.padded.block_size, 4);
  EXPECT_EQ(meta_.padded.view().block_size, 4);
  EXPECT_EQ(meta_.padded.view().num_blocks, meta_.padded.num_blocks);
}

TEST_F(TableGeometry, ManagerOfBlockSize4AndCacheOf16AreRefusedByDecodeAndPrefill) {
  const HostKVCache cache = cache_of(8, 16);
  EXPECT_THAT(decode_refusal(cache, meta_.padded.view()),
              HasSubstr("paged_decode_attention: block tables built for block_size 4 but the "
                        "cache has block_size 16"));
  EXPECT_THAT(refusal(
                  [&](std::span<float> out) {
                    paged_prefill_attention(kParams, cache.layer(0), meta_.padded.view(),
                                            meta_.query_start, q_, out);
                  },
                  2),
              HasSubstr("paged_prefill_attention: block tables built for block_size 4 but the "
                        "cache has block_size 16"));
  // The same batch over a cache of the manager's geometry runs (the control).
  const HostKVCache same = cache_of(8, 4);
  std::vector<float> out(q_.size());
  EXPECT_NO_THROW(paged_decode_attention(kParams, same.layer(0), meta_.padded.view(), q_, out));
}

TEST_F(TableGeometry, AViewWithoutABlockSizeIsRefused) {
  const HostKVCache cache = cache_of(8, 4);
  BlockTableView v = meta_.padded.view();
  v.block_size = 0;
  EXPECT_THAT(decode_refusal(cache, v),
              HasSubstr("block tables built for block_size 0 but the cache has block_size 4 (the "
                        "tables and the cache must come from one configuration; the view's "
                        "block_size is unset)"));
  // Even an empty batch: geometry is configuration, not data.
  v.num_seqs = 0;
  EXPECT_THAT(refusal(
                  [&](std::span<float> out) {
                    paged_decode_attention(kParams, cache.layer(0), v, {}, out);
                  },
                  0),
              HasSubstr("built for block_size 0"));
}

TEST_F(TableGeometry, ACacheWithFewerBlocksThanThePoolIsRefused) {
  BlockTableView v = meta_.padded.view();
  v.num_blocks = m_.num_total_blocks();  // what a caller that knows the pool states
  EXPECT_THAT(decode_refusal(cache_of(6, 4), v),
              HasSubstr("block tables index a pool of 8 blocks but the cache has num_blocks 6"));
  // A cache with more blocks than the pool is fine: every id the tables hold exists.
  std::vector<float> out(q_.size());
  const HostKVCache bigger = cache_of(12, 4);
  EXPECT_NO_THROW(paged_decode_attention(kParams, bigger.layer(0), v, q_, out));
}

TEST(TableGeometryContiguous, IdentityTablesCarryTheContiguousGeometry) {
  const std::vector<int32_t> lens{3, 5};
  const PaddedBlockTables t = identity_block_tables(lens, 8);
  EXPECT_EQ(t.block_size, 8);
  EXPECT_EQ(t.num_blocks, 2);
  // A contiguous view reserving 3 sequences accepts tables of 2 rows; one of max_len 4 does not.
  std::vector<float> k(3 * 2 * 8 * 8), v(k.size()), q(2 * 4 * 8, 0.5f), out(q.size());
  EXPECT_NO_THROW(paged_decode_attention(
      kParams, contiguous_paged_view({3, 2, 8, 8}, k.data(), v.data()), t.view(), q, out));
  EXPECT_THAT(
      [&] {
        paged_decode_attention(kParams, contiguous_paged_view({2, 2, 4, 8}, k.data(), v.data()),
                               t.view(), q, out);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("built for block_size 8 but the cache has "
                                                "block_size 4")));
}

TEST(TableGeometrySlots, SlotListsOfAnotherBlockSizeAreRefused) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 5));
  const std::vector<SeqId> seqs{1};
  const KeptTokens kept = m.kept_tokens(seqs);
  const HostKVCache cache = cache_of(8, 16);
  std::vector<float> q(kParams.num_heads * kParams.head_dim, 0.5f), out(q.size());
  EXPECT_THAT(
      [&] {
        paged_attention_over_slots(kParams, cache.layer(0), {kept.indptr, kept.slots, 4}, q, out);
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("paged_attention_over_slots: block tables built "
                                                "for block_size 4 but the cache has block_size "
                                                "16")));
}

}  // namespace
}  // namespace pagedkv
