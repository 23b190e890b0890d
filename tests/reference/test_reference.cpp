// The ground truth checked against itself: hand-worked examples for reference_attention and
// reference_attention_subset, and the ReferenceKVCache bookkeeping.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/reference/reference_attention.hpp"
#include "pagedkv/reference/reference_kv_cache.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using ::testing::ThrowsMessage;

constexpr float kTol = 1e-6f;

AttentionParams one_head(float scale) {
  AttentionParams p;
  p.num_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = 2;
  p.scale = scale;
  return p;
}

// Hand example, head_dim 2, scale 1, two keys:
//   K0 = [0, 0], K1 = [ln 3, 0], V0 = [1, 0], V1 = [0, 4], q = [1, 0]
//   scores = [0, ln 3] -> exp = [1, 3] -> softmax = [1/4, 3/4]
//   out = 1/4 [1, 0] + 3/4 [0, 4] = [0.25, 3].
const float kLn3 = std::log(3.0f);
const std::vector<float> kK = {0, 0, kLn3, 0};
const std::vector<float> kV = {1, 0, 0, 4};

TEST(ReferenceAttention, HandWorkedDecode) {
  const std::vector<float> q = {1, 0};
  std::vector<float> out(2);
  reference_attention(one_head(1.0f), q, kK, kV, 2, out);
  EXPECT_THAT(out, ElementsAre(FloatNear(0.25f, kTol), FloatNear(3.0f, kTol)));
}

TEST(ReferenceAttention, HandWorkedCausalPrefill) {
  // Two queries at positions 0 and 1. Query 0 sees only K0: weight 1 on V0 whatever q is.
  // Query 1 is the decode example above.
  const std::vector<float> q = {5, -7, 1, 0};
  std::vector<float> out(4);
  reference_attention(one_head(1.0f), q, kK, kV, 2, out);
  EXPECT_THAT(out, Pointwise(FloatNear(kTol), std::vector<float>{1, 0, 0.25f, 3}));
}

TEST(ReferenceAttention, DefaultScaleIsOneOverSqrtHeadDim) {
  // scale 0 -> 1/sqrt(2). K1 = [a, a] with a = ln 3 / sqrt 2 and q = [1, 1]:
  // q.K1 = 2a = sqrt 2 ln 3, scaled: ln 3 -> again weights [1/4, 3/4] -> [0.25, 3].
  const float a = kLn3 / std::sqrt(2.0f);
  const std::vector<float> k = {0, 0, a, a};
  const std::vector<float> q = {1, 1};
  std::vector<float> out(2);
  reference_attention(one_head(0.0f), q, k, kV, 2, out);
  EXPECT_THAT(out, ElementsAre(FloatNear(0.25f, kTol), FloatNear(3.0f, kTol)));
}

TEST(ReferenceAttention, HandWorkedGqa) {
  // 4 query heads, 2 kv heads (group 2): heads 0, 1 read kv head 0; heads 2, 3 read kv head 1.
  // Two tokens; per token the layout is [kv head 0 (2 dims), kv head 1 (2 dims)].
  //   kv head 0: K = [0,0], [ln 3, 0]; V = [1,0], [0,4]   (the example above)
  //   kv head 1: K = [0,0], [0,0];      V = [10,0], [0,10] (equal scores: weights 1/2, 1/2)
  // head 0: q [1,0] -> [0.25, 3];  head 1: q [0,0] -> equal weights -> [0.5, 2];
  // head 2: q [1,0] on kv head 1 -> [5, 5];  head 3: q [9,9] on kv head 1 -> [5, 5].
  AttentionParams p;
  p.num_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 2;
  p.scale = 1.0f;
  const std::vector<float> k = {0, 0, 0, 0, kLn3, 0, 0, 0};
  const std::vector<float> v = {1, 0, 10, 0, 0, 4, 0, 10};
  const std::vector<float> q = {1, 0, 0, 0, 1, 0, 9, 9};
  std::vector<float> out(8);
  reference_attention(p, q, k, v, 2, out);
  EXPECT_THAT(out, Pointwise(FloatNear(kTol), std::vector<float>{0.25f, 3, 0.5f, 2, 5, 5, 5, 5}));
}

