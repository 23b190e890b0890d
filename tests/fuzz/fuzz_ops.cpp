// libFuzzer target: `pagedkv ops` scripts (src/ops/ops_script.hpp). The input is the script
// text. The parser and the executor may only throw pagedkv::Error, as one printable line
// starting "line N: "; after every executed line the manager's invariants hold and the tokens
// the executor counts (issue 16's limits) stay within the limit and cover every sequence's; an
// op that throws, or an `expect_error` that answers, changes nothing; an append prints no
// table (output follows what changed); at the end, freeing every sequence returns the whole
// pool. The seeds are valid scripts (every op, issue 16's among them) and the hostile ones of
// the bad-input corpus, so the fuzzer mutates meaningful operation sequences.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.hpp"
#include "ops/ops_script.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace {

void check_message(const pagedkv::Error& e) {
  const std::string msg = e.what();
  PAGEDKV_FUZZ_CHECK(msg.rfind("line ", 0) == 0, "message does not start with 'line N: ': %s",
                     msg.c_str());
  for (char c : msg) {
    const auto u = static_cast<unsigned char>(c);
    PAGEDKV_FUZZ_CHECK(u >= 0x20 && u != 0x7f, "control byte 0x%02x in message: %s", u,
                       msg.c_str());
  }
}

/// What an op that fails must leave as it was: the pool, the sequences and their lengths, and
/// the executor's token count.
struct Snapshot {
  const pagedkv::KVCacheManager* manager = nullptr;
  const pagedkv::HybridKVCacheManager* hybrid = nullptr;
  int32_t free_blocks = 0;
  int64_t held = 0;
  std::vector<std::pair<pagedkv::SeqId, int64_t>> seqs;

  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const pagedkv::ops::OpsExecutor& ex) {
  Snapshot s;
  s.manager = ex.manager();
  s.held = ex.held_tokens();
  if (s.manager != nullptr) {
    s.free_blocks = s.manager->num_free_blocks();
    for (pagedkv::SeqId q : s.manager->sequences())
      s.seqs.emplace_back(q, s.manager->num_tokens(q));
  }
  s.hybrid = ex.hybrid_manager();
  if (s.hybrid != nullptr) {
    s.free_blocks = s.hybrid->num_free_blocks();
    for (pagedkv::SeqId q : s.hybrid->sequences()) s.seqs.emplace_back(q, s.hybrid->num_tokens(q));
  }
  return s;
}

/// After every line: the limit holds and the count covers the manager's sequences (the rest
/// are preempted sequences kept for resume).
void check_held(const pagedkv::ops::OpsExecutor& ex, const pagedkv::ops::OpsLine& l) {
  int64_t in_manager = 0;
  if (const pagedkv::KVCacheManager* m = ex.manager()) {
    for (pagedkv::SeqId s : m->sequences()) in_manager += m->num_tokens(s);
  }
  if (const pagedkv::HybridKVCacheManager* h = ex.hybrid_manager()) {
    for (pagedkv::SeqId s : h->sequences()) in_manager += h->num_tokens(s);
  }
  PAGEDKV_FUZZ_CHECK(ex.held_tokens() <= pagedkv::ops::OpsLimits::kMaxTotalTokens &&
                         ex.held_tokens() >= in_manager,
                     "line %lld (%s): held %lld, the manager's sequences %lld",
                     static_cast<long long>(l.line), l.op.c_str(),
                     static_cast<long long>(ex.held_tokens()), static_cast<long long>(in_manager));
}

/// Pools the harness will not build: `manager blocks=16777216` is a legitimate request for a
/// large pool, not a bug, but would make every such input slow and trip -malloc_limit_mb.
bool too_big(const pagedkv::ops::OpsLine& l) {
  if (l.op != "manager") return false;
  for (const char* key : {"blocks", "host_blocks", "block_size"}) {
    auto it = l.options.find(key);
    if (it != l.options.end() && it->second.size() > 4) return true;  // > 9999
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pagedkv;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<ops::OpsLine> lines;
  try {
    lines = ops::parse_ops_script(text);
  } catch (const Error& e) {
    check_message(e);
    return 0;
  }
  ops::OpsExecutor ex;
  for (const ops::OpsLine& l : lines) {
    if (too_big(l)) continue;
    const Snapshot before = snapshot(ex);
    try {
      const auto j = ex.execute(l);
      if (l.op == "expect_error") {
        PAGEDKV_FUZZ_CHECK(snapshot(ex) == before, "expect_error at line %lld changed the state",
                           static_cast<long long>(l.line));
      }
      if (j && l.op == "append") {
        PAGEDKV_FUZZ_CHECK(!j->contains("table"), "append printed its table at line %lld",
                           static_cast<long long>(l.line));
      }
    } catch (const Error& e) {
      check_message(e);
      // An expect_error whose op succeeded is the one error after a change (the script stops).
      PAGEDKV_FUZZ_CHECK(l.op == "expect_error" || snapshot(ex) == before,
                         "failed line %lld (%s) changed the state: %s",
                         static_cast<long long>(l.line), l.op.c_str(), e.what());
    }
    check_held(ex, l);
    try {
      if (const KVCacheManager* m = ex.manager()) m->check_invariants();
      if (const HybridKVCacheManager* h = ex.hybrid_manager()) h->check_invariants();
    } catch (const Error& e) {
      PAGEDKV_FUZZ_CHECK(false, "invariant broken after line %lld (%s): %s",
                         static_cast<long long>(l.line), l.op.c_str(), e.what());
    }
  }
  if (const HybridKVCacheManager* h = ex.hybrid_manager()) {
    // The same through a copy of the hybrid manager: every group's blocks return.
    HybridKVCacheManager copy = *h;
    for (SeqId s : copy.sequences()) copy.free_sequence(s);
    copy.check_invariants();
    PAGEDKV_FUZZ_CHECK(copy.num_free_blocks() == copy.config().num_blocks - 1,
                       "hybrid: %d of %d usable blocks free", copy.num_free_blocks(),
                       copy.config().num_blocks - 1);
  }
  if (const KVCacheManager* m = ex.manager()) {
    // Abort every request through a copy (the executor owns its manager): all blocks return.
    KVCacheManager copy = *m;
    for (SeqId s : copy.sequences()) copy.free_sequence(s);
    copy.check_invariants();
    const KVCacheStats st = copy.stats();
    PAGEDKV_FUZZ_CHECK(st.used_blocks == 0 && st.host_used_blocks == 0, "blocks leaked");
    PAGEDKV_FUZZ_CHECK(copy.num_free_blocks() == copy.num_total_blocks(), "available %d of %d",
                       copy.num_free_blocks(), copy.num_total_blocks());
  }
  return 0;
}
