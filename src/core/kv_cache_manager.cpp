#include "pagedkv/kv_cache_manager.hpp"

#include <algorithm>
#include <utility>

#include "detail/check.hpp"

namespace pagedkv {

namespace {
const KVCacheManagerConfig& validated(const KVCacheManagerConfig& config) {
  PAGEDKV_CHECK(config.num_blocks >= 1, "KVCacheManager: num_blocks must be >= 1, got {}",
                config.num_blocks);
  PAGEDKV_CHECK(config.block_size >= 1, "KVCacheManager: block_size must be >= 1, got {}",
                config.block_size);
  return config;
}
}  // namespace

KVCacheManager::KVCacheManager(const KVCacheManagerConfig& config)
    : config_(validated(config)),
      allocator_(config.num_blocks),
      prefix_(config.num_blocks, config.block_size),
      policy_(make_eviction_policy(config.eviction)) {}

const KVCacheManager::Sequence& KVCacheManager::get(SeqId seq, const char* op) const {
  auto it = seqs_.find(seq);
  PAGEDKV_CHECK(it != seqs_.end(), "KVCacheManager::{}: unknown sequence {}", op, seq);
  return it->second;
}

KVCacheManager::Sequence& KVCacheManager::get(SeqId seq, const char* op) {
  return const_cast<Sequence&>(std::as_const(*this).get(seq, op));
}

void KVCacheManager::add_sequence(SeqId seq) {
  PAGEDKV_CHECK(seq != kPaddingSeq, "KVCacheManager::add_sequence: id {} is reserved for padding",
                seq);
  PAGEDKV_CHECK(!seqs_.contains(seq), "KVCacheManager::add_sequence: sequence {} already exists",
                seq);
  seqs_.emplace(seq, Sequence{});
}

void KVCacheManager::free_sequence(SeqId seq) {
  Sequence& s = get(seq, "free_sequence");
  // Tail blocks first: if they become cached, they are evicted before the head blocks that
  // other prompts are more likely to share.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) allocator_.release(*it);
  seqs_.erase(seq);
}

void KVCacheManager::fork(SeqId parent, SeqId child) {
  const Sequence& p = get(parent, "fork");
  PAGEDKV_CHECK(child != kPaddingSeq, "KVCacheManager::fork: id {} is reserved for padding", child);
  PAGEDKV_CHECK(!seqs_.contains(child), "KVCacheManager::fork: sequence {} already exists", child);
  Sequence copy = p;  // copy before emplace: emplace may rehash and move p
  for (BlockId b : copy.blocks) allocator_.retain(b);
  seqs_.emplace(child, std::move(copy));
}

int32_t KVCacheManager::blocks_needed_to_append(SeqId seq, int64_t n) const {
  const Sequence& s = get(seq, "blocks_needed_to_append");
  PAGEDKV_CHECK(n >= 0, "KVCacheManager::blocks_needed_to_append: token count must be >= 0, got {}",
                n);
  const int64_t bs = config_.block_size;
  int64_t needed = blocks_for_tokens(s.num_tokens + n, bs) - static_cast<int64_t>(s.blocks.size());
  // Copy-on-write: writing into a shared, partially filled last block needs a private copy.
  const bool partial_last = s.num_tokens % bs != 0;
  if (n > 0 && partial_last && allocator_.ref_count(s.blocks.back()) > 1) ++needed;
  return static_cast<int32_t>(std::min<int64_t>(needed, INT32_MAX));
}

bool KVCacheManager::can_append(SeqId seq, int64_t n) const {
  return blocks_needed_to_append(seq, n) <= allocator_.num_available();
}

std::optional<AppendResult> KVCacheManager::append_slots(SeqId seq, int64_t n) {
  Sequence& s = get(seq, "append_slots");
  const int32_t needed = blocks_needed_to_append(seq, n);
  std::optional<std::vector<BlockId>> fresh = allocator_.allocate(needed);
  if (!fresh) return std::nullopt;

  AppendResult result;
  const int64_t bs = config_.block_size;
  auto next_fresh = fresh->begin();
  if (n > 0 && s.num_tokens % bs != 0 && allocator_.ref_count(s.blocks.back()) > 1) {
    const BlockId shared = s.blocks.back();
    const BlockId copy = *next_fresh++;
    result.copies.push_back({shared, copy});
    allocator_.release(shared);  // ref > 1, so this only drops our reference
    s.blocks.back() = copy;
  }
  s.blocks.insert(s.blocks.end(), next_fresh, fresh->end());

  result.slots.reserve(n);
  for (int64_t pos = s.num_tokens; pos < s.num_tokens + n; ++pos) {
    result.slots.push_back(static_cast<Slot>(s.blocks[pos / bs]) * bs + pos % bs);
  }
  s.num_tokens += n;
  return result;
}

BatchMetadata KVCacheManager::batch_metadata(std::span<const SeqId> seqs,
                                             std::span<const int64_t> num_new_tokens) const {
  PAGEDKV_CHECK(seqs.size() == num_new_tokens.size(),
                "KVCacheManager::batch_metadata: {} sequences but {} new-token counts",
                seqs.size(), num_new_tokens.size());
  BatchMetadata meta;
  meta.block_size = config_.block_size;
  std::vector<std::span<const BlockId>> tables;
  std::vector<int32_t> lens;
  tables.reserve(seqs.size());
  lens.reserve(seqs.size());
  meta.query_start.reserve(seqs.size() + 1);
  meta.query_start.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n_new = num_new_tokens[i];
    if (seqs[i] == kPaddingSeq) {
      PAGEDKV_CHECK(n_new == 0,
                    "KVCacheManager::batch_metadata: padding row {} must have 0 new tokens, got {}",
                    i, n_new);
      tables.emplace_back();
      lens.push_back(0);
      meta.query_start.push_back(meta.query_start.back());
      continue;
    }
    const Sequence& s = get(seqs[i], "batch_metadata");
    PAGEDKV_CHECK(n_new >= 0 && n_new <= s.num_tokens,
                  "KVCacheManager::batch_metadata: sequence {} has {} tokens, cannot write {} new",
                  seqs[i], s.num_tokens, n_new);
    PAGEDKV_CHECK(s.num_tokens <= INT32_MAX,
                  "KVCacheManager::batch_metadata: sequence {} context {} exceeds int32", seqs[i],
                  s.num_tokens);
    tables.emplace_back(s.blocks);
    lens.push_back(static_cast<int32_t>(s.num_tokens));
    for (int64_t pos = s.num_tokens - n_new; pos < s.num_tokens; ++pos) {
      meta.slot_mapping.push_back(slot_for_position(s.blocks, pos, config_.block_size));
    }
    meta.query_start.push_back(meta.query_start.back() + static_cast<int32_t>(n_new));
  }
  meta.padded = build_padded_block_tables(tables, lens, config_.block_size);
  meta.csr = build_csr_block_tables(tables, lens, config_.block_size);
  return meta;
}

