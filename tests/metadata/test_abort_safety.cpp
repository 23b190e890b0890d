// Abort safety (issue 8): every path that ends a sequence early returns all its blocks.
// A long seeded scheduler scenario runs under several cache configurations; at EVERY step a copy
// of the manager aborts all of its sequences (free, recompute preemption, free while swapped)
// and must end with the whole pool back; the live manager also aborts a random sequence at each
// step. Failed operations (a batch that runs out of blocks half-way, a swap-in that cannot fit,
// a swap-out with a full host pool) must change nothing at all: ref counts, free-list and LRU
// order, the prefix index and the counters included (the full snapshot, manager_snapshot.hpp).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/manager_snapshot.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

// "A failed operation changed nothing" compares the whole snapshot of
// tests/common/manager_snapshot.hpp: tables, kept sets, ref counts, free-list and LRU order of
// both pools, the prefix index, every counter and the pending events.
using testing::observable;

/// The pool is whole: no sequence, no used device or host block, every block available.
void expect_pool_whole(const KVCacheManager& m, const std::string& where) {
  ASSERT_NO_THROW(m.check_invariants()) << where;
  const KVCacheStats st = m.stats();
  EXPECT_EQ(st.num_sequences, 0) << where;
  EXPECT_EQ(st.used_blocks, 0) << where;
  EXPECT_EQ(st.host_used_blocks, 0) << where;
  EXPECT_EQ(m.num_free_blocks(), m.num_total_blocks()) << where;
}

/// Aborts every sequence of `m` in a step-dependent mix of the three ways a request ends early,
/// checking invariants after each, then checks the pool is whole.
void abort_everything(KVCacheManager& m, int step) {
  int i = 0;
  for (SeqId s : m.sequences()) {
    const std::string where = "step " + std::to_string(step) + ", abort of " + std::to_string(s);
    if (!m.is_swapped(s) && (i + step) % 2 == 0) {
      const PreemptedSequence p = m.preempt(s);
      EXPECT_EQ(p.seq, s) << where;
    } else {
      m.free_sequence(s);  // a swapped sequence returns its host blocks
    }
    ASSERT_NO_THROW(m.check_invariants()) << where;
    ++i;
  }
  expect_pool_whole(m, "after aborting everything at step " + std::to_string(step));
  // Cached prefix blocks are available but still registered; dropping the registrations must
  // leave only plain free blocks.
  m.reset_prefix_cache();
  EXPECT_EQ(m.stats().free_blocks, m.num_total_blocks()) << "step " << step;
}

struct AbortCase {
  std::string name;
  KVCacheManagerConfig config;
};

class AbortSafety : public ::testing::TestWithParam<AbortCase> {};

