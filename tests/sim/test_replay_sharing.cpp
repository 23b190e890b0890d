// The timed replay with sharing groups (ReplayConfig::group_width): hand-worked utilization and
// token counts of one parallel-sampling group under paged (copy-on-write forks) and contiguous
// (independent copies) memory, beam search against simulate_group's block counts, and a
// memory-bound trace where sharing serves more.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pagedkv/error.hpp"
#include "sim/replay.hpp"
#include "sim/sharing.hpp"
#include "sim_test_util.hpp"

namespace pagedkv::sim {
namespace {

using ::testing::HasSubstr;
using testing::one_byte_per_token;
using ::testing::ThrowsMessage;

Trace one_request(int64_t prompt, int64_t output) {
  Trace t;
  t.source = "hand";
  t.requests.push_back({.arrival_ms = 0, .prompt_tokens = prompt, .output_tokens = output});
  t.rows_read = 1;
  return t;
}

ReplayConfig group_config(int32_t width, SharingMode mode, int64_t capacity) {
  ReplayConfig c = one_byte_per_token(capacity);
  c.group_width = width;
  c.group_mode = mode;
  return c;
}

TEST(ReplaySharing, ParallelSamplingPagedHandWorked) {
  // P 5, O 3, 2 samples, blocks of 4 (sharing.hpp's model; test_sharing.cpp works the blocks):
  //   step 0: prefill 5 tokens, blocks A B             live 5 / 8
  //   step 1: fork, both append (copy-on-write: A B C)  live 4 + 2 + 2 = 8 / 12
  //   step 2: 7 tokens each                             live 10 / 12
  //   step 3: 8 tokens each, done                       live 12 / 12
  const ReplayResult r =
      replay(one_request(5, 3), group_config(2, SharingMode::kParallelSampling, 64),
             {StrategyKind::kPaged, 4});
  EXPECT_EQ(r.completed, 1);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.generated_tokens, 6);  // 3 per sample
  EXPECT_EQ(r.processed_tokens, 11);
  EXPECT_NEAR(r.util_mean, (5.0 / 8 + 8.0 / 12 + 10.0 / 12 + 1) / 4, 1e-12);
  EXPECT_DOUBLE_EQ(r.reserved_mean_bytes, (8.0 + 12 + 12 + 12) / 4);
}

TEST(ReplaySharing, ParallelSamplingContiguousReservesIndependentCopies) {
  // Contiguous-exact reserves 2 x (5 + 3) = 16; live 5, then 2 x 6, 2 x 7, 2 x 8.
  const ReplayResult r =
      replay(one_request(5, 3), group_config(2, SharingMode::kParallelSampling, 64),
             {StrategyKind::kContiguousExact, 0});
  EXPECT_EQ(r.generated_tokens, 6);
  EXPECT_NEAR(r.util_mean, (5.0 + 12 + 14 + 16) / 16 / 4, 1e-12);
  EXPECT_DOUBLE_EQ(r.reserved_mean_bytes, 16.0);
  // 17 positions do not hold the two copies: rejected, where paging admits it.
  const ReplayResult tight =
      replay(one_request(5, 3), group_config(2, SharingMode::kParallelSampling, 15),
             {StrategyKind::kContiguousExact, 0});
  EXPECT_EQ(tight.rejected_too_large, 1);
}

TEST(ReplaySharing, BeamSearchHoldsWhatTheGroupSimulationHolds) {
  // One request alone: the replay's blocks at each decode step are simulate_group's (same
  // seeded survivor choice, the whole prompt in the manager); the prefill step holds the prompt.
  for (const int32_t w : {2, 4}) {
    const int64_t p = 9, o = 12, bs = 4;
    ReplayConfig c = group_config(w, SharingMode::kBeamSearch, 4096);
    c.beam_seed = 7;
    const ReplayResult r = replay(one_request(p, o), c, {StrategyKind::kPaged, 4});
    const GroupSteps g =
        simulate_group(p, o, {.mode = SharingMode::kBeamSearch, .width = w, .block_size = 4},
                       seeded_beam_chooser(7, w), true);
    double blocks = 3;  // ceil(9 / 4)
    for (int64_t v : g.shared) blocks += static_cast<double>(v);
    EXPECT_EQ(r.generated_tokens, w * o);
    EXPECT_DOUBLE_EQ(r.reserved_mean_bytes, blocks * bs / static_cast<double>(o + 1)) << "W " << w;
  }
}

TEST(ReplaySharing, SharingServesMoreWhenMemoryBinds) {
  // 20 groups of 4 samples (P 40, O 20) at once in 400 positions: contiguous-exact reserves
  // 4 x 60 = 240 per group, one at a time; paged forks share the 40 prompt positions and
  // hold at most 40 + 4 x (20 + 4) = 136, two groups and more at a time.
  Trace t;
  t.source = "hand";
  for (int i = 0; i < 20; ++i) {
    t.requests.push_back({.arrival_ms = 0, .prompt_tokens = 40, .output_tokens = 20});
  }
  const ReplayConfig c = group_config(4, SharingMode::kParallelSampling, 400);
  const ReplayResult contiguous = replay(t, c, {StrategyKind::kContiguousExact, 0});
  const ReplayResult paged = replay(t, c, {StrategyKind::kPaged, 4});
  EXPECT_EQ(contiguous.completed, 20);
  EXPECT_EQ(paged.completed, 20);
  EXPECT_EQ(contiguous.peak_concurrency, 1);
  EXPECT_GE(paged.peak_concurrency, 2);
  EXPECT_LT(paged.steps, contiguous.steps);
}

TEST(ReplaySharing, BadConfigNamesTheValue) {
  ReplayConfig c = one_byte_per_token(64);
  c.group_width = 0;
  EXPECT_THAT([&] { validate(c); },
              ThrowsMessage<Error>(HasSubstr("group width (samples or beams) must be in [1, 64], "
                                             "got 0")));
  c.group_width = 2;
  c.preemption = Preemption::kSwap;
  EXPECT_THAT([&] { validate(c); },
              ThrowsMessage<Error>(HasSubstr("sharing groups (width 2) support recompute "
                                             "preemption only")));
}

}  // namespace
}  // namespace pagedkv::sim
