// Random workloads for prefix caching across KV cache groups
// (include/pagedkv/metadata/hybrid_kv_cache_manager.hpp): prompts with shared prefixes, decode,
// commit, fork, truncate, free, recompute preemption and re-add, swap out and in, over three
// group configurations, checked after every operation against an independent model: which
// entries each group must keep (the release rule, from the hit point on), the K/V each live
// entry holds (a model storage written through the returned slots and copies, so a wrong share,
// copy-on-write or swap mapping shows as wrong content), conservation of both pools, and every
// can_* query against its operation.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/hybrid_groups.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using testing::N;
constexpr int32_t kBs = 4;

using testing::chunked;
using testing::full;
using testing::window;

/// K/V a position holds: a fingerprint of the salt and every token up to it (K/V depend on
/// the whole prefix), so equal fingerprints mean shareable content.
uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0xBF58476D1CE4E5B9ull;
}

struct ModelSeq {
  std::vector<TokenId> tokens;
  std::vector<uint64_t> fp;             // [tokens] fingerprint of each position
  std::vector<std::vector<bool>> live;  // [group][entry]
  uint64_t extra = 0;
  bool ids_known = true;
  bool swapped = false;
};

using Storage = std::map<BlockId, std::vector<uint64_t>>;  // block -> [kBs] fingerprints

struct Model {
  std::vector<KVCacheGroupSpec> groups;
  std::map<SeqId, ModelSeq> seqs;
  Storage device;
  Storage host;

  void push_tokens(ModelSeq& s, std::span<const TokenId> t) const {
    for (TokenId id : t) {
      const uint64_t prev = s.fp.empty() ? mix(12345, s.extra) : s.fp.back();
      s.tokens.push_back(id);
      s.fp.push_back(mix(prev, static_cast<uint64_t>(id) + 1));
    }
  }
  // The release rule at s.tokens, then n more entries' worth of positions.
  void grow(ModelSeq& s, int64_t n) const {
    const auto at = static_cast<int64_t>(s.tokens.size()) - n;
    for (size_t g = 0; g < groups.size(); ++g) {
      const KVCacheGroupSpec& spec = groups[g];
      int64_t first = 0;
      if (spec.kind == GroupAttention::kSlidingWindow)
        first = std::max<int64_t>(0, at - spec.window + 1);
      if (spec.kind == GroupAttention::kChunkedLocal) first = at / spec.chunk * spec.chunk;
      for (size_t e = 0; e < s.live[g].size(); ++e) {
        const bool sink = static_cast<int64_t>(e) * kBs < spec.sink_tokens;
        if (!sink && static_cast<int64_t>(e) * kBs + kBs - 1 < first) s.live[g][e] = false;
      }
      while (static_cast<int64_t>(s.live[g].size()) < (at + n + kBs - 1) / kBs) {
        s.live[g].push_back(true);
      }
    }
  }
  // The engine writes the new positions' K/V after doing the copies first.
  void write(const ModelSeq& s, const HybridAppendResult& r, int64_t first) {
    for (const BlockCopy& c : r.copies) device[c.dst] = device[c.src];
    for (const auto& slots : r.slots) {
      for (size_t i = 0; i < slots.size(); ++i) {
        std::vector<uint64_t>& kv = device[static_cast<BlockId>(slots[i] / kBs)];
        kv.resize(kBs, 0);
        kv[static_cast<size_t>(slots[i] % kBs)] = s.fp[static_cast<size_t>(first) + i];
      }
    }
  }
};

void expect_model(const HybridKVCacheManager& m, const Model& model) {
  std::set<BlockId> held;
  std::set<BlockId> host_held;
  for (const auto& [id, s] : model.seqs) {
    ASSERT_EQ(m.num_tokens(id), static_cast<int64_t>(s.tokens.size())) << id;
    ASSERT_EQ(m.is_swapped(id), s.swapped) << id;
    const Storage& kv = s.swapped ? model.host : model.device;
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      const auto table = m.block_table(id, g);
      const std::vector<bool>& live = s.live[static_cast<size_t>(g)];
      ASSERT_EQ(table.size(), live.size()) << id;
      for (size_t e = 0; e < table.size(); ++e) {
        ASSERT_EQ(table[e] != N, live[e]) << "seq " << id << " group " << g << " entry " << e;
        if (table[e] == N) continue;
        (s.swapped ? host_held : held).insert(table[e]);
        const auto it = kv.find(table[e]);
        ASSERT_NE(it, kv.end()) << "seq " << id << " group " << g << " entry " << e;
        for (size_t p = e * kBs; p < std::min(s.tokens.size(), (e + 1) * kBs); ++p) {
          ASSERT_EQ(it->second[p % kBs], s.fp[p])
              << "seq " << id << " group " << g << " position " << p << " block " << table[e];
        }
      }
    }
  }
  // Conservation: free + cached + in tables == usable, on both pools.
  const BlockAllocator& a = m.allocator();
  ASSERT_EQ(a.num_free() + m.num_cached_blocks() + static_cast<int32_t>(held.size()),
            m.config().num_blocks - 1);
  if (const BlockAllocator* h = m.host_allocator()) {
    ASSERT_EQ(h->num_free() + static_cast<int32_t>(host_held.size()), m.config().num_host_blocks);
  }
}

