// `pagedkv ops` argument conversion: integers, numbers and on/off values with the range each
// op allows, the per-op token limit, and the `manager` line's configuration.

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

#include "core/enum_names.hpp"
#include "ops/ops_internal.hpp"

namespace pagedkv::ops {

namespace {

/// Spellings of an on/off option; the first of each value is the one messages name.
constexpr detail::EnumName<bool> kOnOffNames[] = {{true, "on"},   {true, "true"},   {true, "1"},
                                                  {false, "off"}, {false, "false"}, {false, "0"}};

bool to_bool(const OpsLine& l, std::string_view what, std::string_view text) {
  if (const auto v = detail::parse_enum<bool>(kOnOffNames, text)) return *v;
  fail_at(l.line, fmt::format("{}: {} must be {} or {}, got '{}'", l.op, what,
                              detail::enum_name<bool>(kOnOffNames, true),
                              detail::enum_name<bool>(kOnOffNames, false), printable(text)));
}

const std::string* option(const OpsLine& l, std::string_view key) {
  auto it = l.options.find(std::string(key));
  return it == l.options.end() ? nullptr : &it->second;
}

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
  const std::string policy = option(l, "policy") ? *option(l, "policy") : "none";
  const std::optional<EvictionKind> kind = parse_eviction_kind(policy);
  const PolicyOptions* chosen = nullptr;
  for (const PolicyOptions& p : kPolicies) {
    if (kind == p.kind) chosen = &p;
  }
  if (chosen == nullptr) {
    fail_at(l.line,
            fmt::format("manager: policy must be {}, got '{}'", policy_names(), printable(policy)));
  }
  auto applies = [&](std::string_view k) {
    return std::ranges::find(chosen->options, k) != chosen->options.end();
  };
  // The policy's own parameters are checked before options of other policies are reported.
  auto param = [&](std::string_view k) -> int32_t {
    const std::string* v = option(l, k);
    return applies(k) && v ? static_cast<int32_t>(to_int(l, k, *v, 0, 1 << 24)) : 0;
  };
  const EvictionPolicyConfig c{.kind = chosen->kind,
                               .window = param("window"),
                               .sinks = param("sinks"),
                               .recent = param("recent"),
                               .heavy = param("heavy")};
  for (std::string_view k : {"window", "sinks", "recent", "heavy"}) {
    if (option(l, k) && !applies(k)) {
      fail_at(l.line, fmt::format("manager: option '{}' does not apply to policy {}", k, policy));
    }
  }
  return c;
}

}  // namespace

int64_t to_int(const OpsLine& l, std::string_view what, std::string_view text, int64_t lo,
               int64_t hi) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty()) {
    fail_at(l.line,
            fmt::format("{}: {} must be an integer, got '{}'", l.op, what, printable(text)));
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
    fail_at(l.line,
            fmt::format("{}: {} must be a finite number, got '{}'", l.op, what, printable(text)));
  }
  return v;
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
      fail_at(l.line, fmt::format("{}: unknown option '{}' (accepted: {})", l.op, printable(k),
                                  names.empty() ? "none" : names));
    }
  }
}

void expect_nothing(const OpsLine& l) {
  expect_args(l, 0, 0, "no arguments");
  expect_options(l, {});
}

SeqId seq_arg(const OpsLine& l, size_t i) {
  return to_int(l, "sequence id", l.args[i], 0, INT64_MAX);
}

void check_tokens_per_op(const OpsLine& l, int64_t n, std::string_view what) {
  if (n > OpsLimits::kMaxTokensPerOp) {
    fail_at(l.line, fmt::format("{}: {} {} exceed the limit of {} tokens per op", l.op, n, what,
                                OpsLimits::kMaxTokensPerOp));
  }
}

std::vector<TokenId> token_args(const OpsLine& l, size_t from) {
  const size_t n = l.args.size() > from ? l.args.size() - from : 0;
  check_tokens_per_op(l, static_cast<int64_t>(n), "tokens");
  std::vector<TokenId> t;
  t.reserve(n);
  for (size_t i = from; i < l.args.size(); ++i) {
    t.push_back(static_cast<TokenId>(to_int(l, "token id", l.args[i], 0, INT32_MAX)));
  }
  return t;
}

int64_t count_value(const OpsLine& l, std::string_view what, std::string_view text) {
  const int64_t n = to_int(l, what, text, 0, INT64_MAX);
  check_tokens_per_op(l, n, "tokens");
  return n;
}

int64_t lookahead_option(const OpsLine& l) {
  const std::string* v = option(l, "lookahead");
  return v ? count_value(l, "lookahead", *v) : 0;
}

AddOptions add_options(const OpsLine& l) {
  AddOptions o;
  if (const std::string* v = option(l, "extra"))
    o.extra_key = static_cast<uint64_t>(to_int(l, "extra", *v, 0, INT64_MAX));
  // max_new only enters the admission arithmetic (nothing is allocated for it), so it is
  // bounded by the int32 token range rather than the per-op limit.
  if (const std::string* v = option(l, "max_new"))
    o.max_new_tokens = to_int(l, "max_new", *v, 0, INT32_MAX);
  if (const std::string* v = option(l, "chunk")) o.first_chunk_tokens = count_value(l, "chunk", *v);
  return o;
}

AppendArgs append_args(const OpsLine& l) {
  expect_options(l, {"n"});
  expect_args(l, 1, SIZE_MAX, "SEQ TOKEN... or SEQ n=COUNT");
  AppendArgs a;
  a.by_count = l.options.contains("n");
  if (a.by_count && l.args.size() != 1)
    fail_at(l.line, "append: give either tokens or n=COUNT, not both");
  if (!a.by_count) a.ids = token_args(l, 1);
  a.n = a.by_count ? count_value(l, "n", l.options.at("n")) : static_cast<int64_t>(a.ids.size());
  return a;
}

KVCacheManagerConfig manager_config(const OpsLine& l) {
  expect_args(l, 0, 0, "only key=value options");
  expect_options(l, {"blocks", "block_size", "host_blocks", "watermark", "max_model_len", "policy",
                     "window", "sinks", "recent", "heavy", "prefix", "events"});
  if (!option(l, "blocks")) fail_at(l.line, "manager: blocks=N is required");
  KVCacheManagerConfig c;
  c.num_blocks =
      static_cast<int32_t>(to_int(l, "blocks", *option(l, "blocks"), 1, OpsLimits::kMaxBlocks));
  if (auto* v = option(l, "block_size"))
    c.block_size = static_cast<int32_t>(to_int(l, "block_size", *v, 1, OpsLimits::kMaxBlockSize));
  if (auto* v = option(l, "host_blocks"))
    c.num_host_blocks =
        static_cast<int32_t>(to_int(l, "host_blocks", *v, 0, OpsLimits::kMaxBlocks));
  if (auto* v = option(l, "watermark")) c.watermark = to_double(l, "watermark", *v);
  if (auto* v = option(l, "max_model_len"))
    c.max_model_len = to_int(l, "max_model_len", *v, 0, INT32_MAX);
  if (auto* v = option(l, "prefix")) c.enable_prefix_caching = to_bool(l, "prefix", *v);
  if (auto* v = option(l, "events")) c.enable_events = to_bool(l, "events", *v);
  c.eviction = eviction_option(l);
  return c;
}

}  // namespace pagedkv::ops
