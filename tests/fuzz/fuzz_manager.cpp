// libFuzzer target: the input decodes into a KVCacheManager configuration and a sequence of
// scheduler operations (add, append, fork, free, swap, preempt, batch metadata, heavy-hitter
// scores, prefix-cache reset, copies; issue 16: add with options (chunked prefill,
// max_new_tokens), commit, truncate, lookup_prefix, look-ahead, never/later admissions). After
// every operation:
//  - check_invariants() holds (ref counts, conservation, prefix entries, host pool, stats);
//  - a can_* query agrees with the operation it predicts (success, empty, or throw);
//  - an operation that returned empty or threw pagedkv::Error changed nothing observable
//    (strong guarantee);
// and at the end, freeing every sequence returns the whole pool. Any other exception type
// escapes and is reported by libFuzzer as a crash.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/manager_snapshot.hpp"
#include "fuzz_util.hpp"
#include "manager_models.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::fuzz {
namespace {

/// Everything a caller can observe of a manager's state: tables, kept sets, ref counts, free-list
/// and LRU order of both pools, the prefix index, every cumulative counter (a failed operation
/// must not count a hit, a miss or a preemption) and the pending events.
using Observed = std::string;
using testing::observable;
Observed observe(const KVCacheManager& m) { return observable(m); }

/// Outcome of a query or an operation: threw pagedkv::Error, failed (empty / false), succeeded.
enum class Outcome { kThrew, kFailed, kOk };

const char* name(Outcome o) {
  return o == Outcome::kThrew ? "threw" : o == Outcome::kFailed ? "failed" : "ok";
}

template <typename Fn>
Outcome outcome_of(Fn&& fn) {
  try {
    return fn() ? Outcome::kOk : Outcome::kFailed;
  } catch (const Error&) {
    return Outcome::kThrew;
  }
}

std::optional<KVCacheManagerConfig> decode_config(ByteReader& in) {
  KVCacheManagerConfig c;
  c.block_size = 1 + static_cast<int32_t>(in.below(8));
  c.num_blocks = 1 + static_cast<int32_t>(in.below(32));
  const uint8_t flags = in.byte();
  c.enable_prefix_caching = (flags & 1) != 0;
  c.enable_events = (flags & 2) != 0;
  c.num_host_blocks = (flags & 4) != 0 ? static_cast<int32_t>(in.below(16)) : 0;
  c.watermark = 0.1 * static_cast<double>(in.below(4));
  c.max_model_len = (flags & 8) != 0 ? 1 + static_cast<int64_t>(in.below(64)) : 0;
  switch (in.below(4)) {
    case 0:
      break;
    case 1:
      c.eviction = {.kind = EvictionKind::kSlidingWindow, .window = 1 + int32_t(in.below(12))};
      break;
    case 2:
      c.eviction = {.kind = EvictionKind::kAttentionSinks,
                    .window = 1 + int32_t(in.below(12)),
                    .sinks = 1 + int32_t(in.below(4))};
      break;
    default:
      c.eviction = {.kind = EvictionKind::kHeavyHitters,
                    .recent = 1 + int32_t(in.below(6)),
                    .heavy = int32_t(in.below(6))};
      break;
  }
  // Occasionally an invalid field, so the constructor's checks run too.
  if ((flags & 0xF0) == 0xF0) c.block_size = 0;
  return c;
}

/// Sequence ids -1 (kPaddingSeq, always invalid) .. 7: a small space so operations collide.
SeqId seq_id(ByteReader& in) { return static_cast<SeqId>(in.below(9)) - 1; }

/// Tokens from a 4-letter alphabet, so prompts share prefixes and the prefix cache hits.
std::vector<TokenId> tokens(ByteReader& in, int32_t max_len) {
  std::vector<TokenId> t(in.below(static_cast<uint32_t>(max_len) + 1));
  for (TokenId& x : t) x = static_cast<TokenId>(in.below(4));
  return t;
}

void expect_unchanged(const KVCacheManager& m, const Observed& before, const char* op, Outcome o) {
  PAGEDKV_FUZZ_CHECK(observe(m) == before, "%s %s but changed the manager's state", op, name(o));
}

/// Runs a mutating operation whose success a query predicts; checks agreement and the strong
/// guarantee on failure.
template <typename Query, typename Op>
void predicted(KVCacheManager& m, const char* op, Query&& query, Op&& run) {
  const Outcome predicted = outcome_of(query);
  const Observed before = observe(m);
  const Outcome got = outcome_of(run);
  PAGEDKV_FUZZ_CHECK(predicted == got, "%s: query predicted '%s', operation %s", op,
                     name(predicted), name(got));
  if (got != Outcome::kOk) expect_unchanged(m, before, op, got);
}

/// Runs an operation without a predicting query; checks the strong guarantee when it throws.
template <typename Op>
void guarded(KVCacheManager& m, const char* op, Op&& run) {
  const Observed before = observe(m);
  const Outcome got = outcome_of(run);
  if (got == Outcome::kThrew) expect_unchanged(m, before, op, got);
}

// ---- one function per operation; each reads its arguments from the input in a fixed order ----

void op_add_empty(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  guarded(m, "add_sequence", [&] {
    m.add_sequence(s);
    return true;
  });
}

void op_add_prompt(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const std::vector<TokenId> prompt = tokens(in, 3 * m.config().block_size);
  const uint64_t extra = in.below(2);
  // can_add_sequence does not know `s`; an existing or padding id throws instead.
  const bool bad_id = s == kPaddingSeq || m.has_sequence(s);
  predicted(
      m, "add_sequence(prompt)",
      [&] {
        if (bad_id) throw Error("bad id");
        return m.can_add_sequence(prompt, extra) == Admission::kOk;
      },
      [&] { return m.add_sequence(s, prompt, extra).has_value(); });
}

void op_append_slots(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const uint8_t b = in.byte();  // 255: a negative count, which must throw
  const int64_t n = b == 255 ? -1 : static_cast<int64_t>(b % (3 * m.config().block_size + 1));
  predicted(
      m, "append_slots", [&] { return m.can_append(s, n); },
      [&] {
        const auto r = m.append_slots(s, n);
        if (r) PAGEDKV_FUZZ_CHECK(static_cast<int64_t>(r->slots.size()) == n, "slots");
        return r.has_value();
      });
}

void op_append_tokens(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const std::vector<TokenId> t = tokens(in, 2 * m.config().block_size);
  predicted(
      m, "append_tokens", [&] { return m.can_append(s, static_cast<int64_t>(t.size())); },
      [&] { return m.append_tokens(s, t).has_value(); });
}

void op_fork(KVCacheManager& m, ByteReader& in) {
  const SeqId parent = seq_id(in);
  const SeqId child = seq_id(in);
  guarded(m, "fork", [&] {
    m.fork(parent, child);
    return true;
  });
}

void op_free(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  guarded(m, "free_sequence", [&] {
    m.free_sequence(s);
    return true;
  });
}

void op_swap_out(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  predicted(
      m, "swap_out", [&] { return m.can_swap_out(s); }, [&] { return m.swap_out(s).has_value(); });
}

void op_swap_in(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  predicted(
      m, "swap_in", [&] { return m.can_swap_in(s); }, [&] { return m.swap_in(s).has_value(); });
}

void op_preempt(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  guarded(m, "preempt", [&] {
    const int64_t n = m.has_sequence(s) ? m.num_tokens(s) : -1;
    const PreemptedSequence p = m.preempt(s);
    PAGEDKV_FUZZ_CHECK(p.seq == s && p.num_tokens == n && !m.has_sequence(s), "preempt");
    return true;
  });
}

// Read-only: batch metadata over a few ids (padding rows included) must be consistent.
void op_batch_metadata(KVCacheManager& m, ByteReader& in) {
  std::vector<SeqId> seqs(in.below(4));
  std::vector<int64_t> num_new(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i] = seq_id(in);
    num_new[i] = static_cast<int64_t>(in.below(3));
  }
  // Throws exactly when a documented error applies; otherwise every element matches the model.
  const bool must_throw = batch_must_throw(m, seqs, num_new);
  const Observed before = observe(m);
  const Outcome got = outcome_of([&] {
    check_batch_model(m, seqs, num_new, m.batch_metadata(seqs, num_new));
    return true;
  });
  PAGEDKV_FUZZ_CHECK((got == Outcome::kThrew) == must_throw, "batch_metadata %s, the model says %s",
                     name(got), must_throw ? "reject" : "accept");
  expect_unchanged(m, before, "batch_metadata", got);
}

