// SynchronizedKVCacheManager: the forwarding is faithful, and several threads that add, append,
// fork, free, swap and preempt concurrently leave the pool whole. The stress test is the one
// scripts/ci-sanitizers.sh runs under ThreadSanitizer (ctest -R SynchronizedKVCacheManager).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "common/batch_metadata_expect.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/synchronized_manager.hpp"

namespace pagedkv {
namespace {

TEST(SynchronizedKVCacheManager, ForwardsTheDocExample) {
  SynchronizedKVCacheManager m({.num_blocks = 8, .block_size = 4});
  m.add_sequence(7);
  const auto a = m.append_slots(7, 6);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->slots, (std::vector<Slot>{0, 1, 2, 3, 4, 5}));
  ASSERT_TRUE(m.append_slots(7, 1).has_value());
  m.fork(7, 8);
  const auto b = m.append_slots(8, 1);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->copies, (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_EQ(b->slots, (std::vector<Slot>{11}));
  // block_table returns a copy that stays valid after later mutations.
  const std::vector<BlockId> table = m.block_table(8);
  m.free_sequence(8);
  EXPECT_EQ(table, (std::vector<BlockId>{0, 2}));
  m.free_sequence(7);
  m.check_invariants();
  EXPECT_EQ(m.num_free_blocks(), m.num_total_blocks());
}

// The issue 16 calls, with the values of test_manager_contracts.cpp / test_manager_lifecycle.cpp.
TEST(SynchronizedKVCacheManager, ForwardsCommitLookupTruncateAndAdmissions) {
  SynchronizedKVCacheManager m(
      {.num_blocks = 8, .block_size = 4, .enable_prefix_caching = true, .num_host_blocks = 4});
  const std::vector<TokenId> p{1, 2, 3, 4, 5, 6, 7, 8, 9};
  ASSERT_TRUE(m.add_sequence(1, p));  // {0, 1, 2}
  EXPECT_EQ(m.lookup_prefix(p).num_computed_tokens, 0);
  EXPECT_EQ(m.commit(1, 4), 1);
  EXPECT_EQ(m.num_committed_tokens(1), 4);
  EXPECT_EQ(m.lookup_prefix(p).num_computed_tokens, 4);
  m.truncate(1, 2);
  EXPECT_EQ(m.block_table(1), (std::vector<BlockId>{0}));
  EXPECT_EQ(m.can_add_sequence(p, AddOptions{.max_new_tokens = 23}), Admission::kOk);  // 32
  EXPECT_EQ(m.can_add_sequence(p, AddOptions{.max_new_tokens = 24}), Admission::kNever);
  // Block 0 stays published: its 4 tokens' K/V are intact (sequence 1 copies before writing).
  const auto r = m.add_sequence(2, p, AddOptions{.first_chunk_tokens = 0});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->num_computed_tokens, 4);
  EXPECT_EQ(m.num_tokens(2), 4);
  EXPECT_EQ(m.append_admission(1, 33), Admission::kNever);
  EXPECT_TRUE(m.can_append(1, 1, 2));
  EXPECT_EQ(m.swap_out_admission(1), Admission::kOk);
  ASSERT_TRUE(m.swap_out(1));
  EXPECT_EQ(m.swap_in_admission(1, 30), Admission::kLater);
  EXPECT_EQ(m.swap_in_admission(1, 31), Admission::kNever);
  EXPECT_TRUE(m.can_swap_in(1, 2));
  ASSERT_TRUE(m.swap_in(1, 2));
  EXPECT_EQ(m.min_blocks_held(9), 3);
  m.check_invariants();
}

TEST(SynchronizedKVCacheManager, ErrorsPropagateAndReleaseTheLock) {
  SynchronizedKVCacheManager m({.num_blocks = 4, .block_size = 4});
  EXPECT_THROW(m.free_sequence(42), Error);
  EXPECT_THROW(m.with_lock([](KVCacheManager& k) { k.fork(1, 2); }), Error);
  // Had a throw leaked the lock, this would deadlock rather than pass.
  m.add_sequence(1);
  EXPECT_EQ(m.num_sequences(), 1);
}

TEST(SynchronizedKVCacheManager, BatchMetadataIntoReusedStorage) {
  // The forwarded output-parameter form: a smaller batch after a bigger one leaves nothing of
  // the bigger one, an empty batch gives the empty metadata, and a rejected batch changes
  // nothing. Expected values come from the returning form of the same manager.
  SynchronizedKVCacheManager m({.num_blocks = 16, .block_size = 4});
  m.add_sequence(1);
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(1, 13));
  ASSERT_TRUE(m.append_slots(2, 3));
  BatchMetadata out;
  const std::vector<SeqId> big{1, 2, 1};
  const std::vector<int64_t> big_new{5, 3, 1};
  m.batch_metadata(big, big_new, out);
  const std::vector<SeqId> small{2};
  const std::vector<int64_t> small_new{1};
  m.batch_metadata(small, small_new, out);
  const BatchMetadata fresh = m.batch_metadata(small, small_new);
  EXPECT_EQ(out.padded.num_seqs, 1);
  testing::expect_same_metadata(out, fresh);

