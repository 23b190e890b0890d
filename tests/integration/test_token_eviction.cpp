// Token eviction end to end: paged attention under each policy equals the reference attention
// restricted to the same kept positions (at every position, so both edges of the window are
// covered); memory stays bounded over 10,000 decode steps; blocks released by one sequence are
// reused by another and every free block is filled with NaN before each step, so any read of a
// position outside the kept set shows up as NaN in the output. Heavy hitters also run against an
// independent H2O model written here (its own kept set, scores and softmax probabilities).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/eviction_policy.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/reference/reference_attention.hpp"
#include "pagedkv/reference/reference_kv_cache.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

// ---- attention over explicit slot lists --------------------------------------------------------

/// What paged_attention_over_slots reports in probs, worked out from the definition: for one
/// query row q ([num_heads, head_dim]) over the keys at `positions` of the contiguous k
/// ([tokens, num_kv_heads, head_dim]), each key's softmax probability (scale 1/sqrt(head_dim),
/// query head h reading KV head h / group) summed over the query heads. In double.
std::vector<double> reference_key_probs(const AttentionParams& p, std::span<const float> q,
                                        std::span<const float> k,
                                        std::span<const int64_t> positions) {
  const int64_t hd = p.head_dim;
  const int64_t kv_row = int64_t{p.num_kv_heads} * hd;
  const int32_t group = p.num_heads / p.num_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> sum(positions.size(), 0.0);
  std::vector<double> logit(positions.size());
  for (int32_t h = 0; h < p.num_heads; ++h) {
    for (size_t j = 0; j < positions.size(); ++j) {
      const float* key = k.data() + positions[j] * kv_row + (h / group) * hd;
      double dot = 0.0;
      for (int64_t d = 0; d < hd; ++d) dot += double{q[h * hd + d]} * key[d];
      logit[j] = dot * scale;
    }
    const double top = *std::max_element(logit.begin(), logit.end());
    double total = 0.0;
    for (double& l : logit) total += (l = std::exp(l - top));
    for (size_t j = 0; j < positions.size(); ++j) sum[j] += logit[j] / total;
  }
  return sum;
}

TEST(AttentionOverSlots, MatchesReferenceSubsetAndReportsProbabilities) {
  const KVCacheConfig geom{
      .num_layers = 1, .num_blocks = 6, .block_size = 4, .num_kv_heads = 2, .head_dim = 8};
  HostKVCache cache(geom);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int64_t tokens = 20;
  const int64_t row = 2 * 8;
  std::vector<float> k(tokens * row), v(tokens * row);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  // Scattered slots: position p lives at slot perm[p].
  std::vector<Slot> perm(24);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  perm.resize(tokens);
  cache.write(0, perm, k, v);
  AttentionParams params{.num_heads = 4, .num_kv_heads = 2, .head_dim = 8};
  const std::vector<std::vector<int64_t>> sets{{0, 3, 7, 19}, {5}, {}, {1, 2, 3, 4, 5, 6, 7, 8}};
  std::vector<int32_t> indptr{0};
  std::vector<Slot> slots;
  for (const auto& s : sets) {
    for (int64_t p : s) slots.push_back(perm[p]);
    indptr.push_back(static_cast<int32_t>(slots.size()));
  }
  const int64_t q_row = 4 * 8;
  std::vector<float> q(sets.size() * q_row), out(q.size()), probs(slots.size());
  for (float& x : q) x = u(rng);
  const SlotListView keys{indptr, slots, geom.block_size, geom.num_blocks};
  paged_attention_over_slots(params, cache.layer(0), keys, q, out, probs);
  for (size_t i = 0; i < sets.size(); ++i) {
    std::vector<float> ref(q_row);
    reference_attention_subset(params, std::span(q).subspan(i * q_row, q_row), k, v, tokens,
                               sets[i], ref);
    for (int64_t e = 0; e < q_row; ++e) {
      EXPECT_NEAR(out[i * q_row + e], ref[e], 1e-5) << "row " << i << " elem " << e;
    }
    float sum = 0.0f;
    for (int32_t j = indptr[i]; j < indptr[i + 1]; ++j) sum += probs[j];
    EXPECT_NEAR(sum, sets[i].empty() ? 0.0f : 4.0f, 1e-5) << "row " << i;
    // Each key's own probability, not only the row's total (a permutation keeps the sum).
    if (sets[i].empty()) continue;
    const auto want =
        reference_key_probs(params, std::span(q).subspan(i * q_row, q_row), k, sets[i]);
    for (size_t j = 0; j < want.size(); ++j) {
      EXPECT_NEAR(probs[indptr[i] + j], want[j], 2e-6) << "row " << i << " key " << sets[i][j];
    }
  }
  AttentionParams windowed = params;
  windowed.window_left = 3;
  EXPECT_THAT([&] { paged_attention_over_slots(windowed, cache.layer(0), keys, q, out); },
              ThrowsMessage<Error>(HasSubstr("the slot list is the mask")));
  std::vector<Slot> bad = slots;
  bad[0] = 24;
  EXPECT_THAT(
      [&] {
        paged_attention_over_slots(params, cache.layer(0), {indptr, bad, 4}, q, out);
      },
      ThrowsMessage<Error>(HasSubstr("slot 24 (entry 0) out of range [0, 24)")));
  // Slots computed for 2-token blocks address other tokens in a cache of 4-token blocks.
  EXPECT_THAT(
      [&] {
        paged_attention_over_slots(params, cache.layer(0), {indptr, slots, 2}, q, out);
      },
      ThrowsMessage<Error>(HasSubstr("built for block_size 2 but the cache has block_size 4")));
  EXPECT_THAT(
      [&] {
        paged_attention_over_slots(params, cache.layer(0), {indptr, slots, 4, 7}, q, out);
      },
      ThrowsMessage<Error>(HasSubstr("index a pool of 7 blocks but the cache has num_blocks 6")));
  // A decreasing indptr is rejected by name, before the size checks (rows 0..2, row 1 ends
  // before it starts): 5 -> 4.
  const std::vector<int32_t> decreasing{0, 5, 4, static_cast<int32_t>(slots.size())};
  EXPECT_THAT(
      [&] {
        paged_attention_over_slots(params, cache.layer(0), {decreasing, slots, 4}, q, out);
      },
      ThrowsMessage<Error>(HasSubstr("indptr decreases at row 1 (5 -> 4)")));
}

