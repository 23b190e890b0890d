#pragma once
// Shared by the ops executor's files (ops_execute.cpp, ops_args.cpp, ops_handlers.cpp,
// ops_print.cpp): argument conversion, the executor's state and token accounting, the handler
// table. Private to src/ops.

#include <fmt/format.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/ops_script.hpp"

namespace pagedkv::ops {

using json = nlohmann::ordered_json;

/// Throws pagedkv::Error "line N: message" (the message escaped: see printable()).
[[noreturn]] void fail_at(int64_t line, const std::string& message);

/// What the executor keeps between lines.
struct OpsExecutor::State {
  std::unique_ptr<KVCacheManager> manager;
  /// Instead of `manager` after a `manager ... groups=` line (ops_hybrid.cpp).
  std::unique_ptr<HybridKVCacheManager> hybrid;
  /// Sequences preempted by recompute, for `resume`.
  std::map<SeqId, PreemptedSequence> preempted;
  /// Tokens held: every sequence's num_tokens plus the preempted ones' (OpsLimits).
  int64_t held_tokens = 0;
  /// Work units left (OpsLimits::work_budget).
  int64_t work_left = 0;
};
using State = OpsExecutor::State;

// ---- arguments (ops_args.cpp) ------------------------------------------------------------------

int64_t to_int(const OpsLine& l, std::string_view what, std::string_view text, int64_t lo,
               int64_t hi);
double to_double(const OpsLine& l, std::string_view what, std::string_view text);
void expect_args(const OpsLine& l, size_t lo, size_t hi, std::string_view usage);
void expect_options(const OpsLine& l, std::initializer_list<std::string_view> allowed);
/// An op without positional arguments or options.
void expect_nothing(const OpsLine& l);
SeqId seq_arg(const OpsLine& l, size_t i);
/// Throws naming OpsLimits::kMaxTokensPerOp if `n` exceeds it (`what`: "tokens", "slots"...).
void check_tokens_per_op(const OpsLine& l, int64_t n, std::string_view what);
/// Token ids args[from..]; their count is checked against kMaxTokensPerOp first.
std::vector<TokenId> token_args(const OpsLine& l, size_t from);
/// A token count option or argument: an integer >= 0 within kMaxTokensPerOp.
int64_t count_value(const OpsLine& l, std::string_view what, std::string_view text);
/// What `append SEQ TOKEN...` or `append SEQ n=COUNT` appends (arguments and options checked):
/// the token ids (empty with n=COUNT) and their count.
struct AppendArgs {
  bool by_count = false;
  std::vector<TokenId> ids;
  int64_t n = 0;
};
AppendArgs append_args(const OpsLine& l);
/// The optional `lookahead=N` option (vLLM v0's num_lookahead_slots), 0 when absent.
int64_t lookahead_option(const OpsLine& l);
/// The options of add / can_add: extra=K, max_new=N, chunk=N.
AddOptions add_options(const OpsLine& l);
/// The `manager` line's configuration.
KVCacheManagerConfig manager_config(const OpsLine& l);

/// Whether a `manager` line declares KV cache groups (a hybrid manager).
bool manager_has_groups(const OpsLine& l);
/// The configuration of a `manager blocks=N block_size=B groups=G,G...` line.
HybridKVCacheManagerConfig hybrid_manager_config(const OpsLine& l);

// ---- token accounting (ops_execute.cpp) --------------------------------------------------------

/// Throws naming OpsLimits::kMaxTotalTokens if holding `n` more tokens would exceed it.
void check_growth(const OpsLine& l, const State& st, int64_t n);
/// Throws naming OpsLimits::kMaxSequences if one more sequence would exceed it.
void check_new_sequence(const OpsLine& l, const State& st);
/// Spends `units` of the work budget before the op does the work; throws naming the budget
/// (and changing nothing) if fewer are left.
void charge(const OpsLine& l, State& st, int64_t units);
/// Entries of `seq`'s table (device or host), the unit most ops are charged in.
int64_t table_units(const KVCacheManager& m, SeqId seq);

// ---- results (ops_print.cpp) -------------------------------------------------------------------

/// Every printed object starts with the op and its script line.
json result_head(const OpsLine& l);
json copies_json(const std::vector<BlockCopy>& copies);
json table_json(std::span<const BlockId> t);
std::string hex(uint64_t h);
/// The padded block tables as rows: [num_seqs][max_blocks_per_seq].
json padded_rows_json(const PaddedBlockTables& p);
/// {"indptr", "indices", "last_page_len"}.
json csr_json(const CsrBlockTables& c);

/// `fork PARENT CHILD` on either manager: the child's tokens are counted like the parent's;
/// units(parent) is what the op is charged.
template <typename Manager, typename Units>
void fork_sequence(const OpsLine& l, State& st, Manager& m, Units units) {
  expect_args(l, 2, 2, "PARENT CHILD");
  expect_options(l, {});
  const SeqId parent = seq_arg(l, 0);
  const SeqId child = seq_arg(l, 1);
  const int64_t n = m.num_tokens(parent);
  check_growth(l, st, n);
  if (!m.has_sequence(child)) check_new_sequence(l, st);
  charge(l, st, units(parent));
  m.fork(parent, child);
  st.held_tokens += n;
}

/// `free SEQ` on either manager; units(seq) is what the op is charged.
template <typename Manager, typename Units>
void free_sequence(const OpsLine& l, State& st, Manager& m, Units units) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  const SeqId seq = seq_arg(l, 0);
  const int64_t n = m.has_sequence(seq) ? m.num_tokens(seq) : 0;
  charge(l, st, units(seq));
  m.free_sequence(seq);
  st.held_tokens -= n;
}