// Four tokens with zero keys (all visible keys weigh the same) and V_j = [j + 1, 0]: the
// output's first component is the mean of (j + 1) over the visible positions j.
float mean_of_visible(int32_t window_left, int32_t sink_tokens, int32_t chunk_size = 0) {
  AttentionParams p = one_head(1.0f);
  p.window_left = window_left;
  p.sink_tokens = sink_tokens;
  p.chunk_size = chunk_size;
  const std::vector<float> k(8, 0.0f);
  const std::vector<float> v = {1, 0, 2, 0, 3, 0, 4, 0};
  const std::vector<float> q = {1, 1};  // position 3
  std::vector<float> out(2);
  reference_attention(p, q, k, v, 4, out);
  return out[0];
}

// The same four tokens, all four as queries: row p's first component is the mean of (j + 1)
// over the positions j query p sees.
std::vector<float> prefill_of_four(const AttentionParams& p) {
  const std::vector<float> k(8, 0.0f);
  const std::vector<float> v = {1, 0, 2, 0, 3, 0, 4, 0};
  const std::vector<float> q(8, 1.0f);
  std::vector<float> out(8);
  reference_attention(p, q, k, v, 4, out);
  return out;
}

TEST(ReferenceAttention, HandWorkedWindowAndSinks) {
  EXPECT_NEAR(mean_of_visible(-1, 0), 2.5f, kTol);     // keys 0..3
  EXPECT_NEAR(mean_of_visible(2, 0), 3.5f, kTol);      // keys 2, 3
  EXPECT_NEAR(mean_of_visible(2, 1), 8.0f / 3, kTol);  // keys 0, 2, 3
  EXPECT_NEAR(mean_of_visible(1, 0), 4.0f, kTol);      // key 3 only
  EXPECT_EQ(mean_of_visible(0, 0), 0.0f);              // nothing visible -> zeros
  EXPECT_NEAR(mean_of_visible(0, 2), 1.5f, kTol);      // sinks 0, 1 only
  EXPECT_NEAR(mean_of_visible(10, 0), 2.5f, kTol);     // window wider than the context
  EXPECT_NEAR(mean_of_visible(-1, 2), 2.5f, kTol);     // sinks without a window: no effect
  EXPECT_NEAR(mean_of_visible(2, 3), 2.5f, kTol);      // sinks 0..2 + window 2..3 = all
}

TEST(ReferenceAttention, HandWorkedWindowPrefill) {
  // All four positions as queries, window 2: pos 0 -> {0}: 1; pos 1 -> {0,1}: 1.5;
  // pos 2 -> {1,2}: 2.5; pos 3 -> {2,3}: 3.5.
  AttentionParams p = one_head(1.0f);
  p.window_left = 2;
  EXPECT_THAT(prefill_of_four(p),
              Pointwise(FloatNear(kTol), std::vector<float>{1, 0, 1.5f, 0, 2.5f, 0, 3.5f, 0}));
}

TEST(ReferenceAttention, HandWorkedChunks) {
  // The query at position 3 sees its chunk [floor(3 / C) x C, 3] (Llama 4's chunked local
  // attention), plus sinks; a window as well keeps the later edge.
  EXPECT_NEAR(mean_of_visible(-1, 0, 1), 4.0f, kTol);      // chunk {3}
  EXPECT_NEAR(mean_of_visible(-1, 0, 2), 3.5f, kTol);      // chunk {2, 3}
  EXPECT_NEAR(mean_of_visible(-1, 0, 3), 4.0f, kTol);      // chunk {3, 4, 5}: only 3 exists
  EXPECT_NEAR(mean_of_visible(-1, 0, 4), 2.5f, kTol);      // chunk {0..3}: all
  EXPECT_NEAR(mean_of_visible(-1, 0, 100), 2.5f, kTol);    // chunk past the context: all
  EXPECT_NEAR(mean_of_visible(-1, 1, 2), 8.0f / 3, kTol);  // sink 0 + chunk {2, 3}
  EXPECT_NEAR(mean_of_visible(1, 0, 4), 4.0f, kTol);       // window 1 inside chunk 4: {3}
  EXPECT_NEAR(mean_of_visible(3, 0, 2), 3.5f, kTol);       // chunk {2, 3} inside window {1..3}
}

