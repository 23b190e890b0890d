#pragma once
/// @file ops_script.hpp
/// The `pagedkv ops` script language: a plain-text list of KVCacheManager operations, one per
/// line, executed in order, with JSON results. Lets users unit-test allocator and eviction
/// behaviour without writing C++. Format and worked examples: docs/ops-script.md.
///
/// Split into a parser (text -> OpsLine, no manager involved; the fuzzing entry point) and an
/// executor (OpsLine -> manager call -> optional JSON). Not part of the installed API.

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::ops {

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

/// Parses a whole script. Blank lines and `#` comments (whole-line or trailing) are skipped.
/// Errors: throws pagedkv::Error "line N: ..." naming the offending token for an unknown op, a
/// repeated or empty keyword, or a positional argument after a keyword. Arity and value checks
/// happen in OpsExecutor.
[[nodiscard]] std::vector<OpsLine> parse_ops_script(std::string_view text);

/// Runs parsed lines against a KVCacheManager that the script's `manager` line creates.
class OpsExecutor {
 public:
  OpsExecutor() = default;

  /// Executes one line; returns its JSON result for ops that report one (see
  /// docs/ops-script.md), empty for the others. An op that fails for lack of blocks returns
  /// {"ok": false, "error": ...} and changes nothing.
  /// Errors: throws pagedkv::Error "line N: ..." for a wrong argument count or value, an op
  /// before `manager`, or a contract violation reported by the manager (unknown sequence...).
  std::optional<nlohmann::ordered_json> execute(const OpsLine& line);

  /// The manager, or null before the first `manager` line.
  [[nodiscard]] const KVCacheManager* manager() const { return manager_.get(); }

 private:
  /// Creates the manager (`manager`) or runs the op's handler on it.
  std::optional<nlohmann::ordered_json> run(const OpsLine& line);

  std::unique_ptr<KVCacheManager> manager_;
  std::map<SeqId, PreemptedSequence> preempted_;
};

/// parse_ops_script + OpsExecutor over the whole text: the JSON results in order.
/// Errors: as parse_ops_script and OpsExecutor::execute (stops at the first bad line).
[[nodiscard]] std::vector<nlohmann::ordered_json> run_ops_script(std::string_view text);

}  // namespace pagedkv::ops
