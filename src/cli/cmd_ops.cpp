// `pagedkv ops`: runs a plain-text script of block-manager operations (docs/ops-script.md) and
// prints one JSON object per line for every op that reports a result. Lets users unit-test
// allocator and eviction behaviour without writing C++.

#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "cli/commands.hpp"
#include "ops/ops_script.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::cli {

void add_ops_command(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "ops",
      "Run a script of KV-cache manager operations (one per line: manager, add, append, fork, "
      "free, swap_out, swap_in, preempt, ...) and print JSON results; see docs/ops-script.md.");
  CLI::Option* script = cmd->add_option("script", *path, "Script file; '-' or none reads stdin");
  cmd->callback([path, script] {
    // An empty path given explicitly (`pagedkv ops ''`, an unset shell variable) is a mistake,
    // not a request for stdin, which would then wait on a terminal.
    if (script->count() > 0 && path->empty()) {
      throw Error("the script path is empty (give a file, or '-' for stdin)");
    }
    // Read with the limits checked as bytes arrive, parse everything (a syntax error anywhere
    // runs nothing), then run line by line, printing each result as it comes: memory is the
    // script's bytes plus the manager, never the whole output.
    const std::string text = path->empty() || *path == "-" ? ops::read_ops_script(stdin, "<stdin>")
                                                           : ops::read_ops_script_file(*path);
    ops::for_each_ops_line(text, [](const ops::OpsLine&) {});
    ops::OpsExecutor ex(ops::OpsLimits::work_budget(static_cast<int64_t>(text.size())));
    ops::for_each_ops_line(text, [&](const ops::OpsLine& l) {
      if (auto j = ex.execute(l)) {
        std::fputs(j->dump().c_str(), stdout);
        std::fputc('\n', stdout);
      }
    });
    std::fflush(stdout);
  });
}

}  // namespace pagedkv::cli