// ---- end-to-end: decode under each policy vs the reference -------------------------------------

constexpr int32_t kHeads = 4;
constexpr int32_t kKvHeads = 2;
constexpr int32_t kHeadDim = 8;
constexpr int64_t kKvRow = int64_t{kKvHeads} * kHeadDim;
constexpr int64_t kQRow = int64_t{kHeads} * kHeadDim;

/// Storage + manager + reference for a few sequences. Every step: poison every free block
/// with NaN (before the append, so fresh blocks hold NaN outside the written slots, and after
/// it, so blocks it released do too), write random K/V to the slots and to the reference, then
/// attend.
class Bench {
 public:
  Bench(int32_t num_blocks, int32_t block_size, EvictionPolicyConfig policy, uint32_t seed)
      : cache_({.num_layers = 1,
                .num_blocks = num_blocks,
                .block_size = block_size,
                .num_kv_heads = kKvHeads,
                .head_dim = kHeadDim}),
        ref_(1, kKvHeads, kHeadDim),
        m_({.num_blocks = num_blocks, .block_size = block_size, .eviction = policy}),
        rng_(seed) {
    params_ = {.num_heads = kHeads, .num_kv_heads = kKvHeads, .head_dim = kHeadDim};
    m_.eviction_policy().set_attention_mask(params_);
  }

  KVCacheManager& manager() { return m_; }
  const HostKVCache& cache() const { return cache_; }
  const ReferenceKVCache& reference() const { return ref_; }
  const AttentionParams& params() const { return params_; }

  /// A slot list with the manager's geometry, what paged_attention_over_slots checks.
  SlotListView keys_of(std::span<const int32_t> indptr, std::span<const Slot> slots) const {
    return {indptr, slots, m_.config().block_size, m_.config().num_blocks};
  }

  void add(SeqId s) {
    m_.add_sequence(s);
    ref_.add_sequence(s);
  }

  void poison_free_blocks() {
    std::vector<BlockId> free;
    for (BlockId b = 0; b < m_.num_total_blocks(); ++b) {
      if (m_.allocator().is_free(b)) free.push_back(b);
    }
    cache_.fill_blocks(free, std::nanf(""));
  }

