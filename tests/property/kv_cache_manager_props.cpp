// Property tests of KVCacheManager (rapidcheck): random operation sequences checked against a
// deliberately simple model after every operation.
//
// The model is a shadow of the storage: for every device and host slot, the token id written
// there (or -1 once the block is free: poisoned). Each operation's result is applied to the
// shadow exactly as a storage would apply it (copies first, then writes to the returned slots),
// and each sequence keeps its own list of token ids. Then:
//  - every kept position of every running sequence reads back its own token id from the shadow
//    (so prefix hits share only identical content, copy-on-write isolates writers, swap-out then
//    swap-in restores identical data, and no kept position lives in a freed block);
//  - free + used + cached == total; a block's ref count equals the number of tables holding it;
//    no block is both free and referenced;
//  - every can_* query agrees with the operation it predicts, and a failed operation changes
//    nothing (the manager's observable state is compared before and after);
//  - freeing every sequence returns every block;
//  - commit (publish after write) and truncate (rollback, copy-on-write of a published or
//    shared partial tail) keep all of the above.
// Runs are kept small (a few dozen operations on pools of 1..12 blocks) so the suite takes
// seconds on 2 cores.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <sstream>
#include <utility>

#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

/// Everything observable about a manager, as text (compared before/after failed operations).
std::string observable(const KVCacheManager& m) {
  std::ostringstream os;
  for (SeqId s : m.sequences()) {
    os << "seq " << s << " tokens " << m.num_tokens(s) << " swapped " << m.is_swapped(s)
       << " table";
    for (BlockId b : m.block_table(s)) os << ' ' << b;
    os << '\n';
  }
  const BlockAllocator& a = m.allocator();
  os << "free";
  for (BlockId b : a.free_list()) os << ' ' << b;
  os << "\nlru";
  for (BlockId b : a.cached_lru()) os << ' ' << b;
  os << "\nref";
  for (BlockId b = 0; b < a.num_blocks(); ++b) os << ' ' << a.ref_count(b);
  const KVCacheStats st = m.stats();
  os << "\nstats " << st.prefix_hits << ' ' << st.prefix_misses << ' ' << st.prefix_evictions << ' '
     << st.preemptions << ' ' << st.host_used_blocks << ' ' << st.prefix_cached_entries << ' '
     << st.evicted_tokens << ' ' << st.released_blocks << '\n';
  return os.str();
}

class Model {
 public:
  explicit Model(const KVCacheManagerConfig& c)
      : m_(c),
        bs_(c.block_size),
        device_(static_cast<size_t>(c.num_blocks) * c.block_size, -1),
        host_(static_cast<size_t>(c.num_host_blocks) * c.block_size, -1) {}

  KVCacheManager& manager() { return m_; }

  void copy_block(std::vector<TokenId>& dst_pool, BlockId dst, const std::vector<TokenId>& src_pool,
                  BlockId src) {
    std::copy_n(src_pool.begin() + int64_t{src} * bs_, bs_, dst_pool.begin() + int64_t{dst} * bs_);
  }

  void write(std::span<const Slot> slots, std::span<const TokenId> tokens) {
    RC_ASSERT(slots.size() == tokens.size());
    for (size_t i = 0; i < slots.size(); ++i) device_[slots[i]] = tokens[i];
  }

  void apply(const AppendResult& r, std::span<const TokenId> tokens) {
    for (const BlockCopy& c : r.copies) copy_block(device_, c.dst, device_, c.src);
    write(r.slots, tokens);
  }

  /// Poison free blocks (a real storage would hold stale data there).
  void poison() {
    for (BlockId b = 0; b < m_.num_total_blocks(); ++b) {
      if (m_.allocator().is_free(b)) std::fill_n(device_.begin() + int64_t{b} * bs_, bs_, -1);
    }
    if (const BlockAllocator* h = m_.host_allocator()) {
      for (BlockId b = 0; b < h->num_blocks(); ++b) {
        if (h->is_free(b)) std::fill_n(host_.begin() + int64_t{b} * bs_, bs_, -1);
      }
    }
  }

  KVCacheManager m_;
  int32_t bs_;
  std::vector<TokenId> device_;                   // [num_blocks * block_size]
  std::vector<TokenId> host_;                     // [num_host_blocks * block_size]
  std::map<SeqId, std::vector<TokenId>> tokens_;  // the model's own token list per sequence
};