class Workload {
 public:
  Workload(std::vector<KVCacheGroupSpec> groups, uint64_t seed)
      : m_({.num_blocks = 48,
            .block_size = kBs,
            .groups = groups,
            .enable_prefix_caching = true,
            .num_host_blocks = 16}),
        rng_(seed) {
    model_.groups = std::move(groups);
    // Three base texts over a 3-token vocabulary: prompts are their prefixes, often shared.
    for (auto& b : bases_) {
      for (int i = 0; i < 40; ++i) b.push_back(static_cast<TokenId>(rng_() % 3));
    }
  }

  void step() {
    const int op = static_cast<int>(rng_() % 16);
    if (model_.seqs.empty() || op <= 2) return add(next_id_++, random_prompt(), rng_() % 5 == 0);
    auto it = model_.seqs.begin();
    std::advance(it, static_cast<long>(rng_() % model_.seqs.size()));
    const SeqId id = it->first;
    ModelSeq& s = it->second;
    if (s.swapped) {
      if (op <= 10) return swap_in(id, s);
      m_.free_sequence(id);
      model_.seqs.erase(it);
      return;
    }
    if (op <= 7) return append(id, s, op == 7);
    if (op == 8) {
      (void)m_.commit(id, static_cast<int64_t>(rng_() % (s.tokens.size() + 1)));
      return;
    }
    if (op == 9 && model_.seqs.size() < 8) {
      m_.fork(id, next_id_);
      model_.seqs[next_id_++] = s;
      return;
    }
    if (op == 10) return truncate(id, s);
    if (op == 11) return swap_out(id, s);
    if (op == 12) return preempt(id);
    m_.free_sequence(id);
    model_.seqs.erase(it);
  }

  const HybridKVCacheManager& manager() const { return m_; }
  const Model& model() const { return model_; }
  int64_t hits() const { return hit_tokens_; }

 private:
  std::vector<TokenId> random_prompt() {
    const auto& base = bases_[rng_() % bases_.size()];
    std::vector<TokenId> p(base.begin(), base.begin() + 1 + static_cast<long>(rng_() % 30));
    if (rng_() % 4 == 0) p.push_back(static_cast<TokenId>(rng_() % 3));
    return p;
  }

  void add(SeqId id, const std::vector<TokenId>& prompt, bool salted) {
    const uint64_t extra = salted ? 7 : 0;
    const HybridPrefixLookup look = m_.lookup_prefix(prompt, extra);
    const Admission adm = m_.can_add_sequence(prompt, extra);
    const std::vector<BlockId> free_before = m_.allocator().free_list();
    const std::optional<HybridAddResult> r = m_.add_sequence(id, prompt, extra);
    ASSERT_EQ(adm == Admission::kOk, r.has_value()) << "can_add_sequence answers exactly";
    if (!r) {
      ASSERT_EQ(m_.allocator().free_list(), free_before);
      ASSERT_FALSE(m_.has_sequence(id));
      return;
    }
    const int64_t h = r->num_computed_tokens;
    ASSERT_EQ(h, look.num_computed_tokens) << "lookup_prefix and add agree";
    ASSERT_EQ(h % kBs, 0);
    ASSERT_LT(h, std::max<int64_t>(1, static_cast<int64_t>(prompt.size())));
    hit_tokens_ += h;
    ModelSeq s;
    s.extra = extra;
    s.live.assign(model_.groups.size(), std::vector<bool>(static_cast<size_t>(h / kBs), true));
    for (int32_t g = 0; g < m_.num_groups(); ++g) {
      const auto t = m_.block_table(id, g);
      for (size_t j = 0; j < look.blocks[static_cast<size_t>(g)].size(); ++j) {
        ASSERT_EQ(t[j], look.blocks[static_cast<size_t>(g)][j]) << "the add shares the lookup";
      }
    }
    model_.push_tokens(s, prompt);
    // Entries below the hit: the release rule at h decides which the group keeps.
    model_.grow(s, static_cast<int64_t>(prompt.size()) - h);
    model_.write(s, r->append, h);
    model_.seqs[id] = std::move(s);
  }

