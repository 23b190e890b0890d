// `pagedkv ops` handlers of the ops that change the manager (and the queries that predict
// them). Each checks its arguments and the token limits of OpsLimits before calling the
// manager, prints only what the op changed, and keeps State::held_tokens exact.

#include "ops/ops_internal.hpp"

namespace pagedkv::ops {

namespace {

/// True when appending n tokens to `seq` would pass the manager's max_model_len (if set).
bool past_max_model_len(const KVCacheManager& m, SeqId seq, int64_t n) {
  const int64_t max_len = m.config().max_model_len;
  return max_len > 0 && m.num_tokens(seq) + n > max_len;
}

/// The error name of a failed operation: "never_fits" when it can never succeed, else `later`.
std::string_view failure_name(Admission a, std::string_view later) {
  return a == Admission::kNever ? "never_fits" : later;
}

/// Admits `seq` with `prompt` into `j` (shared by add and resume).
void add_result(const OpsLine& l, State& st, json& j, SeqId seq, const std::vector<TokenId>& prompt,
                const AddOptions& options) {
  KVCacheManager& m = *st.manager;
  j["seq"] = seq;
  if (m.has_sequence(seq))
    fail_at(l.line, fmt::format("{}: sequence {} already exists", l.op, seq));
  const Admission adm = m.can_add_sequence(prompt, options);
  auto r = m.add_sequence(seq, prompt, options);
  j["ok"] = r.has_value();
  if (!r) {
    j["error"] = failure_name(adm, "no_free_blocks");
    j["admission"] = admission_name(adm);
    return;
  }
  st.held_tokens += m.num_tokens(seq);
  j["computed_tokens"] = r->num_computed_tokens;
  j["slots"] = r->append.slots;
  j["table"] = table_json(m.block_table(seq));
}

/// swap_out / swap_in: the same result shape, the pool that can run short differs.
json swap_result(const OpsLine& l, State& st, bool out) {
  KVCacheManager& m = *st.manager;
  expect_args(l, 1, 1, "SEQ");
  if (out) {
    expect_options(l, {});
  } else {
    expect_options(l, {"lookahead"});
  }
  const int64_t lookahead = out ? 0 : lookahead_option(l);
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  j["seq"] = seq;
  charge(l, st, table_units(m, seq) + lookahead);
  auto r = out ? m.swap_out(seq) : m.swap_in(seq, lookahead);
  j["ok"] = r.has_value();
  if (!r) {
    const Admission a = out ? m.swap_out_admission(seq) : m.swap_in_admission(seq, lookahead);
    j["error"] = failure_name(a, out ? "no_free_host_blocks" : "no_free_blocks");
    j["admission"] = admission_name(a);
    return j;
  }
  j["copies"] = copies_json(r->copies);
  j[out ? "host_table" : "table"] = table_json(m.block_table(seq));
  return j;
}

}  // namespace

std::optional<json> op_add(const OpsLine& l, State& st) {
  expect_args(l, 1, SIZE_MAX, "SEQ [TOKEN...] [extra=K] [max_new=N] [chunk=N]");
  expect_options(l, {"extra", "max_new", "chunk"});
  const AddOptions options = add_options(l);
  // Token ids are checked before the sequence id: a line with both wrong names the tokens.
  const std::vector<TokenId> prompt = token_args(l, 1);
  const SeqId seq = seq_arg(l, 0);
  check_growth(l, st, static_cast<int64_t>(prompt.size()));
  if (!st.manager->has_sequence(seq)) check_new_sequence(l, st);
  charge(l, st, static_cast<int64_t>(prompt.size()));
  json j = result_head(l);
  add_result(l, st, j, seq, prompt, options);
  return j;
}

std::optional<json> op_can_add(const OpsLine& l, State& st) {
  expect_args(l, 0, SIZE_MAX, "[TOKEN...] [extra=K] [max_new=N] [chunk=N]");
  expect_options(l, {"extra", "max_new", "chunk"});
  const AddOptions options = add_options(l);
  json j = result_head(l);
  const std::vector<TokenId> prompt = token_args(l, 0);
  charge(l, st, static_cast<int64_t>(prompt.size()));
  j["admission"] = admission_name(st.manager->can_add_sequence(prompt, options));
  return j;
}

std::optional<json> op_lookup(const OpsLine& l, State& st) {
  expect_args(l, 1, SIZE_MAX, "SEQ [TOKEN...] [extra=K]");
  expect_options(l, {"extra"});
  const AddOptions options = add_options(l);
  const std::vector<TokenId> prompt = token_args(l, 1);
  json j = result_head(l);
  j["seq"] = seq_arg(l, 0);
  charge(l, st, static_cast<int64_t>(prompt.size()));
  const PrefixLookup r = st.manager->lookup_prefix(prompt, options.extra_key);
  j["computed_tokens"] = r.num_computed_tokens;
  j["blocks"] = r.blocks;
  return j;
}

std::optional<json> op_commit(const OpsLine& l, State& st) {
  expect_args(l, 2, 2, "SEQ N");
  expect_options(l, {});
  const SeqId seq = seq_arg(l, 0);
  const int64_t n = to_int(l, "N", l.args[1], 0, INT64_MAX);
  json j = result_head(l);
  j["seq"] = seq;
  charge(l, st, table_units(*st.manager, seq));
  j["published"] = st.manager->commit(seq, n);
  j["committed"] = st.manager->num_committed_tokens(seq);
  return j;
}

std::optional<json> op_append(const OpsLine& l, State& st) {
  const auto [by_count, ids, n] = append_args(l);
  KVCacheManager& m = *st.manager;
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  j["seq"] = seq;
  check_growth(l, st, n);
  const bool can_release = m.eviction_policy().kind() != EvictionKind::kNone;
  // Token eviction looks at the table (and this op copies it); slots are printed per token.
  charge(l, st, n + (can_release ? table_units(m, seq) : 0));
  // What the append changes in the table: entries past its old end, a copy-on-write of the last
  // one (in `copies`), and, under a token eviction policy, entries released
  // (KVCacheManager::kNoBlock). Only the last needs the old table, and only a policy can release.
  const std::span<const BlockId> before = m.block_table(seq);
  const size_t old_size = before.size();
  const std::vector<BlockId> old_table =
      can_release ? std::vector<BlockId>(before.begin(), before.end()) : std::vector<BlockId>{};
  // Past max_model_len the append can never fit: the answer append_admission gives, not a stop.
  auto r = past_max_model_len(m, seq, n) ? std::nullopt
           : by_count                    ? m.append_slots(seq, n)
                                         : m.append_tokens(seq, ids);
  j["ok"] = r.has_value();
  if (!r) {
    const Admission a = m.append_admission(seq, n);
    j["error"] = failure_name(a, "no_free_blocks");
    j["admission"] = admission_name(a);
    return j;
  }
  st.held_tokens += n;
  j["slots"] = r->slots;
  j["copies"] = copies_json(r->copies);
  const std::span<const BlockId> after = m.block_table(seq);
  j["new_blocks"] = table_json(after.subspan(std::min(old_size, after.size())));
  if (can_release) {
    json released = json::array();
    for (size_t i = 0; i < old_table.size() && i < after.size(); ++i) {
      if (old_table[i] != KVCacheManager::kNoBlock && after[i] == KVCacheManager::kNoBlock)
        released.push_back(i);
    }
    j["released"] = std::move(released);
  }
  return j;
}

std::optional<json> op_can_append(const OpsLine& l, State& st) {
  expect_args(l, 2, 2, "SEQ COUNT [lookahead=N]");
  expect_options(l, {"lookahead"});
  KVCacheManager& m = *st.manager;
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  const int64_t n = count_value(l, "count", l.args[1]);
  const int64_t lookahead = lookahead_option(l);
  charge(l, st, m.eviction_policy().kind() != EvictionKind::kNone ? table_units(m, seq) : 0);
  j["seq"] = seq;
  j["n"] = n;
  if (lookahead != 0) j["lookahead"] = lookahead;
  // The admission answers past max_model_len too (never); the block count exists only within it.
  const Admission a = m.append_admission(seq, n, lookahead);
  j["ok"] = a == Admission::kOk;
  if (!past_max_model_len(m, seq, n)) {
    j["blocks_needed"] = m.blocks_needed_to_append(seq, n, lookahead);
  }
  j["admission"] = admission_name(a);
  return j;
}

std::optional<json> op_truncate(const OpsLine& l, State& st) {
  expect_args(l, 2, 2, "SEQ N");
  expect_options(l, {});
  KVCacheManager& m = *st.manager;
  const SeqId seq = seq_arg(l, 0);
  const int64_t n = to_int(l, "N", l.args[1], 0, INT64_MAX);
  json j = result_head(l);
  j["seq"] = seq;
  charge(l, st, table_units(m, seq));
  const int64_t old_tokens = m.num_tokens(seq);
  // Truncation drops table entries from the end only, and keeps at least the blocks of the new
  // length but one: copy the entries from there (the table span does not survive the call).
  const std::span<const BlockId> before = m.block_table(seq);
  const int64_t kept_blocks = blocks_for_tokens(std::min(n, old_tokens), m.config().block_size);
  const size_t from =
      std::min(before.size(), static_cast<size_t>(std::max<int64_t>(kept_blocks - 1, 0)));
  const std::vector<BlockId> tail(before.begin() + static_cast<std::ptrdiff_t>(from), before.end());
  m.truncate(seq, n);
  st.held_tokens -= old_tokens - m.num_tokens(seq);
  const size_t new_size = m.block_table(seq).size();
  json released = json::array();
  for (size_t i = std::max(new_size, from) - from; i < tail.size(); ++i) {
    if (tail[i] != KVCacheManager::kNoBlock) released.push_back(tail[i]);
  }
  j["tokens"] = m.num_tokens(seq);
  j["released_blocks"] = std::move(released);
  j["committed"] = m.num_committed_tokens(seq);
  return j;
}

std::optional<json> op_fork(const OpsLine& l, State& st) {
  // The child copies the parent's token ids: charged for them and the parent's table.
  KVCacheManager& m = *st.manager;
  fork_sequence(l, st, m, [&](SeqId p) { return m.num_tokens(p) + table_units(m, p); });
  return std::nullopt;
}

std::optional<json> op_free(const OpsLine& l, State& st) {
  KVCacheManager& m = *st.manager;
  free_sequence(l, st, m, [&](SeqId s) { return table_units(m, s); });
  return std::nullopt;
}

std::optional<json> op_swap_out(const OpsLine& l, State& st) {
  return swap_result(l, st, /*out=*/true);
}

std::optional<json> op_swap_in(const OpsLine& l, State& st) {
  return swap_result(l, st, /*out=*/false);
}

std::optional<json> op_can_swap_out(const OpsLine& l, State& st) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  j["seq"] = seq;
  charge(l, st, table_units(*st.manager, seq));
  j["ok"] = st.manager->can_swap_out(seq);
  j["admission"] = admission_name(st.manager->swap_out_admission(seq));
  return j;
}

