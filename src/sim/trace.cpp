#include "sim/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/check.hpp"
#include "core/enum_names.hpp"

namespace pagedkv::sim {

namespace {

// Token counts above this are certainly corrupt (no model has a billion-token context), and the
// bound keeps every later sum of tokens far from int64 overflow.
constexpr int64_t kMaxTokens = 1'000'000'000;

constexpr detail::EnumName<TraceFormat> kTraceFormatNames[] = {
    {TraceFormat::kAzureCsv, "azure-csv"},
    {TraceFormat::kMooncakeJsonl, "mooncake-jsonl"},
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string_view unquote(std::string_view s) {
  s = trim(s);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

/// Input echoed in a message: control and non-ASCII bytes become '?', long text is cut, so a
/// binary file still yields a one-line, readable message.
std::string shown(std::string_view s, size_t max_chars = 60) {
  std::string out;
  for (char c : s.substr(0, max_chars)) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(u >= 0x20 && u < 0x7F ? c : '?');
  }
  if (s.size() > max_chars) out += "...";
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

/// Collects rows, applies the strict / skip policy and the timestamp order check.
class RowSink {
 public:
  RowSink(Trace& trace, const TraceReadOptions& options) : trace_(trace), options_(options) {}

  /// Records (or, in strict mode, throws for) a bad row.
  void reject(int64_t line, std::string_view reason, const std::string& what) {
    std::string message = fmt::format("{}:{}: {}", trace_.source, line, what);
    if (options_.strict) throw Error(message + " (--strict)");
    ++trace_.rows_skipped;
    ++trace_.skipped_by_reason[std::string(reason)];
    if (trace_.problems.size() < Trace::kMaxProblemsKept) {
      trace_.problems.push_back({line, std::move(message)});
    }
  }

  /// A file-level oddity that does not drop rows (unknown columns or keys).
  void warn(int64_t line, const std::string& what) {
    std::string message = fmt::format("{}:{}: {}", trace_.source, line, what);
    if (options_.strict) throw Error(message + " (--strict)");
    trace_.warnings.push_back(std::move(message));
  }

  /// Accepts a row whose fields are valid, unless its timestamp goes backwards.
  void accept(int64_t line, int64_t timestamp_ns, int64_t prompt, int64_t output,
              std::span<const int64_t> hashes) {
    if (have_last_ && timestamp_ns < last_ns_) {
      reject(line, "timestamp out of order",
             fmt::format("timestamp {:.3f} s is earlier than the previous row's {:.3f} s "
                         "(timestamps must be non-decreasing)",
                         static_cast<double>(timestamp_ns - first_ns_) * 1e-9,
                         static_cast<double>(last_ns_ - first_ns_) * 1e-9));
      return;
    }
    if (!have_last_) first_ns_ = timestamp_ns;
    have_last_ = true;
    last_ns_ = timestamp_ns;
    TraceRequest r;
    r.arrival_ms = static_cast<double>(timestamp_ns - first_ns_) * 1e-6;
    r.prompt_tokens = prompt;
    r.output_tokens = output;
    r.line = line;
    r.hash_begin = static_cast<uint32_t>(trace_.hash_ids.size());
    r.hash_count = static_cast<uint32_t>(hashes.size());
    trace_.hash_ids.insert(trace_.hash_ids.end(), hashes.begin(), hashes.end());
    trace_.requests.push_back(r);
  }

 private:
  Trace& trace_;
  const TraceReadOptions& options_;
  bool have_last_ = false;
  int64_t first_ns_ = 0;
  int64_t last_ns_ = 0;
};

/// Outcome of parsing one field; on failure `reason` (the skipped_by_reason key) and `what`
/// (the message) describe it.
template <typename T>
struct Parsed {
  std::optional<T> value;
  std::string_view reason;
  std::string what;
};

Parsed<int64_t> parse_count(std::string_view field, std::string_view column, int64_t min_value) {
  field = unquote(field);
  if (field.empty()) return {std::nullopt, "empty field", fmt::format("{} is empty", column)};
  int64_t v = 0;
  const char* first = field.data();
  const char* last = field.data() + field.size();
  if (*first == '+') ++first;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc::result_out_of_range || (ec == std::errc() && end == last && v > kMaxTokens))
    return {std::nullopt, "out of range",
            fmt::format("{} '{}' is out of range (max {})", column, shown(field), kMaxTokens)};
  if (ec != std::errc() || end != last)
    return {std::nullopt, "non-numeric",
            fmt::format("{} '{}' is not a whole number", column, shown(field))};
  if (v < 0) return {std::nullopt, "negative", fmt::format("{} is negative ({})", column, v)};
  if (v < min_value)
    return {std::nullopt, "zero prompt",
            fmt::format("{} is {} (must be >= {})", column, v, min_value)};
  return {v, {}, {}};
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant, "chrono-Compatible Low-Level
// Date Algorithms", days_from_civil).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

bool read_digits(std::string_view s, size_t& pos, size_t n, int64_t& out) {
  if (pos + n > s.size()) return false;
  out = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[pos + i];
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  pos += n;
  return true;
}

bool expect(std::string_view s, size_t& pos, std::string_view chars) {
  if (pos >= s.size() || chars.find(s[pos]) == std::string_view::npos) return false;
  ++pos;
  return true;
}

// ---- Mooncake rows ------------------------------------------------------------------------------

using nlohmann::json;

/// The keys a Mooncake row may hold; any other is warned about once per file.
bool is_mooncake_key(std::string_view key) {
  return key == "timestamp" || key == "input_length" || key == "output_length" || key == "hash_ids";
}

void warn_unknown_keys(RowSink& sink, int64_t line_no, const json& row,
                       std::vector<std::string>& warned_keys) {
  for (const auto& [key, value] : row.items()) {
    if (is_mooncake_key(key) || std::ranges::find(warned_keys, key) != warned_keys.end()) continue;
    warned_keys.push_back(key);
    sink.warn(line_no, fmt::format("ignoring unknown key '{}'", shown(key)));
  }
}

/// The timestamp, ms (it may be fractional: only its type, sign and range are checked).
Parsed<double> json_timestamp(const json& row) {
  const auto it = row.find("timestamp");
  if (it == row.end() || it->is_null())
    return {std::nullopt, "empty field", "missing key 'timestamp'"};
  if (!it->is_number()) {
    return {std::nullopt, "non-numeric",
            fmt::format("timestamp {} is not a number", shown(it->dump()))};
  }
  const double ms = it->get<double>();
  if (ms < 0) {
    return {std::nullopt, "negative", fmt::format("timestamp is negative ({})", it->dump())};
  }
  if (ms > 9e12) {
    return {std::nullopt, "out of range",
            fmt::format("timestamp {} ms is out of range", it->dump())};
  }
  return {ms, {}, {}};
}

/// A token count: missing, wrong type, negative, too large or below `min_value` -> one reason
/// each.
Parsed<int64_t> json_count(const json& row, const char* key, int64_t min_value) {
  const auto it = row.find(key);
  if (it == row.end() || it->is_null()) {
    return {std::nullopt, "empty field", fmt::format("missing key '{}'", key)};
  }
  if (!it->is_number_integer()) {
    return {std::nullopt, "non-numeric",
            fmt::format("{} {} is not a whole number", key, shown(it->dump()))};
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(kMaxTokens)) {
    return {std::nullopt, "out of range",
            fmt::format("{} {} is out of range (max {})", key, it->dump(), kMaxTokens)};
  }
  const int64_t v = it->get<int64_t>();
  if (v < 0) return {std::nullopt, "negative", fmt::format("{} is negative ({})", key, v)};
  if (v > kMaxTokens) {
    return {std::nullopt, "out of range",
            fmt::format("{} {} is out of range (max {})", key, v, kMaxTokens)};
  }
  if (v < min_value) {
    return {std::nullopt, "zero prompt",
            fmt::format("{} is {} (must be >= {})", key, v, min_value)};
  }
  return {v, {}, {}};
}

/// Reads the optional hash_ids into `hashes` (cleared first); the message of what is wrong
/// with them, or empty when they are valid.
std::string json_hash_ids(const json& row, int64_t prompt, std::vector<int64_t>& hashes) {
  hashes.clear();
  const auto it = row.find("hash_ids");
  if (it == row.end() || it->is_null()) return {};
  bool ok = it->is_array();
  if (ok) {
    for (const json& h : *it) {
      if (!h.is_number_integer() || h.get<int64_t>() < 0) {
        ok = false;
        break;
      }
      hashes.push_back(h.get<int64_t>());
    }
  }
  if (!ok) return "hash_ids must be an array of non-negative whole numbers";
  const int64_t expected = (prompt + kMooncakeHashBlockTokens - 1) / kMooncakeHashBlockTokens;
  if (static_cast<int64_t>(hashes.size()) != expected) {
    return fmt::format("hash_ids has {} entries, expected ceil(input_length {} / {}) = {}",
                       hashes.size(), prompt, kMooncakeHashBlockTokens, expected);
  }
  return {};
}

/// One non-blank Mooncake line: accepted into the sink, or rejected with its first problem.
void read_mooncake_row(RowSink& sink, int64_t line_no, const std::string& line,
                       std::vector<std::string>& warned_keys, std::vector<int64_t>& hashes) {
  const json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (row.is_discarded() || !row.is_object()) {
    sink.reject(line_no, "invalid JSON",
                row.is_discarded() ? "not valid JSON" : "not a JSON object");
    return;
  }
  warn_unknown_keys(sink, line_no, row, warned_keys);
  const Parsed<double> ts = json_timestamp(row);
  if (!ts.value) return sink.reject(line_no, ts.reason, ts.what);
  const Parsed<int64_t> prompt = json_count(row, "input_length", 1);
  if (!prompt.value) return sink.reject(line_no, prompt.reason, prompt.what);
  const Parsed<int64_t> output = json_count(row, "output_length", 0);
  if (!output.value) return sink.reject(line_no, output.reason, output.what);
  if (const std::string bad = json_hash_ids(row, *prompt.value, hashes); !bad.empty()) {
    return sink.reject(line_no, "bad hash_ids", bad);
  }
  sink.accept(line_no, static_cast<int64_t>(*ts.value * 1e6), *prompt.value, *output.value, hashes);
}

}  // namespace

std::string_view trace_format_name(TraceFormat format) {
  return detail::enum_name<TraceFormat>(kTraceFormatNames, format);
}

bool parse_timestamp_ns(std::string_view text, int64_t& ns) {
  text = unquote(text);
  if (text.empty()) return false;
  size_t pos = 0;
  int64_t y, mo, d, h, mi, s;
  if (text.size() >= 19 && read_digits(text, pos, 4, y) && expect(text, pos, "-") &&
      read_digits(text, pos, 2, mo) && expect(text, pos, "-") && read_digits(text, pos, 2, d) &&
      expect(text, pos, " T") && read_digits(text, pos, 2, h) && expect(text, pos, ":") &&
      read_digits(text, pos, 2, mi) && expect(text, pos, ":") && read_digits(text, pos, 2, s)) {
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) return false;
    // int64 nanoseconds span 1677..2262; outside [1900, 2200] a trace timestamp is corrupt.
    if (y < 1900 || y > 2200) return false;
    int64_t frac_ns = 0;
    if (pos < text.size() && text[pos] == '.') {
      ++pos;
      int64_t scale = 100'000'000;
      size_t digits = 0;
      while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
        frac_ns += (text[pos] - '0') * scale;  // digits beyond ns resolution add 0
        scale /= 10;
        ++pos;
        ++digits;
      }
      if (digits == 0) return false;
    }
    if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) ++pos;
    if (pos != text.size()) return false;
    ns = ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60 + s;
    ns = ns * 1'000'000'000 + frac_ns;
    return true;
  }
  // A plain number of seconds (what other exports of the trace use).
  double seconds = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec != std::errc() || end != text.data() + text.size()) return false;
  if (!(seconds >= 0) || seconds > 9e9) return false;
  ns = static_cast<int64_t>(seconds * 1e9);
  return true;
}

