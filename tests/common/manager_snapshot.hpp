#pragma once
// Small helpers of the KVCacheManager tests: prompts, a table as a vector, and a snapshot of
// everything a read-only or refused call must leave alone (tables, committed counts, ref counts,
// free ring, LRU order, prefix stats), compared before and after.

#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::testing {

/// Tokens first, first + 1, ..., n of them.
inline std::vector<TokenId> iota_tokens(int n, TokenId first = 1) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

/// The block table of `s`, copied (the span dies with the next change).
inline std::vector<BlockId> table_of(const KVCacheManager& m, SeqId s) {
  auto t = m.block_table(s);
  return {t.begin(), t.end()};
}

/// Everything a read-only call must leave alone, as text: per sequence its tokens, committed
/// tokens and table; the free ring, the LRU of cached blocks, every ref count, the prefix stats.
inline std::string observable(const KVCacheManager& m) {
  std::ostringstream os;
  for (SeqId s : m.sequences()) {
    os << s << ':' << m.num_tokens(s) << ':' << m.num_committed_tokens(s);
    for (BlockId b : m.block_table(s)) os << ' ' << b;
    os << '\n';
  }
  for (BlockId b : m.allocator().free_list()) os << 'f' << b;
  for (BlockId b : m.allocator().cached_lru()) os << 'c' << b;
  for (BlockId b = 0; b < m.num_total_blocks(); ++b) os << 'r' << m.allocator().ref_count(b);
  const KVCacheStats st = m.stats();
  os << ' ' << st.prefix_query_tokens << ' ' << st.prefix_hit_tokens << ' ' << st.prefix_hits << ' '
     << st.prefix_misses << ' ' << st.prefix_evictions << ' ' << st.prefix_cached_entries;
  return os.str();
}

}  // namespace pagedkv::testing
