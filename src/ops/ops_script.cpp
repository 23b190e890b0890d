#include "ops/ops_script.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <span>

#include "core/check.hpp"
#include "core/enum_names.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {

namespace {

using json = nlohmann::ordered_json;
using Preempted = std::map<SeqId, PreemptedSequence>;

/// Lines longer than this are rejected: a script is written by hand, and a bound keeps a
/// fuzzer from spending its time on megabyte tokens.
constexpr size_t kMaxLineBytes = 1 << 20;
/// Pool sizes a script may ask for: ample for hand-written scenarios, and bounded so that a
/// script (or a fuzzer) cannot make the manager allocate gigabytes of metadata.
constexpr int64_t kMaxBlocks = 1 << 20;

/// The op that creates the manager; every other op needs one.
constexpr std::string_view kManagerOp = "manager";

/// Spellings of an on/off option; the first of each value is the one messages name.
constexpr detail::EnumName<bool> kOnOffNames[] = {{true, "on"},   {true, "true"},   {true, "1"},
                                                  {false, "off"}, {false, "false"}, {false, "0"}};

[[noreturn]] void fail_at(int64_t line, const std::string& message) {
  throw Error(fmt::format("line {}: {}", line, message));
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

int64_t to_int(const OpsLine& l, std::string_view what, std::string_view text, int64_t lo,
               int64_t hi) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    fail_at(l.line, fmt::format("{}: {} must be an integer, got '{}'", l.op, what, text));
  }
  if (v < lo || v > hi) {
    fail_at(l.line, fmt::format("{}: {} must be in [{}, {}], got {}", l.op, what, lo, hi, v));
  }
  return v;
}

double to_double(const OpsLine& l, std::string_view what, std::string_view text) {
  double v = 0.0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty() || !std::isfinite(v)) {
    fail_at(l.line, fmt::format("{}: {} must be a finite number, got '{}'", l.op, what, text));
  }
  return v;
}

bool to_bool(const OpsLine& l, std::string_view what, std::string_view text) {
  if (const auto v = detail::parse_enum<bool>(kOnOffNames, text)) return *v;
  fail_at(l.line, fmt::format("{}: {} must be {} or {}, got '{}'", l.op, what,
                              detail::enum_name<bool>(kOnOffNames, true),
                              detail::enum_name<bool>(kOnOffNames, false), text));
}

void expect_args(const OpsLine& l, size_t lo, size_t hi, std::string_view usage) {
  if (l.args.size() < lo || l.args.size() > hi) {
    fail_at(l.line, fmt::format("{}: expected {}, got {} argument(s)", l.op, usage, l.args.size()));
  }
}

void expect_options(const OpsLine& l, std::initializer_list<std::string_view> allowed) {
  for (const auto& [k, v] : l.options) {
    if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      std::string names;
      for (std::string_view a : allowed) names += fmt::format("{}{}", names.empty() ? "" : ", ", a);
      fail_at(l.line, fmt::format("{}: unknown option '{}' (accepted: {})", l.op, k,
                                  names.empty() ? "none" : names));
    }
  }
}

/// An op without positional arguments or options.
void expect_nothing(const OpsLine& l) {
  expect_args(l, 0, 0, "no arguments");
  expect_options(l, {});
}

SeqId seq_arg(const OpsLine& l, size_t i) {
  return to_int(l, "sequence id", l.args[i], 0, INT64_MAX);
}

std::vector<TokenId> token_args(const OpsLine& l, size_t from) {
  std::vector<TokenId> t;
  for (size_t i = from; i < l.args.size(); ++i) {
    t.push_back(static_cast<TokenId>(to_int(l, "token id", l.args[i], 0, INT32_MAX)));
  }
  return t;
}

/// The `extra=K` option of add / can_add (the prefix-cache extra key), 0 when absent.
uint64_t extra_option(const OpsLine& l) {
  const auto it = l.options.find("extra");
  if (it == l.options.end()) return 0;
  return static_cast<uint64_t>(to_int(l, "extra", it->second, 0, INT64_MAX));
}

std::string hex(uint64_t h) { return fmt::format("{:#018x}", h); }

json copies_json(const std::vector<BlockCopy>& copies) {
  json a = json::array();
  for (const BlockCopy& c : copies) a.push_back({c.src, c.dst});
  return a;
}

json table_json(std::span<const BlockId> t) {
  return json(std::vector<BlockId>(t.begin(), t.end()));
}

