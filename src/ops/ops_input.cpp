// `pagedkv ops` input: a script is read in chunks with OpsLimits' line and script limits checked
// as the bytes arrive, so an endless or newline-free input (/dev/zero on stdin) stops at the
// first limit instead of filling memory; a named file must be a regular file.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "ops/ops_internal.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {

namespace {

/// What a non-regular file is, for the message.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISCHR(mode)) return "is a character device, not a regular file";
  if (S_ISBLK(mode)) return "is a block device, not a regular file";
  if (S_ISFIFO(mode)) return "is a FIFO, not a regular file (pipe it to stdin: pagedkv ops -)";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  return "is not a regular file";
}

/// Closes the descriptor or FILE on every path out.
struct FileCloser {
  std::FILE* f = nullptr;
  int fd = -1;
  ~FileCloser() {
    if (f != nullptr) {
      std::fclose(f);
    } else if (fd >= 0) {
      ::close(fd);
    }
  }
};

}  // namespace

std::string read_ops_script(std::FILE* in, std::string_view name) {
  std::string text;
  std::array<char, 1 << 16> buf{};
  int64_t line_no = 1;
  int64_t line_bytes = 0;  // bytes of the current line so far
  for (;;) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), in);
    for (size_t i = 0; i < got; ++i) {
      if (buf[i] == '\n') {
        ++line_no;
        line_bytes = 0;
      } else if (++line_bytes > OpsLimits::kMaxLineBytes) {
        fail_at(line_no, fmt::format("line longer than {} bytes", OpsLimits::kMaxLineBytes));
      }
    }
    if (static_cast<int64_t>(text.size() + got) > OpsLimits::kMaxScriptBytes)
      throw Error(fmt::format("script longer than {} bytes", OpsLimits::kMaxScriptBytes));
    text.append(buf.data(), got);
    if (got < buf.size()) {
      if (std::ferror(in) != 0)
        throw Error(
            fmt::format("cannot read script '{}': {}", printable(name, 256), std::strerror(errno)));
      if (std::feof(in) != 0) break;
    }
  }
  return text;
}

std::string read_ops_script_file(const std::string& path) {
  auto fail = [&](const std::string& why) -> std::string {
    throw Error(fmt::format("cannot read script '{}': {}", printable(path, 256), why));
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer before it can be refused.
  FileCloser c;
  c.fd = ::open(path.c_str(), O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (c.fd < 0) return fail(std::strerror(errno));
  struct stat st {};
  if (::fstat(c.fd, &st) != 0) return fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(file_kind(st.st_mode));
  if (st.st_size > OpsLimits::kMaxScriptBytes)
    return fail(fmt::format("{} bytes, longer than the limit of {} bytes", st.st_size,
                            OpsLimits::kMaxScriptBytes));
  c.f = ::fdopen(c.fd, "rb");
  if (c.f == nullptr) return fail(std::strerror(errno));
  return read_ops_script(c.f, path);
}

}  // namespace pagedkv::ops
