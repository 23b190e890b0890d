// libFuzzer target: the request-trace readers (src/sim/trace.hpp), Azure CSV and Mooncake
// JSONL, lenient and strict. A reader may only throw pagedkv::Error (one line, starting with
// the source name); what it accepts must satisfy the documented row invariants, and a small
// accepted trace replays on the real KVCacheManager (paged and prefix strategies) without
// breaking anything.

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz_util.hpp"
#include "pagedkv/error.hpp"
#include "sim/replay.hpp"
#include "sim/trace.hpp"

namespace pagedkv::fuzz {
namespace {

void check_trace(const sim::Trace& t) {
  PAGEDKV_FUZZ_CHECK(t.rows_skipped == t.rows_read - static_cast<int64_t>(t.requests.size()),
                     "rows_skipped %lld != rows_read %lld - accepted %zu",
                     static_cast<long long>(t.rows_skipped), static_cast<long long>(t.rows_read),
                     t.requests.size());
  PAGEDKV_FUZZ_CHECK(t.problems.size() <= sim::Trace::kMaxProblemsKept, "too many problems");
  int64_t skipped = 0;
  for (const auto& [reason, n] : t.skipped_by_reason) skipped += n;
  PAGEDKV_FUZZ_CHECK(skipped == t.rows_skipped, "skipped_by_reason sums to %lld",
                     static_cast<long long>(skipped));
  double prev = 0;
  int64_t prev_line = 0;
  for (const sim::TraceRequest& r : t.requests) {
    PAGEDKV_FUZZ_CHECK(r.arrival_ms >= prev, "arrival %f before %f", r.arrival_ms, prev);
    PAGEDKV_FUZZ_CHECK(r.prompt_tokens >= 1, "prompt %lld",
                       static_cast<long long>(r.prompt_tokens));
    PAGEDKV_FUZZ_CHECK(r.output_tokens >= 0, "output %lld",
                       static_cast<long long>(r.output_tokens));
    PAGEDKV_FUZZ_CHECK(r.line > prev_line, "line %lld", static_cast<long long>(r.line));
    PAGEDKV_FUZZ_CHECK(static_cast<uint64_t>(r.hash_begin) + r.hash_count <= t.hash_ids.size(),
                       "hash range out of bounds");
    for (int64_t h : t.hashes(r)) PAGEDKV_FUZZ_CHECK(h >= 0, "negative hash id");
    prev = r.arrival_ms;
    prev_line = r.line;
  }
  if (!t.requests.empty()) {
    PAGEDKV_FUZZ_CHECK(t.requests.front().arrival_ms == 0, "first arrival %f",
                       t.requests.front().arrival_ms);
  }
}

/// Replays a small trace: bounded so one input stays fast (arrivals within 100 s of simulated
/// time, at most 64 requests; longer requests are rejected by max_context, not simulated).
void replay_small(const sim::Trace& t) {
  if (t.requests.empty() || t.requests.size() > 64 || t.requests.back().arrival_ms > 1e5) return;
  sim::ReplayConfig c;
  c.kv_bytes_per_token = 1;
  c.kv_memory_bytes = 512;
  c.max_context = 256;
  c.max_batch_tokens = 128;
  c.max_seqs = 8;
  c.series_points = 8;
  for (const sim::Strategy& s : {sim::Strategy{sim::StrategyKind::kPaged, 8},
                                 sim::Strategy{sim::StrategyKind::kPagedPrefix, 16},
                                 sim::Strategy{sim::StrategyKind::kContiguousMax, 0}}) {
    const sim::ReplayResult r = sim::replay(t, c, s);
    PAGEDKV_FUZZ_CHECK(r.requests == static_cast<int64_t>(t.requests.size()), "replay requests");
    PAGEDKV_FUZZ_CHECK(r.util_mean >= 0 && r.util_mean <= 1 + 1e-9, "util_mean %f", r.util_mean);
  }
}

}  // namespace
}  // namespace pagedkv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagedkv;
  fuzz::ByteReader in(data, size);
  const uint8_t mode = in.byte();
  const bool jsonl = (mode & 1) != 0;
  const sim::TraceReadOptions options{.strict = (mode & 2) != 0};
  std::istringstream text{std::string(in.rest())};
  sim::Trace trace;
  try {
    trace = jsonl ? sim::read_mooncake_jsonl(text, "fuzz.jsonl", options)
                  : sim::read_azure_csv(text, "fuzz.csv", options);
  } catch (const Error& e) {
    const std::string msg = e.what();
    PAGEDKV_FUZZ_CHECK(msg.rfind(jsonl ? "fuzz.jsonl:" : "fuzz.csv:", 0) == 0,
                       "message does not start with the source: %s", msg.c_str());
    PAGEDKV_FUZZ_CHECK(msg.find('\n') == std::string::npos, "multi-line message: %s", msg.c_str());
    return 0;
  }
  fuzz::check_trace(trace);
  fuzz::replay_small(trace);
  return 0;
}
