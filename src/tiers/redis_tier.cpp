// RedisTier and RedisStream over one private hiredis connection class (detail::RedisLink) that
// owns the timeouts, the circuit breaker, the failure count and the down/up log lines.
#include "pagedkv/tiers/redis_tier.hpp"

#include <fmt/core.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <utility>

#include "pagedkv/error.hpp"

namespace pagedkv {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

struct ReplyFree {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};

timeval to_timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

std::string_view reply_text(const redisReply& r) {
  return r.str != nullptr ? std::string_view(r.str, r.len) : std::string_view("(no text)");
}

/// Keeps a SIGPIPE raised by a write to a socket the server closed from killing the process:
/// blocks it in this thread for the scope and discards it if it became pending here (hiredis
/// writes with write(2), which has no MSG_NOSIGNAL). The process's signal dispositions stay as
/// the application set them.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool was_pending_ = false;
};

void require_no_nul(std::string_view field, const std::string& value) {
  if (value.find('\0') != std::string::npos) {
    throw Error(
        fmt::format("RedisTierConfig.{} holds a zero byte (length {})", field, value.size()));
  }
}

void validate(const RedisTierConfig& c) {
  if (c.unix_socket.empty()) {
    if (c.host.empty()) throw Error("RedisTierConfig.host is empty (and no unix_socket given)");
    if (c.port < 1 || c.port > 65535) {
      throw Error(fmt::format("RedisTierConfig.port {} is outside 1..65535", c.port));
    }
  }
  if (c.timeout_ms < 1) {
    throw Error(fmt::format("RedisTierConfig.timeout_ms {} must be >= 1", c.timeout_ms));
  }
  if (c.retry_after_ms < 0) {
    throw Error(fmt::format("RedisTierConfig.retry_after_ms {} must be >= 0", c.retry_after_ms));
  }
  if (c.ttl_s < 0) throw Error(fmt::format("RedisTierConfig.ttl_s {} must be >= 0", c.ttl_s));
  require_no_nul("host", c.host);
  require_no_nul("unix_socket", c.unix_socket);
  require_no_nul("password", c.password);
}

std::string endpoint(const RedisTierConfig& c) {
  return c.unix_socket.empty() ? fmt::format("{}:{}", c.host, c.port) : "unix:" + c.unix_socket;
}

}  // namespace

using Reply = std::unique_ptr<redisReply, ReplyFree>;
/// The binary-safe arguments of one command.
using Command = std::vector<std::string_view>;

/// One hiredis connection with a circuit breaker. Not synchronized: the owner holds its mutex
/// around every call.
class RedisLink {
 public:
  /// `label` names the link in log lines ("redis tier 127.0.0.1:6379"); `consequence` says what
  /// the engine does meanwhile ("serving by recompute").
  RedisLink(const RedisTierConfig& config, std::string label, std::string consequence)
      : config_(config), label_(std::move(label)), consequence_(std::move(consequence)) {}
  ~RedisLink() { drop(); }
  RedisLink(const RedisLink&) = delete;
  RedisLink& operator=(const RedisLink&) = delete;

  /// Sends all commands in one batch and reads their replies (one round trip): one reply per
  /// command, or empty when the breaker is open or an I/O failure happened (counted, logged).
  std::vector<Reply> run(std::span<const Command> commands);

  /// run() of one command: its reply, or null.
  Reply run_one(const Command& command) {
    std::vector<Reply> replies = run(std::span<const Command>(&command, 1));
    return replies.empty() ? nullptr : std::move(replies.front());
  }

  /// Counts an error reply on a working connection (the connection stays); the first one is
  /// logged, because an error that repeats (NOAUTH, WRONGTYPE) is a deployment problem.
  void count_error(std::string_view what) {
    ++failures_;
    if (!error_logged_) {
      error_logged_ = true;
      fmt::print(stderr, "pagedkv: {} answered an error ({}); {}\n", label_, what, consequence_);
    }
  }

  [[nodiscard]] int64_t failures() const { return failures_; }

 private:
  bool ensure_connected();
  void connect();
  bool authenticate();
  void fail(std::string_view reason);
  std::string io_reason() const;
  void drop() {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
  }

  RedisTierConfig config_;
  std::string label_;
  std::string consequence_;
  redisContext* ctx_ = nullptr;  // null = not connected
  bool down_ = false;            // logged as unavailable, not yet as reachable again
  bool error_logged_ = false;
  Clock::time_point retry_at_{};  // while down_: no attempt before this
  int64_t failures_ = 0;
};

std::string RedisLink::io_reason() const {
  if (ctx_ == nullptr) return "cannot allocate a hiredis context";
  std::string text = ctx_->errstr[0] != '\0' ? ctx_->errstr : "unknown error";
  if (ctx_->err == REDIS_ERR_IO &&
      (text == std::strerror(EAGAIN) || text == std::strerror(EWOULDBLOCK))) {
    return fmt::format("no answer within {} ms", config_.timeout_ms);
  }
  return text;
}

