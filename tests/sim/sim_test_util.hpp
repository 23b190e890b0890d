#pragma once
// Helpers for the simulation tests: where ../shared/traces is, and skipping without it.
//
// PAGEDKV_REQUIRE_TRACES() skips a test with a printed reason when ../shared/traces is missing,
// except under CI=true, where it must fail: CI always provides ../shared, so its absence there
// is a broken checkout, not a reason to skip.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace pagedkv::sim::testing {

inline std::filesystem::path traces_dir() {
  return std::filesystem::path(PAGEDKV_SHARED_DIR) / "traces";
}

inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

/// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ = std::filesystem::temp_directory_path() /
            ("pagedkv_sim_" + name + "_" + std::to_string(::getpid()) + "_" +
             std::to_string(counter()++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }
  [[nodiscard]] std::string path() const { return path_.string(); }

 private:
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace pagedkv::sim::testing

/// Skips (or, with CI=true, fails) the current test when ../shared/traces is missing.
#define PAGEDKV_REQUIRE_TRACES()                                                 \
  do {                                                                           \
    const auto dir_ = ::pagedkv::sim::testing::traces_dir();                     \
    if (!std::filesystem::is_directory(dir_)) {                                  \
      if (::pagedkv::sim::testing::running_in_ci()) {                            \
        FAIL() << "CI=true but the shared traces dir " << dir_ << " is missing"; \
      }                                                                          \
      GTEST_SKIP() << "shared traces dir " << dir_                               \
                   << " is missing: skipping the real-trace checks";             \
    }                                                                            \
  } while (0)