TEST(ReferenceAttention, HandWorkedChunkedPrefill) {
  // All four positions as queries, chunk 2: pos 0 -> {0}: 1; pos 1 -> {0,1}: 1.5;
  // pos 2 -> {2}: 3; pos 3 -> {2,3}: 3.5.
  AttentionParams p = one_head(1.0f);
  p.chunk_size = 2;
  EXPECT_THAT(prefill_of_four(p),
              Pointwise(FloatNear(kTol), std::vector<float>{1, 0, 1.5f, 0, 3, 0, 3.5f, 0}));
  p.chunk_size = -1;
  EXPECT_THROW((void)prefill_of_four(p), Error);
}

TEST(ReferenceAttention, LargeScoresDoNotOverflow) {
  // Scores 999 and 1000: exp(1000) overflows even double, the max-subtracted softmax does not.
  // Weights 1/(1+e) and e/(1+e): out = [1/(1+e), 4e/(1+e)] = [0.2689414, 2.9242344].
  const std::vector<float> k = {999, 0, 1000, 0};
  const std::vector<float> q = {1, 0};
  std::vector<float> out(2);
  reference_attention(one_head(1.0f), q, k, kV, 2, out);
  const double e = std::exp(1.0);
  EXPECT_THAT(out, ElementsAre(FloatNear(static_cast<float>(1 / (1 + e)), kTol),
                               FloatNear(static_cast<float>(4 * e / (1 + e)), kTol)));
}

TEST(ReferenceAttention, PrefillRowsEqualDecodeOverTheirPrefix) {
  // Causality as a property: query i of a prefill equals a decode over the first pos + 1 tokens.
  AttentionParams p;
  p.num_heads = 6;
  p.num_kv_heads = 2;
  p.head_dim = 8;
  const int64_t t = 9, n_q = 5, kv_row = 16, q_row = 48;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1, 1);
  std::vector<float> k(t * kv_row), v(t * kv_row), q(n_q * q_row), out(q.size());
  for (auto* x : {&k, &v, &q}) {
    for (float& e : *x) e = uni(rng);
  }
  reference_attention(p, q, k, v, t, out);
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t prefix = t - n_q + i + 1;
    std::vector<float> one(q_row);
    reference_attention(p, std::span(q).subspan(i * q_row, q_row),
                        std::span(k).first(prefix * kv_row), std::span(v).first(prefix * kv_row),
                        prefix, one);
    EXPECT_THAT(std::span(out).subspan(i * q_row, q_row), Pointwise(FloatNear(kTol), one));
  }
}

TEST(ReferenceAttention, NoQueriesWritesNothingButStillChecksOut) {
  // Zero query rows: the empty output (a zero-length prefix of a sentinel buffer) is all it may
  // write, and a non-empty out is still refused by the size check.
  std::vector<float> sentinel(2, 7.0f);
  reference_attention(one_head(1.0f), {}, kK, kV, 2, std::span(sentinel).first(0));
  EXPECT_THAT(sentinel, ElementsAre(7.0f, 7.0f));
  EXPECT_THAT([&] { reference_attention(one_head(1.0f), {}, kK, kV, 2, sentinel); },
              ThrowsMessage<Error>(HasSubstr("out has 2 elements, q has 0")));
}

