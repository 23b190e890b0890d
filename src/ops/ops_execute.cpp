// `pagedkv ops` execution: the op table, the executor (manager creation, dispatch, errors
// prefixed with the line, `expect_error`) and the script-wide token count of OpsLimits.

#include <fmt/format.h>

#include "ops/ops_internal.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {

namespace {

/// The op that creates the manager; every other op needs one.
constexpr std::string_view kManagerOp = "manager";
/// The op that runs another op and expects it to fail.
constexpr std::string_view kExpectError = "expect_error";

/// Every op after `manager`, in documentation order: its name and its handler.
struct OpEntry {
  std::string_view name;
  OpHandler handler;
};
constexpr OpEntry kOps[] = {{"add", op_add},
                            {"can_add", op_can_add},
                            {"lookup", op_lookup},
                            {"commit", op_commit},
                            {"append", op_append},
                            {"can_append", op_can_append},
                            {"truncate", op_truncate},
                            {"fork", op_fork},
                            {"free", op_free},
                            {"swap_out", op_swap_out},
                            {"can_swap_out", op_can_swap_out},
                            {"swap_in", op_swap_in},
                            {"can_swap_in", op_can_swap_in},
                            {"preempt", op_preempt},
                            {"resume", op_resume},
                            {"score", op_score},
                            {"reset_prefix_cache", op_reset_prefix_cache},
                            {"stats", op_stats},
                            {"dump", op_dump},
                            {"events", op_events},
                            {"batch_metadata", op_batch_metadata}};

/// The ops a hybrid manager (`manager ... groups=`) runs, in documentation order.
constexpr OpEntry kHybridOps[] = {{"add", hy_add},
                                  {"append", hy_append},
                                  {"can_append", hy_can_append},
                                  {"truncate", hy_truncate},
                                  {"fork", hy_fork},
                                  {"free", hy_free},
                                  {"dump", hy_dump},
                                  {"batch_metadata", hy_batch_metadata}};

/// A `manager ... groups=` line: the hybrid manager replaces whatever manager was there.
void start_hybrid(const OpsLine& l, State& st) {
  const HybridKVCacheManagerConfig config = hybrid_manager_config(l);
  charge(l, st, config.num_blocks);
  auto m = std::make_unique<HybridKVCacheManager>(config);
  st.hybrid = std::move(m);
  st.manager.reset();
  st.preempted.clear();
  st.held_tokens = 0;
}

/// Runs `l` on the hybrid manager; ops it does not have are errors naming those it has.
std::optional<json> run_hybrid(const OpsLine& l, State& st) {
  for (const OpEntry& e : kHybridOps) {
    if (e.name == l.op) return e.handler(l, st);
  }
  std::string names;
  for (const OpEntry& e : kHybridOps)
    names += fmt::format("{}{}", names.empty() ? "" : ", ", e.name);
  fail_at(l.line,
          fmt::format("{}: not an op of a manager with groups (those are: {})", l.op, names));
}

/// Creates the manager (`manager`) or runs the op's handler on it.
std::optional<json> run(const OpsLine& l, State& st) {
  if (l.op == kManagerOp && manager_has_groups(l)) {
    start_hybrid(l, st);
    return std::nullopt;
  }
  if (l.op == kManagerOp) {
    // Built first: a rejected configuration leaves the previous manager and its state.
    const KVCacheManagerConfig config = manager_config(l);
    charge(l, st, int64_t{config.num_blocks} + config.num_host_blocks);
    auto m = std::make_unique<KVCacheManager>(config);
    st.manager = std::move(m);
    st.hybrid.reset();
    st.preempted.clear();
    st.held_tokens = 0;
    return std::nullopt;
  }
  if (st.hybrid) return run_hybrid(l, st);
  if (!st.manager)
    fail_at(l.line, fmt::format("{}: no manager yet (start with a `manager` line)", l.op));
  for (const OpEntry& e : kOps) {
    if (e.name == l.op) return e.handler(l, st);
  }
  fail_at(l.line, fmt::format("unknown op '{}'", l.op));  // unreachable: the parser checks
}

/// Runs `l`, turning a manager error into "line N: op: message".
std::optional<json> run_prefixed(const OpsLine& l, State& st) {
  try {
    return run(l, st);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("line ", 0) == 0) throw;
    // A message that already starts with the op's name (the hybrid manager's do) keeps it once.
    if (msg.starts_with(l.op) && msg.compare(l.op.size(), 2, ": ") == 0) fail_at(l.line, msg);
    fail_at(l.line, fmt::format("{}: {}", l.op, msg));
  }
}

