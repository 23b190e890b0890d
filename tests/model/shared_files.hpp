#pragma once
// Test helpers for the model tests: where ../shared is, and reading its reference files.
//
// PAGEDKV_REQUIRE_SHARED() skips a test with a printed reason when ../shared (models,
// reference outputs) is missing, except under CI=true, where a missing ../shared must fail:
// CI always provides it, so its absence there means a broken checkout, not a skip.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace pagedkv::model::testing {

inline std::filesystem::path shared_dir() { return PAGEDKV_SHARED_DIR; }

inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline nlohmann::json read_json(const std::filesystem::path& p) {
  return nlohmann::json::parse(read_text(p));
}

inline std::vector<float> read_f32(const std::filesystem::path& p) {
  const std::string bytes = read_text(p);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

/// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ = std::filesystem::temp_directory_path() /
            ("pagedkv_" + name + "_" + std::to_string(std::rand()) + "_" +
             std::to_string(reinterpret_cast<std::uintptr_t>(this)));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace pagedkv::model::testing

/// Skips (or, with CI=true, fails) the current test when ../shared is missing.
#define PAGEDKV_REQUIRE_SHARED()                                                                \
  do {                                                                                          \
    const auto dir_ = ::pagedkv::model::testing::shared_dir();                                  \
    if (!std::filesystem::is_directory(dir_ / "models") ||                                      \
        !std::filesystem::is_directory(dir_ / "reference")) {                                   \
      if (::pagedkv::model::testing::running_in_ci()) {                                         \
        FAIL() << "CI=true but the shared dir " << dir_ << " (models/, reference/) is missing"; \
      }                                                                                         \
      GTEST_SKIP() << "shared dir " << dir_                                                     \
                   << " (models/, reference/) is missing: skipping the real-model checks";      \
    }                                                                                           \
  } while (0)
