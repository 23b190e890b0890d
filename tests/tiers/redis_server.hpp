#pragma once
// A real redis-server for tests: started on 127.0.0.1 at a free port with no persistence, a
// maxmemory and an eviction policy, stopped (or killed, paused, restarted on the same port) on
// demand, always stopped by the destructor. Tests that need it call PAGEDKV_REQUIRE_REDIS() first:
// without redis-server they skip with the reason, except under CI=true, where they fail.
// No hiredis here (readiness is a raw PING), so any test executable can use it.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/test_files.hpp"

namespace pagedkv::testing {

/// Path of the redis-server executable (each PATH entry, then /usr/bin), or empty.
inline std::string find_redis_server() {
  namespace fs = std::filesystem;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "");
  std::vector<std::string> candidates;
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty()) candidates.push_back(dir + "/redis-server");
  }
  candidates.push_back("/usr/bin/redis-server");
  for (const std::string& c : candidates) {
    if (fs::is_regular_file(c) && ::access(c.c_str(), X_OK) == 0) return c;
  }
  return {};
}

/// Whether redis-server is installed; if not, `why` (when given) gets the reason to print.
inline bool redis_available(std::string* why) {
  if (!find_redis_server().empty()) return true;
  if (why != nullptr) {
    *why = "redis-server not found in PATH or /usr/bin (Debian: apt-get install redis-server)";
  }
  return false;
}

/// In a test body or SetUp(): skips the test when redis-server is missing, fails under CI=true.
#define PAGEDKV_REQUIRE_REDIS()                                              \
  do {                                                                       \
    std::string pagedkv_redis_why_;                                          \
    if (!::pagedkv::testing::redis_available(&pagedkv_redis_why_)) {         \
      if (::pagedkv::testing::running_in_ci()) FAIL() << pagedkv_redis_why_; \
      GTEST_SKIP() << pagedkv_redis_why_;                                    \
    }                                                                        \
  } while (0)

/// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back, closed), or
/// 0 on failure. Also the address of "a server that is down".
inline int pick_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

/// True when something on 127.0.0.1:port answers "PING" with a RESP reply (+PONG, or an error
/// such as -NOAUTH or -LOADING: the server is up either way).
inline bool redis_answers_ping(int port, int timeout_ms = 200) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6) {
    char c = 0;
    ok = ::recv(fd, &c, 1, 0) == 1 && (c == '+' || c == '-');
  }
  ::close(fd);
  return ok;
}

/// How to run the server.
struct RedisServerOptions {
  int64_t maxmemory_bytes = int64_t{64} << 20;   ///< --maxmemory, bytes; 0 = unlimited
  std::string maxmemory_policy = "allkeys-lru";  ///< --maxmemory-policy (or "noeviction")
  bool unix_socket = false;                      ///< also listen on unix_socket_path() (mode 700)
  std::vector<std::string> extra_args;  ///< appended as given, e.g. {"--requirepass", "pw"}
  int ready_timeout_ms = 5000;          ///< how long start() waits for the first PONG
};

/// One redis-server child process. Not copyable; the destructor stops it (SIGTERM, SIGKILL
/// after 2 s). start() throws std::runtime_error with the server's log tail when it cannot get
/// one running, which GoogleTest reports as the test's failure.
class RedisServer {
 public:
  explicit RedisServer(RedisServerOptions options = {})
      : options_(std::move(options)), dir_("redis") {}
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// Starts the server and waits until it answers PING. The first start picks a free port
  /// (retrying on a collision); later starts (after stop() or kill_hard()) reuse that port, so
  /// clients see a restart. No-op while running.
  void start() {
    if (pid_ > 0) return;
    const bool fixed = port_ != 0;
    std::string last;
    for (int attempt = 0; attempt < (fixed ? 20 : 5); ++attempt) {
      if (!fixed) port_ = pick_free_port();
      if (port_ != 0 && try_start(last)) return;
      if (fixed) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("redis-server did not start on 127.0.0.1:" + std::to_string(port_) +
                             ": " + last);
  }

  /// Stops the server now (SIGTERM; SIGKILL after 2 s) and reaps it. No-op when not running.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200 && !reaped(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill_hard();
  }

  /// Kills the server with SIGKILL (a crash: no shutdown, connections reset) and reaps it.
  void kill_hard() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  /// SIGSTOP: the server holds its connections but answers nothing (a stalled server).
  void pause() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  /// SIGCONT after pause().
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] std::string host() const { return "127.0.0.1"; }
  [[nodiscard]] bool running() const { return pid_ > 0; }
  [[nodiscard]] std::string unix_socket_path() const { return dir_.file("redis.sock"); }
  [[nodiscard]] std::string log_path() const { return dir_.file("redis.log"); }

 private:
  /// true once the child has exited (and is reaped).
  bool reaped() {
    if (pid_ <= 0) return true;
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) pid_ = -1;
    return pid_ <= 0;
  }

  std::vector<std::string> args(const std::string& exe) const {
    std::vector<std::string> a = {exe,
                                  "--port",
                                  std::to_string(port_),
                                  "--bind",
                                  "127.0.0.1",
                                  "--save",
                                  "",
                                  "--appendonly",
                                  "no",
                                  "--dir",
                                  dir_.path(),
                                  "--maxmemory",
                                  std::to_string(options_.maxmemory_bytes),
                                  "--maxmemory-policy",
                                  options_.maxmemory_policy,
                                  "--daemonize",
                                  "no"};
    if (options_.unix_socket) {
      a.insert(a.end(), {"--unixsocket", unix_socket_path(), "--unixsocketperm", "700"});
    }
    a.insert(a.end(), options_.extra_args.begin(), options_.extra_args.end());
    return a;
  }

  /// One fork/exec and wait for PONG; false (with `why`) when the child exits or stays silent.
  bool try_start(std::string& why) {
    const std::string exe = find_redis_server();
    if (exe.empty()) {
      why = "redis-server not found";
      return false;
    }
    std::vector<std::string> a = args(exe);
    std::vector<char*> argv;
    for (std::string& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    const std::string log = log_path();
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      why = "fork failed";
      return false;
    }
    if (pid == 0) exec_child(argv.data(), log.c_str(), parent);
    pid_ = pid;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.ready_timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      if (reaped()) {
        why = "it exited: " + log_tail();
        return false;
      }
      if (redis_answers_ping(port_)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill_hard();
    why = "no PONG within " + std::to_string(options_.ready_timeout_ms) + " ms: " + log_tail();
    return false;
  }

  /// In the child: only async-signal-safe calls, then exec; dies with the test process.
  [[noreturn]] static void exec_child(char** argv, const char* log, pid_t parent) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    const int null_in = ::open("/dev/null", O_RDONLY);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    if (null_in >= 0) ::dup2(null_in, STDIN_FILENO);
    for (int i = 3; i < 1024; ++i) ::close(i);
    ::execv(argv[0], argv);
    ::_exit(127);
  }

  std::string log_tail() const {
    std::ifstream in(log_path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return text.size() > 600 ? text.substr(text.size() - 600) : text;
  }

  RedisServerOptions options_;
  TempDir dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace pagedkv::testing
