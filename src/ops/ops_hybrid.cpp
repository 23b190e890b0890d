// `pagedkv ops` on a hybrid manager (issue 17 item 6): `manager ... groups=full,window:8,...`
// creates a HybridKVCacheManager (KV cache groups over one pool), and these handlers run the
// ops it has: add, append, can_append, truncate, fork, free, dump and batch_metadata. Results
// are per group: slots, released entries and tables are [group][...] arrays in the order of
// the groups= list. Same rules as the other handlers: arguments and limits checked first,
// only what changed printed, State::held_tokens exact.

#include <algorithm>

#include "ops/ops_internal.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::ops {

namespace {

using Hybrid = HybridKVCacheManager;

/// Entries of every group's table of `seq` (0 if unknown): what most ops are charged.
int64_t hybrid_units(const Hybrid& m, SeqId seq) {
  if (!m.has_sequence(seq)) return 0;
  return static_cast<int64_t>(m.block_table(seq, 0).size()) * m.num_groups();
}

json group_tables_json(const Hybrid& m, SeqId seq) {
  json tables = json::array();
  for (int32_t g = 0; g < m.num_groups(); ++g) tables.push_back(table_json(m.block_table(seq, g)));
  return tables;
}

/// `text` cut at every `sep` (empty pieces kept).
std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  for (size_t at = 0;;) {
    const size_t next = text.find(sep, at);
    parts.push_back(text.substr(at, next == std::string_view::npos ? next : next - at));
    if (next == std::string_view::npos) return parts;
    at = next + 1;
  }
}

/// One group of the `groups=` list: full | window:W | window:W:S (S sinks) | chunk:C.
KVCacheGroupSpec parse_group(const OpsLine& l, std::string_view text) {
  const std::vector<std::string_view> parts = split(text, ':');
  KVCacheGroupSpec g;
  const auto value = [&](size_t i, std::string_view what) {
    return static_cast<int32_t>(to_int(l, what, parts[i], 0, OpsLimits::kMaxTotalTokens));
  };
  if (parts[0] == "full" && parts.size() == 1) return g;
  if (parts[0] == "window" && (parts.size() == 2 || parts.size() == 3)) {
    g.kind = GroupAttention::kSlidingWindow;
    g.window = value(1, "window");
    if (parts.size() == 3) g.sink_tokens = value(2, "sinks");
    return g;
  }
  if (parts[0] == "chunk" && parts.size() == 2) {
    g.kind = GroupAttention::kChunkedLocal;
    g.chunk = value(1, "chunk");
    return g;
  }
  fail_at(l.line,
          fmt::format("manager: group '{}' is not full, window:W, window:W:S or chunk:C", text));
}

}  // namespace

bool manager_has_groups(const OpsLine& l) { return l.options.contains("groups"); }

HybridKVCacheManagerConfig hybrid_manager_config(const OpsLine& l) {
  expect_args(l, 0, 0, "only key=value options");
  expect_options(l, {"blocks", "block_size", "groups"});
  if (!l.options.contains("blocks")) fail_at(l.line, "manager: blocks=N is required");
  HybridKVCacheManagerConfig c;
  // One block more than asked: block 0 is the hybrid manager's null block, so blocks=N keeps
  // N usable blocks as for the single-group manager.
  c.num_blocks =
      static_cast<int32_t>(to_int(l, "blocks", l.options.at("blocks"), 1, OpsLimits::kMaxBlocks)) +
      1;
  if (l.options.contains("block_size")) {
    c.block_size = static_cast<int32_t>(
        to_int(l, "block_size", l.options.at("block_size"), 1, OpsLimits::kMaxBlockSize));
  }
  const std::vector<std::string_view> items = split(l.options.at("groups"), ',');
  if (static_cast<int64_t>(items.size()) > OpsLimits::kMaxGroups) {
    fail_at(l.line, fmt::format("manager: more than {} groups", OpsLimits::kMaxGroups));
  }
  for (std::string_view item : items) c.groups.push_back(parse_group(l, item));
  return c;
}

std::optional<json> hy_add(const OpsLine& l, State& st) {
  expect_args(l, 1, 1, "SEQ (a manager with groups takes no prompt: append its tokens)");
  expect_options(l, {});
  const SeqId seq = seq_arg(l, 0);
  if (!st.hybrid->has_sequence(seq)) check_new_sequence(l, st);
  st.hybrid->add_sequence(seq);
  return std::nullopt;
}

std::optional<json> hy_append(const OpsLine& l, State& st) {
  const int64_t n = append_args(l).n;  // token ids are checked, then only counted
  Hybrid& m = *st.hybrid;
  json j = result_head(l);
  const SeqId seq = seq_arg(l, 0);
  j["seq"] = seq;
  check_growth(l, st, n);
  charge(l, st, n * m.num_groups() + hybrid_units(m, seq));
  const size_t old_size = m.has_sequence(seq) ? m.block_table(seq, 0).size() : 0;
  const int64_t needed = m.blocks_needed(seq, n);  // throws for an unknown sequence
  auto r = m.append_slots(seq, n);
  j["ok"] = r.has_value();
  if (!r) {
    j["error"] = "no_free_blocks";
    j["blocks_needed"] = needed;
    return j;
  }
  st.held_tokens += n;
  j["slots"] = r->slots;
  json copies = json::array();
  for (size_t i = 0; i < r->copies.size(); ++i) {
    copies.push_back({r->copies[i].src, r->copies[i].dst, r->copy_groups[i]});
  }
  j["copies"] = std::move(copies);
  json fresh = json::array();
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    const std::span<const BlockId> t = m.block_table(seq, g);
    fresh.push_back(table_json(t.subspan(std::min(old_size, t.size()))));
  }
  j["new_blocks"] = std::move(fresh);
  j["released"] = r->released;
  return j;
}

