// README's library example, run: a request is admitted with its prompt (prefix caching on), its
// prompt is prefilled through the slots add_sequence returned, then it decodes token by token
// through append_tokens, batch_metadata, write and paged decode attention; after each forward
// step commit() says the K/V are written, which publishes the full blocks. A second request with
// the same prompt hits them. Every output is compared with the reference attention
// over the same K/V, and the block counts with hand-worked values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "pagedkv/pagedkv.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kHeadDim = 16;
constexpr int64_t kQRow = int64_t{kHeads} * kHeadDim;
constexpr int64_t kKvRow = int64_t{kKvHeads} * kHeadDim;

std::vector<float> random_rows(std::mt19937& rng, int64_t rows, int64_t width) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * width));
  for (float& e : x) e = u(rng);
  return x;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

TEST(Quickstart, AdmitPrefillDecodeAndHitThePrefix) {
  // --- the README snippet, with a small geometry ---
  KVCacheManager manager({.num_blocks = 16, .block_size = 4, .enable_prefix_caching = true});
  HostKVCache cache({.num_layers = 1,
                     .num_blocks = 16,
                     .block_size = 4,
                     .num_kv_heads = kKvHeads,
                     .head_dim = kHeadDim});
  const AttentionParams params{.num_heads = kHeads, .num_kv_heads = kKvHeads, .head_dim = kHeadDim};
  const std::vector<TokenId> prompt{7, 3, 9, 1, 4, 4, 2, 8, 5, 6};  // 10 tokens: 2 full blocks
  const SeqId seq = 1;

  ASSERT_EQ(manager.can_add_sequence(prompt), Admission::kOk);
  std::optional<AddResult> added = manager.add_sequence(seq, prompt);
  ASSERT_TRUE(added);
  EXPECT_EQ(added->num_computed_tokens, 0);  // nothing cached yet
  ASSERT_EQ(added->append.slots.size(), prompt.size());

  // Prefill: the model's K/V of the 10 prompt tokens go to the returned slots.
  std::mt19937 rng(11);
  ReferenceKVCache ref(1, kKvHeads, kHeadDim);
  ref.add_sequence(seq);
  const int64_t n = static_cast<int64_t>(prompt.size());
  std::vector<float> k = random_rows(rng, n, kKvRow), v = random_rows(rng, n, kKvRow);
  cache.write(0, added->append.slots, k, v);
  ref.append(seq, 0, k, v);
  std::vector<float> q = random_rows(rng, n, kQRow), out(q.size()), expect(q.size());
  const std::vector<SeqId> seqs{seq};
  BatchMetadata meta = manager.batch_metadata(seqs, std::vector<int64_t>{n});
  paged_prefill_attention(params, cache.layer(0), meta.padded.view(), meta.query_start, q, out);
  reference_attention(params, q, ref.keys(seq, 0), ref.values(seq, 0), n, expect);
  EXPECT_LE(max_abs_diff(out, expect), 1e-5f);
  // The prompt's K/V are written: its 2 full blocks become shareable.
  EXPECT_EQ(manager.commit(seq, n), 2);

  // Decode: one token per step.
  for (TokenId next : {TokenId{12}, TokenId{13}, TokenId{14}}) {
    std::optional<AppendResult> r = manager.append_tokens(seq, std::span(&next, 1));
    ASSERT_TRUE(r);  // empty optional: out of blocks (preempt someone, retry)
    cache.copy_blocks(r->copies);
    meta = manager.batch_metadata(seqs, std::vector<int64_t>{1});
    std::vector<float> k1 = random_rows(rng, 1, kKvRow), v1 = random_rows(rng, 1, kKvRow);
    cache.write(0, meta.slot_mapping, k1, v1);
    ref.append(seq, 0, k1, v1);
    std::vector<float> q1 = random_rows(rng, 1, kQRow), o1(q1.size()), e1(q1.size());
    paged_decode_attention(params, cache.layer(0), meta.padded.view(), q1, o1);
    reference_attention(params, q1, ref.keys(seq, 0), ref.values(seq, 0), manager.num_tokens(seq),
                        e1);
    EXPECT_LE(max_abs_diff(o1, e1), 1e-5f);
    manager.commit(seq, manager.num_tokens(seq));  // position 11 fills block 2: published
  }
  EXPECT_EQ(manager.num_tokens(seq), 13);
  EXPECT_EQ(manager.block_table(seq).size(), 4u);  // ceil(13 / 4)

  // The same prompt again: its 2 full blocks are shared, 2 tokens are left to prefill.
  std::optional<AddResult> again = manager.add_sequence(2, prompt);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->num_computed_tokens, 8);
  EXPECT_EQ(again->append.slots.size(), 2u);
  EXPECT_EQ(manager.block_table(2)[0], manager.block_table(seq)[0]);
  EXPECT_EQ(manager.block_table(2)[1], manager.block_table(seq)[1]);
  manager.free_sequence(seq);
  manager.free_sequence(2);
  EXPECT_EQ(manager.num_free_blocks(), 16);
  manager.check_invariants();
}

}  // namespace
}  // namespace pagedkv