  /// Appends n tokens to s (random K/V). Returns false when the pool is short.
  bool append(SeqId s, int64_t n) {
    poison_free_blocks();
    auto r = m_.append_slots(s, n);
    if (!r) return false;
    poison_free_blocks();  // again: the append may have released blocks
    for (const BlockCopy& c : r->copies) cache_.copy_blocks(std::span(&c, 1));
    std::vector<float> k(n * kKvRow), v(n * kKvRow);
    for (float& x : k) x = u_(rng_);
    for (float& x : v) x = u_(rng_);
    cache_.write(0, r->slots, k, v);
    ref_.append(s, 0, k, v);
    return true;
  }

  /// Positional policies: the last n tokens of s attend through batch_metadata with the
  /// policy's mask (prefill when n > 1); compared with the masked reference. Returns the
  /// max abs error (NaN if any output is NaN).
  float check_positional(SeqId s, int64_t n) {
    std::vector<SeqId> seqs{s};
    std::vector<int64_t> news{n};
    BatchMetadata meta = m_.batch_metadata(seqs, news);
    std::vector<float> q(n * kQRow), out(q.size()), ref(q.size());
    for (float& x : q) x = u_(rng_);
    paged_prefill_attention(params_, cache_.layer(0), meta.padded.view(), meta.query_start, q, out);
    reference_attention(params_, q, ref_.keys(s, 0), ref_.values(s, 0), ref_.num_tokens(s), ref);
    return max_err(out, ref);
  }

  /// Heavy hitters: one query over kept_tokens(s) with probabilities fed back as scores;
  /// compared with reference_attention_subset over the same positions.
  float check_kept(SeqId s) {
    std::vector<SeqId> seqs{s};
    KeptTokens kept = m_.kept_tokens(seqs);
    std::vector<float> q(kQRow), out(kQRow), ref(kQRow), probs(kept.slots.size());
    for (float& x : q) x = u_(rng_);
    paged_attention_over_slots(params_, cache_.layer(0), keys_of(kept.indptr, kept.slots), q, out,
                               probs);
    reference_attention_subset(params_, q, ref_.keys(s, 0), ref_.values(s, 0), ref_.num_tokens(s),
                               kept.positions, ref);
    m_.accumulate_attention(s, probs);
    return max_err(out, ref);
  }

  /// Heavy hitters, prompt: causal attention of every prompt token over the (positional) kept
  /// list; column sums of the probabilities become the initial scores.
  void score_prompt(SeqId s) {
    std::vector<SeqId> seqs{s};
    KeptTokens kept = m_.kept_tokens(seqs);
    const int64_t n = static_cast<int64_t>(kept.slots.size());
    std::vector<int32_t> indptr{0};
    std::vector<Slot> slots;
    for (int64_t t = 0; t < n; ++t) {
      slots.insert(slots.end(), kept.slots.begin(), kept.slots.begin() + t + 1);
      indptr.push_back(static_cast<int32_t>(slots.size()));
    }
    std::vector<float> q(n * kQRow), out(q.size()), probs(slots.size());
    for (float& x : q) x = u_(rng_);
    paged_attention_over_slots(params_, cache_.layer(0), keys_of(indptr, slots), q, out, probs);
    std::vector<float> column(n, 0.0f);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j <= t; ++j) column[j] += probs[indptr[t] + j];
    }
    m_.accumulate_attention(s, column);
  }

  int32_t live_blocks(SeqId s) const {
    int32_t n = 0;
    for (BlockId b : m_.block_table(s)) n += b >= 0 ? 1 : 0;
    return n;
  }

 private:
  static float max_err(std::span<const float> a, std::span<const float> b) {
    float e = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i])) return std::nanf("");
      e = std::max(e, std::abs(a[i] - b[i]));
    }
    return e;
  }

  HostKVCache cache_;
  ReferenceKVCache ref_;
  KVCacheManager m_;
  AttentionParams params_;
  std::mt19937 rng_;
  std::uniform_real_distribution<float> u_{-1.0f, 1.0f};
};

struct PositionalCase {
  const char* name;
  EvictionPolicyConfig policy;
  int32_t block_size;
};

void PrintTo(const PositionalCase& c, std::ostream* os) { *os << c.name; }

class PositionalPolicy : public ::testing::TestWithParam<PositionalCase> {};