std::optional<json> op_can_swap_in(const OpsLine& l, State& st) {
  expect_args(l, 1, 1, "SEQ [lookahead=N]");
  expect_options(l, {"lookahead"});
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  const int64_t lookahead = lookahead_option(l);
  j["seq"] = seq;
  if (lookahead != 0) j["lookahead"] = lookahead;
  charge(l, st, table_units(*st.manager, seq));
  j["ok"] = st.manager->can_swap_in(seq, lookahead);
  j["admission"] = admission_name(st.manager->swap_in_admission(seq, lookahead));
  return j;
}

std::optional<json> op_preempt(const OpsLine& l, State& st) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  json j = result_head(l);
  // The token ids move from the manager to `preempted`: the held count does not change. A
  // sequence preempted again before its resume (added anew meanwhile) replaces the older entry.
  const SeqId seq = seq_arg(l, 0);
  if (st.manager->has_sequence(seq))
    charge(l, st, st.manager->num_tokens(seq) + table_units(*st.manager, seq));
  PreemptedSequence p = st.manager->preempt(seq);
  if (auto old = st.preempted.find(p.seq); old != st.preempted.end())
    st.held_tokens -= old->second.num_tokens;
  j["seq"] = p.seq;
  j["num_tokens"] = p.num_tokens;
  j["tokens"] = p.tokens;
  st.preempted[p.seq] = std::move(p);
  return j;
}

