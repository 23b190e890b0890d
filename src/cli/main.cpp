// The `pagedkv` executable: one CLI::App, one subcommand per feature (see commands.hpp).

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <new>
#include <string>

#include "cli/commands.hpp"
#include "pagedkv/error.hpp"

namespace {

/// The subcommand being run, for error messages ("pagedkv generate: ...").
std::string command_name(const CLI::App& app) {
  std::string name = "pagedkv";
  for (const CLI::App* sub : app.get_subcommands()) name += " " + sub->get_name();
  return name;
}

/// Collapses a message to one line: the error policy promises one line on stderr.
std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "pagedkv: paged KV-cache management and attention kernels for LLM inference.\n"
      "Run `pagedkv <command> --help` for a command's options."};
  // Help shows `Usage: pagedkv <command>`, not the path the binary was started by.
  app.name("pagedkv");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(PAGEDKV_VERSION));
  // CLI11's default failure message spans two lines; ours is one.
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return fmt::format("{}: {} (see --help)\n", command_name(*a), one_line(e.what()));
  });

  pagedkv::cli::add_generate_command(app);
  pagedkv::cli::add_memory_command(app);
  pagedkv::cli::add_replay_command(app);
  pagedkv::cli::add_ops_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help/version (rc 0) or the one-line error
    return rc == 0 ? 0 : 2;
  } catch (const pagedkv::cli::ExitStatus& s) {
    return s.code;
  } catch (const pagedkv::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: {}\n", command_name(app), one_line(e.what()));
    return 2;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: internal error: out of memory\n", command_name(app));
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: internal error: {}\n", command_name(app), one_line(e.what()));
    return 1;
  } catch (...) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: internal error: unknown exception\n", command_name(app));
    return 1;
  }
  return 0;
}