/// `expect_error OP ARGS...`: OP must throw; its message (without "line N: ") is the result.
/// Every op leaves the state as it was when it throws, so the script can go on and inspect it.
json run_expect_error(const OpsLine& l, State& st) {
  OpsLine inner = l;
  inner.op = l.args.front();
  inner.args.erase(inner.args.begin());
  json j = result_head(l);
  j["expected"] = inner.op;
  std::optional<json> r;
  try {
    r = run_prefixed(inner, st);
  } catch (const Error& e) {
    const std::string msg = e.what();
    const std::string prefix = fmt::format("line {}: ", l.line);
    j["error"] = msg.rfind(prefix, 0) == 0 ? msg.substr(prefix.size()) : msg;
    return j;
  }
  if (r) {
    fail_at(l.line, fmt::format("expect_error: {} succeeded (it printed {})", inner.op,
                                printable(r->dump(), 200)));
  }
  fail_at(l.line, fmt::format("expect_error: {} succeeded", inner.op));
}

}  // namespace

void check_growth(const OpsLine& l, const State& st, int64_t n) {
  if (n > OpsLimits::kMaxTotalTokens - st.held_tokens) {
    fail_at(l.line, fmt::format("{}: {} more tokens would hold {} in all, over the limit of {} "
                                "tokens per script",
                                l.op, n, st.held_tokens + n, OpsLimits::kMaxTotalTokens));
  }
}

void charge(const OpsLine& l, State& st, int64_t units) {
  if (units > st.work_left) {
    fail_at(l.line,
            fmt::format("{}: needs {} work units, more than the {} left of the script's "
                        "budget ({} + {} per script byte)",
                        l.op, units, st.work_left, OpsLimits::kWorkBase, OpsLimits::kWorkPerByte));
  }
  st.work_left -= units;
}

int64_t table_units(const KVCacheManager& m, SeqId seq) {
  return m.has_sequence(seq) ? static_cast<int64_t>(m.block_table(seq).size()) : 0;
}

void check_new_sequence(const OpsLine& l, const State& st) {
  const int64_t held = (st.hybrid ? st.hybrid->num_sequences() : st.manager->num_sequences()) +
                       static_cast<int64_t>(st.preempted.size());
  if (held >= OpsLimits::kMaxSequences) {
    fail_at(l.line, fmt::format("{}: {} sequences held (preempted ones included), the limit of {} "
                                "sequences per script",
                                l.op, held, OpsLimits::kMaxSequences));
  }
}

const std::vector<std::string>& ops_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v{std::string(kManagerOp)};
    for (const OpEntry& e : kOps) v.emplace_back(e.name);
    v.emplace_back(kExpectError);
    return v;
  }();
  return names;
}

OpsExecutor::OpsExecutor(int64_t work_budget) : state_(std::make_unique<State>()) {
  state_->work_left = work_budget;
}
OpsExecutor::~OpsExecutor() = default;

const KVCacheManager* OpsExecutor::manager() const { return state_->manager.get(); }
const HybridKVCacheManager* OpsExecutor::hybrid_manager() const { return state_->hybrid.get(); }
int64_t OpsExecutor::held_tokens() const { return state_->held_tokens; }
int64_t OpsExecutor::work_left() const { return state_->work_left; }

std::optional<json> OpsExecutor::execute(const OpsLine& line) {
  charge(line, *state_, 1);  // the line itself: a script of blank-free lines is charged per line
  if (line.op == kExpectError) {
    if (line.args.empty()) fail_at(line.line, "expect_error: expected an op after expect_error");
    return run_expect_error(line, *state_);
  }
  return run_prefixed(line, *state_);
}

std::vector<json> run_ops_script(std::string_view text) {
  // Parse everything first: a syntax error anywhere runs nothing.
  for_each_ops_line(text, [](const OpsLine&) {});
  OpsExecutor ex(OpsLimits::work_budget(static_cast<int64_t>(text.size())));
  std::vector<json> out;
  for_each_ops_line(text, [&](const OpsLine& l) {
    if (auto j = ex.execute(l)) out.push_back(std::move(*j));
  });
  return out;
}

}  // namespace pagedkv::ops