/// The model's checks, after every operation.
void check_all(Model& md) {
  KVCacheManager& m = md.m_;
  try {
    m.check_invariants();
  } catch (const Error& e) {
    RC_FAIL(std::string("check_invariants: ") + e.what());
  }
  const BlockAllocator& a = m.allocator();
  const int32_t total = a.num_blocks();
  std::vector<int32_t> holders(static_cast<size_t>(total), 0);
  for (SeqId s : m.sequences()) {
    RC_ASSERT(m.num_tokens(s) == static_cast<int64_t>(md.tokens_.at(s).size()));
    if (m.is_swapped(s)) continue;
    for (BlockId b : m.block_table(s)) {
      if (b >= 0) ++holders[b];
    }
  }
  int32_t free = 0, used = 0, cached = 0;
  for (BlockId b = 0; b < total; ++b) {
    RC_ASSERT(a.ref_count(b) == holders[b]);
    if (a.is_free(b)) {
      RC_ASSERT(holders[b] == 0);  // never both free and referenced
      ++free;
    } else if (a.ref_count(b) > 0) {
      ++used;
    } else {
      RC_ASSERT(a.is_cached(b));
      ++cached;
    }
  }
  RC_ASSERT(free + used + cached == total);
  const KVCacheStats st = m.stats();
  RC_ASSERT(st.free_blocks == free && st.used_blocks == used && st.cached_blocks == cached);
  // Content: every kept position of a running sequence holds its own token.
  for (SeqId s : m.sequences()) {
    if (m.is_swapped(s)) continue;
    const std::vector<SeqId> one{s};
    const KeptTokens kept = m.kept_tokens(one);
    const auto& toks = md.tokens_.at(s);
    for (size_t i = 0; i < kept.slots.size(); ++i) {
      const TokenId got = md.device_.at(static_cast<size_t>(kept.slots[i]));
      if (got != toks.at(static_cast<size_t>(kept.positions[i]))) {
        RC_FAIL("sequence " + std::to_string(s) + " position " + std::to_string(kept.positions[i]) +
                " reads token " + std::to_string(got) + " at slot " +
                std::to_string(kept.slots[i]) + ", expected " +
                std::to_string(toks[kept.positions[i]]));
      }
    }
  }
}

std::vector<TokenId> gen_tokens(int64_t max_len) {
  // A 3-letter alphabet: prompts share prefixes (and whole blocks) often.
  const auto n = *rc::gen::inRange<int64_t>(0, max_len + 1);
  return *rc::gen::container<std::vector<TokenId>>(static_cast<size_t>(n),
                                                   rc::gen::inRange<TokenId>(1, 4));
}

enum class Op {
  kAdd,
  kAppendTokens,
  kAppendSlots,
  kFork,
  kFree,
  kSwapOut,
  kSwapIn,
  kPreempt,
  kReset,
  kScore,
  kCommit,
  kTruncate
};

/// A random prompt added as sequence `id`; false when admission refused it (nothing changed).
bool add_prompt(Model& md, const KVCacheManagerConfig& config, SeqId id,
                const std::string& before) {
  KVCacheManager& m = md.m_;
  const int32_t bs = config.block_size;
  const std::vector<TokenId> prompt = gen_tokens(3 * bs + 2);
  const uint64_t extra = *rc::gen::inRange<uint64_t>(0, 2);
  const Admission adm = m.can_add_sequence(prompt, extra);
  auto r = m.add_sequence(id, prompt, extra);
  RC_ASSERT(r.has_value() == (adm == Admission::kOk));
  if (adm == Admission::kNever) {
    RC_ASSERT(
        (config.max_model_len > 0 && static_cast<int64_t>(prompt.size()) > config.max_model_len) ||
        blocks_for_tokens(static_cast<int64_t>(prompt.size()), bs) >
            config.num_blocks - m.watermark_blocks());
  }
  if (!r) {
    RC_ASSERT(observable(m) == before);
    return false;
  }
  RC_ASSERT(r->num_computed_tokens % bs == 0);
  RC_ASSERT(prompt.empty() || r->num_computed_tokens <= static_cast<int64_t>(prompt.size()) - 1);
  md.tokens_[id] = prompt;
  md.apply(r->append, std::span(prompt).subspan(static_cast<size_t>(r->num_computed_tokens)));
  return true;
}

