// Property test of the prefix-cache lifecycle (issue 16): random engine-like workloads (admit,
// chunked prefill, decode, commit partially, abort at every lifecycle point, fork, swap with
// look-ahead, preempt, reset the prefix cache, truncate, lookup) against a model that tracks
// which token each device slot holds and whether its K/V are written (committed), plus a router
// that knows only the event stream. After every operation:
//  - no hit on unwritten K/V: every position add_sequence shares holds the prompt's token,
//    written; every kStored event names a block whose slots are all written with its tokens;
//  - nothing returned for writing lies in a published or shared block (copy-on-write);
//  - a later identical prompt hits every committed full block whose chain the manager still
//    holds (the model follows the rule: nothing below a removed entry, nothing after a reset
//    from a sequence that had written K/V before it); no block holding K/V written before a
//    reset is published after it;
//  - the router, replaying the events (each kStored names a stored parent or the root), predicts
//    exactly the hits lookup_prefix and add_sequence give; lookup_prefix changes nothing;
//  - a successful swap-in with look-ahead k is followed by a successful append of k;
//  - conservation: check_invariants, and freeing everything returns every block.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "common/manager_snapshot.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"

namespace pagedkv {
namespace {

using testing::observable;

constexpr int64_t kIntact = std::numeric_limits<int64_t>::max();

struct SlotState {
  TokenId token = -1;
  bool written = false;
  int32_t epoch = 0;  // reset_prefix_cache calls before the K/V were written
};

struct SeqModel {
  std::vector<TokenId> tokens;   // ids of the positions the sequence holds
  std::vector<TokenId> pending;  // rest of a chunked prompt, not appended yet
  uint64_t extra = 0;
  int64_t committed = 0;
  bool publishable = true;
  int64_t broken_at = kIntact;  // first block index whose published chain is gone
  bool swapped = false;
};

class Harness {
 public:
  explicit Harness(const KVCacheManagerConfig& c)
      : m_(c),
        bs_(c.block_size),
        device_(static_cast<size_t>(c.num_blocks) * c.block_size),
        host_(static_cast<size_t>(c.num_host_blocks) * c.block_size) {}

  KVCacheManager m_;
  int32_t bs_;
  std::vector<SlotState> device_;
  std::vector<SlotState> host_;
  std::map<SeqId, SeqModel> seqs_;
  std::unordered_map<BlockHash, BlockHash> router_;  // stored key -> parent key
  int32_t resets_ = 0;

  /// Keys of the first `n` full blocks of `t`, chained from the root.
  std::vector<BlockHash> chain(std::span<const TokenId> t, int64_t n, uint64_t extra) const {
    std::vector<BlockHash> keys;
    BlockHash parent = kRootBlockHash;
    for (int64_t j = 0; j < n; ++j) {
      parent = block_hash(parent, t.subspan(static_cast<size_t>(j * bs_), bs_), extra);
      keys.push_back(parent);
    }
    return keys;
  }

  /// Hit blocks the router predicts from the events alone.
  int64_t predict(std::span<const TokenId> prompt, uint64_t extra) const {
    const auto len = static_cast<int64_t>(prompt.size());
    const int64_t eligible = len == 0 ? 0 : (len - 1) / bs_;
    int64_t hits = 0;
    for (BlockHash k : chain(prompt, eligible, extra)) {
      if (!router_.contains(k)) break;
      ++hits;
    }
    return hits;
  }

  Slot slot_of(SeqId s, int64_t pos) const {
    return Slot{m_.block_table(s)[pos / bs_]} * bs_ + pos % bs_;
  }

  /// Slots returned for writing: private, unpublished blocks only; their K/V are not written.
  void take_writes(std::span<const Slot> slots, std::span<const TokenId> tokens) {
    RC_ASSERT(slots.size() == tokens.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto b = static_cast<BlockId>(slots[i] / bs_);
      RC_ASSERT(m_.prefix_cache().entry(b) == nullptr);
      RC_ASSERT(m_.allocator().ref_count(b) == 1);
      device_[slots[i]] = {tokens[i], false};
    }
  }

  void copy_blocks(std::vector<SlotState>& dst_pool, std::span<const BlockCopy> copies,
                   const std::vector<SlotState>& src_pool) {
    for (const BlockCopy& c : copies) {
      std::copy_n(src_pool.begin() + int64_t{c.src} * bs_, bs_,
                  dst_pool.begin() + int64_t{c.dst} * bs_);
    }
  }

