// `pagedkv ops` results: the JSON pieces every op shares, and the ops that only report
// (stats, dump, events, batch_metadata).

#include <algorithm>
#include <span>
#include <vector>

#include "ops/ops_internal.hpp"

namespace pagedkv::ops {

json result_head(const OpsLine& l) { return json{{"op", l.op}, {"line", l.line}}; }

json copies_json(const std::vector<BlockCopy>& copies) {
  json a = json::array();
  for (const BlockCopy& c : copies) a.push_back({c.src, c.dst});
  return a;
}

json table_json(std::span<const BlockId> t) {
  return json(std::vector<BlockId>(t.begin(), t.end()));
}

std::string hex(uint64_t h) { return fmt::format("{:#018x}", h); }

std::optional<json> op_stats(const OpsLine& l, State& st) {
  expect_nothing(l);
  charge(l, st, st.manager->num_sequences());  // stats() counts the swapped sequences
  json j = result_head(l);
  const KVCacheStats s = st.manager->stats();
  j["blocks"] = {{"total", s.total_blocks},
                 {"free", s.free_blocks},
                 {"used", s.used_blocks},
                 {"cached", s.cached_blocks}};
  j["usage"] = s.usage;
  j["sequences"] = s.num_sequences;
  j["swapped_sequences"] = s.num_swapped_sequences;
  j["prefix"] = {{"query_tokens", s.prefix_query_tokens},
                 {"hit_tokens", s.prefix_hit_tokens},
                 {"hits", s.prefix_hits},
                 {"misses", s.prefix_misses},
                 {"hit_rate", s.prefix_hit_rate()},
                 {"evictions", s.prefix_evictions},
                 {"entries", s.prefix_cached_entries}};
  j["preemptions"] = s.preemptions;
  j["swap"] = {{"host_total", s.host_total_blocks},
               {"host_used", s.host_used_blocks},
               {"swapped_out_blocks", s.swapped_out_blocks},
               {"swapped_in_blocks", s.swapped_in_blocks}};
  j["eviction"] = {{"released_blocks", s.released_blocks}, {"evicted_tokens", s.evicted_tokens}};
  return j;
}

namespace {

/// The prefix index, in block order: what a later prompt can hit. `candidates`: sorted, unique
/// device blocks that some table holds or that are cached, the only ones an entry can be on (a
/// published block is held or cached until it is evicted, which unpublishes it).
json prefix_index_json(const KVCacheManager& m, const std::vector<BlockId>& candidates) {
  const PrefixCache& index = m.prefix_cache();
  json entries = json::array();
  for (BlockId b : candidates) {
    const PrefixCache::Entry* e = index.entry(b);
    if (e == nullptr) continue;
    json x{{"block", b}, {"hash", hex(e->hash)}, {"parent", hex(e->parent_hash)}};
    const std::span<const TokenId> tokens = index.tokens(b);
    x["tokens"] = std::vector<TokenId>(tokens.begin(), tokens.end());
    if (e->extra_key != 0) x["extra"] = e->extra_key;
    entries.push_back(std::move(x));
  }
  return entries;
}

}  // namespace

std::optional<json> op_dump(const OpsLine& l, State& st) {
  expect_nothing(l);
  const KVCacheManager& m = *st.manager;
  // The state printed is what is charged: the sequences, their tables (and kept positions
  // under a policy), the cached blocks and the index entries (at most one per block of those).
  charge(l, st, m.num_sequences());
  const bool show_kept = m.eviction_policy().kind() != EvictionKind::kNone;
  int64_t units = static_cast<int64_t>(m.allocator().cached_lru().size());
  for (SeqId s : m.sequences()) {
    units += table_units(m, s) + (show_kept ? m.num_tokens(s) : 0);
  }
  charge(l, st, 2 * units);
  json j = result_head(l);
  const BlockAllocator& a = m.allocator();
  j["blocks"] = {{"total", a.num_blocks()},
                 {"free", a.num_free()},
                 {"used", a.num_used()},
                 {"cached", a.num_cached()}};
  const bool prefix = m.config().enable_prefix_caching;
  json seqs = json::array();
  std::vector<BlockId> held;  // device blocks of the running tables
  for (SeqId s : m.sequences()) {
    json e{{"seq", s}, {"tokens", m.num_tokens(s)}};
    if (prefix) e["committed"] = m.num_committed_tokens(s);
    const std::span<const BlockId> table = m.block_table(s);
    e[m.is_swapped(s) ? "host_table" : "table"] = table_json(table);
    if (!m.is_swapped(s)) {
      for (BlockId b : table) {
        if (b != KVCacheManager::kNoBlock) held.push_back(b);
      }
      if (show_kept) {
        const std::vector<SeqId> one{s};
        e["kept"] = m.kept_tokens(one).positions;
      }
    }
    seqs.push_back(std::move(e));
  }
  j["sequences"] = std::move(seqs);
  std::ranges::sort(held);
  held.erase(std::unique(held.begin(), held.end()), held.end());
  // Reference count of every block some table holds, in block order (a cached block nobody
  // holds is 0 and is listed under "cached" instead).
  // ordered_json's operator[] searches its keys linearly; the keys are distinct (held is
  // deduplicated), so append them to the underlying vector: linear, not quadratic, in blocks.
  json refs = json::object();
  auto& entries = static_cast<json::object_t::Container&>(refs.get_ref<json::object_t&>());
  entries.reserve(held.size());
  for (BlockId b : held) entries.emplace_back(std::to_string(b), a.ref_count(b));
  j["ref_counts"] = std::move(refs);
  const std::vector<BlockId> cached = a.cached_lru();
  j["cached"] = cached;
  if (prefix) {
    std::vector<BlockId> candidates = held;
    candidates.insert(candidates.end(), cached.begin(), cached.end());
    std::ranges::sort(candidates);
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    j["prefix_index"] = prefix_index_json(m, candidates);
  }
  const KVCacheStats stats = m.stats();
  j["prefix"] = {{"hits", stats.prefix_hits}, {"misses", stats.prefix_misses}};
  return j;
}

std::optional<json> op_events(const OpsLine& l, State& st) {
  expect_nothing(l);
  json j = result_head(l);
  json ev = json::array();
  for (const KVCacheEvent& e : st.manager->take_events()) {
    if (e.kind == KVCacheEvent::Kind::kAllCleared) {  // names no block
      ev.push_back(json{{"kind", event_kind_name(e.kind)}});
      continue;
    }
    json x{{"kind", event_kind_name(e.kind)}, {"block", e.block}, {"hash", hex(e.hash)}};
    if (e.kind == KVCacheEvent::Kind::kStored) {
      x["parent"] = hex(e.parent_hash);
      x["tokens"] = e.tokens;
      if (e.extra_key != 0) x["extra"] = e.extra_key;
    }
    ev.push_back(std::move(x));
  }
  j["events"] = std::move(ev);
  return j;
}

json padded_rows_json(const PaddedBlockTables& p) {
  const auto width = static_cast<size_t>(p.max_blocks_per_seq);
  json rows = json::array();
  for (size_t i = 0; i < static_cast<size_t>(p.num_seqs); ++i) {
    rows.push_back(std::vector<int32_t>(p.block_tables.begin() + i * width,
                                        p.block_tables.begin() + (i + 1) * width));
  }
  return rows;
}

json csr_json(const CsrBlockTables& c) {
  return {{"indptr", c.indptr}, {"indices", c.indices}, {"last_page_len", c.last_page_len}};
}

std::optional<json> op_batch_metadata(const OpsLine& l, State& st) {
  expect_args(l, 1, SIZE_MAX, "SEQ[:NEW]... (SEQ -1: a padding row)");
  expect_options(l, {});
  const KVCacheManager& m = *st.manager;
  std::vector<SeqId> seqs;
  std::vector<int64_t> news;
  int64_t total_new = 0;
  int64_t widest = 0;
  for (const std::string& a : l.args) {
    const size_t colon = a.find(':');
    const std::string_view seq_text = std::string_view(a).substr(0, colon);
    const SeqId s = to_int(l, "sequence id", seq_text, kPaddingSeq, INT64_MAX);
    const int64_t n = colon == std::string::npos
                          ? (s == kPaddingSeq ? 0 : 1)
                          : count_value(l, "new tokens", std::string_view(a).substr(colon + 1));
    total_new += n;
    check_tokens_per_op(l, total_new, "new tokens");
    if (s != kPaddingSeq && m.has_sequence(s))
      widest = std::max<int64_t>(widest, static_cast<int64_t>(m.block_table(s).size()));
    seqs.push_back(s);
    news.push_back(n);
  }
  // The padded tables are rows x widest entries: bounded like tokens, before they are built.
  const int64_t entries = static_cast<int64_t>(seqs.size()) * std::max<int64_t>(widest, 1);
  check_tokens_per_op(l, entries, "padded table entries");
  charge(l, st, 2 * entries + total_new);
  const BatchMetadata b = m.batch_metadata(seqs, news);
  json j = result_head(l);
  j["block_size"] = b.block_size;
  j["block_tables"] = padded_rows_json(b.padded);
  j["context_lens"] = b.padded.context_lens;
  j["slot_mapping"] = b.slot_mapping;
  j["query_start"] = b.query_start;
  j["csr"] = csr_json(b.csr);
  return j;
}

}  // namespace pagedkv::ops
