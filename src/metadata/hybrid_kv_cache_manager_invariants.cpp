// HybridKVCacheManager::check_invariants: tables against the release rule, reference counts
// against the tables (device and host pools), and the per-group key indexes against the pool's
// cached blocks and the sequences' keys.

#include <algorithm>

#include "core/check.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv {

void HybridKVCacheManager::check_sequence(SeqId id, const Sequence& s,
                                          std::vector<int32_t>& holders,
                                          std::vector<int32_t>& host_holders) const {
  const int64_t bs = config_.block_size;
  const int64_t want = blocks_for_tokens(s.num_tokens, bs);
  PAGEDKV_CHECK(s.committed >= 0 && s.committed <= s.num_tokens,
                "hybrid manager: sequence {} committed {} of {} tokens", id, s.committed,
                s.num_tokens);
  PAGEDKV_CHECK(static_cast<int64_t>(s.hashes.size()) <= s.committed / bs,
                "hybrid manager: sequence {} has {} block keys but {} committed tokens", id,
                s.hashes.size(), s.committed);
  PAGEDKV_CHECK(!s.ids_known || static_cast<int64_t>(s.token_ids.size()) == s.num_tokens,
                "hybrid manager: sequence {} knows {} token ids of {}", id, s.token_ids.size(),
                s.num_tokens);
  const int32_t pool_size = s.swapped ? host_->num_blocks() : config_.num_blocks;
  for (size_t g = 0; g < s.tables.size(); ++g) {
    const std::vector<BlockId>& table = s.tables[g];
    const KVCacheGroupSpec& spec = config_.groups[g];
    PAGEDKV_CHECK(static_cast<int64_t>(table.size()) == want,
                  "hybrid manager: sequence {} group {} has {} entries for {} tokens (want {})", id,
                  g, table.size(), s.num_tokens, want);
    PAGEDKV_CHECK(s.serials[g].size() == s.hashes.size(),
                  "hybrid manager: sequence {} group {} has {} serials for {} keys", id, g,
                  s.serials[g].size(), s.hashes.size());
    const int64_t live_from = first_live_entry(spec, s.num_tokens);
    const int64_t released_to = s.released_to[g];
    PAGEDKV_CHECK(released_to >= 0 && released_to <= static_cast<int64_t>(table.size()),
                  "hybrid manager: sequence {} group {} released up to entry {} of {}", id, g,
                  released_to, table.size());
    for (int64_t e = sink_blocks(spec); e < released_to; ++e) {
      PAGEDKV_CHECK(table[static_cast<size_t>(e)] == kNullBlock,
                    "hybrid manager: sequence {} group {} entry {} is below the release mark {} "
                    "but holds block {}",
                    id, g, e, released_to, table[static_cast<size_t>(e)]);
    }
    for (size_t e = 0; e < table.size(); ++e) {
      const BlockId b = table[e];
      PAGEDKV_CHECK(b >= 0 && b < pool_size,
                    "hybrid manager: sequence {} group {} entry {} holds block {} outside the {} "
                    "pool",
                    id, g, e, b, s.swapped ? "host" : "device");
      const bool needed =
          static_cast<int64_t>(e) < sink_blocks(spec) || static_cast<int64_t>(e) >= live_from;
      PAGEDKV_CHECK(!needed || b != kNullBlock,
                    "hybrid manager: sequence {} group {} entry {} is released but still seen", id,
                    g, e);
      if (b == kNullBlock) continue;
      ++(s.swapped ? host_holders : holders)[static_cast<size_t>(b)];
      // A registered block in a table holds the content the sequence's key names there.
      const PrefixCache::Entry* entry = s.swapped ? nullptr : prefix_[g].entry(b);
      // Past the keys (a truncated, not yet re-keyed last block) any published content may sit.
      PAGEDKV_CHECK(entry == nullptr || e >= s.hashes.size() || entry->hash == s.hashes[e],
                    "hybrid manager: sequence {} group {} entry {} holds block {} published "
                    "under another key",
                    id, g, e, b);
    }
  }
}

void HybridKVCacheManager::check_prefix() const {
  int32_t published = 0;
  for (BlockId b = 0; b < config_.num_blocks; ++b) {
    int32_t groups = 0;
    for (size_t g = 0; g < prefix_.size(); ++g) {
      const PrefixCache::Entry* e = prefix_[g].entry(b);
      if (e == nullptr) continue;
      ++groups;
      if (config_.groups[g].kind == GroupAttention::kFull) {
        // Published only under a live parent, dropped with it: a walk from the root reaches it.
        const std::optional<BlockId> p = prefix_[g].find(e->parent_hash);
        PAGEDKV_CHECK(e->parent_serial == 0 ? e->parent_hash == kRootBlockHash
                                            : p && prefix_[g].entry(*p)->serial == e->parent_serial,
                      "hybrid manager: group {} block {} is published under a parent entry that "
                      "is gone",
                      g, b);
      } else {
        PAGEDKV_CHECK(e->parent_serial == 0,
                      "hybrid manager: local group {} block {} is chained to an entry", g, b);
      }
    }
    PAGEDKV_CHECK(b != kNullBlock || groups == 0, "hybrid manager: the null block is published");
    PAGEDKV_CHECK(groups <= 1, "hybrid manager: block {} is published in {} groups", b, groups);
    PAGEDKV_CHECK((groups == 1) == pool_.is_cached(b),
                  "hybrid manager: block {} is {}published but {}marked cached in the pool", b,
                  groups == 1 ? "" : "not ", pool_.is_cached(b) ? "" : "not ");
    published += groups;
  }
  int32_t registered = 0;
  for (const PrefixCache& pc : prefix_) registered += pc.size();
  PAGEDKV_CHECK(registered == published, "hybrid manager: {} keys but {} published blocks",
                registered, published);
}

void HybridKVCacheManager::check_invariants() const {
  pool_.check_invariants();
  if (host_) host_->check_invariants();
  for (const PrefixCache& pc : prefix_) pc.check_invariants();
  std::vector<int32_t> holders(static_cast<size_t>(config_.num_blocks), 0);
  std::vector<int32_t> host_holders(host_ ? static_cast<size_t>(host_->num_blocks()) : 0, 0);
  for (const auto& [id, s] : seqs_) {
    PAGEDKV_CHECK(!s.swapped || host_, "hybrid manager: sequence {} is swapped with no host pool",
                  id);
    check_sequence(id, s, holders, host_holders);
  }
  PAGEDKV_CHECK(pool_.ref_count(kNullBlock) == 1,
                "hybrid manager: the null block's ref count is {}, want 1 (the manager's own)",
                pool_.ref_count(kNullBlock));
  for (BlockId b = 1; b < config_.num_blocks; ++b) {
    PAGEDKV_CHECK(pool_.ref_count(b) == holders[static_cast<size_t>(b)],
                  "hybrid manager: block {} has ref count {} but {} table entries", b,
                  pool_.ref_count(b), holders[static_cast<size_t>(b)]);
  }
  if (host_) {
    PAGEDKV_CHECK(host_->ref_count(0) == 1 && host_->num_cached() == 0,
                  "hybrid manager: host block 0 has ref count {} (want 1), {} host blocks cached",
                  host_->ref_count(0), host_->num_cached());
    for (BlockId b = 1; b < host_->num_blocks(); ++b) {
      PAGEDKV_CHECK(host_->ref_count(b) == host_holders[static_cast<size_t>(b)],
                    "hybrid manager: host block {} has ref count {} but {} swapped entries", b,
                    host_->ref_count(b), host_holders[static_cast<size_t>(b)]);
    }
  }
  check_prefix();
}

}  // namespace pagedkv
