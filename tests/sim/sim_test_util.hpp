#pragma once
// Helpers for the simulation tests: where ../shared/traces is, skipping without it, a replay
// config in token units, and the file helpers of common/test_files.hpp under the names the
// tests use.
//
// PAGEDKV_REQUIRE_TRACES() skips a test with a printed reason when ../shared/traces is missing,
// except under CI=true, where it must fail: CI always provides ../shared, so its absence there
// is a broken checkout, not a reason to skip.

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <vector>

#include "common/test_files.hpp"
#include "sim/replay.hpp"
#include "sim/trace.hpp"

namespace pagedkv::sim::testing {

inline std::filesystem::path traces_dir() {
  return std::filesystem::path(PAGEDKV_SHARED_DIR) / "traces";
}

using ::pagedkv::testing::running_in_ci;
using ::pagedkv::testing::TempDir;
using ::pagedkv::testing::write_file;

/// A replay config whose budget reads as token positions: one byte per position, one step per
/// ms, max context 100, no watermark, the default batch limits.
inline ReplayConfig one_byte_per_token(int64_t capacity_tokens) {
  ReplayConfig c;
  c.kv_memory_bytes = capacity_tokens;
  c.kv_bytes_per_token = 1;
  c.max_context = 100;
  c.step_ms = 1.0;
  c.max_batch_tokens = 8192;
  c.max_seqs = 256;
  c.watermark = 0.0;
  return c;
}

/// One request of a hand-written trace.
struct Req {
  double t_ms;
  int64_t prompt;
  int64_t output;
  std::vector<int64_t> hashes = {};
};

/// A trace from rows (arrival ms, prompt, output, hash ids) with `hash_block_tokens` per hash
/// id (0 = none), source "hand".
inline Trace make_trace(const std::vector<Req>& reqs, int64_t hash_block_tokens = 0) {
  Trace t;
  t.source = "hand";
  t.hash_block_tokens = hash_block_tokens;
  int64_t line = 1;
  for (const Req& r : reqs) {
    TraceRequest q;
    q.arrival_ms = r.t_ms;
    q.prompt_tokens = r.prompt;
    q.output_tokens = r.output;
    q.line = line++;
    q.hash_begin = static_cast<uint32_t>(t.hash_ids.size());
    q.hash_count = static_cast<uint32_t>(r.hashes.size());
    t.hash_ids.insert(t.hash_ids.end(), r.hashes.begin(), r.hashes.end());
    t.requests.push_back(q);
  }
  t.rows_read = line - 1;
  return t;
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