TEST(ReferenceAttention, ErrorsNameTheValue) {
  std::vector<float> out(6);
  const std::vector<float> q3 = {1, 0, 1, 0, 1, 0};
  EXPECT_THAT([&] { reference_attention(one_head(1.0f), q3, kK, kV, 2, out); },
              ThrowsMessage<Error>(HasSubstr("3 query tokens but only 2 kv tokens")));
  const std::vector<float> q_odd = {1, 0, 1};
  std::vector<float> out3(3);
  EXPECT_THAT([&] { reference_attention(one_head(1.0f), q_odd, kK, kV, 2, out3); },
              ThrowsMessage<Error>(HasSubstr("q has 3 elements, not a multiple")));
  const std::vector<float> q = {1, 0};
  std::vector<float> out2(2);
  EXPECT_THAT([&] { reference_attention(one_head(1.0f), q, kK, kV, 3, out2); },
              ThrowsMessage<Error>(HasSubstr("k has 4 and v has 4 elements, expected 6")));
  std::vector<float> out1(1);
  EXPECT_THAT([&] { reference_attention(one_head(1.0f), q, kK, kV, 2, out1); },
              ThrowsMessage<Error>(HasSubstr("out has 1 elements")));
  AttentionParams p = one_head(1.0f);
  p.num_heads = 3;
  p.num_kv_heads = 2;
  EXPECT_THAT([&] { reference_attention(p, q, kK, kV, 2, out2); },
              ThrowsMessage<Error>(HasSubstr("num_heads 3 is not a multiple of num_kv_heads 2")));
}

TEST(ReferenceAttentionSubset, HandWorked) {
  // Zero keys, V_j = [j + 1, 0]: the output is the mean over the kept positions.
  const AttentionParams p = one_head(1.0f);
  const std::vector<float> k(8, 0.0f);
  const std::vector<float> v = {1, 0, 2, 0, 3, 0, 4, 0};
  const std::vector<float> q = {1, 1};
  std::vector<float> out(2);
  const std::vector<int64_t> ends = {3, 0};
  reference_attention_subset(p, q, k, v, 4, ends, out);
  EXPECT_THAT(out, ElementsAre(FloatNear(2.5f, kTol), FloatNear(0.0f, kTol)));
  const std::vector<int64_t> repeated = {3, 0, 3};  // a position given twice counts once
  reference_attention_subset(p, q, k, v, 4, repeated, out);
  EXPECT_NEAR(out[0], 2.5f, kTol);
  out = {9, 9};
  reference_attention_subset(p, q, k, v, 4, {}, out);
  EXPECT_THAT(out, ElementsAre(0.0f, 0.0f));
  // The softmax example: keep both positions of the 2-token example -> [0.25, 3].
  const std::vector<int64_t> both = {1, 0};
  const std::vector<float> q10 = {1, 0};
  reference_attention_subset(p, q10, kK, kV, 2, both, out);
  EXPECT_THAT(out, ElementsAre(FloatNear(0.25f, kTol), FloatNear(3.0f, kTol)));
}

TEST(ReferenceAttentionSubset, WindowSetEqualsWindowedAttention) {
  AttentionParams p;
  p.num_heads = 4;
  p.num_kv_heads = 1;
  p.head_dim = 16;
  p.window_left = 5;
  p.sink_tokens = 2;
  const int64_t t = 20;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(-1, 1);
  std::vector<float> k(t * 16), v(t * 16), q(64), windowed(64), subset(64);
  for (auto* x : {&k, &v, &q}) {
    for (float& e : *x) e = uni(rng);
  }
  reference_attention(p, q, k, v, t, windowed);
  const std::vector<int64_t> kept = {0, 1, 15, 16, 17, 18, 19};  // sinks + last 5 of pos 19
  reference_attention_subset(p, q, k, v, t, kept, subset);
  EXPECT_THAT(subset, Pointwise(FloatNear(kTol), windowed));
}

TEST(ReferenceAttentionSubset, ErrorsNameTheValue) {
  const std::vector<float> q = {1, 0};
  std::vector<float> out(2);
  const std::vector<int64_t> bad = {0, 4};
  EXPECT_THAT([&] { reference_attention_subset(one_head(1.0f), q, kK, kV, 2, bad, out); },
              ThrowsMessage<Error>(HasSubstr("position 4 out of range [0, 2)")));
  const std::vector<float> q2 = {1, 0, 1, 0};
  EXPECT_THAT([&] { reference_attention_subset(one_head(1.0f), q2, kK, kV, 2, {}, out); },
              ThrowsMessage<Error>(HasSubstr("q has 4 and out 2 elements")));
}

