// KVCacheManager, what a step reads: batch metadata (block tables in both formats, slot
// mapping), the kept sets of token eviction, and attention scores fed back for heavy hitters.

#include "core/check.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {

BatchMetadata KVCacheManager::batch_metadata(std::span<const SeqId> seqs,
                                             std::span<const int64_t> num_new_tokens) const {
  BatchMetadata meta;
  batch_metadata(seqs, num_new_tokens, meta);
  return meta;
}

// Every check of batch_metadata, so that a throw leaves `out` untouched; rows[i] is the sequence
// of row i, nullptr for a padding row. Returns the number of new tokens of the batch.
int64_t KVCacheManager::check_batch(std::span<const SeqId> seqs,
                                    std::span<const int64_t> num_new_tokens,
                                    std::vector<const Sequence*>& rows) const {
  PAGEDKV_CHECK(seqs.size() == num_new_tokens.size(),
                "KVCacheManager::batch_metadata: {} sequences but {} new-token counts", seqs.size(),
                num_new_tokens.size());
  const int64_t bs = config_.block_size;
  rows.assign(seqs.size(), nullptr);
  int64_t total_new = 0;
  int64_t total_blocks = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t n_new = num_new_tokens[i];
    if (seqs[i] == kPaddingSeq) {
      PAGEDKV_CHECK(n_new == 0,
                    "KVCacheManager::batch_metadata: padding row {} must have 0 new tokens, got {}",
                    i, n_new);
      continue;
    }
    const Sequence& s = get_running(seqs[i], "batch_metadata");
    PAGEDKV_CHECK(!s.kept.sparse(),
                  "KVCacheManager::batch_metadata: sequence {} has evicted heavy-hitter tokens; "
                  "its table is not positional (use kept_tokens + paged_attention_over_slots)",
                  seqs[i]);
    PAGEDKV_CHECK(n_new >= 0 && n_new <= s.num_tokens,
                  "KVCacheManager::batch_metadata: sequence {} has {} tokens, cannot write {} new",
                  seqs[i], s.num_tokens, n_new);
    PAGEDKV_CHECK(s.num_tokens <= INT32_MAX,
                  "KVCacheManager::batch_metadata: sequence {} context {} exceeds int32", seqs[i],
                  s.num_tokens);
    for (int64_t pos = s.num_tokens - n_new; pos < s.num_tokens; ++pos) {
      PAGEDKV_CHECK(s.blocks[pos / bs] != kNoBlock,
                    "KVCacheManager::batch_metadata: position {} of sequence {} is in a block "
                    "released by token eviction",
                    pos, seqs[i]);
    }
    rows[i] = &s;
    total_new += n_new;
    total_blocks += blocks_for_tokens(s.num_tokens, bs);
  }
  // The formats' int32 offsets (query_start, CSR indptr), checked here rather than by the
  // builders, which run after `out` has been partly written.
  PAGEDKV_CHECK(total_new <= INT32_MAX,
                "KVCacheManager::batch_metadata: {} new tokens overflow the int32 query_start",
                total_new);
  PAGEDKV_CHECK(total_blocks <= INT32_MAX,
                "KVCacheManager::batch_metadata: {} blocks in the batch overflow the int32 indptr",
                total_blocks);
  return total_new;
}

void KVCacheManager::batch_metadata(std::span<const SeqId> seqs,
                                    std::span<const int64_t> num_new_tokens,
                                    BatchMetadata& out) const {
  std::vector<const Sequence*> rows;
  const int64_t total_new = check_batch(seqs, num_new_tokens, rows);

  // Tables are read in place; only one with entries released by token eviction is copied, to
  // put back the id each released block had: never read under the policy's mask, and a valid
  // id, so kernels' range checks hold. (A kernel that ignored the mask would read a block now
  // owned by someone else; the NaN-poisoning tests catch exactly that.)
  std::vector<std::span<const BlockId>> tables(seqs.size());
  std::vector<int32_t> lens(seqs.size(), 0);
  std::vector<std::vector<BlockId>> patched;  // reserved before the first push: spans stay valid
  out.block_size = config_.block_size;
  out.slot_mapping.clear();
  out.slot_mapping.reserve(static_cast<size_t>(total_new));
  out.query_start.clear();
  out.query_start.reserve(seqs.size() + 1);
  out.query_start.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence* s = rows[i];
    const int64_t n_new = s == nullptr ? 0 : num_new_tokens[i];
    out.query_start.push_back(out.query_start.back() + static_cast<int32_t>(n_new));
    if (s == nullptr) continue;
    tables[i] = s->blocks;
    // Ids are >= 0 and kNoBlock is -1, so OR-ing the entries sets the sign bit exactly when one
    // was released; this reduction vectorizes, where std::find took a third of the call.
    uint32_t bits = 0;
    for (BlockId b : s->blocks) bits |= static_cast<uint32_t>(b);
    if (static_cast<int32_t>(bits) < 0) {
      if (patched.empty()) patched.reserve(seqs.size());
      std::vector<BlockId>& table = patched.emplace_back(s->blocks);
      for (size_t j = 0; j < table.size(); ++j) {
        if (table[j] == kNoBlock) table[j] = s->placeholders[j];
      }
      tables[i] = table;
    }
    lens[i] = static_cast<int32_t>(s->num_tokens);
    for (int64_t pos = s->num_tokens - n_new; pos < s->num_tokens; ++pos) {
      out.slot_mapping.push_back(slot_for_position(s->blocks, pos, config_.block_size));
    }
  }
  build_padded_block_tables(tables, lens, config_.block_size, out.padded);
  build_csr_block_tables(tables, lens, config_.block_size, out.csr);
}

KeptTokens KVCacheManager::kept_tokens(std::span<const SeqId> seqs) const {
  KeptTokens out;
  out.indptr.reserve(seqs.size() + 1);
  out.indptr.push_back(0);
  const AttentionMask mask = policy_->attention_mask();
  for (SeqId id : seqs) {
    if (id != kPaddingSeq) {
      const Sequence& s = get_running(id, "kept_tokens");
      s.kept.append_kept(s.blocks, s.num_tokens, mask, config_.block_size, out);
    }
    PAGEDKV_CHECK(out.slots.size() <= static_cast<size_t>(INT32_MAX),
                  "KVCacheManager::kept_tokens: {} kept tokens exceed int32", out.slots.size());
    out.indptr.push_back(static_cast<int32_t>(out.slots.size()));
  }
  return out;
}

void KVCacheManager::accumulate_attention(SeqId seq, std::span<const float> weights) {
  Sequence& s = get(seq, "accumulate_attention");
  PAGEDKV_CHECK(!s.swapped, "KVCacheManager::accumulate_attention: sequence {} is swapped out",
                seq);
  s.kept.accumulate(seq, weights, policy_->kind());
}

}  // namespace pagedkv