void op_kept_tokens(KVCacheManager& m, ByteReader& in) {
  std::vector<SeqId> seqs(in.below(3));
  for (SeqId& s : seqs) s = seq_id(in);
  // Throws exactly for an unknown or swapped sequence; every row matches the policy's model.
  const bool must_throw = std::any_of(seqs.begin(), seqs.end(), [&](SeqId s) {
    return s != kPaddingSeq && (!m.has_sequence(s) || m.is_swapped(s));
  });
  const Observed before = observe(m);
  const Outcome got = outcome_of([&] {
    const KeptTokens k = m.kept_tokens(seqs);
    PAGEDKV_FUZZ_CHECK(k.indptr.size() == seqs.size() + 1 && k.indptr[0] == 0, "indptr size");
    PAGEDKV_FUZZ_CHECK(k.slots.size() == static_cast<size_t>(k.indptr.back()) &&
                           k.positions.size() == k.slots.size(),
                       "kept sizes");
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto from = static_cast<size_t>(k.indptr[i]);
      const auto n = static_cast<size_t>(k.indptr[i + 1] - k.indptr[i]);
      check_kept_row(m, seqs[i], std::span(k.positions).subspan(from, n),
                     std::span(k.slots).subspan(from, n));
    }
    return true;
  });
  PAGEDKV_FUZZ_CHECK((got == Outcome::kThrew) == must_throw, "kept_tokens %s", name(got));
  expect_unchanged(m, before, "kept_tokens", got);
}