// ---- ReferenceKVCache --------------------------------------------------------------------------

TEST(ReferenceKVCache, AppendGrowsPerLayerAndCountsBytes) {
  ReferenceKVCache cache(2, 2, 3);  // 2 layers, 2 kv heads, head_dim 3: 6 floats a token
  cache.add_sequence(1);
  cache.add_sequence(2);
  std::vector<float> k(12), v(12);
  for (int i = 0; i < 12; ++i) {
    k[i] = static_cast<float>(i);
    v[i] = static_cast<float>(-i);
  }
  cache.append(1, 0, std::span(k).first(6), std::span(v).first(6));  // token 0
  cache.append(1, 0, std::span(k).last(6), std::span(v).last(6));    // token 1
  cache.append(1, 1, k, v);
  cache.append(2, 0, std::span(k).first(6), std::span(v).first(6));
  EXPECT_EQ(cache.num_tokens(1, 0), 2);
  EXPECT_EQ(cache.num_tokens(1, 1), 2);
  EXPECT_EQ(cache.num_tokens(2), 1);
  EXPECT_EQ(cache.num_tokens(2, 1), 0);
  EXPECT_THAT(cache.keys(1, 0), Pointwise(::testing::Eq(), k));  // concatenated in order
  EXPECT_THAT(cache.values(2, 0), ElementsAre(0, -1, -2, -3, -4, -5));
  // 2 (K, V) x 5 tokens stored in total x 2 heads x 3 dims x 4 bytes = 240.
  EXPECT_EQ(cache.bytes_in_use(), 240);
  cache.free_sequence(1);
  EXPECT_FALSE(cache.has_sequence(1));
  EXPECT_TRUE(cache.has_sequence(2));
  EXPECT_EQ(cache.bytes_in_use(), 48);
}

TEST(ReferenceKVCache, ErrorsNameTheValue) {
  EXPECT_THAT([] { ReferenceKVCache c(0, 1, 1); },
              ThrowsMessage<Error>(HasSubstr("num_layers must be >= 1, got 0")));
  EXPECT_THAT([] { ReferenceKVCache c(1, -2, 1); },
              ThrowsMessage<Error>(HasSubstr("num_kv_heads must be >= 1, got -2")));
  EXPECT_THAT([] { ReferenceKVCache c(1, 1, 0); },
              ThrowsMessage<Error>(HasSubstr("head_dim must be >= 1, got 0")));
  ReferenceKVCache cache(2, 2, 3);
  cache.add_sequence(7);
  EXPECT_THAT([&] { cache.add_sequence(7); }, ThrowsMessage<Error>(HasSubstr("sequence 7 exists")));
  EXPECT_THAT([&] { cache.free_sequence(9); },
              ThrowsMessage<Error>(HasSubstr("unknown sequence 9")));
  EXPECT_THAT([&] { (void)cache.num_tokens(9); },
              ThrowsMessage<Error>(HasSubstr("unknown sequence 9")));
  EXPECT_THAT([&] { (void)cache.keys(7, 2); },
              ThrowsMessage<Error>(HasSubstr("layer 2 out of range [0, 2)")));
  const std::vector<float> six(6), three(3), seven(7);
  EXPECT_THAT([&] { cache.append(7, 0, six, three); },
              ThrowsMessage<Error>(HasSubstr("k has 6 elements but v has 3")));
  EXPECT_THAT([&] { cache.append(7, 0, seven, seven); },
              ThrowsMessage<Error>(HasSubstr("7 elements is not a multiple of num_kv_heads x "
                                             "head_dim = 6")));
  EXPECT_THAT([&] { cache.append(8, 0, six, six); },
              ThrowsMessage<Error>(HasSubstr("unknown sequence 8")));
  EXPECT_EQ(cache.num_tokens(7), 0);  // failed appends stored nothing
}

}  // namespace
}  // namespace pagedkv
