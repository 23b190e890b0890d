// Tests for model::compare_runs (src/model/generate.hpp), the oracle of the cross-mode agreement
// check: hand-built runs whose agreement is worked out by hand. A token divergence, a NaN against
// a number, and a run that ends early (fewer sequences, a prefix without BOS, fewer positions) must
// each be reported, never hidden behind logits that agree up to the shorter run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "model/generate.hpp"

namespace pagedkv::model {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr size_t kVocab = 3;

/// A sequence whose prompt is {1, 5} and ids `ids`, with `positions` rows of logits; row p, entry
/// v is 10 p + v (so two runs' logits are equal unless a test changes one).
SequenceOutput seq(std::vector<TokenId> ids, int64_t positions, bool bos = false) {
  SequenceOutput s;
  s.prompt_ids = {1, 5};
  s.ids = std::move(ids);
  s.positions_run = positions;
  s.num_generated = static_cast<int64_t>(s.ids.size()) - 2;
  s.stopped_on_bos = bos;
  for (int64_t p = 0; p < positions; ++p) {
    for (size_t v = 0; v < kVocab; ++v) s.logits.push_back(static_cast<float>(10 * p + v));
  }
  return s;
}

GenerateResult run(std::vector<SequenceOutput> seqs) { return {std::move(seqs), {}}; }

/// Two sequences: {1,5,7,8} after 3 positions, and {1,5,9} after 2.
GenerateResult base() { return run({seq({1, 5, 7, 8}, 3), seq({1, 5, 9}, 2)}); }

TEST(CompareRuns, IdenticalRunsAgreeWithZeroDifference) {
  const Agreement g = compare_runs(base(), base());
  EXPECT_TRUE(g.same_tokens);
  EXPECT_TRUE(g.same_lengths);
  EXPECT_EQ(g.diverge_seq, -1);
  EXPECT_EQ(g.length_seq, -1);
  EXPECT_EQ(g.max_abs_logit_diff, 0.0);
  EXPECT_EQ(g.positions_compared, 5);  // 3 + 2 rows
}

TEST(CompareRuns, TokenDivergenceIsLocatedAndOnlyRowsBeforeItCompared) {
  GenerateResult b = base();
  b.seqs[1].ids[2] = 4;              // sequence 1 samples 4 where a sampled 9
  b.seqs[1].logits[1 * 3 + 0] = 99;  // row 1 predicted ids[2]: it differs, and is compared
  const Agreement g = compare_runs(base(), b);
  EXPECT_FALSE(g.same_tokens);
  EXPECT_EQ(g.diverge_seq, 1);
  EXPECT_EQ(g.diverge_index, 2);
  EXPECT_TRUE(g.same_lengths);  // a sampled token explains everything after it
  EXPECT_EQ(g.max_abs_logit_diff, 99.0 - 10.0);
  EXPECT_EQ(g.positions_compared, 3 + 2);  // common prefix of 2 ids: rows 0 and 1
}

TEST(CompareRuns, NaNAgainstANumberIsAnInfiniteDifference) {
  GenerateResult b = base();
  b.seqs[0].logits[4] = kNaN;  // row 1, entry 1 (a has 11)
  const Agreement g = compare_runs(base(), b);
  EXPECT_TRUE(g.same_tokens);
  EXPECT_EQ(g.max_abs_logit_diff, std::numeric_limits<double>::infinity());
  // Either side: a NaN in the first run is a difference too.
  EXPECT_EQ(compare_runs(b, base()).max_abs_logit_diff, std::numeric_limits<double>::infinity());
}

TEST(CompareRuns, NaNAgainstNaNAndEqualInfinitiesAgree) {
  GenerateResult a = base();
  a.seqs[0].logits[0] = kNaN;
  a.seqs[0].logits[1] = kInf;
  a.seqs[1].logits[2] = -kInf;
  EXPECT_EQ(compare_runs(a, a).max_abs_logit_diff, 0.0);
  GenerateResult b = a;
  b.seqs[1].logits[2] = kInf;  // +inf against -inf
  EXPECT_EQ(compare_runs(a, b).max_abs_logit_diff, std::numeric_limits<double>::infinity());
}

TEST(CompareRuns, FewerSequencesIsALengthMismatch) {
  GenerateResult b = base();
  b.seqs.pop_back();
  const Agreement g = compare_runs(base(), b);
  EXPECT_FALSE(g.same_tokens);
  EXPECT_FALSE(g.same_lengths);
  EXPECT_EQ(g.length_seq, 1);
  EXPECT_EQ(g.diverge_seq, 1);
  EXPECT_EQ(g.diverge_index, 0);
}

TEST(CompareRuns, ARunCutShortWithoutBosIsALengthMismatch) {
  // b's sequence 0 is a's minus its last token and position: every logit it has agrees.
  GenerateResult b = base();
  b.seqs[0] = seq({1, 5, 7}, 2);
  for (const bool b_first : {false, true}) {
    const Agreement g = b_first ? compare_runs(b, base()) : compare_runs(base(), b);
    EXPECT_FALSE(g.same_tokens);
    EXPECT_EQ(g.diverge_seq, 0);
    EXPECT_EQ(g.diverge_index, 3);
    EXPECT_FALSE(g.same_lengths) << "b_first " << b_first;
    EXPECT_EQ(g.length_seq, 0);
    EXPECT_EQ(g.max_abs_logit_diff, 0.0);
  }
}

TEST(CompareRuns, AShorterRunThatStoppedOnBosIsATokenDivergence) {
  // b sampled BOS at position 2 where a sampled 8: a near-tie, not a length mismatch.
  GenerateResult b = base();
  b.seqs[0] = seq({1, 5, 7}, 3, /*bos=*/true);
  const Agreement g = compare_runs(base(), b);
  EXPECT_FALSE(g.same_tokens);
  EXPECT_EQ(g.diverge_index, 3);
  EXPECT_TRUE(g.same_lengths);
  EXPECT_EQ(g.positions_compared, 3 + 2);
}

TEST(CompareRuns, EqualIdsAfterDifferentPositionsIsALengthMismatch) {
  GenerateResult b = base();
  b.seqs[1] = seq({1, 5, 9}, 1);  // the same ids, one position (and logits row) fewer
  const Agreement g = compare_runs(base(), b);
  EXPECT_TRUE(g.same_tokens);
  EXPECT_FALSE(g.same_lengths);
  EXPECT_EQ(g.length_seq, 1);
}

TEST(CompareRuns, LogitsOfAnotherShapeAreALengthMismatch) {
  GenerateResult b = base();
  b.seqs[0].logits.pop_back();  // 8 floats for 3 positions: not whole rows
  Agreement g = compare_runs(base(), b);
  EXPECT_FALSE(g.same_lengths);
  EXPECT_EQ(g.length_seq, 0);
  b = base();
  b.seqs[1].logits.resize(2 * 4, 0.0f);  // 2 rows of vocabulary 4 against 3
  g = compare_runs(base(), b);
  EXPECT_FALSE(g.same_lengths);
  EXPECT_EQ(g.length_seq, 1);
}

TEST(CompareRuns, MeanIsOverEveryComparedLogitAndOnlyThose) {
  EXPECT_EQ(compare_runs(base(), base()).mean_abs_logit_diff, 0.0);
  GenerateResult b = base();
  b.seqs[0].logits[0] += 3.0f;  // row 0 of sequence 0
  b.seqs[1].logits[4] -= 1.5f;  // row 1 of sequence 1
  Agreement g = compare_runs(base(), b);
  EXPECT_DOUBLE_EQ(g.mean_abs_logit_diff, (3.0 + 1.5) / (5 * kVocab));  // 5 rows x 3 entries
  // Sequence 0 diverges at ids[2]: its row 1 (predicting ids[2]) still counts, its row 2 not.
  b.seqs[0].ids[2] = 6;
  b.seqs[0].logits[2 * kVocab + 1] += 100.0f;
  g = compare_runs(base(), b);
  EXPECT_EQ(g.positions_compared, 4);
  EXPECT_DOUBLE_EQ(g.mean_abs_logit_diff, (3.0 + 1.5) / (4 * kVocab));
  b.seqs[0].logits[5] = kNaN;  // NaN against a number: an infinite difference, in the mean too
  EXPECT_EQ(compare_runs(base(), b).mean_abs_logit_diff, kInf);
}

TEST(CompareRuns, MissingLogitsAreNotCompared) {
  GenerateResult b = base();
  b.seqs[0].logits.clear();
  const Agreement g = compare_runs(base(), b);
  EXPECT_EQ(g.max_abs_logit_diff, -1.0);
  EXPECT_EQ(g.mean_abs_logit_diff, -1.0);
  EXPECT_TRUE(g.same_lengths);
}

}  // namespace
}  // namespace pagedkv::model