void op_accumulate(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const bool wrong_size = in.below(8) == 0;
  guarded(m, "accumulate_attention", [&] {
    const SeqId one[] = {s};
    const KeptTokens k = m.kept_tokens(one);
    std::vector<float> w(k.slots.size() + (wrong_size ? 1 : 0));
    for (float& x : w) x = static_cast<float>(in.below(16)) / 8.0f;
    m.accumulate_attention(s, w);
    return true;
  });
}

void op_reset_prefix_cache(KVCacheManager& m, ByteReader&) { m.reset_prefix_cache(); }

void op_take_events(KVCacheManager& m, ByteReader&) {
  const std::vector<KVCacheEvent> events = m.take_events();
  PAGEDKV_FUZZ_CHECK(m.config().enable_events || events.empty(), "events while disabled");
}

// Copies and moves are deep and faithful.
void op_copy_and_move(KVCacheManager& m, ByteReader&) {
  const Observed before = observe(m);
  KVCacheManager copy(m);
  PAGEDKV_FUZZ_CHECK(observe(copy) == before, "copy differs");
  m = std::move(copy);
  PAGEDKV_FUZZ_CHECK(observe(m) == before, "move-assign differs");
}

// blocks_needed_to_append and can_append agree on errors, and a pool with at least that many
// available blocks (watermark aside) means the append fits.
void op_blocks_needed(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const int64_t n = static_cast<int64_t>(in.below(3 * m.config().block_size + 1));
  int32_t needed = -1;
  const Outcome a = outcome_of([&] {
    needed = m.blocks_needed_to_append(s, n);
    return true;
  });
  const Outcome b = outcome_of([&] { return m.can_append(s, n) || true; });
  // can_append also throws past max_model_len, which blocks_needed_to_append does not check.
  if (b == Outcome::kOk) {
    PAGEDKV_FUZZ_CHECK(a == Outcome::kOk, "blocks_needed_to_append threw, can_append did not");
    PAGEDKV_FUZZ_CHECK(needed >= 0, "negative blocks needed %d", needed);
  }
}

void op_add_options(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const int32_t bs = m.config().block_size;
  const std::vector<TokenId> prompt = tokens(in, 3 * bs);
  const uint32_t mn = in.below(3 * static_cast<uint32_t>(bs) + 2);  // last value: -1, throws
  const AddOptions options{
      .extra_key = in.below(2),
      .max_new_tokens = mn == 3 * static_cast<uint32_t>(bs) + 1 ? -1 : int64_t{mn},
      .first_chunk_tokens = static_cast<int64_t>(in.below(static_cast<uint32_t>(bs) + 3)) - 2};
  const bool bad_id = s == kPaddingSeq || m.has_sequence(s);
  predicted(
      m, "add_sequence(options)",
      [&] {
        const Admission a = m.can_add_sequence(prompt, options);  // throws on bad options
        if (bad_id) throw Error("bad id");
        return a == Admission::kOk;
      },
      [&] {
        const std::optional<AddResult> r = m.add_sequence(s, prompt, options);
        if (r && options.first_chunk_tokens >= 0) {
          PAGEDKV_FUZZ_CHECK(
              m.num_tokens(s) <= static_cast<int64_t>(prompt.size()) &&
                  m.num_tokens(s) <= r->num_computed_tokens + options.first_chunk_tokens,
              "chunked add holds %lld tokens", static_cast<long long>(m.num_tokens(s)));
        }
        return r.has_value();
      });
}