  void drain_events() {
    for (const KVCacheEvent& e : m_.take_events()) {
      if (e.kind == KVCacheEvent::Kind::kStored) {
        RC_ASSERT(e.parent_hash == kRootBlockHash || router_.contains(e.parent_hash));
        RC_ASSERT(!router_.contains(e.hash));
        router_[e.hash] = e.parent_hash;
        // Published only once written.
        RC_ASSERT(static_cast<int32_t>(e.tokens.size()) == bs_);
        for (int32_t i = 0; i < bs_; ++i) {
          const SlotState& st = device_[static_cast<size_t>(e.block) * bs_ + i];
          RC_ASSERT(st.written);
          RC_ASSERT(st.token == e.tokens[i]);
          RC_ASSERT(st.epoch == resets_);  // nothing computed before a reset is published
        }
        continue;
      }
      if (e.kind == KVCacheEvent::Kind::kAllCleared) {
        // A reset's last event: its kRemoved events emptied the router's mirror.
        RC_ASSERT(router_.empty());
        continue;
      }
      RC_ASSERT(router_.erase(e.hash) == 1u);
      for (auto& [id, sm] : seqs_) {
        const std::vector<BlockHash> keys = chain(sm.tokens, sm.committed / bs_, sm.extra);
        auto it = std::find(keys.begin(), keys.end(), e.hash);
        if (it != keys.end()) sm.broken_at = std::min<int64_t>(sm.broken_at, it - keys.begin());
      }
    }
    RC_ASSERT(static_cast<int32_t>(router_.size()) == m_.prefix_cache().size());
  }

  void poison() {
    for (BlockId b = 0; b < m_.num_total_blocks(); ++b) {
      if (m_.allocator().is_free(b))
        std::fill_n(device_.begin() + int64_t{b} * bs_, bs_, SlotState{});
    }
    if (const BlockAllocator* h = m_.host_allocator()) {
      for (BlockId b = 0; b < h->num_blocks(); ++b) {
        if (h->is_free(b)) std::fill_n(host_.begin() + int64_t{b} * bs_, bs_, SlotState{});
      }
    }
  }