/// Every printed object starts with the op and its script line.
json result_head(const OpsLine& l) { return json{{"op", l.op}, {"line", l.line}}; }

// ---- manager -----------------------------------------------------------------------------------

/// Eviction policies a script can name (by eviction_kind_name) and the options each takes.
struct PolicyOptions {
  EvictionKind kind;
  std::array<std::string_view, 2> options;  ///< unused entries are empty
};
constexpr PolicyOptions kPolicies[] = {{EvictionKind::kNone, {}},
                                       {EvictionKind::kSlidingWindow, {"window"}},
                                       {EvictionKind::kAttentionSinks, {"window", "sinks"}},
                                       {EvictionKind::kHeavyHitters, {"recent", "heavy"}}};

/// "none, window, sinks or h2o".
std::string policy_names() {
  std::string out;
  for (size_t i = 0; i < std::size(kPolicies); ++i) {
    if (i > 0) out += i + 1 == std::size(kPolicies) ? " or " : ", ";
    out += eviction_kind_name(kPolicies[i].kind);
  }
  return out;
}

/// The `policy=` option and its parameters (window, sinks, recent, heavy).
EvictionPolicyConfig eviction_option(const OpsLine& l) {
  auto opt = [&](std::string_view k) -> const std::string* {
    auto it = l.options.find(std::string(k));
    return it == l.options.end() ? nullptr : &it->second;
  };
  const std::string policy = opt("policy") ? *opt("policy") : "none";
  const std::optional<EvictionKind> kind = parse_eviction_kind(policy);
  const PolicyOptions* chosen = nullptr;
  for (const PolicyOptions& p : kPolicies) {
    if (kind == p.kind) chosen = &p;
  }
  if (chosen == nullptr) {
    fail_at(l.line, fmt::format("manager: policy must be {}, got '{}'", policy_names(), policy));
  }
  auto applies = [&](std::string_view k) {
    return std::ranges::find(chosen->options, k) != chosen->options.end();
  };
  // The policy's own parameters are checked before options of other policies are reported.
  auto param = [&](std::string_view k) -> int32_t {
    return applies(k) && opt(k) ? static_cast<int32_t>(to_int(l, k, *opt(k), 0, 1 << 24)) : 0;
  };
  const EvictionPolicyConfig c{.kind = chosen->kind,
                               .window = param("window"),
                               .sinks = param("sinks"),
                               .recent = param("recent"),
                               .heavy = param("heavy")};
  for (std::string_view k : {"window", "sinks", "recent", "heavy"}) {
    if (opt(k) && !applies(k)) {
      fail_at(l.line, fmt::format("manager: option '{}' does not apply to policy {}", k, policy));
    }
  }
  return c;
}

KVCacheManagerConfig manager_config(const OpsLine& l) {
  expect_args(l, 0, 0, "only key=value options");
  expect_options(l, {"blocks", "block_size", "host_blocks", "watermark", "max_model_len", "policy",
                     "window", "sinks", "recent", "heavy", "prefix", "events"});
  auto opt = [&](const char* k) -> const std::string* {
    auto it = l.options.find(k);
    return it == l.options.end() ? nullptr : &it->second;
  };
  if (!opt("blocks")) fail_at(l.line, "manager: blocks=N is required");
  KVCacheManagerConfig c;
  c.num_blocks = static_cast<int32_t>(to_int(l, "blocks", *opt("blocks"), 1, kMaxBlocks));
  if (auto* v = opt("block_size"))
    c.block_size = static_cast<int32_t>(to_int(l, "block_size", *v, 1, 1 << 16));
  if (auto* v = opt("host_blocks"))
    c.num_host_blocks = static_cast<int32_t>(to_int(l, "host_blocks", *v, 0, kMaxBlocks));
  if (auto* v = opt("watermark")) c.watermark = to_double(l, "watermark", *v);
  if (auto* v = opt("max_model_len"))
    c.max_model_len = to_int(l, "max_model_len", *v, 0, INT32_MAX);
  if (auto* v = opt("prefix")) c.enable_prefix_caching = to_bool(l, "prefix", *v);
  if (auto* v = opt("events")) c.enable_events = to_bool(l, "events", *v);
  c.eviction = eviction_option(l);
  return c;
}

// ---- ops on a manager: one handler each --------------------------------------------------------

/// A handler runs one line on the manager; it returns the printed result, or nothing for ops
/// that print nothing. `preempted` keeps the sequences preempted by recompute, for `resume`.
using OpHandler = std::optional<json> (*)(const OpsLine& l, KVCacheManager& m,
                                          Preempted& preempted);