// A count in [-1, num_tokens + 1] for `s` (-1 and num_tokens + 1 must throw).
int64_t token_count(const KVCacheManager& m, SeqId s, ByteReader& in) {
  const int64_t held = m.has_sequence(s) ? m.num_tokens(s) : 0;
  return static_cast<int64_t>(in.below(static_cast<uint32_t>(std::min<int64_t>(held, 250)) + 3)) -
         1;
}

void op_commit(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const int64_t n = token_count(m, s, in);
  guarded(m, "commit", [&] {
    const int64_t before = m.has_sequence(s) ? m.num_committed_tokens(s) : 0;
    (void)m.commit(s, n);
    PAGEDKV_FUZZ_CHECK(m.num_committed_tokens(s) == std::max(before, n), "committed count");
    return true;
  });
}

void op_truncate(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const int64_t n = token_count(m, s, in);
  guarded(m, "truncate", [&] {
    m.truncate(s, n);
    PAGEDKV_FUZZ_CHECK(m.num_tokens(s) == n && m.num_committed_tokens(s) <= n, "truncated");
    return true;
  });
}

// Read-only, and what add_sequence would share (checked on a copy).
void op_lookup(KVCacheManager& m, ByteReader& in) {
  const std::vector<TokenId> prompt = tokens(in, 3 * m.config().block_size);
  const uint64_t extra = in.below(2);
  const Observed before = observe(m);
  const PrefixLookup l = m.lookup_prefix(prompt, extra);
  PAGEDKV_FUZZ_CHECK(observe(m) == before, "lookup_prefix changed the manager");
  PAGEDKV_FUZZ_CHECK(
      static_cast<int64_t>(l.blocks.size()) * m.config().block_size == l.num_computed_tokens,
      "lookup blocks vs tokens");
  if (m.can_add_sequence(prompt, extra) != Admission::kOk) return;
  KVCacheManager copy(m);
  SeqId id = 100;
  while (copy.has_sequence(id)) ++id;
  const std::optional<AddResult> r = copy.add_sequence(id, prompt, extra);
  PAGEDKV_FUZZ_CHECK(r && r->num_computed_tokens == l.num_computed_tokens,
                     "lookup says %lld tokens, add shares %lld",
                     static_cast<long long>(l.num_computed_tokens),
                     r ? static_cast<long long>(r->num_computed_tokens) : -1LL);
}

// Look-ahead: a successful can_append(s, n, k) or swap_in(s, k) leaves room for k more slots
// (positional policies; those past max_model_len are not counted).
void op_lookahead(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const int64_t n = static_cast<int64_t>(in.below(2 * m.config().block_size + 1));
  const int64_t k = static_cast<int64_t>(in.below(2 * m.config().block_size + 1));
  const bool positional = !m.eviction_policy().scores_tokens();
  auto room_for = [&](int64_t want) {
    const int64_t max_len = m.config().max_model_len;
    return max_len > 0 ? std::min(want, max_len - m.num_tokens(s)) : want;
  };
  if (m.has_sequence(s) && m.is_swapped(s)) {
    predicted(
        m, "swap_in(look-ahead)", [&] { return m.can_swap_in(s, k); },
        [&] {
          if (!m.swap_in(s, k)) return false;
          PAGEDKV_FUZZ_CHECK(m.can_append(s, room_for(k)), "swap_in(%lld) then no room",
                             static_cast<long long>(k));
          return true;
        });
    return;
  }
  guarded(m, "can_append(look-ahead)", [&] {
    if (!m.can_append(s, n, k)) return false;
    PAGEDKV_FUZZ_CHECK(m.append_slots(s, n).has_value(), "can_append(n, k) but append(n) failed");
    if (positional) {
      PAGEDKV_FUZZ_CHECK(m.can_append(s, room_for(k)), "look-ahead slots not there");
    }
    return true;
  });
}

