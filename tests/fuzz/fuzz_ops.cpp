// libFuzzer target: `pagedkv ops` scripts (src/ops/ops_script.hpp). The input is the script
// text. The parser and the executor may only throw pagedkv::Error, as one line starting
// "line N: "; after every executed line the manager's invariants hold; at the end, freeing
// every sequence returns the whole pool. The seeds are valid scripts, so the fuzzer mutates
// meaningful operation sequences rather than random bytes.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.hpp"
#include "ops/ops_script.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace {

void check_message(const pagedkv::Error& e) {
  const std::string msg = e.what();
  PAGEDKV_FUZZ_CHECK(msg.rfind("line ", 0) == 0, "message does not start with 'line N: ': %s",
                     msg.c_str());
  PAGEDKV_FUZZ_CHECK(msg.find('\n') == std::string::npos, "multi-line message: %s", msg.c_str());
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
    try {
      (void)ex.execute(l);
    } catch (const Error& e) {
      check_message(e);
    }
    if (const KVCacheManager* m = ex.manager()) {
      try {
        m->check_invariants();
      } catch (const Error& e) {
        PAGEDKV_FUZZ_CHECK(false, "invariant broken after line %lld (%s): %s",
                           static_cast<long long>(l.line), l.op.c_str(), e.what());
      }
    }
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
