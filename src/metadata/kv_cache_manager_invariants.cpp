// KVCacheManager::check_invariants: every table against the pool's ref counts, the prefix index
// against the cached flags, the host pool against the swapped tables, and the stats' relations.

#include "core/check.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {

void KVCacheManager::check_invariants() const {
  // The parts' own structure first (list links, index entries): the checks below read them.
  allocator_.check_invariants();
  if (host_) host_->check_invariants();
  prefix_.check_invariants();
  const int32_t total = allocator_.num_blocks();
  PAGEDKV_CHECK(allocator_.num_free() + allocator_.num_used() + allocator_.num_cached() == total,
                "invariant: free {} + used {} + cached {} != total {}", allocator_.num_free(),
                allocator_.num_used(), allocator_.num_cached(), total);
  std::vector<int32_t> holders(total, 0);
  std::vector<int32_t> host_holders(host_ ? host_->num_blocks() : 0, 0);
  int32_t host_live = 0;
  for (const auto& [id, s] : seqs_) check_sequence(id, s, holders, host_holders, host_live);
  check_blocks(holders);
  check_host_pool(host_holders, host_live);
  const int64_t bs = config_.block_size;
  PAGEDKV_CHECK(counters_.prefix_hit_tokens == counters_.prefix_hits * bs &&
                    counters_.prefix_hit_tokens <= counters_.prefix_query_tokens,
                "invariant: prefix hit tokens {} vs hits {} x {} and queries {}",
                counters_.prefix_hit_tokens, counters_.prefix_hits, bs,
                counters_.prefix_query_tokens);
}

// One sequence's table; counts the holders of each device (or host) block it references.
void KVCacheManager::check_sequence(SeqId id, const Sequence& s, std::vector<int32_t>& holders,
                                    std::vector<int32_t>& host_holders, int32_t& host_live) const {
  const int32_t total = allocator_.num_blocks();
  const int64_t bs = config_.block_size;
  const bool positional = !s.kept.sparse();
  PAGEDKV_CHECK(s.placeholders.size() == s.blocks.size(),
                "invariant: sequence {} has {} placeholders for {} table entries", id,
                s.placeholders.size(), s.blocks.size());
  if (positional) {
    const int64_t need = blocks_for_tokens(s.num_tokens, bs);
    PAGEDKV_CHECK(static_cast<int64_t>(s.blocks.size()) == need,
                  "invariant: sequence {} has {} tokens but {} blocks (expected {})", id,
                  s.num_tokens, s.blocks.size(), need);
  }
  for (size_t j = 0; j < s.blocks.size(); ++j) {
    const BlockId b = s.blocks[j];
    if (b == kNoBlock) {
      PAGEDKV_CHECK(!positional || (s.placeholders[j] >= 0 && s.placeholders[j] < total),
                    "invariant: sequence {} entry {} released without a valid placeholder", id, j);
      continue;
    }
    PAGEDKV_CHECK(s.placeholders[j] == -1,
                  "invariant: sequence {} entry {} is live but has placeholder {}", id, j,
                  s.placeholders[j]);
    if (s.swapped) {
      PAGEDKV_CHECK(b >= 0 && b < static_cast<BlockId>(host_holders.size()),
                    "invariant: swapped sequence {} holds host block id {} out of range", id, b);
      ++host_holders[b];
      ++host_live;
    } else {
      PAGEDKV_CHECK(b >= 0 && b < total, "invariant: sequence {} holds block id {} out of range",
                    id, b);
      ++holders[b];
    }
  }
  // The last (partially filled) block of a positional sequence is never released.
  if (positional && s.num_tokens % bs != 0) {
    PAGEDKV_CHECK(s.blocks.back() != kNoBlock,
                  "invariant: sequence {} released its partially filled last block", id);
  }
  PAGEDKV_CHECK(static_cast<int64_t>(s.hashes.size()) * bs <= s.committed &&
                    s.committed <= s.num_tokens && s.serials.size() == s.hashes.size(),
                "invariant: sequence {} keys {} blocks, committed {} of {} tokens", id,
                s.hashes.size(), s.committed, s.num_tokens);
  s.kept.check(id, s.blocks, s.num_tokens, config_.block_size);
}

// Each device block: ref count == holders, never free and held, prefix entry <=> cached flag.
void KVCacheManager::check_blocks(std::span<const int32_t> holders) const {
  int32_t used = 0;
  int32_t registered = 0;
  for (BlockId b = 0; b < allocator_.num_blocks(); ++b) {
    PAGEDKV_CHECK(allocator_.ref_count(b) == holders[b],
                  "invariant: block {} has ref count {} but {} tables hold it", b,
                  allocator_.ref_count(b), holders[b]);
    PAGEDKV_CHECK(!(allocator_.is_free(b) && holders[b] > 0),
                  "invariant: block {} is free and referenced", b);
    if (holders[b] > 0) ++used;
    const bool has_entry = prefix_.entry(b) != nullptr;
    PAGEDKV_CHECK(has_entry == allocator_.is_cached(b),
                  "invariant: block {} prefix entry {} but allocator cached flag {}", b, has_entry,
                  allocator_.is_cached(b));
    if (has_entry) {
      ++registered;
      const PrefixCache::Entry& e = *prefix_.entry(b);
      PAGEDKV_CHECK(prefix_.find(e.hash) == b,
                    "invariant: block {} entry key does not map back to it", b);
      // No orphan: every entry hangs under the root or under its registered parent entry.
      const std::optional<BlockId> parent =
          e.parent_serial == 0 ? std::nullopt : prefix_.find(e.parent_hash);
      PAGEDKV_CHECK(
          e.parent_serial == 0 ? e.parent_hash == kRootBlockHash
                               : parent && prefix_.entry(*parent)->serial == e.parent_serial,
          "invariant: block {} entry's parent (serial {}) is not registered", b, e.parent_serial);
    }
  }
  PAGEDKV_CHECK(used == allocator_.num_used(), "invariant: {} blocks held but allocator says {}",
                used, allocator_.num_used());
  PAGEDKV_CHECK(registered == prefix_.size(), "invariant: {} registered blocks but index has {}",
                registered, prefix_.size());
}

void KVCacheManager::check_host_pool(std::span<const int32_t> host_holders,
                                     int32_t host_live) const {
  if (!host_) {
    PAGEDKV_CHECK(host_live == 0, "invariant: {} host blocks held without a host pool", host_live);
    return;
  }
  for (BlockId b = 0; b < host_->num_blocks(); ++b) {
    PAGEDKV_CHECK(host_->ref_count(b) == host_holders[b],
                  "invariant: host block {} has ref count {} but {} tables hold it", b,
                  host_->ref_count(b), host_holders[b]);
  }
  PAGEDKV_CHECK(host_->num_used() == host_live && host_->num_cached() == 0,
                "invariant: host pool uses {} blocks, swapped tables hold {}", host_->num_used(),
                host_live);
}

}  // namespace pagedkv
