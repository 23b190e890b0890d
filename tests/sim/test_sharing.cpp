// Sharing workloads (sim/sharing.hpp): blocks held per decode step on hand-worked groups, the
// parallel-sampling closed form, the fast path (prompt tail only) against the whole prompt,
// the seeded beam chooser, the trace totals and bad input.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <set>

#include "pagedkv/error.hpp"
#include "sim/sharing.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

/// A chooser that replays fixed survivor lists, one per beam step.
BeamChooser fixed(std::deque<std::vector<int32_t>> steps) {
  auto left = std::make_shared<std::deque<std::vector<int32_t>>>(std::move(steps));
  return [left](int32_t) {
    std::vector<int32_t> v = left->front();
    left->pop_front();
    return v;
  };
}

TEST(Sharing, ParallelSamplingHandWorked) {
  // P = 5, block size 4, n = 2: block A holds positions 0-3 (shared), B position 4. Step 1:
  // sample 0 appends into the shared partial B, so copy-on-write gives it C; sample 1 then owns
  // B and writes in place: A, B, C = 3 blocks (independent: 2 x ceil(6 / 4) = 4). Steps 2, 3
  // fill B and C (3 vs 4); steps 4, 5 (9, 10 tokens) add a block each: 5 vs 2 x 3 = 6.
  const SharingConfig c{.mode = SharingMode::kParallelSampling, .width = 2, .block_size = 4};
  for (const bool full : {false, true}) {
    const GroupSteps g = simulate_group(5, 5, c, nullptr, full);
    EXPECT_THAT(g.shared, ElementsAre(3, 3, 3, 5, 5)) << "full prompt " << full;
    EXPECT_THAT(g.independent, ElementsAre(4, 4, 4, 6, 6));
  }
}

TEST(Sharing, ParallelSamplingMatchesTheClosedForm) {
  // Only the floor(P / bs) full prompt blocks are shared; every partial block is copied:
  // shared(t) = n * ceil((P + t) / bs) - (n - 1) * floor(P / bs).
  for (const int32_t bs : {1, 3, 4, 16}) {
    for (const int32_t n : {1, 2, 6}) {
      for (const int64_t p : {1, 3, 4, 5, 16, 33}) {
        const SharingConfig c{.width = n, .block_size = bs};
        const int64_t o = 2 * bs + 3;
        const GroupSteps g = simulate_group(p, o, c, nullptr);
        ASSERT_EQ(g.shared.size(), static_cast<size_t>(o));
        for (int64_t t = 1; t <= o; ++t) {
          const int64_t want = n * ((p + t + bs - 1) / bs) - (n - 1) * (p / bs);
          ASSERT_EQ(g.shared[t - 1], want) << "bs " << bs << " n " << n << " P " << p << " t " << t;
          ASSERT_EQ(g.independent[t - 1], n * ((p + t + bs - 1) / bs));
        }
      }
    }
  }
}

TEST(Sharing, BeamSearchHandWorked) {
  // P = 3, block size 2, W = 2: A = positions 0-1 (shared), B = position 2.
  // Step 1: fork; beam 0 copies B into C (copy-on-write), beam 1 writes B: A, B, C = 3
  //   (independent 2 x ceil(4 / 2) = 4).
  // Step 2, survivors {0, 0}: beam 0 forks (both share A, C), beam 1 is freed (B goes); the two
  //   appends at position 4 open D and E: A, C, D, E = 4 (independent 2 x 3 = 6).
  // Step 3, survivors {0, 0}: beam 0 forks again (sharing A, C, D), beam 1 frees E; beam 0
  //   copies the shared partial D into F, its fork writes D: A, C, D, F = 4 (independent 6).
  const SharingConfig c{.mode = SharingMode::kBeamSearch, .width = 2, .block_size = 2};
  for (const bool full : {false, true}) {
    const GroupSteps g = simulate_group(3, 3, c, fixed({{0, 0}, {0, 0}}), full);
    EXPECT_THAT(g.shared, ElementsAre(3, 4, 4)) << "full prompt " << full;
    EXPECT_THAT(g.independent, ElementsAre(4, 6, 6));
  }
  // Survivors {1, 0} at step 3 instead: no fork, no free; both write their own D, E: still 4.
  const GroupSteps g = simulate_group(3, 3, c, fixed({{0, 0}, {1, 0}}));
  EXPECT_THAT(g.shared, ElementsAre(3, 4, 4));
}

