#pragma once
// Helpers shared by the libFuzzer targets in tests/fuzz (see docs/reliability.md).
// A broken property must crash the process (abort): libFuzzer, and the corpus replay driver
// run by ctest, report any abnormal exit as a finding and keep the input that caused it.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/test_files.hpp"

/// Aborts with a message when `cond` is false: a broken invariant is a finding like a crash.
#define PAGEDKV_FUZZ_CHECK(cond, ...)                                                        \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                     \
      std::fprintf(stderr, "\n");                                                            \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)

namespace pagedkv::fuzz {

/// Consumes the fuzz input front to back; past the end every read yields 0, so any input
/// (the empty one included) decodes to some valid program.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  [[nodiscard]] bool empty() const { return pos_ >= size_; }
  [[nodiscard]] size_t remaining() const { return empty() ? 0 : size_ - pos_; }

  uint8_t byte() { return empty() ? 0 : data_[pos_++]; }
  /// A value in [0, n) (n >= 1) from one or two bytes.
  uint32_t below(uint32_t n) {
    const uint32_t v = n <= 256 ? byte() : (static_cast<uint32_t>(byte()) << 8) | byte();
    return v % n;
  }
  bool flag() { return (byte() & 1) != 0; }
  /// The rest of the input as bytes.
  std::string_view rest() {
    const std::string_view r(reinterpret_cast<const char*>(data_) + pos_, remaining());
    pos_ = size_;
    return r;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// A scratch file for readers that only take a path (model and tokenizer files). One per
/// process (libFuzzer runs inputs sequentially); removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(const char* stem) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/pagedkv-fuzz-" + stem +
            "-" + std::to_string(::getpid());
  }
  ~ScratchFile() { std::remove(path_.c_str()); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  /// Replaces the file's content and returns its path.
  const std::string& write(std::string_view bytes) {
    PAGEDKV_FUZZ_CHECK(testing::write_file(path_, bytes), "cannot write scratch file %s",
                       path_.c_str());
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace pagedkv::fuzz
