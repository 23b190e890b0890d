// OpenBLAS started with one thread, its workers created on demand: see blas_startup.hpp.

#include "cli/blas_startup.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "model/llama.hpp"

namespace pagedkv::cli {

namespace {

constexpr std::string_view kThreadsVar = "OPENBLAS_NUM_THREADS";
/// Present only between the re-execution and the constructor below.
constexpr std::string_view kMarkerVar = "PAGEDKV_DEFERRED_OPENBLAS_START";

bool deferred = false;

/// Whether envp (NAME=value entries) holds `name`. getenv cannot be used yet: libc has not set
/// up environ when .preinit_array functions run.
bool has_variable(char** envp, std::string_view name) {
  for (char** e = envp; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=') {
      return true;
    }
  }
  return false;
}

/// Before the shared libraries' constructors: unless the user chose a thread count, run this
/// executable again with OpenBLAS asked to start with one thread.
void defer_blas_start(int /*argc*/, char** argv, char** envp) {
  if (envp == nullptr || argv == nullptr || has_variable(envp, kMarkerVar) ||
      has_variable(envp, kThreadsVar) || has_variable(envp, "GOTO_NUM_THREADS") ||
      has_variable(envp, "OMP_NUM_THREADS")) {
    return;
  }
  size_t n = 0;
  while (envp[n] != nullptr) ++n;
  // malloc, not new: the C++ runtime's constructors have not run yet. Never freed: execve
  // replaces the image, and on failure the process carries on with an 8-byte-per-entry leak.
  auto** env = static_cast<char**>(std::malloc((n + 3) * sizeof(char*)));
  if (env == nullptr) return;
  std::memcpy(env, envp, n * sizeof(char*));
  env[n] = const_cast<char*>("OPENBLAS_NUM_THREADS=1");
  env[n + 1] = const_cast<char*>("PAGEDKV_DEFERRED_OPENBLAS_START=1");
  env[n + 2] = nullptr;
  execve("/proc/self/exe", argv, env);
  std::free(static_cast<void*>(env));  // execve failed: OpenBLAS starts its default threads
}

/// After the libraries' constructors (OpenBLAS has read its variable): the user's environment.
[[gnu::constructor]] void restore_environment() {
  if (std::getenv(kMarkerVar.data()) == nullptr) return;
  deferred = true;
  unsetenv(kMarkerVar.data());
  unsetenv(kThreadsVar.data());
}

#if defined(__ELF__) && defined(__linux__)
[[gnu::section(".preinit_array"),
  gnu::used]] void (*const kDeferBlasStart)(int, char**, char**) = &defer_blas_start;
#endif

}  // namespace

bool blas_start_deferred() { return deferred; }

int32_t matmul_max_threads() {
  if (!deferred) return model::blas_threads();
  return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace pagedkv::cli
