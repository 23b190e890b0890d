#pragma once
// Test helpers for the model tests: where ../shared is, and reading its reference files (the
// file helpers themselves are tests/common/test_files.hpp).
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

#include "common/test_files.hpp"

namespace pagedkv::model::testing {

inline std::filesystem::path shared_dir() { return PAGEDKV_SHARED_DIR; }

using ::pagedkv::testing::read_file;
using ::pagedkv::testing::running_in_ci;
using ::pagedkv::testing::TempDir;
using ::pagedkv::testing::write_file;

inline nlohmann::json read_json(const std::filesystem::path& p) {
  return nlohmann::json::parse(read_file(p));
}

inline std::vector<float> read_f32(const std::filesystem::path& p) {
  const std::string bytes = read_file(p);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
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
