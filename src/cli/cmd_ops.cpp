// `pagedkv ops`: runs a plain-text script of block-manager operations (docs/ops-script.md) and
// prints one JSON object per line for every op that reports a result. Lets users unit-test
// allocator and eviction behaviour without writing C++.

#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "cli/commands.hpp"
#include "ops/ops_script.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cli {

namespace {

std::string read_all(const std::string& path) {
  std::ostringstream ss;
  if (path.empty() || path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("cannot open script '{}'", path));
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

void add_ops_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "ops",
      "Run a script of KV-cache manager operations (one per line: manager, add, append, fork, "
      "free, swap_out, swap_in, preempt, ...) and print JSON results; see docs/ops-script.md.");
  cmd->add_option("script", *path, "Script file; '-' or none reads stdin");
  cmd->callback([path] {
    const std::string text = read_all(*path);
    // Parse everything first: a syntax error anywhere runs nothing.
    const std::vector<ops::OpsLine> lines = ops::parse_ops_script(text);
    ops::OpsExecutor ex;
    for (const ops::OpsLine& l : lines) {
      if (auto j = ex.execute(l)) {
        std::fputs(j->dump().c_str(), stdout);
        std::fputc('\n', stdout);
      }
    }
    std::fflush(stdout);
  });
}

}  // namespace pagedkv::cli
