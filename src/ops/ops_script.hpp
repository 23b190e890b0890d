#pragma once
/// @file ops_script.hpp
/// The `pagedkv ops` script language: a plain-text list of KVCacheManager operations, one per
/// line, executed in order, with JSON results. Lets users unit-test allocator and eviction
/// behaviour without writing C++. Format, limits and worked examples: docs/ops-script.md.
///
/// Split into a reader (bytes -> script text, limits enforced while reading; ops_input.cpp), a
/// parser (text -> OpsLine, no manager involved; the fuzzing entry point; ops_parse.cpp) and an
/// executor (OpsLine -> manager call -> optional JSON; ops_execute.cpp, ops_handlers.cpp,
/// ops_print.cpp). Not part of the installed API.
///
/// Bounded against hostile scripts (issue 16): the limits below make memory, time and output
/// linear in the script's size. Every op's cost is bounded by them and ops print only what they
/// changed (an append prints its slots and new blocks, not the whole table).

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::ops {

/// Limits of a script, documented in docs/ops-script.md ("Limits"). Exceeding one is an error
/// naming the limit (exit 2 from the CLI), checked before anything is allocated for it.
struct OpsLimits {
  /// Bytes of one line, newline excluded (checked while reading: /dev/zero stops here).
  static constexpr int64_t kMaxLineBytes = int64_t{1} << 20;
  /// Bytes of the whole script (the script is read whole, then parsed, before anything runs).
  static constexpr int64_t kMaxScriptBytes = int64_t{16} << 20;
  /// Tokens one op may name or ask for: prompt or appended tokens, n=COUNT, can_append COUNT,
  /// lookahead=N, score weights, batch_metadata new tokens (and its padded table entries).
  static constexpr int64_t kMaxTokensPerOp = int64_t{1} << 16;
  /// Tokens the script may hold at once: every sequence's num_tokens (a fork copies its
  /// parent's) plus the token ids kept for `resume` of preempted sequences.
  static constexpr int64_t kMaxTotalTokens = int64_t{1} << 20;
  /// Sequences the script may hold at once: the manager's plus the preempted ones kept for
  /// `resume` (an empty sequence holds no token but costs metadata, and a line in `dump`).
  static constexpr int64_t kMaxSequences = int64_t{1} << 16;
  /// Blocks of the device or host pool a `manager` line may ask for.
  static constexpr int64_t kMaxBlocks = int64_t{1} << 18;
  /// Tokens per block a `manager` line may ask for.
  static constexpr int64_t kMaxBlockSize = int64_t{1} << 16;
  /// KV cache groups a `manager ... groups=` line may declare.
  static constexpr int64_t kMaxGroups = 64;
  /// Work budget: an op is charged, before it runs, one unit per token or block it touches or
  /// prints (a `manager` line its blocks, `fork` its parent's tokens and table, `dump` the whole
  /// state...) and one for the line. A script may spend kWorkBase plus kWorkPerByte per byte
  /// of its text: time and output then grow at most linearly with the script, whatever it
  /// repeats (a million `dump` lines of a large state, `fork`/`free` cycles, `manager` lines
  /// of the largest pool).
  static constexpr int64_t kWorkBase = int64_t{1} << 24;
  static constexpr int64_t kWorkPerByte = 2;
  /// The budget of a script of `script_bytes` bytes.
  static constexpr int64_t work_budget(int64_t script_bytes) {
    return kWorkBase + kWorkPerByte * script_bytes;
  }
};

/// One parsed script line: `op arg arg key=value ...`. Arguments stay text; the executor
/// converts them (it knows which are integers, weights or names).
struct OpsLine {
  int64_t line = 0;  ///< 1-based line number in the script
  std::string op;
  std::vector<std::string> args;
  std::map<std::string, std::string> options;
};

/// Names of every op, in documentation order.
[[nodiscard]] const std::vector<std::string>& ops_names();

/// `text` safe to echo in a one-line message: bytes outside printable ASCII as \xNN, a
/// backslash as \\, and cut after `max_bytes` input bytes with "..." appended.
[[nodiscard]] std::string printable(std::string_view text, size_t max_bytes = 64);

/// Parses one line (without its newline) numbered `line_no`; empty for a blank or comment line.
/// Errors: throws pagedkv::Error "line N: ..." naming the offending token (escaped, see
/// printable()) for a line over kMaxLineBytes, an unknown op, a repeated or empty keyword, a
/// positional argument after a keyword, or an `expect_error` not followed by another op.
[[nodiscard]] std::optional<OpsLine> parse_ops_line(std::string_view raw, int64_t line_no);

/// Calls `fn` with every parsed line of `text`, in order. Blank lines and `#` comments
/// (whole-line or trailing) are skipped. Errors: as parse_ops_line, and a text over
/// kMaxScriptBytes; `fn`'s exceptions pass through.
void for_each_ops_line(std::string_view text, const std::function<void(const OpsLine&)>& fn);

/// Parses a whole script into lines (tests and the fuzzer; the CLI re-parses line by line
/// instead of holding every OpsLine). Errors: as for_each_ops_line.
[[nodiscard]] std::vector<OpsLine> parse_ops_script(std::string_view text);

/// Reads a script from `in` (stdin: a pipe, a terminal, /dev/zero...) in chunks, enforcing
/// kMaxLineBytes and kMaxScriptBytes while reading, so an endless input stops at the first limit.
/// Errors: throws pagedkv::Error "line N: line longer than 1048576 bytes" or "script longer
/// than 16777216 bytes", or naming `name` on a read error.
[[nodiscard]] std::string read_ops_script(std::FILE* in, std::string_view name);

/// Opens `path` and reads it with read_ops_script. Only a regular file is accepted: a directory,
/// a device (/dev/zero), a FIFO or a socket is refused before reading (pipe a stream to stdin).
/// Errors: throws pagedkv::Error "cannot read script 'PATH': ..." naming the reason.
[[nodiscard]] std::string read_ops_script_file(const std::string& path);

/// Runs parsed lines against a KVCacheManager that the script's `manager` line creates.
class OpsExecutor {
 public:
  /// An executor that may spend `work_budget` units (OpsLimits::work_budget of the script's
  /// size; the default is the budget of an empty script).
  explicit OpsExecutor(int64_t work_budget = OpsLimits::work_budget(0));
  ~OpsExecutor();
  OpsExecutor(const OpsExecutor&) = delete;
  OpsExecutor& operator=(const OpsExecutor&) = delete;

  /// Executes one line; returns its JSON result for ops that report one (see
  /// docs/ops-script.md), empty for the others. An op that fails for lack of blocks returns
  /// {"ok": false, "error": ...} and changes nothing. `expect_error OP ...` runs OP, which must
  /// throw: its message is the result and the script goes on with the state unchanged.
  /// Errors: throws pagedkv::Error "line N: ..." for a wrong argument count or value, a limit
  /// of OpsLimits exceeded, an op before `manager`, a contract violation reported by the
  /// manager (unknown sequence...), or an `expect_error` whose op succeeded. Nothing changes
  /// (but the work units charged).
  std::optional<nlohmann::ordered_json> execute(const OpsLine& line);

  /// The manager, or null before the first `manager` line and while a `manager ... groups=`
  /// line's hybrid manager is in use.
  [[nodiscard]] const KVCacheManager* manager() const;
  /// The hybrid manager of a `manager ... groups=` line, else null.
  [[nodiscard]] const HybridKVCacheManager* hybrid_manager() const;
  /// Tokens held now, as counted against OpsLimits::kMaxTotalTokens.
  [[nodiscard]] int64_t held_tokens() const;
  /// Work units left of the budget.
  [[nodiscard]] int64_t work_left() const;

  struct State;  ///< the manager, the preempted sequences and the token count (ops_internal.hpp)

 private:
  std::unique_ptr<State> state_;
};

/// for_each_ops_line + OpsExecutor (with the text's work budget) over the whole text: the JSON
/// results in order. The whole text is parsed before any line runs.
/// Errors: as parse_ops_script and OpsExecutor::execute (stops at the first bad line).
[[nodiscard]] std::vector<nlohmann::ordered_json> run_ops_script(std::string_view text);

}  // namespace pagedkv::ops
