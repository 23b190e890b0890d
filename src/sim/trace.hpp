#pragma once
/// @file trace.hpp
/// Readers for production LLM-serving request traces, loaded as they are published:
///  - Azure LLM inference trace 2023 (Patel et al., "Splitwise", ISCA 2024), CSV with a header
///    TIMESTAMP,ContextTokens,GeneratedTokens; TIMESTAMP is wall-clock
///    "YYYY-MM-DD HH:MM:SS[.fraction]" (a plain number is read as seconds);
///  - Mooncake FAST'25 trace (Qin et al., "Mooncake", FAST 2025), JSON lines with timestamp (ms
///    from trace start), input_length, output_length and hash_ids: ids of the prompt's
///    512-token blocks, where equal ids mark the same prefix content.
///
/// Bad input policy (issue 6): a missing or unreadable file, or a CSV header without the
/// required columns, always throws. A bad row (wrong field count, empty, non-numeric,
/// negative, zero prompt, invalid JSON, hash_ids of the wrong length, timestamp earlier than
/// the previous accepted row) throws in strict mode, and otherwise is skipped and counted.
/// Unknown extra columns / keys throw in strict mode and are otherwise ignored with a warning.
/// Every message starts "<source>:<line>: ". Lines are numbered from 1, the CSV header is 1.

#include <cstdint>
#include <istream>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv::sim {

/// Tokens per Mooncake hash block (the trace README: "block size 512").
inline constexpr int64_t kMooncakeHashBlockTokens = 512;

enum class TraceFormat { kAzureCsv, kMooncakeJsonl };

/// "azure-csv" or "mooncake-jsonl".
[[nodiscard]] std::string_view trace_format_name(TraceFormat format);

/// One request of a trace. 24 bytes of payload + the line number: a 20k-row trace is ~0.8 MB.
struct TraceRequest {
  double arrival_ms = 0;      ///< ms after the first accepted row (>= 0, non-decreasing)
  int64_t prompt_tokens = 0;  ///< >= 1
  int64_t output_tokens = 0;  ///< >= 0 (0 = prefill only)
  int64_t line = 0;           ///< source line, for messages
  uint32_t hash_begin = 0;    ///< first index into Trace::hash_ids
  uint32_t hash_count = 0;    ///< number of prefix-block hash ids (0 when the format has none)
};

/// A skipped row or an ignored oddity, for the summary.
struct TraceProblem {
  int64_t line = 0;
  std::string message;  ///< "<source>:<line>: <what>"
};

/// A loaded trace and what was wrong with its input.
struct Trace {
  std::string source;  ///< file path or the name given to a stream reader
  TraceFormat format = TraceFormat::kAzureCsv;
  std::vector<TraceRequest> requests;  ///< accepted rows in file order
  std::vector<int64_t> hash_ids;       ///< all requests' hash ids back to back
  int64_t hash_block_tokens = 0;       ///< tokens per hash id (512 for Mooncake), 0 when none
  int64_t rows_read = 0;               ///< data rows seen (header and final newline excluded)
  int64_t rows_skipped = 0;            ///< rows_read - requests.size()
  std::map<std::string, int64_t> skipped_by_reason;  ///< reason key -> rows
  std::vector<TraceProblem> problems;                ///< the first kMaxProblemsKept skipped rows
  std::vector<std::string> warnings;                 ///< file-level notes (ignored columns / keys)

  static constexpr size_t kMaxProblemsKept = 20;

  /// The hash ids of one request. Shapes: [r.hash_count].
  [[nodiscard]] std::span<const int64_t> hashes(const TraceRequest& r) const {
    return {hash_ids.data() + r.hash_begin, r.hash_count};
  }
};

struct TraceReadOptions {
  bool strict = false;  ///< throw on the first bad row / unknown column instead of skipping
};

/// Reads an Azure LLM inference trace CSV from `in`; `source` names it in messages.
/// Errors: throws pagedkv::Error "<source>:1: ..." when the header is missing or lacks a
/// required column (naming the columns found); in strict mode also on the first bad row.
[[nodiscard]] Trace read_azure_csv(std::istream& in, std::string_view source,
                                   const TraceReadOptions& options = {});

/// Reads a Mooncake JSONL trace from `in`. hash_ids is optional (a row without it has no
/// prefix information); when present it must hold ceil(input_length / 512) non-negative ids.
/// Errors: in strict mode throws pagedkv::Error "<source>:<line>: ..." on the first bad row or
/// unknown key.
[[nodiscard]] Trace read_mooncake_jsonl(std::istream& in, std::string_view source,
                                        const TraceReadOptions& options = {});

/// Opens `path` and reads it with the reader its format needs: ".csv" -> Azure, ".jsonl" /
/// ".json" -> Mooncake, otherwise by content (first non-blank character '{' -> Mooncake).
/// Errors: throws pagedkv::Error "cannot read trace '<path>': <reason>" when the file is
/// missing, a directory or unreadable; then as the readers.
[[nodiscard]] Trace read_trace(const std::string& path, const TraceReadOptions& options = {});

/// Parses an Azure TIMESTAMP "YYYY-MM-DD HH:MM:SS[.fraction]" (also with 'T') to nanoseconds
/// since 1970-01-01 (UTC assumed; only differences are used), or a plain decimal number of
/// seconds. Returns false when the text is neither.
[[nodiscard]] bool parse_timestamp_ns(std::string_view text, int64_t& ns);

}  // namespace pagedkv::sim