  void append(SeqId id, ModelSeq& s, bool unknown_ids) {
    const auto n = static_cast<int64_t>(rng_() % 6);
    std::vector<TokenId> t;
    for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>(rng_() % 3));
    const bool ok = m_.can_append(id, n);
    const auto first = static_cast<int64_t>(s.tokens.size());
    const auto r = unknown_ids ? m_.append_slots(id, n) : m_.append_tokens(id, t);
    ASSERT_EQ(ok, r.has_value()) << "can_append answers exactly";
    if (!r) return;
    if (unknown_ids && n > 0) {
      s.ids_known = false;
      for (TokenId& x : t) x = 1000 + static_cast<TokenId>(rng_() % 1000);
    }
    model_.push_tokens(s, t);
    model_.grow(s, n);
    model_.write(s, *r, first);
    for (const auto& slots : r->slots) {
      for (Slot slot : slots) {
        ASSERT_EQ(m_.allocator().ref_count(static_cast<BlockId>(slot / kBs)), 1);
        ASSERT_FALSE(m_.allocator().is_cached(static_cast<BlockId>(slot / kBs)))
            << "a published block is never written";
      }
    }
  }

  void truncate(SeqId id, ModelSeq& s) {
    const int64_t keep = static_cast<int64_t>(s.tokens.size()) - static_cast<int64_t>(rng_() % 6);
    if (keep < 0) return;
    try {
      m_.truncate(id, keep);
    } catch (const Error&) {
      return;  // refused (a released block would be needed): the model keeps its state too
    }
    s.tokens.resize(static_cast<size_t>(keep));
    s.fp.resize(static_cast<size_t>(keep));
    for (auto& l : s.live) l.resize(static_cast<size_t>((keep + kBs - 1) / kBs));
  }

  void swap_out(SeqId id, ModelSeq& s) {
    const bool ok = m_.can_swap_out(id);
    const auto r = m_.swap_out(id);
    ASSERT_EQ(ok, r.has_value());
    if (!r) return;
    for (const BlockCopy& c : r->copies) model_.host[c.dst] = model_.device[c.src];
    s.swapped = true;
  }

  void swap_in(SeqId id, ModelSeq& s) {
    const bool ok = m_.can_swap_in(id);
    const auto r = m_.swap_in(id);
    ASSERT_EQ(ok, r.has_value());
    if (!r) return;
    for (const BlockCopy& c : r->copies) model_.device[c.dst] = model_.host[c.src];
    s.swapped = false;
  }

  void preempt(SeqId id) {
    const ModelSeq s = model_.seqs.at(id);
    const PreemptedSequence p = m_.preempt(id);
    model_.seqs.erase(id);
    ASSERT_EQ(p.num_tokens, static_cast<int64_t>(s.tokens.size()));
    ASSERT_EQ(p.extra_key, s.extra);
    if (!s.ids_known) {
      ASSERT_TRUE(p.tokens.empty());
      return;
    }
    ASSERT_EQ(p.tokens, s.tokens);
    add(id, p.tokens, p.extra_key != 0);  // prefill again: it may hit its own blocks
  }

  HybridKVCacheManager m_;
  Model model_;
  std::mt19937 rng_;
  std::array<std::vector<TokenId>, 3> bases_;
  SeqId next_id_ = 0;
  int64_t hit_tokens_ = 0;
};

TEST(HybridPrefixWorkload, RandomOperationsMatchTheModel) {
  const std::vector<std::vector<KVCacheGroupSpec>> configs = {
      {full(), window(8)}, {window(5, 3), chunked(6), full()}, {chunked(8), window(6, 2)}};
  for (size_t c = 0; c < configs.size(); ++c) {
    Workload w(configs[c], 2026 + c);
    for (int step = 0; step < 1500; ++step) {
      w.step();
      if (HasFatalFailure()) {
        ADD_FAILURE() << "config " << c << " step " << step;
        return;
      }
      w.manager().check_invariants();
      expect_model(w.manager(), w.model());
      if (HasFatalFailure()) {
        ADD_FAILURE() << "config " << c << " step " << step;
        return;
      }
    }
    EXPECT_GT(w.hits(), 200) << "config " << c << ": the workload exercises prefix hits";
  }
}

}  // namespace
}  // namespace pagedkv
