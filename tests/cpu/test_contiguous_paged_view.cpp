// Contiguous cache as a paged view (contiguous_paged_view.hpp): geometry, the identity table,
// errors, and the point of it: attention over the contiguous copy of a paged cache gives the same
// bits (with the same work split) through the same kernel.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <vector>

#include "common/paged_scenario.hpp"
#include "cpu/attention_fast.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/contiguous_paged_view.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::make_scenario;
using testing::max_abs_diff;
using testing::PagedScenario;

TEST(ContiguousKV, ViewGeometryHnd) {
  // The worked example of the header.
  float dummy = 0.0f;
  const KVLayerView view = contiguous_paged_view(
      {.num_seqs = 2, .num_kv_heads = 4, .max_len = 1024, .head_dim = 128}, &dummy, &dummy);
  EXPECT_EQ(view.num_blocks, 2);
  EXPECT_EQ(view.block_size, 1024);
  EXPECT_EQ(view.block_stride, 524288);
  EXPECT_EQ(view.head_stride, 131072);
  EXPECT_EQ(view.token_stride, 128);
  // Element (seq 1, head 2, pos 5) of a [seqs, heads, max_len, dim] array.
  EXPECT_EQ(view.offset(1, 2, 5), ((1 * 4 + 2) * 1024 + 5) * 128);
}

TEST(ContiguousKV, ViewGeometryNhd) {
  float dummy = 0.0f;
  const ContiguousKVShape shape{.num_seqs = 3,
                                .num_kv_heads = 2,
                                .max_len = 10,
                                .head_dim = 8,
                                .dtype = DType::kBF16,
                                .layout = KVLayout::kNHD};
  const KVLayerView view = contiguous_paged_view(shape, &dummy, &dummy);
  EXPECT_EQ(view.dtype, DType::kBF16);
  // Element (seq 2, head 1, pos 7) of a [seqs, max_len, heads, dim] array.
  EXPECT_EQ(view.offset(2, 1, 7), ((2 * 10 + 7) * 2 + 1) * 8);
  EXPECT_EQ(contiguous_kv_elements(shape), 3 * 2 * 10 * 8);
}

TEST(ContiguousKV, IdentityTables) {
  const std::vector<int32_t> lens = {5, 0, 9};
  const PaddedBlockTables t = identity_block_tables(lens, 9);
  EXPECT_EQ(t.num_seqs, 3);
  EXPECT_EQ(t.max_blocks_per_seq, 1);
  EXPECT_THAT(t.block_tables, ElementsAre(0, 1, 2));
  EXPECT_THAT(t.context_lens, ElementsAre(5, 0, 9));
  const PaddedBlockTables empty = identity_block_tables({}, 4);
  EXPECT_EQ(empty.num_seqs, 0);
  EXPECT_EQ(empty.max_blocks_per_seq, 0);
}

TEST(ContiguousKV, Errors) {
  float x = 0.0f;
  EXPECT_THAT([&] { (void)contiguous_paged_view({.num_seqs = 0}, &x, &x); },
              ::testing::ThrowsMessage<Error>(HasSubstr("num_seqs must be >= 1, got 0")));
  EXPECT_THAT([&] { (void)contiguous_paged_view({.max_len = -4}, &x, &x); },
              ::testing::ThrowsMessage<Error>(HasSubstr("max_len must be >= 1, got -4")));
  EXPECT_THAT([&] { (void)contiguous_paged_view({}, nullptr, &x); },
              ::testing::ThrowsMessage<Error>(HasSubstr("null K or V buffer")));
  const std::vector<int32_t> too_long = {3, 11};
  EXPECT_THAT([&] { (void)identity_block_tables(too_long, 10); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("context length 11 of sequence 1 outside [0, max_len 10]")));
  const std::vector<int32_t> negative = {-1};
  EXPECT_THAT([&] { (void)identity_block_tables(negative, 10); },
              ::testing::ThrowsMessage<Error>(HasSubstr("context length -1 of sequence 0")));
}

/// Copies the stored (dtype-rounded) K/V of a paged scenario into a contiguous cache.
struct ContiguousCopy {
  ContiguousKVShape shape;
  std::vector<std::byte> k, v;
  KVLayerView view;
  PaddedBlockTables tables;
};

