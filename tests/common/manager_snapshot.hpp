#pragma once
// Small helpers of the KVCacheManager tests and the manager fuzz target: prompts, a table as a
// vector, and a snapshot of everything a read-only or refused call must leave alone (tables,
// kept sets, ref counts, free ring and LRU order of both pools, the prefix index, every counter,
// pending events), compared before and after. No GoogleTest here: the fuzz target includes it.

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

/// A pool's structure as text: free ring (head first), LRU order of cached ref-0 blocks, then
/// each block's ref count and cached flag.
inline void observe_pool(std::ostringstream& os, const BlockAllocator& a) {
  os << "free";
  for (BlockId b : a.free_list()) os << ' ' << b;
  os << "\nlru";
  for (BlockId b : a.cached_lru()) os << ' ' << b;
  os << "\nref";
  for (BlockId b = 0; b < a.num_blocks(); ++b) {
    os << ' ' << a.ref_count(b) << (a.is_cached(b) ? "c" : "");
  }
  os << '\n';
}

/// Everything a read-only or refused call must leave alone, as text: per sequence its tokens,
/// committed tokens, swapped flag and table, and (running sequences) its kept positions and
/// slots; the device pool and the host pool (free ring order, LRU order, ref counts, cached
/// flags); every prefix-index entry (block, key, parent key, serial, parent serial, salt,
/// tokens); every counter of stats(); the pending events (read from a copy, so `m` keeps them).
/// Not covered: heavy-hitter scores (no accessor; they show through later victims).
inline std::string observable(const KVCacheManager& m) {
  std::ostringstream os;
  for (SeqId s : m.sequences()) {
    os << s << ':' << m.num_tokens(s) << ':' << m.num_committed_tokens(s)
       << (m.is_swapped(s) ? ":swapped" : "");
    for (BlockId b : m.block_table(s)) os << ' ' << b;
    if (!m.is_swapped(s)) {
      const SeqId one[] = {s};
      const KeptTokens k = m.kept_tokens(one);
      os << " kept";
      for (size_t i = 0; i < k.positions.size(); ++i)
        os << ' ' << k.positions[i] << '@' << k.slots[i];
    }
    os << '\n';
  }
  observe_pool(os, m.allocator());
  if (const BlockAllocator* host = m.host_allocator()) {
    os << "host ";
    observe_pool(os, *host);
  }
  const PrefixCache& p = m.prefix_cache();
  for (BlockId b = 0; b < m.num_total_blocks(); ++b) {
    const PrefixCache::Entry* e = p.entry(b);
    if (e == nullptr) continue;
    os << "entry " << b << ' ' << e->hash << ' ' << e->parent_hash << ' ' << e->serial << ' '
       << e->parent_serial << ' ' << e->extra_key << ':';
    for (TokenId t : p.tokens(b)) os << ' ' << t;
    os << '\n';
  }
  const KVCacheStats st = m.stats();
  os << "stats " << st.total_blocks << ' ' << st.free_blocks << ' ' << st.used_blocks << ' '
     << st.cached_blocks << ' ' << st.num_sequences << ' ' << st.num_swapped_sequences << ' '
     << st.prefix_query_tokens << ' ' << st.prefix_hit_tokens << ' ' << st.prefix_hits << ' '
     << st.prefix_misses << ' ' << st.prefix_evictions << ' ' << st.prefix_cached_entries << ' '
     << st.preemptions << ' ' << st.swapped_out_blocks << ' ' << st.swapped_in_blocks << ' '
     << st.host_total_blocks << ' ' << st.host_used_blocks << ' ' << st.released_blocks << ' '
     << st.evicted_tokens << '\n';
  if (m.config().enable_events) {
    KVCacheManager copy(m);
    for (const KVCacheEvent& e : copy.take_events()) {
      os << "event " << static_cast<int>(e.kind) << ' ' << e.block << ' ' << e.hash << ' '
         << e.parent_hash << ' ' << e.extra_key << ':';
      for (TokenId t : e.tokens) os << ' ' << t;
      os << '\n';
    }
  }
  return os.str();
}

}  // namespace pagedkv::testing