TEST(Sharing, TheTailOnlyPathCountsWhatTheWholePromptDoes) {
  for (const int32_t w : {2, 4, 6}) {
    for (const int64_t p : {1, 7, 16, 17, 40}) {
      const SharingConfig c{.mode = SharingMode::kBeamSearch, .width = w, .block_size = 4};
      const GroupSteps fast = simulate_group(p, 30, c, seeded_beam_chooser(9, w));
      const GroupSteps whole = simulate_group(p, 30, c, seeded_beam_chooser(9, w), true);
      EXPECT_EQ(fast.shared, whole.shared) << "W " << w << " P " << p;
      EXPECT_EQ(fast.independent, whole.independent);
      // Sharing never holds more than independent copies, and at least one sequence's blocks.
      for (size_t t = 0; t < fast.shared.size(); ++t) {
        EXPECT_LE(fast.shared[t], fast.independent[t]);
        EXPECT_GE(fast.shared[t], fast.independent[t] / w);
      }
    }
  }
}

TEST(Sharing, SeededChooserDrawsDistinctCandidates) {
  const BeamChooser a = seeded_beam_chooser(5, 4);
  const BeamChooser b = seeded_beam_chooser(5, 4);
  std::set<int32_t> parents_seen;
  for (int step = 0; step < 200; ++step) {
    const std::vector<int32_t> x = a(4);
    ASSERT_EQ(x, b(4)) << "same seed, same draws";
    ASSERT_EQ(x.size(), 4u);
    for (int32_t p : x) {
      ASSERT_TRUE(p >= 0 && p < 4);
      parents_seen.insert(p);
    }
    // Without replacement: no parent has more than W = 4 survivors (it has 4 candidates).
  }
  EXPECT_EQ(parents_seen.size(), 4u);
  // A width-1 beam always keeps its only candidate.
  EXPECT_THAT(seeded_beam_chooser(3, 1)(1), ElementsAre(0));
}

TEST(Sharing, TraceTotalsAreTheSumsOfTheGroups) {
  Trace t;
  t.requests = {{.prompt_tokens = 5, .output_tokens = 5},
                {.prompt_tokens = 9, .output_tokens = 0},  // prefill only: not counted
                {.prompt_tokens = 8, .output_tokens = 1}};
  const SharingConfig c{.mode = SharingMode::kParallelSampling, .width = 2, .block_size = 4};
  const SharingResult r = simulate_sharing(t, c);
  // Request 0 (hand-worked above): 19 vs 24. Request 2: 8 prompt tokens fill 2 blocks, each
  // sample's first token opens its own block: 4 vs 2 x 3 = 6.
  EXPECT_EQ(r.workload, "parallel-2");
  EXPECT_EQ(r.requests, 2);
  EXPECT_EQ(r.decode_steps, 6);
  EXPECT_DOUBLE_EQ(r.shared_block_steps, 23);
  EXPECT_DOUBLE_EQ(r.independent_block_steps, 30);
  EXPECT_DOUBLE_EQ(r.saving, 1.0 - 23.0 / 30.0);
  EXPECT_DOUBLE_EQ(r.capacity_gain, 30.0 / 23.0);
  EXPECT_EQ(simulate_sharing(t, c, 1).requests, 1);  // limit
  // One sample shares nothing with anyone.
  const SharingResult one = simulate_sharing(t, {.width = 1, .block_size = 4});
  EXPECT_DOUBLE_EQ(one.saving, 0.0);
}

TEST(Sharing, BadInputNamesTheValue) {
  const SharingConfig ok{.width = 2, .block_size = 4};
  EXPECT_THAT([&] { (void)simulate_group(0, 3, ok, nullptr); },
              ThrowsMessage<Error>(HasSubstr("prompt must be >= 1 token, got 0")));
  EXPECT_THAT([&] { (void)simulate_group(3, -1, ok, nullptr); },
              ThrowsMessage<Error>(HasSubstr("output must be >= 0 tokens, got -1")));
  EXPECT_THAT([&] { (void)simulate_group(3, 3, {.width = 0}, nullptr); },
              ThrowsMessage<Error>(HasSubstr("width (samples or beams) must be >= 1, got 0")));
  EXPECT_THAT([&] { (void)simulate_group(3, 3, {.width = 2, .block_size = 0}, nullptr); },
              ThrowsMessage<Error>(HasSubstr("block size must be >= 1, got 0")));
  const SharingConfig beam{.mode = SharingMode::kBeamSearch, .width = 2, .block_size = 4};
  EXPECT_THAT([&] { (void)simulate_group(3, 3, beam, nullptr); },
              ThrowsMessage<Error>(HasSubstr("beam search of width 2 needs a survivor chooser")));
  EXPECT_THAT([&] { (void)simulate_group(3, 3, beam, fixed({{0}})); },
              ThrowsMessage<Error>(HasSubstr("returned 1 survivors, expected 2")));
  EXPECT_THAT(
      [&] {
        (void)simulate_group(3, 3, beam, fixed({{0, 2}}));
      },
      ThrowsMessage<Error>(HasSubstr("returned parent 2, not in [0, 2)")));
}

}  // namespace
}  // namespace pagedkv::sim
