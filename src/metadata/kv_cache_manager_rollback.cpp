// KVCacheManager::truncate: rollback of a sequence's last tokens (speculative decoding rejects
// draft tokens). The blocks past the new end are released; what stays is never written in place
// while another sequence or the prefix index may read it (the next append copies it first).

#include <algorithm>

#include "core/check.hpp"
#include "metadata/manager_internal.hpp"

namespace pagedkv {

void KVCacheManager::check_truncate(SeqId seq, const Sequence& s, int64_t num_tokens) const {
  PAGEDKV_CHECK(num_tokens >= 0 && num_tokens <= s.num_tokens,
                "KVCacheManager::truncate: {} tokens for sequence {}, which holds {}", num_tokens,
                seq, s.num_tokens);
  // A sparse table's entries no longer follow positions: there is no "block past the end".
  PAGEDKV_CHECK(!s.kept.sparse(),
                "KVCacheManager::truncate: sequence {} has evicted heavy-hitter tokens (its block "
                "table is not positional)",
                seq);
  // Token eviction released the blocks no query at or after the old end sees; the last kept
  // token's query (position num_tokens - 1, what kept_tokens() and the next step read) sees
  // further back. Every released entry it would see is data that is gone.
  const int64_t bs = config_.block_size;
  const int64_t keep = blocks_for_tokens(num_tokens, bs);
  const auto [first, last] = released_block_range(std::max<int64_t>(num_tokens - 1, 0));
  for (int64_t j = 0; j < keep; ++j) {
    if (s.blocks[j] != kNoBlock || (j >= first && j < last)) continue;
    PAGEDKV_CHECK(false,
                  "KVCacheManager::truncate: sequence {} to {} tokens: block {} (positions {}..{}) "
                  "was released by token eviction and the query at position {} would see it",
                  seq, num_tokens, j, j * bs, (j + 1) * bs - 1, num_tokens - 1);
  }
}

void KVCacheManager::truncate(SeqId seq, int64_t num_tokens) {
  check_truncate(seq, get_running(seq, "truncate"), num_tokens);
  Sequence& s = get(seq, "truncate");
  const int64_t bs = config_.block_size;
  const auto keep = static_cast<size_t>(blocks_for_tokens(num_tokens, bs));
  // Tail first, as free_sequence: a published block that becomes cached is evicted before the
  // earlier ones other prompts are likelier to share. A published block stays published.
  for (size_t j = s.blocks.size(); j-- > keep;) {
    if (s.blocks[j] != kNoBlock) allocator_.release(s.blocks[j]);
  }
  s.blocks.resize(keep);
  s.placeholders.resize(keep);
  s.num_tokens = num_tokens;
  if (s.ids_known) s.token_ids.resize(static_cast<size_t>(num_tokens));
  s.committed = std::min(s.committed, num_tokens);
  // Keys of the full blocks that remain; the new last block, if partial, is keyed again once it
  // is full and committed (its content may differ from what it held).
  const auto full = static_cast<size_t>(num_tokens / bs);
  if (s.hashes.size() > full) {
    s.hashes.resize(full);
    s.serials.resize(full);
  }
  s.kept.truncate(num_tokens);
}

}  // namespace pagedkv