/// Admits `seq` with `prompt` into `j` (shared by add and resume).
void add_result(const OpsLine& l, KVCacheManager& m, json& j, SeqId seq,
                const std::vector<TokenId>& prompt, uint64_t extra) {
  j["seq"] = seq;
  const Admission adm = m.can_add_sequence(prompt, extra);
  if (m.has_sequence(seq))
    fail_at(l.line, fmt::format("{}: sequence {} already exists", l.op, seq));
  auto r = m.add_sequence(seq, prompt, extra);
  j["ok"] = r.has_value();
  if (!r) {
    j["error"] = adm == Admission::kNever ? "never_fits" : "no_free_blocks";
    j["admission"] = admission_name(adm);
    return;
  }
  j["computed_tokens"] = r->num_computed_tokens;
  j["slots"] = r->append.slots;
  j["table"] = table_json(m.block_table(seq));
}

std::optional<json> op_add(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_args(l, 1, SIZE_MAX, "SEQ [TOKEN...] [extra=K]");
  expect_options(l, {"extra"});
  const uint64_t extra = extra_option(l);
  // Token ids are checked before the sequence id: a line with both wrong names the tokens.
  const std::vector<TokenId> prompt = token_args(l, 1);
  const SeqId seq = seq_arg(l, 0);
  json j = result_head(l);
  add_result(l, m, j, seq, prompt, extra);
  return j;
}

std::optional<json> op_can_add(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_args(l, 0, SIZE_MAX, "[TOKEN...] [extra=K]");
  expect_options(l, {"extra"});
  json j = result_head(l);
  const uint64_t extra = extra_option(l);
  j["admission"] = admission_name(m.can_add_sequence(token_args(l, 0), extra));
  return j;
}

std::optional<json> op_append(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_options(l, {"n"});
  expect_args(l, 1, SIZE_MAX, "SEQ TOKEN... or SEQ n=COUNT");
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  j["seq"] = seq;
  std::optional<AppendResult> r;
  if (l.options.contains("n")) {
    if (l.args.size() != 1) fail_at(l.line, "append: give either tokens or n=COUNT, not both");
    r = m.append_slots(seq, to_int(l, "n", l.options.at("n"), 0, INT32_MAX));
  } else {
    r = m.append_tokens(seq, token_args(l, 1));
  }
  j["ok"] = r.has_value();
  if (!r) {
    j["error"] = "no_free_blocks";
    return j;
  }
  j["slots"] = r->slots;
  j["copies"] = copies_json(r->copies);
  j["table"] = table_json(m.block_table(seq));
  return j;
}

std::optional<json> op_can_append(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_args(l, 2, 2, "SEQ COUNT");
  expect_options(l, {});
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  const int64_t n = to_int(l, "count", l.args[1], 0, INT32_MAX);
  j["seq"] = seq;
  j["n"] = n;
  j["ok"] = m.can_append(seq, n);
  j["blocks_needed"] = m.blocks_needed_to_append(seq, n);
  return j;
}

std::optional<json> op_fork(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_args(l, 2, 2, "PARENT CHILD");
  expect_options(l, {});
  m.fork(seq_arg(l, 0), seq_arg(l, 1));
  return std::nullopt;
}

std::optional<json> op_free(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  m.free_sequence(seq_arg(l, 0));
  return std::nullopt;
}

/// swap_out / swap_in: the same result shape, the pool that can run short differs.
json swap_result(const OpsLine& l, KVCacheManager& m, bool out) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  j["seq"] = seq;
  auto r = out ? m.swap_out(seq) : m.swap_in(seq);
  j["ok"] = r.has_value();
  if (!r) {
    j["error"] = out ? "no_free_host_blocks" : "no_free_blocks";
    return j;
  }
  j["copies"] = copies_json(r->copies);
  j[out ? "host_table" : "table"] = table_json(m.block_table(seq));
  return j;
}

std::optional<json> op_swap_out(const OpsLine& l, KVCacheManager& m, Preempted&) {
  return swap_result(l, m, /*out=*/true);
}

std::optional<json> op_swap_in(const OpsLine& l, KVCacheManager& m, Preempted&) {
  return swap_result(l, m, /*out=*/false);
}

std::optional<json> op_preempt(const OpsLine& l, KVCacheManager& m, Preempted& preempted) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  json j = result_head(l);
  PreemptedSequence p = m.preempt(seq_arg(l, 0));
  j["seq"] = p.seq;
  j["num_tokens"] = p.num_tokens;
  j["tokens"] = p.tokens;
  preempted[p.seq] = std::move(p);
  return j;
}

