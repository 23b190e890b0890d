// Corpus replay driver: runs a fuzz target's LLVMFuzzerTestOneInput over files and folders
// given on the command line, without libFuzzer. Lets every compiler (gcc included) and the
// ASan/UBSan test job run the committed seed corpus as a regression test; a broken property
// aborts, which ctest reports as a failure naming the input.

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/test_files.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define PAGEDKV_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PAGEDKV_REPLAY_ASAN 1
#endif
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

/// Under ASan: an allocation above 1 GiB is a report, not a success (the fuzz job gets the same
/// from libFuzzer's -malloc_limit_mb). A corrupt header must never cause a huge allocation.
/// ASAN_OPTIONS from the environment still apply on top.
extern "C" const char* __asan_default_options() {
  return "max_allocation_size_mb=1024:allocator_may_return_null=0";
}

namespace {

void run_file(const std::filesystem::path& path) {
  const std::string bytes = pagedkv::testing::read_file(path);
  // Name the input first, so an abort inside the target is attributed to it in the log.
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
  (void)LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
#if !defined(PAGEDKV_REPLAY_ASAN)
  // Without ASan, cap the address space instead: a huge allocation throws std::bad_alloc, which
  // the targets do not catch, so it aborts the replay. (ASan reserves terabytes of address
  // space for its shadow memory, so it cannot run under such a cap.)
  const rlimit cap{.rlim_cur = rlim_t{2} << 30, .rlim_max = RLIM_INFINITY};
  setrlimit(RLIMIT_AS, &cap);
#endif
  int64_t count = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());  // deterministic order
    } else if (std::filesystem::is_regular_file(arg)) {
      files.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: no such file or folder: %s\n", argv[i]);
      return 2;
    }
    for (const auto& f : files) {
      run_file(f);
      ++count;
    }
  }
  // An empty input is a valid program for every target; run it so the driver is never a no-op.
  (void)LLVMFuzzerTestOneInput(nullptr, 0);
  std::printf("replay: %lld inputs ok\n", static_cast<long long>(count));
  return count > 0 ? 0 : 2;
}