/// One random scenario under `config`; `ops` operations, then everything is freed.
void run_scenario(const KVCacheManagerConfig& config) {
  Model md(config);
  KVCacheManager& m = md.m_;
  const int32_t bs = config.block_size;
  SeqId next = 0;
  const int num_ops = *rc::gen::inRange(1, 64);
  for (int step = 0; step < num_ops; ++step) {
    const std::vector<SeqId> seqs = m.sequences();
    Op kind = *rc::gen::weightedElement<Op>({{3, Op::kAdd},
                                             {4, Op::kAppendTokens},
                                             {2, Op::kAppendSlots},
                                             {3, Op::kFork},
                                             {1, Op::kFree},
                                             {1, Op::kSwapOut},
                                             {1, Op::kSwapIn},
                                             {1, Op::kPreempt},
                                             {1, Op::kReset},
                                             {2, Op::kScore},
                                             {3, Op::kCommit},
                                             {1, Op::kTruncate}});
    if (seqs.empty()) kind = Op::kAdd;
    const SeqId s = seqs.empty() ? 0 : *rc::gen::elementOf(seqs);
    const bool swapped = !seqs.empty() && m.is_swapped(s);
    const std::string before = observable(m);
    if (kind == Op::kAdd) {
      if (!add_prompt(md, config, next++, before)) continue;
    } else if ((kind == Op::kAppendTokens || kind == Op::kAppendSlots) && !swapped) {
      const std::vector<TokenId> toks = gen_tokens(2 * bs + 1);
      const int64_t n = static_cast<int64_t>(toks.size());
      if (config.max_model_len > 0 && m.num_tokens(s) + n > config.max_model_len) {
        RC_ASSERT_THROWS_AS((void)m.can_append(s, n), Error);
        RC_ASSERT_THROWS_AS((void)m.append_slots(s, n), Error);
        RC_ASSERT(observable(m) == before);
        continue;
      }
      const bool can = m.can_append(s, n);
      auto r = kind == Op::kAppendSlots ? m.append_slots(s, n) : m.append_tokens(s, toks);
      RC_ASSERT(r.has_value() == can);
      if (!r) {
        RC_ASSERT(observable(m) == before);
        continue;
      }
      RC_ASSERT(static_cast<int64_t>(r->slots.size()) == n);
      md.apply(*r, toks);
      auto& mine = md.tokens_[s];
      mine.insert(mine.end(), toks.begin(), toks.end());
    } else if (kind == Op::kFork && !swapped) {
      const SeqId id = next++;
      m.fork(s, id);
      md.tokens_[id] = md.tokens_[s];
    } else if (kind == Op::kFree) {
      m.free_sequence(s);
      md.tokens_.erase(s);
    } else if (kind == Op::kSwapOut && !swapped) {
      const bool can = m.can_swap_out(s);
      auto r = m.swap_out(s);
      RC_ASSERT(r.has_value() == can);
      if (!r) {
        RC_ASSERT(observable(m) == before);
        continue;
      }
      for (const BlockCopy& c : r->copies) md.copy_block(md.host_, c.dst, md.device_, c.src);
    } else if ((kind == Op::kSwapIn || kind == Op::kSwapOut) && swapped) {
      const bool can = m.can_swap_in(s);
      auto r = m.swap_in(s);
      RC_ASSERT(r.has_value() == can);
      if (!r) {
        RC_ASSERT(observable(m) == before);
        continue;
      }
      for (const BlockCopy& c : r->copies) md.copy_block(md.device_, c.dst, md.host_, c.src);
    } else if (kind == Op::kPreempt && !swapped) {
      const PreemptedSequence p = m.preempt(s);
      RC_ASSERT(p.num_tokens == static_cast<int64_t>(md.tokens_[s].size()));
      if (!p.tokens.empty()) RC_ASSERT(p.tokens == md.tokens_[s]);
      md.tokens_.erase(s);
    } else if (kind == Op::kReset) {
      (void)m.reset_prefix_cache();
    } else if (kind == Op::kCommit && !swapped) {
      // The forward step wrote some prefix of what the sequence holds (the shadow already
      // holds every token: content checks stay exact whatever is published).
      (void)m.commit(s, *rc::gen::inRange<int64_t>(0, m.num_tokens(s) + 1));
    } else if (kind == Op::kTruncate && !swapped) {
      const int64_t keep = *rc::gen::inRange<int64_t>(0, m.num_tokens(s) + 1);
      try {
        m.truncate(s, keep);
      } catch (const Error&) {
        // Refused (heavy hitters evicted, or released blocks the new end would see): nothing
        // may have changed.
        RC_ASSERT(observable(m) == before);
        continue;
      }
      md.tokens_[s].resize(static_cast<size_t>(keep));
    } else if (kind == Op::kScore && !swapped &&
               config.eviction.kind == EvictionKind::kHeavyHitters) {
      const std::vector<SeqId> one{s};
      const auto kept = m.kept_tokens(one);
      const auto w =
          *rc::gen::container<std::vector<int>>(kept.slots.size(), rc::gen::inRange(0, 4));
      m.accumulate_attention(s, std::vector<float>(w.begin(), w.end()));
    }
    md.poison();
    check_all(md);
  }
  for (SeqId s : m.sequences()) m.free_sequence(s);
  md.tokens_.clear();
  check_all(md);
  RC_ASSERT(m.allocator().num_used() == 0);
  RC_ASSERT(m.num_free_blocks() == config.num_blocks);
  RC_ASSERT(m.stats().host_used_blocks == 0);
}