void RedisLink::fail(std::string_view reason) {
  drop();
  ++failures_;
  retry_at_ = Clock::now() + std::chrono::milliseconds(config_.retry_after_ms);
  if (!down_) {
    down_ = true;
    fmt::print(stderr, "pagedkv: {} unavailable ({}); {}, retrying every {} ms\n", label_, reason,
               consequence_, config_.retry_after_ms);
  }
}

bool RedisLink::authenticate() {
  if (config_.password.empty()) return true;
  const char* argv[] = {"AUTH", config_.password.c_str()};
  const size_t lens[] = {4, config_.password.size()};
  Reply reply(static_cast<redisReply*>(redisCommandArgv(ctx_, 2, argv, lens)));
  if (!reply) {
    fail(io_reason());
    return false;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    fail(fmt::format("AUTH refused: {}", reply_text(*reply)));
    return false;
  }
  return true;
}

void RedisLink::connect() {
  const timeval tv = to_timeval(config_.timeout_ms);
  ctx_ = config_.unix_socket.empty()
             ? redisConnectWithTimeout(config_.host.c_str(), config_.port, tv)
             : redisConnectUnixWithTimeout(config_.unix_socket.c_str(), tv);
  if (ctx_ == nullptr || ctx_->err != 0) {
    fail(io_reason());
    return;
  }
  if (redisSetTimeout(ctx_, tv) != REDIS_OK) {
    fail(fmt::format("cannot set the socket timeout: {}", io_reason()));
    return;
  }
  if (!authenticate()) return;
  if (down_) {
    down_ = false;
    fmt::print(stderr, "pagedkv: {} reachable again\n", label_);
  }
}

bool RedisLink::ensure_connected() {
  if (ctx_ != nullptr) return true;
  if (down_ && Clock::now() < retry_at_) return false;  // breaker open: no network
  connect();
  return ctx_ != nullptr;
}

std::vector<Reply> RedisLink::run(std::span<const Command> commands) {
  SigpipeGuard sigpipe;
  if (!ensure_connected()) return {};
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const Command& command : commands) {
    argv.clear();
    lens.clear();
    for (std::string_view arg : command) {
      argv.push_back(arg.data());
      lens.push_back(arg.size());
    }
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
        REDIS_OK) {
      fail(io_reason());
      return {};
    }
  }
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      fail(io_reason());
      return {};
    }
    replies.emplace_back(static_cast<redisReply*>(raw));
  }
  return replies;
}

}  // namespace detail

using detail::Command;
using detail::Reply;
using detail::reply_text;

namespace {

void require_key(std::string_view op, std::string_view key) {
  if (key.empty()) throw Error(fmt::format("RedisTier::{}: empty key", op));
}

/// The text after "<name>:" on its own line of an INFO answer, or empty.
std::optional<std::string> info_field(std::string_view info, std::string_view name) {
  const std::string needle = fmt::format("{}:", name);
  for (size_t at = 0; at < info.size();) {
    size_t end = info.find('\n', at);
    if (end == std::string_view::npos) end = info.size();
    std::string_view line = info.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with(needle)) return std::string(line.substr(needle.size()));
    at = end + 1;
  }
  return std::nullopt;
}

/// Parses a whole decimal field into `out`; false when absent or not a number.
bool parse_int(const std::optional<std::string>& text, int64_t& out) {
  if (!text || text->empty()) return false;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, out);
  return ec == std::errc() && ptr == end;
}

}  // namespace

RedisTier::RedisTier(RedisTierConfig config) : config_(std::move(config)) {
  detail::validate(config_);
  link_ = std::make_unique<detail::RedisLink>(config_, "redis tier " + detail::endpoint(config_),
                                              "serving by recompute");
}

RedisTier::~RedisTier() = default;

std::string RedisTier::full_key(std::string_view key) const {
  std::string out;
  out.reserve(config_.key_prefix.size() + key.size());
  out.append(config_.key_prefix).append(key);
  return out;
}

PutOutcome RedisTier::put(std::string_view key, std::span<const std::byte> value) {
  require_key("put", key);
  if (value.empty()) throw Error(fmt::format("RedisTier::put: empty value for key {}", key));
  const auto size = static_cast<int64_t>(value.size());
  std::lock_guard lock(mu_);
  if (size > kMaxValueBytes) {
    ++stats_.rejected;
    return PutOutcome::kTooLarge;
  }
  const std::string k = full_key(key);
  const std::string ttl = std::to_string(config_.ttl_s);
  Command command{"SET", k,
                  std::string_view(reinterpret_cast<const char*>(value.data()), value.size())};
  if (config_.ttl_s > 0) command.insert(command.end(), {"EX", ttl});
  const Reply reply = link_->run_one(command);
  if (!reply) return PutOutcome::kFailed;
  if (reply->type == REDIS_REPLY_ERROR) {
    if (reply_text(*reply).starts_with("OOM")) {
      ++stats_.rejected;
      return PutOutcome::kFull;
    }
    link_->count_error(reply_text(*reply));
    return PutOutcome::kFailed;
  }
  ++stats_.puts;
  stats_.bytes_written += size;
  return PutOutcome::kStored;
}