int64_t KVCacheManager::num_tokens(SeqId seq) const { return get(seq, "num_tokens").num_tokens; }

std::span<const BlockId> KVCacheManager::block_table(SeqId seq) const {
  return get(seq, "block_table").blocks;
}

std::vector<SeqId> KVCacheManager::sequences() const {
  std::vector<SeqId> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

double KVCacheManager::usage() const {
  return static_cast<double>(allocator_.num_used()) / allocator_.num_blocks();
}

void KVCacheManager::check_invariants() const {
  const int32_t total = allocator_.num_blocks();
  PAGEDKV_CHECK(allocator_.num_free() + allocator_.num_used() + allocator_.num_cached() == total,
                "invariant: free {} + used {} + cached {} != total {}", allocator_.num_free(),
                allocator_.num_used(), allocator_.num_cached(), total);
  std::vector<int32_t> holders(total, 0);
  for (const auto& [id, s] : seqs_) {
    const int64_t need = blocks_for_tokens(s.num_tokens, config_.block_size);
    PAGEDKV_CHECK(static_cast<int64_t>(s.blocks.size()) == need,
                  "invariant: sequence {} has {} tokens but {} blocks (expected {})", id,
                  s.num_tokens, s.blocks.size(), need);
    for (BlockId b : s.blocks) {
      PAGEDKV_CHECK(b >= 0 && b < total, "invariant: sequence {} holds block id {} out of range",
                    id, b);
      ++holders[b];
    }
  }
  int32_t used = 0;
  for (BlockId b = 0; b < total; ++b) {
    PAGEDKV_CHECK(allocator_.ref_count(b) == holders[b],
                  "invariant: block {} has ref count {} but {} tables hold it", b,
                  allocator_.ref_count(b), holders[b]);
    if (holders[b] > 0) ++used;
  }
  PAGEDKV_CHECK(used == allocator_.num_used(), "invariant: {} blocks held but allocator says {}",
                used, allocator_.num_used());
}

}  // namespace pagedkv