// Two sequences decode side by side in a pool too small to keep their whole history, so the
// blocks one releases are poisoned and reused by the other. Every step of each sequence is
// checked (both edges of the window pass by at every block offset).
TEST_P(PositionalPolicy, DecodeMatchesMaskedReferenceWithPoisonedReuse) {
  const PositionalCase& c = GetParam();
  const int32_t bs = c.block_size;
  const int64_t keep = c.policy.window + c.policy.sinks;
  const int32_t per_seq = static_cast<int32_t>(blocks_for_tokens(c.policy.sinks, bs) +
                                               blocks_for_tokens(c.policy.window, bs) + 1);
  Bench bench(2 * per_seq + 1, bs, c.policy, 17);
  bench.add(1);
  bench.add(2);
  // A prompt longer than the window: one masked prefill.
  const int64_t prompt = keep + bs + 1;
  ASSERT_TRUE(bench.append(1, prompt));
  EXPECT_LE(bench.check_positional(1, prompt), 1e-5);
  std::set<BlockId> released_by_1;
  bool reused = false;
  for (int step = 0; step < 12 * bs + 20; ++step) {
    for (SeqId s : {SeqId{1}, SeqId{2}}) {
      const auto before = bench.manager().block_table(s);
      std::vector<BlockId> old(before.begin(), before.end());
      ASSERT_TRUE(bench.append(s, 1)) << c.name << " step " << step;
      const auto after = bench.manager().block_table(s);
      for (size_t j = 0; j < old.size(); ++j) {
        if (s == 1 && old[j] >= 0 && after[j] < 0) released_by_1.insert(old[j]);
      }
      if (s == 2) {
        for (BlockId b : after) reused |= b >= 0 && released_by_1.contains(b);
      }
      const float err = bench.check_positional(s, 1);
      ASSERT_LE(err, 1e-5) << c.name << " seq " << s << " step " << step << " (NaN = a read "
                           << "outside the kept set)";
      EXPECT_LE(bench.live_blocks(s), per_seq);
      bench.manager().check_invariants();
    }
  }
  EXPECT_TRUE(reused) << "test did not exercise reuse of released blocks";
}

