// `pagedkv ops` parsing: script text -> OpsLine, one line at a time, with the line and script
// limits of OpsLimits; and the escaping every echoed token goes through.

#include <fmt/format.h>

#include <algorithm>

#include "ops/ops_internal.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/// The op that runs another op and expects it to fail.
constexpr std::string_view kExpectError = "expect_error";

bool is_op(std::string_view name) {
  const auto& names = ops_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

[[noreturn]] void unknown_op(int64_t line_no, std::string_view op) {
  fail_at(line_no, fmt::format("unknown op '{}' (ops: {})", printable(op, 40),
                               fmt::join(ops_names(), ", ")));
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  const size_t n = std::min(text.size(), max_bytes);
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > max_bytes) out += "...";
  return out;
}

void fail_at(int64_t line, const std::string& message) {
  // The message's own text is ASCII; a control byte can only come from an echoed token that a
  // caller did not pass through printable(): escape it here too, so stderr stays one line.
  std::string safe;
  safe.reserve(message.size());
  for (char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      safe += fmt::format("\\x{:02x}", u);
    } else {
      safe += c;
    }
  }
  throw Error(fmt::format("line {}: {}", line, safe));
}

std::optional<OpsLine> parse_ops_line(std::string_view raw, int64_t line_no) {
  if (static_cast<int64_t>(raw.size()) > OpsLimits::kMaxLineBytes)
    fail_at(line_no, fmt::format("line longer than {} bytes", OpsLimits::kMaxLineBytes));
  if (size_t hash = raw.find('#'); hash != std::string_view::npos) raw = raw.substr(0, hash);
  std::vector<std::string_view> tokens;
  for (size_t i = 0; i < raw.size();) {
    while (i < raw.size() && is_space(raw[i])) ++i;
    size_t j = i;
    while (j < raw.size() && !is_space(raw[j])) ++j;
    if (j > i) tokens.push_back(raw.substr(i, j - i));
    i = j;
  }
  if (tokens.empty()) return std::nullopt;
  OpsLine l;
  l.line = line_no;
  l.op = std::string(tokens[0]);
  if (!is_op(l.op)) unknown_op(line_no, l.op);
  size_t first_arg = 1;
  if (l.op == kExpectError) {
    // `expect_error OP ARGS...`: the inner op is checked like any op, so a typo is a parse
    // error, not an "expected" one.
    if (tokens.size() < 2 || tokens[1].find('=') != std::string_view::npos)
      fail_at(line_no, "expect_error: expected an op after expect_error");
    if (tokens[1] == kExpectError) fail_at(line_no, "expect_error: cannot be nested");
    if (!is_op(tokens[1])) unknown_op(line_no, tokens[1]);
    l.args.emplace_back(tokens[1]);
    first_arg = 2;
  }
  for (size_t i = first_arg; i < tokens.size(); ++i) {
    std::string_view t = tokens[i];
    if (size_t eq = t.find('='); eq != std::string_view::npos) {
      std::string key(t.substr(0, eq));
      if (key.empty() || eq + 1 == t.size()) {
        fail_at(line_no,
                fmt::format("{}: malformed option '{}' (expected key=value)", l.op, printable(t)));
      }
      if (!l.options.emplace(key, std::string(t.substr(eq + 1))).second) {
        fail_at(line_no, fmt::format("{}: option '{}' given twice", l.op, printable(key)));
      }
    } else {
      if (!l.options.empty()) {
        fail_at(line_no,
                fmt::format("{}: positional argument '{}' after an option", l.op, printable(t)));
      }
      l.args.emplace_back(t);
    }
  }
  return l;
}

void for_each_ops_line(std::string_view text, const std::function<void(const OpsLine&)>& fn) {
  if (static_cast<int64_t>(text.size()) > OpsLimits::kMaxScriptBytes)
    throw Error(fmt::format("script longer than {} bytes", OpsLimits::kMaxScriptBytes));
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view raw = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (auto l = parse_ops_line(raw, ++line_no)) fn(*l);
  }
}

std::vector<OpsLine> parse_ops_script(std::string_view text) {
  std::vector<OpsLine> out;
  for_each_ops_line(text, [&](const OpsLine& l) { out.push_back(l); });
  return out;
}

}  // namespace pagedkv::ops
