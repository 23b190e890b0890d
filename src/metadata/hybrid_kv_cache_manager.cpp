#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

#include <algorithm>
#include <limits>

#include "core/check.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"

namespace pagedkv {

const char* group_attention_name(GroupAttention kind) {
  switch (kind) {
    case GroupAttention::kFull:
      return "full";
    case GroupAttention::kSlidingWindow:
      return "sliding_window";
    case GroupAttention::kChunkedLocal:
      return "chunked_local";
  }
  return "unknown";
}

int64_t KVCacheGroupSpec::first_visible(int64_t pos) const {
  switch (kind) {
    case GroupAttention::kSlidingWindow:
      return std::max<int64_t>(0, pos - window + 1);
    case GroupAttention::kChunkedLocal:
      return pos / chunk * chunk;
    case GroupAttention::kFull:
      break;
  }
  return 0;
}

AttentionMask KVCacheGroupSpec::mask() const {
  if (kind == GroupAttention::kSlidingWindow) return {window, sink_tokens, 0};
  if (kind == GroupAttention::kChunkedLocal) return {-1, 0, chunk};
  return {};
}

namespace {

void validate_group(const KVCacheGroupSpec& g, size_t i) {
  PAGEDKV_CHECK(g.num_layers >= 1, "hybrid manager: group {} layers must be >= 1, got {}", i,
                g.num_layers);
  switch (g.kind) {
    case GroupAttention::kFull:
      PAGEDKV_CHECK(
          g.window == 0 && g.chunk == 0 && g.sink_tokens == 0,
          "hybrid manager: full group {} takes no window, chunk or sinks (got {}, {}, {})", i,
          g.window, g.chunk, g.sink_tokens);
      return;
    case GroupAttention::kSlidingWindow:
      PAGEDKV_CHECK(g.window >= 1 && g.chunk == 0,
                    "hybrid manager: sliding-window group {} needs window >= 1 and no chunk, got "
                    "window {}, chunk {}",
                    i, g.window, g.chunk);
      PAGEDKV_CHECK(g.sink_tokens >= 0, "hybrid manager: group {} sinks must be >= 0, got {}", i,
                    g.sink_tokens);
      return;
    case GroupAttention::kChunkedLocal:
      PAGEDKV_CHECK(g.chunk >= 1 && g.window == 0 && g.sink_tokens == 0,
                    "hybrid manager: chunked group {} needs chunk >= 1 and no window or sinks, got "
                    "chunk {}, window {}, sinks {}",
                    i, g.chunk, g.window, g.sink_tokens);
      return;
  }
  detail::fail("hybrid manager: group {} has unknown attention kind {}", i,
               static_cast<int>(g.kind));
}

int32_t checked_pool_size(const HybridKVCacheManagerConfig& c) {
  PAGEDKV_CHECK(c.num_blocks >= 2,
                "hybrid manager: num_blocks must be >= 2 (block 0 is the null block), got {}",
                c.num_blocks);
  PAGEDKV_CHECK(c.block_size >= 1, "hybrid manager: block_size must be >= 1, got {}", c.block_size);
  PAGEDKV_CHECK(!c.groups.empty(), "hybrid manager: at least one KV cache group is needed");
  for (size_t i = 0; i < c.groups.size(); ++i) validate_group(c.groups[i], i);
  PAGEDKV_CHECK(c.num_host_blocks >= 0 && c.num_host_blocks < (1 << 30),
                "hybrid manager: num_host_blocks must be in [0, 2^30), got {}", c.num_host_blocks);
  return c.num_blocks;
}

}  // namespace

HybridKVCacheManager::HybridKVCacheManager(HybridKVCacheManagerConfig config)
    : config_(std::move(config)), pool_(checked_pool_size(config_)) {
  const std::optional<BlockId> null = pool_.allocate();  // ids come in ascending order: 0
  PAGEDKV_CHECK(null && *null == kNullBlock, "hybrid manager: the null block is not block 0");
  if (config_.num_host_blocks > 0) {
    host_.emplace(config_.num_host_blocks + 1);
    (void)host_->allocate();  // host block 0, so that a swapped entry never reads as null
  }
  prefix_.reserve(config_.groups.size());
  for (size_t g = 0; g < config_.groups.size(); ++g) {
    prefix_.emplace_back(config_.num_blocks, config_.block_size);
  }
}

const HybridKVCacheManager::Sequence& HybridKVCacheManager::get(SeqId seq, const char* op) const {
  const auto it = seqs_.find(seq);
  PAGEDKV_CHECK(it != seqs_.end(), "{}: unknown sequence {}", op, seq);
  return it->second;
}

HybridKVCacheManager::Sequence& HybridKVCacheManager::get(SeqId seq, const char* op) {
  const auto it = seqs_.find(seq);
  PAGEDKV_CHECK(it != seqs_.end(), "{}: unknown sequence {}", op, seq);
  return it->second;
}

const HybridKVCacheManager::Sequence& HybridKVCacheManager::get_running(SeqId seq,
                                                                        const char* op) const {
  const Sequence& s = get(seq, op);
  PAGEDKV_CHECK(!s.swapped, "{}: sequence {} is swapped out", op, seq);
  return s;
}

HybridKVCacheManager::Sequence HybridKVCacheManager::new_sequence() const {
  Sequence s;
  s.tables.resize(config_.groups.size());
  s.released_to.resize(config_.groups.size());
  s.serials.resize(config_.groups.size());
  return s;
}

int64_t HybridKVCacheManager::sink_blocks(const KVCacheGroupSpec& g) const {
  return blocks_for_tokens(g.sink_tokens, config_.block_size);
}

int64_t HybridKVCacheManager::first_live_entry(const KVCacheGroupSpec& g, int64_t pos) const {
  return g.first_visible(pos) / config_.block_size;
}

int64_t HybridKVCacheManager::release_end(const Sequence& s, size_t g) const {
  return std::min(first_live_entry(config_.groups[g], s.num_tokens),
                  static_cast<int64_t>(s.tables[g].size()));
}

void HybridKVCacheManager::add_sequence(SeqId seq) {
  PAGEDKV_CHECK(!seqs_.contains(seq), "add_sequence: sequence {} already exists", seq);
  seqs_.emplace(seq, new_sequence());
}

HybridKVCacheManager::Plan HybridKVCacheManager::plan(const Sequence& s, int64_t n) const {
  const int64_t p = s.num_tokens;
  const int32_t bs = config_.block_size;
  Plan out;
  for (size_t g = 0; g < config_.groups.size(); ++g) {
    const KVCacheGroupSpec& spec = config_.groups[g];
    const std::vector<BlockId>& table = s.tables[g];
    const auto size = static_cast<int64_t>(table.size());
    const int64_t end = release_end(s, g);
    for (int64_t e = std::max(sink_blocks(spec), s.released_to[g]); e < end; ++e) {
      const BlockId b = table[static_cast<size_t>(e)];
      if (b == kNullBlock) continue;
      out.release.emplace_back(static_cast<int32_t>(g), e);
      out.freed += pool_.ref_count(b) == 1;
    }
    // A published block may be the last one again after a truncate: its cached content must
    // not be overwritten in place either.
    if (n > 0 && p % bs != 0 &&
        (pool_.ref_count(table.back()) > 1 || pool_.is_cached(table.back()))) {
      out.cow.push_back(static_cast<int32_t>(g));
    }
    out.new_blocks += blocks_for_tokens(p + n, bs) - size;
  }
  return out;
}

int64_t HybridKVCacheManager::blocks_needed(SeqId seq, int64_t n) const {
  PAGEDKV_CHECK(n >= 0, "blocks_needed: tokens must be >= 0, got {}", n);
  const Plan pl = plan(get_running(seq, "blocks_needed"), n);
  return pl.new_blocks + static_cast<int64_t>(pl.cow.size()) - pl.freed;
}

bool HybridKVCacheManager::can_append(SeqId seq, int64_t n) const {
  return blocks_needed(seq, n) <= pool_.num_available();
}

std::optional<HybridAppendResult> HybridKVCacheManager::append_slots(SeqId seq, int64_t n) {
  return do_append(seq, n, {}, false, true, "append_slots");
}

std::optional<HybridAppendResult> HybridKVCacheManager::append_slots(SeqId seq, int64_t n,
                                                                     const AppendOptions& options) {
  return do_append(seq, n, {}, false, options.return_slots, "append_slots");
}

std::optional<HybridAppendResult> HybridKVCacheManager::append_tokens(
    SeqId seq, std::span<const TokenId> tokens, const AppendOptions& options) {
  return do_append(seq, static_cast<int64_t>(tokens.size()), tokens, true, options.return_slots,
                   "append_tokens");
}

std::optional<HybridAppendResult> HybridKVCacheManager::append_tokens(
    SeqId seq, std::span<const TokenId> tokens) {
  return do_append(seq, static_cast<int64_t>(tokens.size()), tokens, true, true, "append_tokens");
}

std::optional<HybridAppendResult> HybridKVCacheManager::do_append(SeqId seq, int64_t n,
                                                                  std::span<const TokenId> ids,
                                                                  bool record_ids, bool slots,
                                                                  const char* op) {
  PAGEDKV_CHECK(n >= 0, "{}: tokens must be >= 0, got {}", op, n);
  PAGEDKV_CHECK(n <= std::numeric_limits<int32_t>::max(),
                "{}: at most 2^31 - 1 tokens per call, got {}", op, n);
  // One lookup (an append runs once per sequence per decode step): get_running's checks.
  auto& s = const_cast<Sequence&>(get_running(seq, op));
  const Plan pl = plan(s, n);
  const int64_t fresh_count = pl.new_blocks + static_cast<int64_t>(pl.cow.size());
  if (fresh_count - pl.freed > pool_.num_available()) return std::nullopt;
  // Only this can throw (bad_alloc) among the changes: do it first.
  if (s.ids_known && record_ids) {
    s.token_ids.insert(s.token_ids.end(), ids.begin(), ids.end());
  }

  HybridAppendResult r;
  r.released.resize(config_.groups.size());
  if (slots) r.slots.resize(config_.groups.size());
  for (const auto& [g, e] : pl.release) {
    BlockId& entry = s.tables[static_cast<size_t>(g)][static_cast<size_t>(e)];
    r.released[static_cast<size_t>(g)].push_back(entry);
    (void)pool_.release(entry);
    entry = kNullBlock;
  }
  // Every entry of [sink blocks, release_end) is released now: the next scan starts there.
  for (size_t g = 0; g < s.tables.size(); ++g) {
    s.released_to[g] = std::max(s.released_to[g], release_end(s, g));
  }
  // Enough blocks are available now (checked above, the releases came first).
  std::vector<BlockId> fresh = allocate_evicting(static_cast<int32_t>(fresh_count));
  size_t next = 0;
  for (int32_t g : pl.cow) {
    BlockId& last = s.tables[static_cast<size_t>(g)].back();
    r.copies.push_back({last, fresh[next]});
    r.copy_groups.push_back(g);
    (void)pool_.release(last);  // shared: its count stays >= 1
    last = fresh[next++];
  }
  const int64_t p = s.num_tokens;
  const int32_t bs = config_.block_size;
  for (size_t g = 0; g < s.tables.size(); ++g) {
    std::vector<BlockId>& table = s.tables[g];
    while (static_cast<int64_t>(table.size()) < blocks_for_tokens(p + n, bs)) {
      table.push_back(fresh[next++]);
    }
    if (slots) append_position_slots(table, p, n, bs, r.slots[g]);
  }
  s.num_tokens = p + n;
  if (n > 0 && !record_ids && s.ids_known) {
    s.ids_known = false;  // positions with unknown ids: nothing at or after them is keyed
    s.token_ids.clear();
  }
  return r;
}

void HybridKVCacheManager::fork(SeqId parent, SeqId child) {
  const Sequence& src = get_running(parent, "fork");
  PAGEDKV_CHECK(!seqs_.contains(child), "fork: sequence {} already exists", child);
  Sequence copy = src;
  for (const std::vector<BlockId>& table : copy.tables) {
    for (BlockId b : table) {
      if (b != kNullBlock) pool_.retain(b);
    }
  }
  seqs_.emplace(child, std::move(copy));
}

void HybridKVCacheManager::truncate(SeqId seq, int64_t num_tokens) {
  (void)get_running(seq, "truncate");
  Sequence& s = get(seq, "truncate");
  PAGEDKV_CHECK(num_tokens >= 0 && num_tokens <= s.num_tokens,
                "truncate: sequence {} has {} tokens, cannot keep {}", seq, s.num_tokens,
                num_tokens);
  const int64_t keep = blocks_for_tokens(num_tokens, config_.block_size);
  for (size_t g = 0; g < s.tables.size(); ++g) {
    const KVCacheGroupSpec& spec = config_.groups[g];
    const int64_t sinks = std::min(sink_blocks(spec), keep);
    for (int64_t e = 0; e < keep; ++e) {
      const bool needed = e < sinks || e >= first_live_entry(spec, num_tokens);
      PAGEDKV_CHECK(!needed || s.tables[g][static_cast<size_t>(e)] != kNullBlock,
                    "truncate: sequence {} group {} ({}) already released block {} (positions "
                    "{}..{}), which the query at position {} needs",
                    seq, g, group_attention_name(spec.kind), e, e * config_.block_size,
                    (e + 1) * config_.block_size - 1, num_tokens);
    }
  }
  // Tail first, entry by entry over the groups, as free_sequence.
  for (auto e = static_cast<int64_t>(s.tables[0].size()); e-- > keep;) {
    for (std::vector<BlockId>& table : s.tables) {
      if (table[static_cast<size_t>(e)] != kNullBlock) {
        (void)pool_.release(table[static_cast<size_t>(e)]);
      }
    }
  }
  for (std::vector<BlockId>& table : s.tables) table.resize(static_cast<size_t>(keep));
  for (int64_t& r : s.released_to) r = std::min(r, keep);
  s.num_tokens = num_tokens;
  if (s.ids_known) s.token_ids.resize(static_cast<size_t>(num_tokens));
  s.committed = std::min(s.committed, num_tokens);
  // Keys of the full blocks that remain; a partial last block is keyed again once full.
  const auto full_blocks = static_cast<size_t>(num_tokens / config_.block_size);
  if (s.hashes.size() > full_blocks) {
    s.hashes.resize(full_blocks);
    for (std::vector<uint64_t>& serials : s.serials) serials.resize(full_blocks);
  }
}

void HybridKVCacheManager::release_tables(const std::vector<std::vector<BlockId>>& tables,
                                          BlockAllocator& pool) {
  // Tail entries first over every group: cached tail blocks reach the LRU first, so they are
  // evicted before the head blocks other prompts are likelier to share.
  for (auto e = static_cast<int64_t>(tables[0].size()); e-- > 0;) {
    for (const std::vector<BlockId>& table : tables) {
      if (table[static_cast<size_t>(e)] != kNullBlock) {
        (void)pool.release(table[static_cast<size_t>(e)]);
      }
    }
  }
}

void HybridKVCacheManager::free_sequence(SeqId seq) {
  const Sequence& s = get(seq, "free_sequence");
  release_tables(s.tables, s.swapped ? *host_ : pool_);
  seqs_.erase(seq);
}

const PrefixCache& HybridKVCacheManager::prefix_cache(int32_t group) const {
  PAGEDKV_CHECK(group >= 0 && group < num_groups(), "prefix_cache: group {} not in [0, {})", group,
                num_groups());
  return prefix_[static_cast<size_t>(group)];
}

std::vector<SeqId> HybridKVCacheManager::sequences() const {
  std::vector<SeqId> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

int64_t HybridKVCacheManager::num_tokens(SeqId seq) const {
  return get(seq, "num_tokens").num_tokens;
}

std::span<const BlockId> HybridKVCacheManager::block_table(SeqId seq, int32_t group) const {
  const Sequence& s = get(seq, "block_table");
  PAGEDKV_CHECK(group >= 0 && group < num_groups(), "block_table: group {} not in [0, {})", group,
                num_groups());
  return s.tables[static_cast<size_t>(group)];
}

int64_t HybridKVCacheManager::blocks_in_tables(int32_t group) const {
  PAGEDKV_CHECK(group >= 0 && group < num_groups(), "blocks_in_tables: group {} not in [0, {})",
                group, num_groups());
  int64_t n = 0;
  for (const auto& [id, s] : seqs_) {
    if (s.swapped) continue;
    n += std::count_if(s.tables[static_cast<size_t>(group)].begin(),
                       s.tables[static_cast<size_t>(group)].end(),
                       [](BlockId b) { return b != kNullBlock; });
  }
  return n;
}

std::vector<GroupBatchMetadata> HybridKVCacheManager::batch_metadata(
    std::span<const SeqId> seqs) const {
  std::vector<const Sequence*> rows;
  std::vector<int32_t> lens;
  for (SeqId id : seqs) {
    const Sequence& s = get_running(id, "batch_metadata");
    PAGEDKV_CHECK(s.num_tokens <= std::numeric_limits<int32_t>::max(),
                  "batch_metadata: sequence {} has {} tokens, more than int32 context lengths hold",
                  id, s.num_tokens);
    rows.push_back(&s);
    lens.push_back(static_cast<int32_t>(s.num_tokens));
  }
  std::vector<GroupBatchMetadata> out(config_.groups.size());
  std::vector<std::span<const BlockId>> tables(rows.size());
  for (size_t g = 0; g < config_.groups.size(); ++g) {
    for (size_t i = 0; i < rows.size(); ++i) tables[i] = rows[i]->tables[g];
    out[g].padded = build_padded_block_tables(tables, lens, config_.block_size);
    out[g].padded.num_blocks = config_.num_blocks;
    out[g].csr = build_csr_block_tables(tables, lens, config_.block_size);
    out[g].mask = config_.groups[g].mask();
  }
  return out;
}

}  // namespace pagedkv