KVCacheManagerConfig gen_config(EvictionKind kind) {
  KVCacheManagerConfig c;
  c.num_blocks = *rc::gen::inRange(1, 13);
  c.block_size = *rc::gen::inRange(1, 5);
  c.num_host_blocks = *rc::gen::inRange(0, 6);
  c.watermark = *rc::gen::element(0.0, 0.1, 0.25);
  c.enable_prefix_caching = *rc::gen::arbitrary<bool>();
  c.max_model_len = *rc::gen::element<int64_t>(0, 0, 12);
  c.enable_events = *rc::gen::arbitrary<bool>();
  c.eviction.kind = kind;
  const int64_t len = std::exchange(c.max_model_len, 0);
  switch (kind) {
    case EvictionKind::kNone:
      break;
    case EvictionKind::kSlidingWindow:
      c.eviction.window = *rc::gen::inRange(1, 7);
      break;
    case EvictionKind::kAttentionSinks:
      c.eviction.window = *rc::gen::inRange(1, 7);
      c.eviction.sinks = *rc::gen::inRange(1, 5);
      break;
    case EvictionKind::kHeavyHitters:
      c.eviction.recent = *rc::gen::inRange(1, 5);
      c.eviction.heavy = *rc::gen::inRange(0, 5);
      break;
  }
  // A max_model_len the pool can never hold is rejected at construction.
  if (len > 0 && KVCacheManager(c).min_blocks_held(len) > c.num_blocks) {
    KVCacheManagerConfig bad = c;
    bad.max_model_len = len;
    RC_ASSERT_THROWS_AS(KVCacheManager{bad}, Error);
  } else {
    c.max_model_len = len;
  }
  return c;
}

RC_GTEST_PROP(KVCacheManagerProps, NoEvictionMatchesModel, ()) {
  run_scenario(gen_config(EvictionKind::kNone));
}

RC_GTEST_PROP(KVCacheManagerProps, SlidingWindowMatchesModel, ()) {
  run_scenario(gen_config(EvictionKind::kSlidingWindow));
}

RC_GTEST_PROP(KVCacheManagerProps, AttentionSinksMatchModel, ()) {
  run_scenario(gen_config(EvictionKind::kAttentionSinks));
}

RC_GTEST_PROP(KVCacheManagerProps, HeavyHittersMatchModel, ()) {
  run_scenario(gen_config(EvictionKind::kHeavyHitters));
}

/// Copies of a manager are independent and a copy behaves exactly like the original.
RC_GTEST_PROP(KVCacheManagerProps, CopyBehavesLikeOriginal, ()) {
  KVCacheManagerConfig c = gen_config(EvictionKind::kNone);
  c.enable_prefix_caching = true;
  KVCacheManager a(c);
  for (SeqId s = 0; s < 4; ++s) (void)a.add_sequence(s, gen_tokens(3 * c.block_size));
  KVCacheManager b = a;
  const std::vector<TokenId> p = gen_tokens(3 * c.block_size);
  auto ra = a.add_sequence(99, p);
  auto rb = b.add_sequence(99, p);
  RC_ASSERT(ra.has_value() == rb.has_value());
  if (ra) RC_ASSERT(ra->append.slots == rb->append.slots);
  RC_ASSERT(observable(a) == observable(b));
}

}  // namespace
}  // namespace pagedkv
