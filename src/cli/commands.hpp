#pragma once
/// @file commands.hpp
/// The subcommands of the `pagedkv` executable. main.cpp builds the CLI::App and calls every
/// add_*_command below; each registers its options and a callback that does the work.
///
/// Contract for a command's callback (main.cpp enforces the exit codes):
///  - bad input (a flag value, a missing or corrupt file): throw pagedkv::Error with a one-line
///    message naming the value -> "pagedkv <command>: <message>" on stderr, exit 2;
///    CLI::ParseError / CLI::ValidationError are reported the same way;
///  - any other exception is an internal failure: one line on stderr, exit 1;
///  - a command that wants another exit status throws cli::ExitStatus after printing.
/// Adding a command: declare add_<name>_command here, define it in src/cli/cmd_<name>.cpp (the
/// CMakeLists globs cmd_*.cpp), call it from main.cpp.

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>

namespace pagedkv::cli {

/// Check for a uint64 option (a seed): decimal digits only, at most 2^64 - 1. Without it
/// CLI11 reads "-1" and values past 2^64 - 1 as 2^64 - 1 (strtoull's wrap and saturation), so
/// different seeds would silently be one.
inline CLI::Validator uint64_digits() {
  return {[](std::string& value) {
            uint64_t x = 0;
            const char* end = value.data() + value.size();
            const auto [ptr, ec] = std::from_chars(value.data(), end, x);
            if (value.empty() || ec != std::errc() || ptr != end) {
              return "must be a decimal integer in [0, 18446744073709551615], got " + value;
            }
            return std::string();
          },
          "UINT64"};
}

/// Thrown by a command that has already reported its outcome and wants exit status `code`.
struct ExitStatus {
  int code;
};

/// `pagedkv generate`: run a Llama model (built-in or llama2.c files) through the paged,
/// contiguous and no-cache modes; see docs/cli.md.
void add_generate_command(CLI::App& app);

/// `pagedkv memory`: KV bytes per token and growth table for a model preset, plus a real tiny
/// model's measured cache bytes vs the formula; see docs/memory.md.
void add_memory_command(CLI::App& app);

/// `pagedkv replay`: request-trace replay through the scheduler simulation, contiguous vs paged
/// vs prefix caching under one KV budget; see docs/memory.md.
void add_replay_command(CLI::App& app);

/// `pagedkv ops`: run a script of KV-cache manager operations, JSON results; see
/// docs/ops-script.md.
void add_ops_command(CLI::App& app);

}  // namespace pagedkv::cli