ContiguousCopy copy_to_contiguous(const PagedScenario& s, KVLayout layout, int32_t max_len) {
  ContiguousCopy c;
  c.shape = {.num_seqs = static_cast<int32_t>(s.seqs.size()),
             .num_kv_heads = s.config.num_kv_heads,
             .max_len = max_len,
             .head_dim = s.config.head_dim,
             .dtype = s.config.dtype,
             .layout = layout};
  const auto bytes =
      static_cast<size_t>(contiguous_kv_elements(c.shape) * dtype_size(c.shape.dtype));
  // NaN everywhere a sequence has no token: reading past a context would show.
  c.k.resize(bytes);
  c.v.resize(bytes);
  c.view = contiguous_paged_view(c.shape, c.k.data(), c.v.data());
  for (int64_t i = 0; i < contiguous_kv_elements(c.shape); ++i) {
    store_from_f32(c.k.data(), c.shape.dtype, i, std::numeric_limits<float>::quiet_NaN());
    store_from_f32(c.v.data(), c.shape.dtype, i, std::numeric_limits<float>::quiet_NaN());
  }
  const int32_t heads = c.shape.num_kv_heads;
  const int32_t dim = c.shape.head_dim;
  for (size_t seq = 0; seq < s.seqs.size(); ++seq) {
    const std::vector<float> ks = s.stored(seq, false);  // [ctx, heads, dim]
    const std::vector<float> vs = s.stored(seq, true);
    for (int64_t p = 0; p < s.seqs[seq].context_len; ++p) {
      for (int32_t h = 0; h < heads; ++h) {
        const int64_t dst = c.view.offset(static_cast<int64_t>(seq), h, p);
        const int64_t src = (p * heads + h) * dim;
        for (int32_t d = 0; d < dim; ++d) {
          store_from_f32(c.k.data(), c.shape.dtype, dst + d, ks[src + d]);
          store_from_f32(c.v.data(), c.shape.dtype, dst + d, vs[src + d]);
        }
      }
    }
  }
  c.tables = identity_block_tables(s.context_lens, max_len);
  return c;
}

struct SameBitsCase {
  DType dtype;
  KVLayout layout;
  int32_t block_size;
  bool prefill;
};

class ContiguousSameBits : public ::testing::TestWithParam<SameBitsCase> {};

TEST_P(ContiguousSameBits, PagedAndContiguousGiveIdenticalOutputs) {
  // With the same work split (kv heads per item, key partitions), the kernel visits keys in the
  // same order and tiles whatever the table says, so the paged cache and its contiguous copy give
  // bit-identical outputs: the benchmark compares the speed of exactly this pair. Through the
  // public functions the kernel may split the two differently (it groups kv heads when a
  // block's per-head runs are short), which changes only the fp32 summation order.
  const SameBitsCase& p = GetParam();
  KVCacheConfig geometry;
  geometry.block_size = p.block_size;
  geometry.num_kv_heads = 2;
  geometry.head_dim = 64;
  geometry.dtype = p.dtype;
  AttentionParams params;
  params.num_heads = 8;
  params.num_kv_heads = 2;
  params.head_dim = 64;
  const std::vector<testing::SeqSpec> seqs =
      p.prefill ? std::vector<testing::SeqSpec>{{700, 20}, {33, 33}, {0, 0}, {5, 1}}
                : std::vector<testing::SeqSpec>{{700, 1}, {33, 1}, {0, 1}, {2049, 1}};
  const PagedScenario s = make_scenario(geometry, params, seqs, 19);
  const ContiguousCopy c = copy_to_contiguous(s, p.layout, /*max_len=*/2100);

  for (const detail::FastAttentionConfig& config :
       {detail::FastAttentionConfig{.num_threads = 2, .partition_keys = 0, .heads_per_item = 1},
        detail::FastAttentionConfig{.num_threads = 1, .partition_keys = 96, .heads_per_item = 2}}) {
    std::vector<float> paged(s.q.size()), contiguous(s.q.size());
    detail::fast_paged_prefill_attention(params, s.layer(), s.view(), s.query_start, s.q, paged,
                                         config);
    detail::fast_paged_prefill_attention(params, c.view, c.tables.view(), s.query_start, s.q,
                                         contiguous, config);
    EXPECT_EQ(paged, contiguous);
  }

  std::vector<float> paged(s.q.size()), contiguous(s.q.size());
  if (p.prefill) {
    paged_prefill_attention(params, s.layer(), s.view(), s.query_start, s.q, paged);
    paged_prefill_attention(params, c.view, c.tables.view(), s.query_start, s.q, contiguous);
  } else {
    paged_decode_attention(params, s.layer(), s.view(), s.q, paged);
    paged_decode_attention(params, c.view, c.tables.view(), s.q, contiguous);
  }
  const std::vector<float> ref = s.reference(/*rounded=*/true);
  EXPECT_LE(max_abs_diff(paged, contiguous), 1e-6);
  EXPECT_LE(max_abs_diff(paged, ref), 1e-5);
  EXPECT_LE(max_abs_diff(contiguous, ref), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContiguousSameBits,
                         ::testing::Values(SameBitsCase{DType::kF32, KVLayout::kHND, 16, false},
                                           SameBitsCase{DType::kBF16, KVLayout::kHND, 7, false},
                                           SameBitsCase{DType::kF16, KVLayout::kNHD, 32, false},
                                           SameBitsCase{DType::kF32, KVLayout::kNHD, 8, true},
                                           SameBitsCase{DType::kBF16, KVLayout::kHND, 128, true}),
                         [](const ::testing::TestParamInfo<SameBitsCase>& info) {
                           const SameBitsCase& p = info.param;
                           return std::string(p.prefill ? "prefill_" : "decode_") +
                                  std::string(dtype_name(p.dtype)) +
                                  (p.layout == KVLayout::kHND ? "_hnd" : "_nhd") + "_bs" +
                                  std::to_string(p.block_size);
                         });

}  // namespace
}  // namespace pagedkv