TEST_P(AbortSafety, AbortAtEveryStepReturnsEveryBlock) {
  KVCacheManager m(GetParam().config);
  const int32_t bs = m.config().block_size;
  std::mt19937_64 rng(2024);
  std::vector<SeqId> live;
  SeqId next = 0;
  auto random_live = [&] { return live[rng() % live.size()]; };
  // Prompts share a few prefixes so prefix caching (where on) hits and shares blocks.
  auto prompt = [&] {
    std::vector<TokenId> p(rng() % (4 * bs));
    const TokenId base = static_cast<TokenId>(rng() % 3) * 1000;
    for (size_t i = 0; i < p.size(); ++i) p[i] = base + static_cast<TokenId>(i);
    return p;
  };
  constexpr int kSteps = 1000;
  int64_t failed_adds = 0, failed_appends = 0, failed_swaps = 0, max_live = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::string where = "step " + std::to_string(step);
    const int op = static_cast<int>(rng() % 12);
    if (live.empty() || op < 2) {
      const std::vector<TokenId> p = prompt();
      const bool predicted = m.can_add_sequence(p) == Admission::kOk;
      const std::string before = observable(m);
      const auto r = m.add_sequence(next, p);
      ASSERT_EQ(r.has_value(), predicted) << where;
      if (r) {
        live.push_back(next);
      } else {
        ASSERT_EQ(observable(m), before) << where << ": failed add changed the state";
        ++failed_adds;
      }
      ++next;
    } else if (op < 6) {
      // A decode batch over every running sequence: when the pool runs out half-way, the
      // failing append changes nothing and the scheduler preempts that sequence (recompute),
      // which must hand back its blocks; the rest of the batch goes on.
      for (size_t i = 0; i < live.size();) {
        const SeqId s = live[i];
        if (m.is_swapped(s)) {
          ++i;
          continue;
        }
        // The step before ran its forward pass: what the sequence holds is written (a sequence
        // aborted before its first decode batch never publishes anything).
        m.commit(s, m.num_tokens(s));
        const int64_t n = 1 + static_cast<int64_t>(rng() % 3);
        const bool predicted = m.can_append(s, n);
        const std::string before = observable(m);
        const auto r = m.append_slots(s, n);
        ASSERT_EQ(r.has_value(), predicted) << where;
        if (r) {
          ++i;
          continue;
        }
        ASSERT_EQ(observable(m), before) << where << ": failed append changed the state";
        ++failed_appends;
        (void)m.preempt(s);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        ASSERT_NO_THROW(m.check_invariants()) << where;
      }
    } else if (op < 7) {
      const SeqId parent = random_live();
      if (!m.is_swapped(parent)) {
        m.fork(parent, next);
        live.push_back(next++);
      }
    } else if (op < 9 && m.host_allocator() != nullptr) {
      const SeqId s = random_live();
      const std::string before = observable(m);
      if (m.is_swapped(s)) {
        const bool predicted = m.can_swap_in(s);
        const auto r = m.swap_in(s);
        ASSERT_EQ(r.has_value(), predicted) << where;
        if (!r) {
          ASSERT_EQ(observable(m), before) << where << ": failed swap-in changed the state";
          ++failed_swaps;
        }
      } else {
        const bool predicted = m.can_swap_out(s);
        const auto r = m.swap_out(s);
        ASSERT_EQ(r.has_value(), predicted) << where;
        if (!r) {
          ASSERT_EQ(observable(m), before) << where << ": failed swap-out changed the state";
          ++failed_swaps;
        }
      }
    } else {
      // Client abort of one random sequence, in whatever state it is.
      const size_t i = rng() % live.size();
      m.free_sequence(live[i]);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_NO_THROW(m.check_invariants()) << where;
    max_live = std::max<int64_t>(max_live, static_cast<int64_t>(live.size()));
    const KVCacheStats st = m.stats();
    ASSERT_EQ(st.free_blocks + st.used_blocks + st.cached_blocks, st.total_blocks) << where;

    // Abort everything on a copy: whatever the state at this step, the pool comes back whole.
    KVCacheManager copy = m;
    abort_everything(copy, step);
    if (::testing::Test::HasFailure()) return;
  }
  // The scenario must reach the interesting paths, or the test proves little.
  const KVCacheStats st = m.stats();
  EXPECT_GT(failed_appends, 0) << "no batch ran out of blocks";
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GE(max_live, 4);
  if (m.host_allocator() != nullptr) {
    EXPECT_GT(st.swapped_in_blocks, 0);
    EXPECT_GT(failed_swaps, 0) << "no swap ran out of room";
  }
  if (m.config().enable_prefix_caching) EXPECT_GT(st.prefix_hits, 0);
  std::printf(
      "%lld failed adds, %lld failed appends, %lld failed swaps, %lld preemptions, "
      "up to %lld live sequences\n",
      static_cast<long long>(failed_adds), static_cast<long long>(failed_appends),
      static_cast<long long>(failed_swaps), static_cast<long long>(st.preemptions),
      static_cast<long long>(max_live));
  abort_everything(m, kSteps);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, AbortSafety,
    ::testing::Values(
        AbortCase{"plain", {.num_blocks = 12, .block_size = 4}},
        AbortCase{"prefix_cache_swap_watermark",
                  {.num_blocks = 32,
                   .block_size = 4,
                   .enable_prefix_caching = true,
                   .num_host_blocks = 12,
                   .watermark = 0.1}},
        AbortCase{"sliding_window_swap",
                  {.num_blocks = 24,
                   .block_size = 4,
                   .num_host_blocks = 16,
                   .eviction = {.kind = EvictionKind::kSlidingWindow, .window = 6}}},
        AbortCase{"sinks_prefix_cache",
                  {.num_blocks = 24,
                   .block_size = 2,
                   .enable_prefix_caching = true,
                   .num_host_blocks = 8,
                   .eviction = {.kind = EvictionKind::kAttentionSinks, .window = 5, .sinks = 2},
                   .enable_events = true}}),  // the snapshot then covers the pending events
    [](const ::testing::TestParamInfo<AbortCase>& info) { return info.param.name; });