  const std::vector<SeqId> bad{2, 99};
  const std::vector<int64_t> bad_new{1, 1};
  EXPECT_THROW(m.batch_metadata(bad, bad_new, out), Error);
  const std::vector<int64_t> mismatched{1, 1};
  EXPECT_THROW(m.batch_metadata(small, mismatched, out), Error);
  EXPECT_EQ(out.padded.block_tables, fresh.padded.block_tables);
  EXPECT_EQ(out.csr.indices, fresh.csr.indices);
  EXPECT_EQ(out.slot_mapping, fresh.slot_mapping);
  EXPECT_EQ(out.query_start, fresh.query_start);

  m.batch_metadata({}, {}, out);
  EXPECT_EQ(out.padded.num_seqs, 0);
  EXPECT_EQ(out.padded.max_blocks_per_seq, 0);
  EXPECT_TRUE(out.padded.block_tables.empty());
  EXPECT_TRUE(out.padded.context_lens.empty());
  EXPECT_EQ(out.csr.indptr, std::vector<int32_t>{0});
  EXPECT_TRUE(out.csr.indices.empty());
  EXPECT_TRUE(out.csr.last_page_len.empty());
  EXPECT_TRUE(out.slot_mapping.empty());
  EXPECT_EQ(out.query_start, std::vector<int32_t>{0});
}

TEST(SynchronizedKVCacheManager, WithLockReturnsTheCallablesResult) {
  SynchronizedKVCacheManager m({.num_blocks = 2, .block_size = 4});
  m.add_sequence(1);
  // Check-and-act as one critical section: no other thread can take the blocks in between.
  const auto grow = [](KVCacheManager& k) -> std::optional<AppendResult> {
    if (!k.can_append(1, 4)) return std::nullopt;
    return k.append_slots(1, 4);
  };
  EXPECT_TRUE(m.with_lock(grow).has_value());
  EXPECT_TRUE(m.with_lock(grow).has_value());
  EXPECT_FALSE(m.with_lock(grow).has_value());
  const SynchronizedKVCacheManager& cm = m;
  EXPECT_EQ(cm.with_lock([](const KVCacheManager& k) { return k.num_tokens(1); }), 8);
  const KVCacheManager copy = m.snapshot();
  EXPECT_EQ(copy.num_tokens(1), 8);
  EXPECT_EQ(m.config().num_blocks, 2);
}

/// Per-thread record of one live sequence.
struct Live {
  SeqId id;
  bool swapped;
};

/// What the stress test's threads share: the manager, counters, and the ids each worker
/// publishes for the others' cross-thread forks (possibly stale by the time they are used).
struct Traffic {
  static constexpr int kWorkers = 4;
  static constexpr int kOpsPerWorker = 10000;
  SynchronizedKVCacheManager m{{.num_blocks = 192,
                                .block_size = 4,
                                .enable_prefix_caching = true,
                                .num_host_blocks = 96,
                                .watermark = 0.05}};
  std::atomic<int64_t> errors_expected{0};
  std::atomic<int64_t> successes{0};
  std::atomic<int64_t> cross_forks{0};
  std::vector<std::atomic<SeqId>> published = std::vector<std::atomic<SeqId>>(kWorkers);
};

/// One worker thread's random scheduler traffic. It owns an id range, so it knows its own
/// sequences' states; cross-thread forks are expected to throw sometimes.
class TrafficWorker {
 public:
  TrafficWorker(Traffic& traffic, int t)
      : tr_(traffic), m_(traffic.m), t_(t), rng_(1234 + t), next_(SeqId{t} * 1'000'000) {}