// Never vs later: kOk exactly when the can_* query says yes; kNever holds even with every
// other sequence gone.
void op_admissions(KVCacheManager& m, ByteReader& in) {
  const SeqId s = seq_id(in);
  const int64_t n = static_cast<int64_t>(in.below(4 * m.config().block_size + 1));
  if (!m.has_sequence(s)) return;
  if (m.is_swapped(s)) {
    const Admission a = m.swap_in_admission(s, n);
    PAGEDKV_FUZZ_CHECK((a == Admission::kOk) == m.can_swap_in(s, n), "swap_in_admission");
    return;
  }
  const Admission so = m.swap_out_admission(s);
  PAGEDKV_FUZZ_CHECK((so == Admission::kOk) == m.can_swap_out(s), "swap_out_admission");
  PAGEDKV_FUZZ_CHECK(m.host_allocator() != nullptr || so == Admission::kNever,
                     "swap_out without a host pool is not never");
  // Past max_model_len the admission query answers never; the append and can_append throw.
  const Admission a = m.append_admission(s, n);
  const int64_t max_len = m.config().max_model_len;
  if (max_len > 0 && m.num_tokens(s) + n > max_len) {
    PAGEDKV_FUZZ_CHECK(a == Admission::kNever, "append past max_model_len is not never");
    PAGEDKV_FUZZ_CHECK(outcome_of([&] { return m.can_append(s, n); }) == Outcome::kThrew,
                       "can_append past max_model_len did not throw");
    return;
  }
  PAGEDKV_FUZZ_CHECK((a == Admission::kOk) == m.can_append(s, n), "append_admission");
  if (a == Admission::kNever) {
    KVCacheManager alone(m);
    for (SeqId o : alone.sequences()) {
      if (o != s) alone.free_sequence(o);
    }
    alone.reset_prefix_cache();
    PAGEDKV_FUZZ_CHECK(!alone.can_append(s, n), "append_admission never, but fits alone");
  }
}

/// One operation, chosen by the next input byte (the order is the corpus' encoding: keep it;
/// new operations go at the end).
void step(KVCacheManager& m, ByteReader& in) {
  using Op = void (*)(KVCacheManager&, ByteReader&);
  static constexpr Op kOps[22] = {
      op_add_empty,          op_add_prompt,  op_append_slots,
      op_append_tokens,      op_fork,        op_free,
      op_swap_out,           op_swap_in,     op_preempt,
      op_batch_metadata,     op_kept_tokens, op_accumulate,
      op_reset_prefix_cache, op_take_events, op_copy_and_move,
      op_blocks_needed,      op_add_options, op_commit,
      op_truncate,           op_lookup,      op_lookahead,
      op_admissions,
  };
  kOps[in.below(22)](m, in);
}

}  // namespace
}  // namespace pagedkv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagedkv;
  fuzz::ByteReader in(data, size);
  const std::optional<KVCacheManagerConfig> config = fuzz::decode_config(in);
  std::optional<KVCacheManager> manager;
  try {
    manager.emplace(*config);
  } catch (const Error&) {
    return 0;  // an invalid configuration is rejected up front: nothing else to check
  }
  KVCacheManager& m = *manager;
  for (int ops = 0; !in.empty() && ops < 2000; ++ops) {
    fuzz::step(m, in);
    try {
      m.check_invariants();
    } catch (const Error& e) {
      PAGEDKV_FUZZ_CHECK(false, "invariant broken after op %d: %s", ops, e.what());
    }
  }
  // Abort every request: the whole pool (and the host pool) must come back.
  for (SeqId s : m.sequences()) m.free_sequence(s);
  m.check_invariants();
  const KVCacheStats st = m.stats();
  PAGEDKV_FUZZ_CHECK(st.used_blocks == 0 && st.host_used_blocks == 0 && st.num_sequences == 0,
                     "blocks leaked: used %d, host used %d", st.used_blocks, st.host_used_blocks);
  PAGEDKV_FUZZ_CHECK(m.num_free_blocks() == m.num_total_blocks(), "available %d of %d",
                     m.num_free_blocks(), m.num_total_blocks());
  m.reset_prefix_cache();
  PAGEDKV_FUZZ_CHECK(m.stats().free_blocks == m.num_total_blocks(), "cached blocks remain");
  return 0;
}