  void check() {
    try {
      m_.check_invariants();
    } catch (const Error& e) {
      RC_FAIL(std::string("check_invariants: ") + e.what());
    }
    for (const auto& [id, sm] : seqs_) {
      RC_ASSERT(m_.num_tokens(id) == static_cast<int64_t>(sm.tokens.size()));
      RC_ASSERT(m_.num_committed_tokens(id) == sm.committed);
      // A later identical prompt hits every committed full block of an intact chain.
      const int64_t intact = std::min(sm.broken_at, sm.committed / bs_);
      std::vector<TokenId> probe(sm.tokens.begin(), sm.tokens.begin() + intact * bs_);
      probe.push_back(1);
      const std::string before = observable(m_);
      const PrefixLookup l = m_.lookup_prefix(probe, sm.extra);
      RC_ASSERT(observable(m_) == before);
      RC_ASSERT(l.num_computed_tokens >= intact * bs_);
      RC_ASSERT(l.num_computed_tokens == predict(probe, sm.extra) * bs_);
    }
  }
};

std::vector<TokenId> gen_tokens(int64_t max_len) {
  const auto n = *rc::gen::inRange<int64_t>(0, max_len + 1);
  return *rc::gen::container<std::vector<TokenId>>(static_cast<size_t>(n),
                                                   rc::gen::inRange<TokenId>(1, 4));
}

enum class Op {
  kAdd,
  kAppend,
  kCommit,
  kStep,
  kFree,
  kFork,
  kSwap,
  kPreempt,
  kReset,
  kTruncate,
  kLookup
};

void add(Harness& h, SeqId id) {
  KVCacheManager& m = h.m_;
  const int32_t bs = h.bs_;
  const std::vector<TokenId> prompt = gen_tokens(3 * bs + 2);
  const auto len = static_cast<int64_t>(prompt.size());
  const AddOptions options{.extra_key = *rc::gen::inRange<uint64_t>(0, 2),
                           .first_chunk_tokens = *rc::gen::element<int64_t>(-1, -1, 0, 1, bs)};
  const int64_t predicted = h.predict(prompt, options.extra_key);
  const PrefixLookup look = m.lookup_prefix(prompt, options.extra_key);
  RC_ASSERT(look.num_computed_tokens == predicted * bs);
  const Admission adm = m.can_add_sequence(prompt, options);
  const std::string before = observable(m);
  std::optional<AddResult> r = m.add_sequence(id, prompt, options);
  RC_ASSERT(r.has_value() == (adm == Admission::kOk));
  if (!r) {
    RC_ASSERT(observable(m) == before);
    return;
  }
  RC_ASSERT(r->num_computed_tokens == look.num_computed_tokens);
  const std::span<const BlockId> table = m.block_table(id);
  RC_ASSERT(std::equal(look.blocks.begin(), look.blocks.end(), table.begin()));
  // No hit on K/V that were never written.
  for (int64_t p = 0; p < r->num_computed_tokens; ++p) {
    const SlotState& st = h.device_[static_cast<size_t>(h.slot_of(id, p))];
    RC_ASSERT(st.written);
    RC_ASSERT(st.token == prompt[p]);
  }
  const int64_t held = m.num_tokens(id);
  RC_ASSERT(held == (options.first_chunk_tokens < 0
                         ? len
                         : std::min(len, r->num_computed_tokens + options.first_chunk_tokens)));
  h.take_writes(r->append.slots,
                std::span(prompt).subspan(static_cast<size_t>(r->num_computed_tokens),
                                          static_cast<size_t>(held - r->num_computed_tokens)));
  SeqModel sm;
  sm.tokens.assign(prompt.begin(), prompt.begin() + held);
  sm.pending.assign(prompt.begin() + held, prompt.end());
  sm.extra = options.extra_key;
  sm.committed = r->num_computed_tokens;
  h.seqs_[id] = std::move(sm);
}

void append(Harness& h, SeqId s) {
  KVCacheManager& m = h.m_;
  SeqModel& sm = h.seqs_.at(s);
  std::vector<TokenId> toks;
  const bool chunk = !sm.pending.empty();
  if (chunk) {  // the next prefill chunk
    const auto n = *rc::gen::inRange<size_t>(1, sm.pending.size() + 1);
    toks.assign(sm.pending.begin(), sm.pending.begin() + static_cast<std::ptrdiff_t>(n));
  } else {  // decode (or speculative drafts)
    toks = *rc::gen::container<std::vector<TokenId>>(*rc::gen::inRange<size_t>(1, 4),
                                                     rc::gen::inRange<TokenId>(1, 4));
  }
  const auto n = static_cast<int64_t>(toks.size());
  const bool can = m.can_append(s, n);
  const std::string before = observable(m);
  std::optional<AppendResult> r = m.append_tokens(s, toks);
  RC_ASSERT(r.has_value() == can);
  if (!r) {
    RC_ASSERT(observable(m) == before);
    RC_ASSERT(m.append_admission(s, n) != Admission::kOk);
    return;
  }
  h.copy_blocks(h.device_, r->copies, h.device_);
  h.take_writes(r->slots, toks);
  sm.tokens.insert(sm.tokens.end(), toks.begin(), toks.end());
  if (chunk) sm.pending.erase(sm.pending.begin(), sm.pending.begin() + n);
}

// The forward step wrote the K/V of positions [committed, n).
void commit(Harness& h, SeqId s, int64_t n) {
  SeqModel& sm = h.seqs_.at(s);
  for (int64_t p = sm.committed; p < n; ++p) {
    SlotState& st = h.device_[static_cast<size_t>(h.slot_of(s, p))];
    RC_ASSERT(st.token == sm.tokens[p]);
    st.written = true;
    st.epoch = h.resets_;
  }
  (void)h.m_.commit(s, n);
  sm.committed = std::max(sm.committed, n);
}

void swap(Harness& h, SeqId s) {
  KVCacheManager& m = h.m_;
  SeqModel& sm = h.seqs_.at(s);
  if (!sm.swapped) {
    const bool can = m.can_swap_out(s);
    RC_ASSERT((m.swap_out_admission(s) == Admission::kOk) == can);
    std::optional<SwapResult> r = m.swap_out(s);
    RC_ASSERT(r.has_value() == can);
    if (r) {
      h.copy_blocks(h.host_, r->copies, h.device_);
      sm.swapped = true;
    }
    return;
  }
  const auto ahead = *rc::gen::inRange<int64_t>(0, 3);
  const bool can = m.can_swap_in(s, ahead);
  std::optional<SwapResult> r = m.swap_in(s, ahead);
  RC_ASSERT(r.has_value() == can);
  if (!r) return;
  h.copy_blocks(h.device_, r->copies, h.host_);
  sm.swapped = false;
  RC_ASSERT(m.can_append(s, ahead));  // the step's append after the swap-in cannot fail
}

void truncate(Harness& h, SeqId s) {
  SeqModel& sm = h.seqs_.at(s);
  const auto n = *rc::gen::inRange<int64_t>(0, static_cast<int64_t>(sm.tokens.size()) + 1);
  h.m_.truncate(s, n);
  sm.tokens.resize(static_cast<size_t>(n));
  sm.pending.clear();
  sm.committed = std::min(sm.committed, n);
  // Blocks from n / bs on are gone; the new content there chains on block n / bs - 1.
  if (sm.publishable && sm.broken_at >= n / h.bs_) sm.broken_at = kIntact;
}

void run(const KVCacheManagerConfig& config) {
  Harness h(config);
  KVCacheManager& m = h.m_;
  SeqId next = 0;
  const int num_ops = *rc::gen::inRange(1, 80);
  for (int step = 0; step < num_ops; ++step) {
    Op kind = *rc::gen::weightedElement<Op>({{3, Op::kAdd},
                                             {4, Op::kAppend},
                                             {2, Op::kCommit},
                                             {3, Op::kStep},
                                             {2, Op::kFree},
                                             {1, Op::kFork},
                                             {2, Op::kSwap},
                                             {1, Op::kPreempt},
                                             {1, Op::kReset},
                                             {2, Op::kTruncate},
                                             {1, Op::kLookup}});
    if (h.seqs_.empty() && kind != Op::kReset && kind != Op::kLookup) kind = Op::kAdd;
    SeqId s = -1;
    if (!h.seqs_.empty()) {
      s = std::next(h.seqs_.begin(),
                    *rc::gen::inRange<int64_t>(0, static_cast<int64_t>(h.seqs_.size())))
              ->first;
    }
    const bool running = s >= 0 && !h.seqs_.at(s).swapped;
    if (kind == Op::kAdd) {
      add(h, next++);
    } else if (kind == Op::kAppend && running) {
      append(h, s);
    } else if (kind == Op::kCommit && running) {
      commit(h, s, *rc::gen::inRange<int64_t>(0, m.num_tokens(s) + 1));
    } else if (kind == Op::kStep) {
      // A forward step over every running sequence: all they hold is written.
      for (auto& [id, sm] : h.seqs_) {
        if (!sm.swapped) commit(h, id, static_cast<int64_t>(sm.tokens.size()));
      }
    } else if (kind == Op::kFree && s >= 0) {  // abort, at whatever point of its life
      m.free_sequence(s);
      h.seqs_.erase(s);
    } else if (kind == Op::kFork && running) {
      m.fork(s, next);
      h.seqs_[next++] = h.seqs_.at(s);
    } else if (kind == Op::kSwap && s >= 0) {
      swap(h, s);
    } else if (kind == Op::kPreempt && running) {
      (void)m.preempt(s);
      h.seqs_.erase(s);
    } else if (kind == Op::kReset) {
      (void)m.reset_prefix_cache();
      ++h.resets_;
      for (auto& [id, sm] : h.seqs_) {
        if (sm.committed > 0) {
          sm.publishable = false;
          sm.broken_at = 0;
        }
      }
    } else if (kind == Op::kTruncate && running) {
      truncate(h, s);
    } else if (kind == Op::kLookup) {
      const std::vector<TokenId> p = gen_tokens(3 * h.bs_ + 2);
      const uint64_t extra = *rc::gen::inRange<uint64_t>(0, 2);
      const std::string before = observable(m);
      RC_ASSERT(m.lookup_prefix(p, extra).num_computed_tokens == h.predict(p, extra) * h.bs_);
      RC_ASSERT(observable(m) == before);
    }
    h.drain_events();
    h.poison();
    h.check();
  }
  for (const auto& [id, sm] : h.seqs_) m.free_sequence(id);
  h.seqs_.clear();
  h.drain_events();
  h.check();
  RC_ASSERT(m.allocator().num_used() == 0);
  RC_ASSERT(m.num_free_blocks() == config.num_blocks);
  RC_ASSERT(m.stats().host_used_blocks == 0);
}

RC_GTEST_PROP(PrefixLifecycleProps, EngineWorkloadsMatchTheModelAndTheRouter, ()) {
  KVCacheManagerConfig c;
  c.num_blocks = *rc::gen::inRange(1, 13);
  c.block_size = *rc::gen::inRange(1, 5);
  c.num_host_blocks = *rc::gen::inRange(0, 7);
  c.watermark = *rc::gen::element(0.0, 0.1);
  c.enable_prefix_caching = true;
  c.enable_events = true;
  run(c);
}

}  // namespace
}  // namespace pagedkv