  void run() {
    for (int op = 0; op < Traffic::kOpsPerWorker; ++op) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng_);
      if (live_.empty() || kind == 0) {
        add_prompt();
      } else if (kind <= 3) {
        append();
      } else if (kind == 4) {
        fork_own();
      } else if (kind == 5) {
        fork_other();
      } else if (kind == 6) {
        const size_t i = pick();
        m_.free_sequence(live_[i].id);
        live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (kind == 7) {
        swap();
      } else if (kind == 8) {
        preempt();
      } else {
        add_checked();
      }
    }
    for (const Live& s : live_) m_.free_sequence(s.id);
  }

 private:
  size_t pick() { return std::uniform_int_distribution<size_t>(0, live_.size() - 1)(rng_); }

  // Prompts drawn from a few shared prefixes, so threads hit each other's cached blocks.
  void add_prompt() {
    const int len = std::uniform_int_distribution<int>(0, 13)(rng_);
    std::vector<TokenId> prompt(len);
    const TokenId base = static_cast<TokenId>(rng_() % 3) * 100;
    for (int i = 0; i < len; ++i) prompt[i] = base + i;
    const SeqId id = next_++;
    if (m_.add_sequence(id, prompt).has_value()) {
      live_.push_back({id, false});
      ++tr_.successes;
    }
  }

  void append() {
    Live& s = live_[pick()];
    if (s.swapped) return;
    // The previous step's forward pass wrote what the sequence holds: publish it. Only this
    // thread changes its own sequences, so the two calls need no common lock.
    m_.commit(s.id, m_.num_tokens(s.id));
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 6)(rng_);
    if (rng_() % 2) {
      if (m_.append_slots(s.id, n).has_value()) ++tr_.successes;
    } else {
      std::vector<TokenId> toks(n, static_cast<TokenId>(t_));
      if (m_.append_tokens(s.id, toks).has_value()) ++tr_.successes;
    }
  }

  void fork_own() {
    const Live& s = live_[pick()];
    if (s.swapped) return;
    const SeqId child = next_++;
    m_.fork(s.id, child);
    live_.push_back({child, false});
    tr_.published[t_].store(child);
  }

  // The parent may have been freed, preempted or swapped meanwhile.
  void fork_other() {
    const SeqId parent = tr_.published[(t_ + 1) % Traffic::kWorkers].load();
    const SeqId child = next_++;
    try {
      m_.fork(parent, child);
      live_.push_back({child, false});
      ++tr_.cross_forks;
    } catch (const Error&) {
      ++tr_.errors_expected;
    }
  }

  void swap() {
    Live& s = live_[pick()];
    if (s.swapped) {
      if (m_.swap_in(s.id).has_value()) s.swapped = false;
    } else if (m_.swap_out(s.id).has_value()) {
      s.swapped = true;
    }
  }

  void preempt() {
    const size_t i = pick();
    if (live_[i].swapped) return;
    const PreemptedSequence p = m_.preempt(live_[i].id);
    EXPECT_EQ(p.seq, live_[i].id);
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Compound operation: admission query and add must see the same state.
  void add_checked() {
    const SeqId id = next_++;
    const std::vector<TokenId> prompt{1, 2, 3, 4, 5};
    const bool added = m_.with_lock([&](KVCacheManager& k) {
      if (k.can_add_sequence(prompt) != Admission::kOk) return false;
      const bool ok = k.add_sequence(id, prompt).has_value();
      EXPECT_TRUE(ok) << "can_add_sequence said kOk";
      return ok;
    });
    if (added) live_.push_back({id, false});
  }

  Traffic& tr_;
  SynchronizedKVCacheManager& m_;
  int t_;
  std::mt19937_64 rng_;
  SeqId next_;
  std::vector<Live> live_;
};

// Several worker threads run random scheduler traffic on one shared manager; a checker thread
// validates invariants and stats concurrently. Prefix caching is on so threads share cached
// blocks.
TEST(SynchronizedKVCacheManager, ConcurrentTrafficReturnsEveryBlock) {
  constexpr int kWorkers = Traffic::kWorkers;
  constexpr int kOpsPerWorker = Traffic::kOpsPerWorker;
  Traffic traffic;
  SynchronizedKVCacheManager& m = traffic.m;
  for (auto& p : traffic.published) p.store(-2);
  std::atomic<bool> done{false};
  auto worker = [&](int t) { TrafficWorker(traffic, t).run(); };

  std::thread checker([&] {
    while (!done.load()) {
      m.check_invariants();
      const KVCacheStats s = m.stats();
      EXPECT_EQ(s.free_blocks + s.used_blocks + s.cached_blocks, s.total_blocks);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kWorkers; ++t) workers.emplace_back(worker, t);
  for (auto& w : workers) w.join();
  done.store(true);
  checker.join();

  m.check_invariants();
  EXPECT_EQ(m.num_sequences(), 0);
  EXPECT_EQ(m.num_free_blocks(), m.num_total_blocks());
  const KVCacheStats s = m.stats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.host_used_blocks, 0);
  // The traffic really exercised the contended paths, not just the trivial ones.
  EXPECT_GT(traffic.successes.load(), kWorkers * kOpsPerWorker / 20);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.swapped_in_blocks, 0);
  EXPECT_GT(s.prefix_hits, 0);
  // Cross-thread forks and their expected failures depend on how the OS interleaves the
  // threads (on a loaded 2-core machine a worker may finish before its neighbour publishes an
  // id), so they are reported below, not asserted.
  std::printf(
      "successes %lld, cross-thread forks %lld, expected errors %lld, preemptions %lld, "
      "swapped in %lld blocks, prefix hits %lld\n",
      static_cast<long long>(traffic.successes.load()),
      static_cast<long long>(traffic.cross_forks.load()),
      static_cast<long long>(traffic.errors_expected.load()), static_cast<long long>(s.preemptions),
      static_cast<long long>(s.swapped_in_blocks), static_cast<long long>(s.prefix_hits));
  // Releasing the prefix cache turns every cached block back into a plain free one.
  m.reset_prefix_cache();
  EXPECT_EQ(m.stats().free_blocks, m.num_total_blocks());
}

}  // namespace
}  // namespace pagedkv