std::optional<json> op_resume(const OpsLine& l, State& st) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  auto it = st.preempted.find(seq);
  if (it == st.preempted.end())
    fail_at(l.line, fmt::format("resume: sequence {} was not preempted", seq));
  if (it->second.tokens.size() != static_cast<size_t>(it->second.num_tokens)) {
    fail_at(l.line, fmt::format("resume: sequence {} was appended with n=COUNT (token ids "
                                "unknown), so it cannot be prefilled again from here",
                                seq));
  }
  charge(l, st, it->second.num_tokens);
  add_result(l, st, j, seq, it->second.tokens, AddOptions{.extra_key = it->second.extra_key});
  if (j["ok"].get<bool>()) {
    st.held_tokens -= it->second.num_tokens;  // add_result counted them again
    st.preempted.erase(it);
  }
  return j;
}

std::optional<json> op_score(const OpsLine& l, State& st) {
  expect_args(l, 1, SIZE_MAX, "SEQ WEIGHT...");
  expect_options(l, {});
  check_tokens_per_op(l, static_cast<int64_t>(l.args.size()) - 1, "weights");
  charge(l, st, static_cast<int64_t>(l.args.size()));
  std::vector<float> w;
  w.reserve(l.args.size() - 1);
  for (size_t i = 1; i < l.args.size(); ++i) {
    w.push_back(static_cast<float>(to_double(l, "weight", l.args[i])));
  }
  st.manager->accumulate_attention(seq_arg(l, 0), w);
  return std::nullopt;
}

std::optional<json> op_reset_prefix_cache(const OpsLine& l, State& st) {
  expect_nothing(l);
  json j = result_head(l);
  // The manager visits every block of the pool and every sequence.
  charge(l, st, int64_t{st.manager->num_total_blocks()} + st.manager->num_sequences());
  j["removed"] = st.manager->reset_prefix_cache();
  return j;
}

}  // namespace pagedkv::ops
