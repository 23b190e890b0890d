#pragma once
// Test helpers for files: a scratch directory removed at scope exit, whole-file reads and writes,
// and whether the run is CI's. No GoogleTest here, so the fuzz targets and their corpus replay
// driver use it too.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace pagedkv::testing {

/// True under CI=true. CI always provides ../shared, so a test that would skip for want of it
/// must fail there instead: its absence means a broken checkout.
inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

/// A fresh empty directory under the system temp dir, removed by the destructor. The name holds
/// the process id and a counter, so parallel test processes never share one.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    path_ =
        std::filesystem::temp_directory_path() /
        ("pagedkv_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
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

/// Replaces the file's content with `bytes`; false when it could not be written.
inline bool write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return out.good();
}

/// The whole file as bytes; empty when it cannot be read.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace pagedkv::testing