// ---- handlers ----------------------------------------------------------------------------------

/// A handler runs one line on the manager; it returns the printed result, or nothing for ops
/// that print nothing.
using OpHandler = std::optional<json> (*)(const OpsLine& l, State& st);

// ops_handlers.cpp: ops that change the manager, and the queries beside them.
std::optional<json> op_add(const OpsLine& l, State& st);
std::optional<json> op_can_add(const OpsLine& l, State& st);
std::optional<json> op_lookup(const OpsLine& l, State& st);
std::optional<json> op_commit(const OpsLine& l, State& st);
std::optional<json> op_append(const OpsLine& l, State& st);
std::optional<json> op_can_append(const OpsLine& l, State& st);
std::optional<json> op_truncate(const OpsLine& l, State& st);
std::optional<json> op_fork(const OpsLine& l, State& st);
std::optional<json> op_free(const OpsLine& l, State& st);
std::optional<json> op_swap_out(const OpsLine& l, State& st);
std::optional<json> op_can_swap_out(const OpsLine& l, State& st);
std::optional<json> op_swap_in(const OpsLine& l, State& st);
std::optional<json> op_can_swap_in(const OpsLine& l, State& st);
std::optional<json> op_preempt(const OpsLine& l, State& st);
std::optional<json> op_resume(const OpsLine& l, State& st);
std::optional<json> op_score(const OpsLine& l, State& st);
std::optional<json> op_reset_prefix_cache(const OpsLine& l, State& st);
// ops_print.cpp: ops that only report.
std::optional<json> op_stats(const OpsLine& l, State& st);
std::optional<json> op_dump(const OpsLine& l, State& st);
std::optional<json> op_events(const OpsLine& l, State& st);
std::optional<json> op_batch_metadata(const OpsLine& l, State& st);

// ops_hybrid.cpp: the ops of a hybrid manager (`manager ... groups=`).
std::optional<json> hy_add(const OpsLine& l, State& st);
std::optional<json> hy_append(const OpsLine& l, State& st);
std::optional<json> hy_can_append(const OpsLine& l, State& st);
std::optional<json> hy_truncate(const OpsLine& l, State& st);
std::optional<json> hy_fork(const OpsLine& l, State& st);
std::optional<json> hy_free(const OpsLine& l, State& st);
std::optional<json> hy_dump(const OpsLine& l, State& st);
std::optional<json> hy_batch_metadata(const OpsLine& l, State& st);

}  // namespace pagedkv::ops