std::optional<std::vector<std::byte>> RedisTier::get(std::string_view key) {
  require_key("get", key);
  const std::string k = full_key(key);
  std::lock_guard lock(mu_);
  ++stats_.gets;
  const Reply reply = link_->run_one(Command{"GET", k});
  if (!reply || reply->type == REDIS_REPLY_NIL) return std::nullopt;
  if (reply->type != REDIS_REPLY_STRING) {
    link_->count_error(reply_text(*reply));
    return std::nullopt;
  }
  const auto* first = reinterpret_cast<const std::byte*>(reply->str);
  std::vector<std::byte> out(first, first + reply->len);
  ++stats_.hits;
  stats_.bytes_read += static_cast<int64_t>(out.size());
  return out;
}

std::vector<bool> RedisTier::contains(std::span<const std::string> keys) {
  for (const std::string& key : keys) require_key("contains", key);
  std::vector<bool> out(keys.size(), false);
  if (keys.empty()) return out;
  std::vector<std::string> full;
  full.reserve(keys.size());
  std::vector<Command> commands;
  commands.reserve(keys.size());
  for (const std::string& key : keys) {
    full.push_back(full_key(key));
    commands.push_back(Command{"EXISTS", full.back()});
  }
  std::lock_guard lock(mu_);
  const std::vector<Reply> replies = link_->run(commands);
  if (replies.empty()) return out;
  std::string error;
  for (size_t i = 0; i < replies.size(); ++i) {
    if (replies[i]->type == REDIS_REPLY_INTEGER) {
      out[i] = replies[i]->integer > 0;
    } else if (error.empty()) {
      error = reply_text(*replies[i]);
    }
  }
  if (!error.empty()) {
    link_->count_error(error);
    std::fill(out.begin(), out.end(), false);
  }
  return out;
}

TierStats RedisTier::stats() const {
  std::lock_guard lock(mu_);
  TierStats s = stats_;
  s.budget_bytes = 0;
  s.used_bytes = -1;
  s.entries = -1;
  s.evictions = 0;
  s.failures = link_->failures();
  return s;
}

std::optional<RedisMemoryInfo> RedisTier::server_info() {
  std::lock_guard lock(mu_);
  const Reply reply = link_->run_one(Command{"INFO", "memory"});
  if (!reply) return std::nullopt;
  if (reply->type != REDIS_REPLY_STRING) {
    link_->count_error(reply_text(*reply));
    return std::nullopt;
  }
  const std::string_view info = reply_text(*reply);
  RedisMemoryInfo out;
  if (!parse_int(info_field(info, "used_memory"), out.used_bytes) ||
      !parse_int(info_field(info, "maxmemory"), out.max_bytes)) {
    link_->count_error("INFO memory without a used_memory or maxmemory number");
    return std::nullopt;
  }
  out.policy = info_field(info, "maxmemory_policy").value_or("");
  return out;
}

RedisStream::RedisStream(RedisTierConfig config, std::string stream_key, int64_t max_len)
    : stream_key_(std::move(stream_key)), max_len_(std::to_string(max_len)) {
  detail::validate(config);
  if (stream_key_.empty()) throw Error("RedisStream: empty stream_key");
  if (max_len < 1) throw Error(fmt::format("RedisStream: max_len {} must be >= 1", max_len));
  link_ = std::make_unique<detail::RedisLink>(
      config, fmt::format("redis stream {} at {}", stream_key_, detail::endpoint(config)),
      "dropping KV events");
}

RedisStream::~RedisStream() = default;

bool RedisStream::xadd(std::string_view field, std::string_view json) {
  if (field.empty()) throw Error(fmt::format("RedisStream::xadd: empty field on {}", stream_key_));
  std::lock_guard lock(mu_);
  const Reply reply =
      link_->run_one(Command{"XADD", stream_key_, "MAXLEN", "~", max_len_, "*", field, json});
  if (!reply) return false;
  if (reply->type == REDIS_REPLY_ERROR) {
    link_->count_error(reply_text(*reply));
    return false;
  }
  ++added_;
  return true;
}

int64_t RedisStream::added() const {
  std::lock_guard lock(mu_);
  return added_;
}

int64_t RedisStream::failures() const {
  std::lock_guard lock(mu_);
  return link_->failures();
}

}  // namespace pagedkv