Trace read_azure_csv(std::istream& in, std::string_view source, const TraceReadOptions& options) {
  Trace trace;
  trace.source = std::string(source);
  trace.format = TraceFormat::kAzureCsv;
  RowSink sink(trace, options);

  std::string line;
  int64_t line_no = 0;
  // Header: the first line, a UTF-8 byte-order mark tolerated.
  if (!std::getline(in, line)) {
    throw Error(
        fmt::format("{}:1: empty file: expected the header "
                    "TIMESTAMP,ContextTokens,GeneratedTokens",
                    trace.source));
  }
  line_no = 1;
  std::string_view header = line;
  if (header.starts_with("\xEF\xBB\xBF")) header.remove_prefix(3);
  std::vector<std::string> columns;
  for (size_t start = 0;;) {
    const size_t comma = header.find(',', start);
    columns.emplace_back(unquote(header.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  constexpr std::array<std::string_view, 3> kRequired = {"TIMESTAMP", "ContextTokens",
                                                         "GeneratedTokens"};
  std::array<int, 3> index = {-1, -1, -1};
  std::vector<bool> known(columns.size(), false);
  for (size_t c = 0; c < columns.size(); ++c) {
    for (size_t k = 0; k < kRequired.size(); ++k) {
      if (iequals(columns[c], kRequired[k]) && index[k] < 0) {
        index[k] = static_cast<int>(c);
        known[c] = true;
      }
    }
  }
  // A missing column is the more useful message, so it comes before unknown-column notes.
  for (size_t k = 0; k < kRequired.size(); ++k) {
    if (index[k] < 0) {
      throw Error(fmt::format(
          "{}:1: missing column '{}' (found: {}; expected "
          "TIMESTAMP,ContextTokens,GeneratedTokens)",
          trace.source, kRequired[k], shown(fmt::format("{}", fmt::join(columns, ",")), 120)));
    }
  }
  for (size_t c = 0; c < columns.size(); ++c) {
    if (!known[c]) sink.warn(1, fmt::format("ignoring unknown column '{}'", shown(columns[c])));
  }

  std::vector<std::string_view> fields;
  while (std::getline(in, line)) {
    ++line_no;
    ++trace.rows_read;
    const std::string_view row = line;
    if (trim(row).empty()) {
      sink.reject(line_no, "empty row", "empty row");
      continue;
    }
    fields.clear();
    for (size_t start = 0;;) {
      const size_t comma = row.find(',', start);
      fields.push_back(row.substr(start, comma - start));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (fields.size() != columns.size()) {
      sink.reject(line_no, "wrong field count",
                  fmt::format("expected {} fields, got {}", columns.size(), fields.size()));
      continue;
    }
    int64_t ts = 0;
    if (!parse_timestamp_ns(fields[index[0]], ts)) {
      const std::string_view f = unquote(fields[index[0]]);
      sink.reject(line_no, f.empty() ? "empty field" : "bad timestamp",
                  f.empty() ? std::string("TIMESTAMP is empty")
                            : fmt::format("TIMESTAMP '{}' is not 'YYYY-MM-DD HH:MM:SS[.f]' or "
                                          "a number of seconds",
                                          shown(f)));
      continue;
    }
    const Parsed<int64_t> prompt = parse_count(fields[index[1]], "ContextTokens", 1);
    if (!prompt.value) {
      sink.reject(line_no, prompt.reason, prompt.what);
      continue;
    }
    const Parsed<int64_t> output = parse_count(fields[index[2]], "GeneratedTokens", 0);
    if (!output.value) {
      sink.reject(line_no, output.reason, output.what);
      continue;
    }
    sink.accept(line_no, ts, *prompt.value, *output.value, {});
  }
  if (in.bad()) throw Error(fmt::format("{}:{}: read error", trace.source, line_no + 1));
  return trace;
}

Trace read_mooncake_jsonl(std::istream& in, std::string_view source,
                          const TraceReadOptions& options) {
  Trace trace;
  trace.source = std::string(source);
  trace.format = TraceFormat::kMooncakeJsonl;
  trace.hash_block_tokens = kMooncakeHashBlockTokens;
  RowSink sink(trace, options);

  std::vector<std::string> warned_keys;
  std::vector<int64_t> hashes;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    ++trace.rows_read;
    if (trim(line).empty()) {
      sink.reject(line_no, "empty row", "empty row");
      continue;
    }
    read_mooncake_row(sink, line_no, line, warned_keys, hashes);
  }
  if (in.bad()) throw Error(fmt::format("{}:{}: read error", trace.source, line_no + 1));
  return trace;
}

Trace read_trace(const std::string& path, const TraceReadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    throw Error(fmt::format("cannot read trace '{}': no such file", path));
  }
  if (fs::is_directory(st)) {
    throw Error(fmt::format("cannot read trace '{}': is a directory", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(fmt::format("cannot read trace '{}': {}", path, std::strerror(errno)));
  }
  std::string ext = fs::path(path).extension().string();
  std::ranges::transform(ext, ext.begin(), [](char c) {
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  });
  bool jsonl = ext == ".jsonl" || ext == ".json";
  if (ext != ".csv" && !jsonl) {
    // Unknown extension: sniff the first non-blank byte.
    int c;
    while ((c = in.peek()) != EOF && std::isspace(c)) in.get();
    jsonl = c == '{';
    in.clear();
    in.seekg(0);
  }
  return jsonl ? read_mooncake_jsonl(in, path, options) : read_azure_csv(in, path, options);
}

}  // namespace pagedkv::sim