std::optional<json> op_resume(const OpsLine& l, KVCacheManager& m, Preempted& preempted) {
  expect_args(l, 1, 1, "SEQ");
  expect_options(l, {});
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  auto it = preempted.find(seq);
  if (it == preempted.end())
    fail_at(l.line, fmt::format("resume: sequence {} was not preempted", seq));
  if (it->second.tokens.size() != static_cast<size_t>(it->second.num_tokens)) {
    fail_at(l.line, fmt::format("resume: sequence {} was appended with n=COUNT (token ids "
                                "unknown), so it cannot be prefilled again from here",
                                seq));
  }
  add_result(l, m, j, seq, it->second.tokens, it->second.extra_key);
  if (j["ok"].get<bool>()) preempted.erase(seq);
  return j;
}

std::optional<json> op_score(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_args(l, 1, SIZE_MAX, "SEQ WEIGHT...");
  expect_options(l, {});
  std::vector<float> w;
  for (size_t i = 1; i < l.args.size(); ++i) {
    w.push_back(static_cast<float>(to_double(l, "weight", l.args[i])));
  }
  m.accumulate_attention(seq_arg(l, 0), w);
  return std::nullopt;
}

std::optional<json> op_reset_prefix_cache(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_nothing(l);
  json j = result_head(l);
  j["removed"] = m.reset_prefix_cache();
  return j;
}

std::optional<json> op_stats(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_nothing(l);
  json j = result_head(l);
  const KVCacheStats s = m.stats();
  j["blocks"] = {{"total", s.total_blocks},
                 {"free", s.free_blocks},
                 {"used", s.used_blocks},
                 {"cached", s.cached_blocks}};
  j["usage"] = s.usage;
  j["sequences"] = s.num_sequences;
  j["swapped_sequences"] = s.num_swapped_sequences;
  j["prefix"] = {{"query_tokens", s.prefix_query_tokens},
                 {"hit_tokens", s.prefix_hit_tokens},
                 {"hits", s.prefix_hits},
                 {"misses", s.prefix_misses},
                 {"hit_rate", s.prefix_hit_rate()},
                 {"evictions", s.prefix_evictions},
                 {"entries", s.prefix_cached_entries}};
  j["preemptions"] = s.preemptions;
  j["swap"] = {{"host_total", s.host_total_blocks},
               {"host_used", s.host_used_blocks},
               {"swapped_out_blocks", s.swapped_out_blocks},
               {"swapped_in_blocks", s.swapped_in_blocks}};
  j["eviction"] = {{"released_blocks", s.released_blocks}, {"evicted_tokens", s.evicted_tokens}};
  return j;
}

std::optional<json> op_dump(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_nothing(l);
  json j = result_head(l);
  const BlockAllocator& a = m.allocator();
  j["blocks"] = {{"total", a.num_blocks()},
                 {"free", a.num_free()},
                 {"used", a.num_used()},
                 {"cached", a.num_cached()}};
  json seqs = json::array();
  const bool show_kept = m.eviction_policy().kind() != EvictionKind::kNone;
  for (SeqId s : m.sequences()) {
    json e{{"seq", s}, {"tokens", m.num_tokens(s)}};
    e[m.is_swapped(s) ? "host_table" : "table"] = table_json(m.block_table(s));
    if (show_kept && !m.is_swapped(s)) {
      const std::vector<SeqId> one{s};
      e["kept"] = m.kept_tokens(one).positions;
    }
    seqs.push_back(std::move(e));
  }
  j["sequences"] = std::move(seqs);
  json shared = json::object();
  for (BlockId b = 0; b < a.num_blocks(); ++b) {
    if (a.ref_count(b) > 1) shared[std::to_string(b)] = a.ref_count(b);
  }
  j["shared"] = std::move(shared);
  j["cached"] = a.cached_lru();
  j["prefix"] = {{"hits", m.stats().prefix_hits}, {"misses", m.stats().prefix_misses}};
  return j;
}