std::optional<json> hy_can_append(const OpsLine& l, State& st) {
  expect_args(l, 2, 2, "SEQ COUNT");
  expect_options(l, {});
  const SeqId seq = seq_arg(l, 0);
  const int64_t n = count_value(l, "count", l.args[1]);
  charge(l, st, hybrid_units(*st.hybrid, seq));
  json j = result_head(l);
  j["seq"] = seq;
  j["n"] = n;
  j["blocks_needed"] = st.hybrid->blocks_needed(seq, n);
  j["ok"] = st.hybrid->can_append(seq, n);
  return j;
}

std::optional<json> hy_truncate(const OpsLine& l, State& st) {
  expect_args(l, 2, 2, "SEQ N");
  expect_options(l, {});
  Hybrid& m = *st.hybrid;
  const SeqId seq = seq_arg(l, 0);
  const int64_t n = to_int(l, "N", l.args[1], 0, INT64_MAX);
  charge(l, st, hybrid_units(m, seq));
  const int64_t old_tokens = m.num_tokens(seq);
  m.truncate(seq, n);
  st.held_tokens -= old_tokens - m.num_tokens(seq);
  json j = result_head(l);
  j["seq"] = seq;
  j["tokens"] = m.num_tokens(seq);
  j["tables"] = group_tables_json(m, seq);
  return j;
}

std::optional<json> hy_fork(const OpsLine& l, State& st) {
  Hybrid& m = *st.hybrid;
  fork_sequence(l, st, m, [&](SeqId p) { return hybrid_units(m, p); });
  return std::nullopt;
}

std::optional<json> hy_free(const OpsLine& l, State& st) {
  Hybrid& m = *st.hybrid;
  free_sequence(l, st, m, [&](SeqId s) { return hybrid_units(m, s); });
  return std::nullopt;
}

std::optional<json> hy_dump(const OpsLine& l, State& st) {
  expect_nothing(l);
  const Hybrid& m = *st.hybrid;
  const std::vector<SeqId> ids = m.sequences();
  int64_t units = static_cast<int64_t>(ids.size()) + m.num_groups();
  for (SeqId s : ids) units += hybrid_units(m, s);
  charge(l, st, 2 * units);
  json j = result_head(l);
  const BlockAllocator& a = m.allocator();
  // The null block (id 0) is the manager's, not the pool's to give: counted apart.
  j["blocks"] = {{"total", a.num_blocks() - 1}, {"free", a.num_free()}, {"used", a.num_used() - 1}};
  json groups = json::array();
  for (int32_t g = 0; g < m.num_groups(); ++g) {
    const KVCacheGroupSpec& spec = m.config().groups[static_cast<size_t>(g)];
    json e{{"group", g}, {"kind", group_attention_name(spec.kind)}};
    if (spec.kind == GroupAttention::kSlidingWindow) {
      e["window"] = spec.window;
      e["sinks"] = spec.sink_tokens;
    }
    if (spec.kind == GroupAttention::kChunkedLocal) e["chunk"] = spec.chunk;
    e["blocks_in_tables"] = m.blocks_in_tables(g);
    groups.push_back(std::move(e));
  }
  j["groups"] = std::move(groups);
  json seqs = json::array();
  std::vector<BlockId> held;
  for (SeqId s : ids) {
    seqs.push_back({{"seq", s}, {"tokens", m.num_tokens(s)}, {"tables", group_tables_json(m, s)}});
    for (int32_t g = 0; g < m.num_groups(); ++g) {
      for (BlockId b : m.block_table(s, g)) {
        if (b != Hybrid::kNullBlock) held.push_back(b);
      }
    }
  }
  j["sequences"] = std::move(seqs);
  std::ranges::sort(held);
  held.erase(std::unique(held.begin(), held.end()), held.end());
  json refs = json::object();
  for (BlockId b : held) refs[std::to_string(b)] = a.ref_count(b);
  j["ref_counts"] = std::move(refs);
  return j;
}

std::optional<json> hy_batch_metadata(const OpsLine& l, State& st) {
  expect_args(l, 1, SIZE_MAX, "SEQ... (context = each sequence's tokens)");
  expect_options(l, {});
  const Hybrid& m = *st.hybrid;
  std::vector<SeqId> seqs;
  int64_t widest = 0;
  for (size_t i = 0; i < l.args.size(); ++i) {
    const SeqId s = seq_arg(l, i);
    if (m.has_sequence(s)) {
      widest = std::max<int64_t>(widest, static_cast<int64_t>(m.block_table(s, 0).size()));
    }
    seqs.push_back(s);
  }
  const int64_t entries = static_cast<int64_t>(seqs.size()) * std::max<int64_t>(widest, 1);
  check_tokens_per_op(l, entries, "padded table entries");
  charge(l, st, 2 * entries * m.num_groups());
  const std::vector<GroupBatchMetadata> groups = m.batch_metadata(seqs);
  json j = result_head(l);
  json out = json::array();
  for (const GroupBatchMetadata& g : groups) {
    out.push_back({{"window_left", g.mask.window_left},
                   {"sink_tokens", g.mask.sink_tokens},
                   {"chunk_size", g.mask.chunk_size},
                   {"block_tables", padded_rows_json(g.padded)},
                   {"context_lens", g.padded.context_lens},
                   {"csr", csr_json(g.csr)}});
  }
  j["groups"] = std::move(out);
  return j;
}

}  // namespace pagedkv::ops