INSTANTIATE_TEST_SUITE_P(
    Edges, PositionalPolicy,
    ::testing::Values(
        PositionalCase{"window1_bs4", {.kind = EvictionKind::kSlidingWindow, .window = 1}, 4},
        PositionalCase{"window3_bs4", {.kind = EvictionKind::kSlidingWindow, .window = 3}, 4},
        PositionalCase{"window4_bs4", {.kind = EvictionKind::kSlidingWindow, .window = 4}, 4},
        PositionalCase{"window5_bs4", {.kind = EvictionKind::kSlidingWindow, .window = 5}, 4},
        PositionalCase{"window9_bs4", {.kind = EvictionKind::kSlidingWindow, .window = 9}, 4},
        PositionalCase{"window2_bs1", {.kind = EvictionKind::kSlidingWindow, .window = 2}, 1},
        PositionalCase{"sinks1_window4_bs4",
                       {.kind = EvictionKind::kAttentionSinks, .window = 4, .sinks = 1},
                       4},
        PositionalCase{"sinks4_window3_bs4",
                       {.kind = EvictionKind::kAttentionSinks, .window = 3, .sinks = 4},
                       4},
        PositionalCase{"sinks5_window5_bs4",
                       {.kind = EvictionKind::kAttentionSinks, .window = 5, .sinks = 5},
                       4},
        PositionalCase{"sinks2_window1_bs3",
                       {.kind = EvictionKind::kAttentionSinks, .window = 1, .sinks = 2},
                       3}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(EvictionPolicy, SlidingWindowMemoryBoundedOver10000Steps) {
  const int32_t bs = 4;
  const EvictionPolicyConfig policy{.kind = EvictionKind::kAttentionSinks, .window = 8, .sinks = 2};
  const int32_t bound = 1 + 2 + 1;  // sink block + ceil(8 / 4) + 1 partially covered
  Bench bench(bound, bs, policy, 5);
  bench.add(1);
  for (int step = 0; step < 10000; ++step) {
    ASSERT_TRUE(bench.append(1, 1)) << "step " << step;
    ASSERT_LE(bench.live_blocks(1), bound) << "step " << step;
    if (step % 997 == 0 || step == 9999) {
      ASSERT_LE(bench.check_positional(1, 1), 1e-5) << "step " << step;
    }
  }
  EXPECT_EQ(bench.manager().num_tokens(1), 10000);
  bench.manager().check_invariants();
  bench.manager().free_sequence(1);
  EXPECT_EQ(bench.manager().num_free_blocks(), bound);
}

TEST(EvictionPolicy, HeavyHittersMatchReferenceSubsetWithPoisonedReuse) {
  const int32_t bs = 4;
  const EvictionPolicyConfig policy{.kind = EvictionKind::kHeavyHitters, .recent = 3, .heavy = 4};
  const int64_t budget = 7;
  const int32_t per_seq = static_cast<int32_t>(blocks_for_tokens(budget, bs) + 1);
  // Room for one 13-token prompt (4 blocks) next to the other sequence's bound.
  Bench bench(2 * per_seq + 2, bs, policy, 23);
  bench.add(1);
  bench.add(2);
  ASSERT_TRUE(bench.append(1, 13));  // prompt longer than the budget: prefill is exact
  EXPECT_LE(bench.check_positional(1, 13), 1e-5);
  bench.score_prompt(1);
  for (int step = 0; step < 200; ++step) {
    for (SeqId s : {SeqId{1}, SeqId{2}}) {
      ASSERT_TRUE(bench.append(s, 1)) << "step " << step;
      const float err = bench.check_kept(s);
      ASSERT_LE(err, 1e-5) << "seq " << s << " step " << step;
      std::vector<SeqId> seqs{s};
      const KeptTokens kept = bench.manager().kept_tokens(seqs);
      const int64_t t = bench.manager().num_tokens(s);
      ASSERT_LE(static_cast<int64_t>(kept.positions.size()), budget);
      // The last `recent` positions are always kept.
      for (int64_t p = std::max<int64_t>(0, t - 3); p < t; ++p) {
        ASSERT_TRUE(std::find(kept.positions.begin(), kept.positions.end(), p) !=
                    kept.positions.end())
            << "recent position " << p << " evicted at step " << step;
      }
      ASSERT_LE(bench.live_blocks(s), per_seq) << "step " << step;
      bench.manager().check_invariants();
    }
  }
  EXPECT_GT(bench.manager().stats().evicted_tokens, 0);
  std::vector<SeqId> seqs{1};
  EXPECT_THAT([&] { (void)bench.manager().batch_metadata(seqs, std::vector<int64_t>{1}); },
              ThrowsMessage<Error>(HasSubstr("use kept_tokens")));
}

TEST(EvictionPolicy, HeavyHittersMemoryBoundedOver10000Steps) {
  const int32_t bs = 4;
  const EvictionPolicyConfig policy{.kind = EvictionKind::kHeavyHitters, .recent = 4, .heavy = 6};
  const int32_t bound = static_cast<int32_t>(blocks_for_tokens(10, bs) + 1);
  Bench bench(bound, bs, policy, 29);
  bench.add(1);
  for (int step = 0; step < 10000; ++step) {
    ASSERT_TRUE(bench.append(1, 1)) << "step " << step;
    ASSERT_LE(bench.live_blocks(1), bound) << "step " << step;
    if (step % 50 == 0 || step == 9999) {
      ASSERT_LE(bench.check_kept(1), 1e-5) << "step " << step;
    } else {
      // Still feed scores so victims vary; cheaper than the reference check.
      std::vector<SeqId> seqs{1};
      const auto kept = bench.manager().kept_tokens(seqs);
      std::vector<float> w(kept.slots.size());
      for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((step * 7 + i * 3) % 5);
      bench.manager().accumulate_attention(1, w);
    }
  }
  bench.manager().check_invariants();
  bench.manager().free_sequence(1);
  EXPECT_EQ(bench.manager().num_free_blocks(), bound);
}

/// H2O (Zhang et al., NeurIPS 2023) for one sequence, from the rule rather than from the
/// manager: keep the last R positions and, of the older ones, the H with the largest
/// accumulated attention. An append of n tokens that would leave more than R + H kept drops the
/// lowest-scored tokens older than the new recent window (the older first among equal scores);
/// new tokens start at score 0.
class H2OModel {
 public:
  H2OModel(int64_t recent, int64_t heavy) : recent_(recent), heavy_(heavy) {}

  void append(int64_t n) {
    const int64_t excess = static_cast<int64_t>(kept_.size()) + n - (recent_ + heavy_);
    const int64_t recent_start = next_ + n - recent_;
    std::vector<std::pair<double, int64_t>> older;  // (score, position): lowest, then oldest
    for (const auto& [pos, score] : kept_) {
      if (pos < recent_start) older.emplace_back(score, pos);
    }
    std::sort(older.begin(), older.end());
    for (int64_t i = 0; i < std::min<int64_t>(excess, static_cast<int64_t>(older.size())); ++i) {
      kept_.erase(older[i].second);
    }
    for (int64_t i = 0; i < n; ++i) kept_[next_ + i] = 0.0;
    next_ += n;
  }
  /// Adds one weight per kept token, in position order.
  void accumulate(std::span<const float> w) {
    ASSERT_EQ(w.size(), kept_.size());
    size_t i = 0;
    for (auto& [pos, score] : kept_) score += w[i++];
  }
  [[nodiscard]] std::vector<int64_t> positions() const {
    std::vector<int64_t> p;
    for (const auto& [pos, score] : kept_) p.push_back(pos);
    return p;
  }

 private:
  int64_t recent_, heavy_;
  int64_t next_ = 0;
  std::map<int64_t, double> kept_;  // position -> accumulated score
};

// The manager's kept set follows the model step by step; the kernel's output is compared with
// the reference over the model's kept positions and each key's probability with the softmax
// worked out here. Both sides accumulate the same weights (the model's probabilities rounded
// to float), so the victims depend on the rule alone. Appends of 1 and 2 tokens; two sequences
// share a poisoned pool.
TEST(EvictionPolicy, HeavyHittersFollowAnIndependentH2OModel) {
  const int32_t bs = 4;
  const EvictionPolicyConfig policy{.kind = EvictionKind::kHeavyHitters, .recent = 3, .heavy = 4};
  Bench bench(24, bs, policy, 31);
  std::mt19937 rng(37);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);  // spread scores: victims vary
  std::map<SeqId, H2OModel> model;
  const AttentionParams& params = bench.params();
  ASSERT_EQ(params.scale, 0.0f);  // reference_key_probs uses the default 1/sqrt(head_dim)
  // One query over the manager's kept set; returns the model's probabilities as float weights.
  auto attend = [&](SeqId s, int step) -> std::vector<float> {
    std::vector<SeqId> seqs{s};
    const KeptTokens kept = bench.manager().kept_tokens(seqs);
    const std::vector<int64_t> want = model.at(s).positions();
    EXPECT_EQ(kept.positions, want) << "seq " << s << " step " << step;
    if (kept.positions != want) return {};
    std::vector<float> q(kQRow), out(kQRow), ref(kQRow), probs(kept.slots.size());
    for (float& x : q) x = u(rng);
    paged_attention_over_slots(params, bench.cache().layer(0),
                               bench.keys_of(kept.indptr, kept.slots), q, out, probs);
    const auto& r = bench.reference();
    reference_attention_subset(params, q, r.keys(s, 0), r.values(s, 0), r.num_tokens(s), want, ref);
    for (int64_t e = 0; e < kQRow; ++e) {
      EXPECT_NEAR(out[e], ref[e], 1e-5) << "seq " << s << " step " << step << " elem " << e;
    }
    const auto p = reference_key_probs(params, q, r.keys(s, 0), want);
    std::vector<float> w(p.size());
    for (size_t j = 0; j < p.size(); ++j) {
      EXPECT_NEAR(probs[j], p[j], 2e-6) << "seq " << s << " step " << step << " key " << want[j];
      w[j] = static_cast<float>(p[j]);
    }
    return w;
  };
  int64_t evicted = 0;
  for (SeqId s : {SeqId{1}, SeqId{2}}) {
    bench.add(s);
    model.emplace(s, H2OModel(3, 4));
  }
  ASSERT_TRUE(bench.append(1, 11));  // a prompt longer than the budget: nothing evicted yet
  model.at(1).append(11);
  for (int step = 0; step < 300; ++step) {
    for (SeqId s : {SeqId{1}, SeqId{2}}) {
      const int64_t n = step % 5 == 2 ? 2 : 1;
      const int64_t before = bench.manager().stats().evicted_tokens;
      ASSERT_TRUE(bench.append(s, n)) << "seq " << s << " step " << step;
      evicted += bench.manager().stats().evicted_tokens - before;
      model.at(s).append(n);
      const std::vector<float> w = attend(s, step);
      ASSERT_FALSE(w.empty() || ::testing::Test::HasFailure()) << "seq " << s << " step " << step;
      bench.manager().accumulate_attention(s, w);
      model.at(s).accumulate(w);
      bench.manager().check_invariants();
    }
  }
  EXPECT_GT(evicted, 500);  // the victims were chosen many times, not once
}

}  // namespace
}  // namespace pagedkv