std::optional<json> op_events(const OpsLine& l, KVCacheManager& m, Preempted&) {
  expect_nothing(l);
  json j = result_head(l);
  json ev = json::array();
  for (const KVCacheEvent& e : m.take_events()) {
    json x{{"kind", event_kind_name(e.kind)}, {"block", e.block}, {"hash", hex(e.hash)}};
    if (e.kind == KVCacheEvent::Kind::kStored) {
      x["parent"] = hex(e.parent_hash);
      x["tokens"] = e.tokens;
      if (e.extra_key != 0) x["extra"] = e.extra_key;
    }
    ev.push_back(std::move(x));
  }
  j["events"] = std::move(ev);
  return j;
}

/// Every op after `manager`, in documentation order: its name and its handler.
struct OpEntry {
  std::string_view name;
  OpHandler handler;
};
constexpr OpEntry kOps[] = {
    {"add", op_add},           {"can_add", op_can_add},
    {"append", op_append},     {"can_append", op_can_append},
    {"fork", op_fork},         {"free", op_free},
    {"swap_out", op_swap_out}, {"swap_in", op_swap_in},
    {"preempt", op_preempt},   {"resume", op_resume},
    {"score", op_score},       {"reset_prefix_cache", op_reset_prefix_cache},
    {"stats", op_stats},       {"dump", op_dump},
    {"events", op_events}};

}  // namespace

const std::vector<std::string>& ops_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v{std::string(kManagerOp)};
    for (const OpEntry& e : kOps) v.emplace_back(e.name);
    return v;
  }();
  return names;
}

std::vector<OpsLine> parse_ops_script(std::string_view text) {
  std::vector<OpsLine> out;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view raw = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (raw.size() > kMaxLineBytes)
      fail_at(line_no, fmt::format("line longer than {} bytes", kMaxLineBytes));
    if (size_t hash = raw.find('#'); hash != std::string_view::npos) raw = raw.substr(0, hash);
    std::vector<std::string_view> tokens;
    for (size_t i = 0; i < raw.size();) {
      while (i < raw.size() && is_space(raw[i])) ++i;
      size_t j = i;
      while (j < raw.size() && !is_space(raw[j])) ++j;
      if (j > i) tokens.push_back(raw.substr(i, j - i));
      i = j;
    }
    if (tokens.empty()) continue;
    OpsLine l;
    l.line = line_no;
    l.op = std::string(tokens[0]);
    const auto& names = ops_names();
    if (std::find(names.begin(), names.end(), l.op) == names.end()) {
      std::string printable;
      for (char c : l.op.substr(0, 40)) printable += (c >= 32 && c < 127) ? c : '?';
      fail_at(line_no, fmt::format("unknown op '{}' (ops: {})", printable, fmt::join(names, ", ")));
    }
    for (size_t i = 1; i < tokens.size(); ++i) {
      std::string_view t = tokens[i];
      if (size_t eq = t.find('='); eq != std::string_view::npos) {
        std::string key(t.substr(0, eq));
        if (key.empty() || eq + 1 == t.size()) {
          fail_at(line_no, fmt::format("{}: malformed option '{}' (expected key=value)", l.op, t));
        }
        if (!l.options.emplace(key, std::string(t.substr(eq + 1))).second) {
          fail_at(line_no, fmt::format("{}: option '{}' given twice", l.op, key));
        }
      } else {
        if (!l.options.empty()) {
          fail_at(line_no, fmt::format("{}: positional argument '{}' after an option", l.op, t));
        }
        l.args.emplace_back(t);
      }
    }
    out.push_back(std::move(l));
  }
  return out;
}

std::optional<json> OpsExecutor::execute(const OpsLine& line) {
  try {
    return run(line);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.rfind("line ", 0) == 0) throw;
    fail_at(line.line, fmt::format("{}: {}", line.op, msg));
  }
}

std::optional<json> OpsExecutor::run(const OpsLine& l) {
  if (l.op == kManagerOp) {
    manager_ = std::make_unique<KVCacheManager>(manager_config(l));
    preempted_.clear();
    return std::nullopt;
  }
  if (!manager_)
    fail_at(l.line, fmt::format("{}: no manager yet (start with a `manager` line)", l.op));
  for (const OpEntry& e : kOps) {
    if (e.name == l.op) return e.handler(l, *manager_, preempted_);
  }
  fail_at(l.line, fmt::format("unknown op '{}'", l.op));  // unreachable: the parser checks
}

std::vector<json> run_ops_script(std::string_view text) {
  const std::vector<OpsLine> lines = parse_ops_script(text);
  OpsExecutor ex;
  std::vector<json> out;
  for (const OpsLine& l : lines) {
    if (auto j = ex.execute(l)) out.push_back(std::move(*j));
  }
  return out;
}

}  // namespace pagedkv::ops