// A batch of prefills that runs out of blocks half-way: the prompt that does not fit is
// rejected whole (no block of it stays allocated), the ones before it stay, and aborting the
// batch returns everything.
TEST(AbortSafetyCases, PrefillBatchRunsOutHalfWay) {
  KVCacheManager m({.num_blocks = 10, .block_size = 4});
  const std::vector<TokenId> twelve(12, 7);  // 3 blocks each
  ASSERT_TRUE(m.add_sequence(1, twelve));
  ASSERT_TRUE(m.add_sequence(2, twelve));
  ASSERT_TRUE(m.add_sequence(3, twelve));
  const std::string before = observable(m);
  EXPECT_EQ(m.num_free_blocks(), 1);
  EXPECT_EQ(m.can_add_sequence(twelve), Admission::kLater);
  EXPECT_FALSE(m.add_sequence(4, twelve));  // needs 3, 1 left: takes none of them
  EXPECT_EQ(observable(m), before);
  EXPECT_FALSE(m.has_sequence(4));
  // An append that needs 2 blocks with 1 free: all-or-nothing, not one block of two.
  EXPECT_EQ(m.blocks_needed_to_append(1, 5), 2);
  EXPECT_FALSE(m.append_slots(1, 5));
  EXPECT_EQ(observable(m), before);
  for (SeqId s : {1, 2, 3}) m.free_sequence(s);
  expect_pool_whole(m, "batch aborted");
}

// A swap-in that cannot fit changes nothing; freeing the still-swapped sequence returns its
// host blocks; a swap-out that cannot fit the host pool changes nothing either.
TEST(AbortSafetyCases, SwapInThatCannotFitThenAbort) {
  KVCacheManager m({.num_blocks = 6, .block_size = 4, .num_host_blocks = 3});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 12));  // 3 blocks
  ASSERT_TRUE(m.swap_out(1));
  EXPECT_EQ(m.stats().host_used_blocks, 3);
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 16));  // 4 of the 6 device blocks: 2 left, 1 needs 3
  EXPECT_FALSE(m.can_swap_in(1));
  std::string before = observable(m);
  EXPECT_FALSE(m.swap_in(1));
  EXPECT_EQ(observable(m), before);
  // Host pool full (3/3): sequence 2 cannot be swapped out.
  EXPECT_FALSE(m.can_swap_out(2));
  EXPECT_FALSE(m.swap_out(2));
  EXPECT_EQ(observable(m), before);
  // Swapped sequences cannot run; the error changes nothing either.
  EXPECT_THROW((void)m.append_slots(1, 1), Error);
  EXPECT_THROW(m.preempt(1), Error);
  EXPECT_EQ(observable(m), before);
  m.free_sequence(1);  // the request is aborted while swapped out
  EXPECT_EQ(m.stats().host_used_blocks, 0);
  m.free_sequence(2);
  expect_pool_whole(m, "after aborting the swapped and the running sequence");
}

// Contract violations in the middle of a scenario (double free, fork of a freed parent,
// appending to a freed sequence) throw and leave the pool exactly as it was.
TEST(AbortSafetyCases, ErrorsAfterAbortChangeNothing) {
  KVCacheManager m({.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true});
  const std::vector<TokenId> p{1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(m.add_sequence(1, p));
  m.fork(1, 2);
  m.free_sequence(1);
  const std::string before = observable(m);
  EXPECT_THROW(m.free_sequence(1), Error);
  EXPECT_THROW(m.fork(1, 3), Error);
  EXPECT_THROW((void)m.append_slots(1, 1), Error);
  EXPECT_THROW(m.preempt(1), Error);
  EXPECT_EQ(observable(m), before);
  m.free_sequence(2);
  expect_pool_whole(m, "after the errors");
}

}  // namespace
}  // namespace pagedkv
