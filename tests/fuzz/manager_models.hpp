#pragma once
// Models of what KVCacheManager::batch_metadata and kept_tokens must return, for the manager
// fuzz target: worked out from the public tables (block_table, num_tokens) and the formulas of
// the headers, element by element, not from the functions under test. A mismatch aborts with the
// row and field (PAGEDKV_FUZZ_CHECK).

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz_util.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::fuzz {

/// Heavy-hitter sequences whose table turned sparse (a token evicted: evictions never come back
/// and truncate refuses such a table) keep fewer tokens than they hold.
inline bool is_sparse(const KVCacheManager& m, SeqId s) {
  if (!m.eviction_policy().scores_tokens()) return false;
  const SeqId one[] = {s};
  return static_cast<int64_t>(m.kept_tokens(one).positions.size()) < m.num_tokens(s);
}

/// Whether batch_metadata(seqs, num_new) must throw, from its documented errors.
inline bool batch_must_throw(const KVCacheManager& m, std::span<const SeqId> seqs,
                             std::span<const int64_t> num_new) {
  const int64_t bs = m.config().block_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqId s = seqs[i];
    if (s == kPaddingSeq) {
      if (num_new[i] != 0) return true;
      continue;
    }
    if (!m.has_sequence(s) || m.is_swapped(s) || is_sparse(m, s)) return true;
    const int64_t t = m.num_tokens(s);
    if (num_new[i] < 0 || num_new[i] > t) return true;
    const std::span<const BlockId> table = m.block_table(s);
    for (int64_t p = t - num_new[i]; p < t; ++p) {
      if (table[p / bs] == KVCacheManager::kNoBlock) return true;
    }
  }
  return false;
}

/// Every element of `meta` against the tables: padded rows (live entries as in block_table, a
/// released one any valid id, -1 past ceil(len / bs)), context lengths, CSR indptr / indices /
/// last_page_len, slot = table[p / bs] * bs + p % bs for the last num_new positions of each row,
/// query_start as the prefix sum of num_new.
inline void check_batch_model(const KVCacheManager& m, std::span<const SeqId> seqs,
                              std::span<const int64_t> num_new, const BatchMetadata& meta) {
  const int64_t bs = m.config().block_size;
  const auto rows = static_cast<int64_t>(seqs.size());
  int64_t width = rows > 0 ? 1 : 0;
  for (SeqId s : seqs) {
    if (s != kPaddingSeq) width = std::max(width, (m.num_tokens(s) + bs - 1) / bs);
  }
  PAGEDKV_FUZZ_CHECK(meta.block_size == bs && meta.padded.num_seqs == rows &&
                         meta.padded.max_blocks_per_seq == width &&
                         static_cast<int64_t>(meta.padded.block_tables.size()) == rows * width &&
                         static_cast<int64_t>(meta.padded.context_lens.size()) == rows &&
                         static_cast<int64_t>(meta.csr.indptr.size()) == rows + 1 &&
                         static_cast<int64_t>(meta.csr.last_page_len.size()) == rows &&
                         static_cast<int64_t>(meta.query_start.size()) == rows + 1,
                     "batch metadata shapes for %lld rows of width %lld",
                     static_cast<long long>(rows), static_cast<long long>(width));
  PAGEDKV_FUZZ_CHECK(meta.csr.indptr[0] == 0 && meta.query_start[0] == 0, "offsets start at 0");
  int64_t csr = 0;
  int64_t q = 0;
  size_t slot = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const bool pad = seqs[i] == kPaddingSeq;
    const int64_t len = pad ? 0 : m.num_tokens(seqs[i]);
    const std::span<const BlockId> table =
        pad ? std::span<const BlockId>{} : m.block_table(seqs[i]);
    const int64_t used = (len + bs - 1) / bs;
    PAGEDKV_FUZZ_CHECK(meta.padded.context_lens[i] == len, "row %lld context length",
                       static_cast<long long>(i));
    for (int64_t j = 0; j < width; ++j) {
      const BlockId got = meta.padded.block_tables[i * width + j];
      const bool ok = j >= used ? got == -1
                      : table[j] != KVCacheManager::kNoBlock
                          ? got == table[j]
                          : got >= 0 && got < m.num_total_blocks();
      PAGEDKV_FUZZ_CHECK(ok, "row %lld padded block %lld is %d", static_cast<long long>(i),
                         static_cast<long long>(j), got);
      if (j < used) {
        PAGEDKV_FUZZ_CHECK(csr + j < static_cast<int64_t>(meta.csr.indices.size()) &&
                               meta.csr.indices[csr + j] == got,
                           "row %lld CSR block %lld", static_cast<long long>(i),
                           static_cast<long long>(j));
      }
    }
    csr += used;
    PAGEDKV_FUZZ_CHECK(meta.csr.indptr[i + 1] == csr, "row %lld CSR indptr",
                       static_cast<long long>(i));
    PAGEDKV_FUZZ_CHECK(meta.csr.last_page_len[i] == (len == 0 ? 0 : len - (used - 1) * bs),
                       "row %lld last_page_len %d for %lld tokens", static_cast<long long>(i),
                       meta.csr.last_page_len[i], static_cast<long long>(len));
    q += num_new[i];
    PAGEDKV_FUZZ_CHECK(meta.query_start[i + 1] == q, "row %lld query_start",
                       static_cast<long long>(i));
    for (int64_t p = len - num_new[i]; p < len; ++p, ++slot) {
      PAGEDKV_FUZZ_CHECK(slot < meta.slot_mapping.size() &&
                             meta.slot_mapping[slot] == int64_t{table[p / bs]} * bs + p % bs,
                         "row %lld slot of position %lld", static_cast<long long>(i),
                         static_cast<long long>(p));
    }
  }
  PAGEDKV_FUZZ_CHECK(
      static_cast<int64_t>(meta.csr.indices.size()) == csr && meta.slot_mapping.size() == slot,
      "batch metadata lengths");
}

/// One row of kept_tokens against the policy: a positional policy keeps what the query at
/// t - 1 sees (all; the last W; the first S and the last W), a heavy-hitter sequence all its
/// positions until a token is evicted, then ascending distinct positions with the last R
/// always among them; every slot is table[p / bs] * bs + p % bs for a positional table, and in
/// a live block of the sequence, distinct, for a sparse one.
inline void check_kept_row(const KVCacheManager& m, SeqId s, std::span<const int64_t> positions,
                           std::span<const Slot> slots) {
  PAGEDKV_FUZZ_CHECK(positions.size() == slots.size(), "kept sizes of sequence %lld",
                     static_cast<long long>(s));
  if (s == kPaddingSeq) {
    PAGEDKV_FUZZ_CHECK(positions.empty(), "padding row keeps tokens");
    return;
  }
  const int64_t bs = m.config().block_size;
  const int64_t t = m.num_tokens(s);
  const std::span<const BlockId> table = m.block_table(s);
  const EvictionPolicyConfig& pol = m.eviction_policy().config();
  std::vector<int64_t> want;
  const bool sparse =
      pol.kind == EvictionKind::kHeavyHitters && static_cast<int64_t>(positions.size()) < t;
  if (!sparse) {
    const int64_t window =
        pol.kind == EvictionKind::kSlidingWindow || pol.kind == EvictionKind::kAttentionSinks
            ? pol.window
            : t;
    const int64_t sinks = pol.kind == EvictionKind::kAttentionSinks ? pol.sinks : 0;
    for (int64_t p = 0; p < t; ++p) {
      if (p < sinks || p >= t - window) want.push_back(p);
    }
    PAGEDKV_FUZZ_CHECK(std::equal(want.begin(), want.end(), positions.begin(), positions.end()),
                       "sequence %lld keeps %zu positions, the policy %zu",
                       static_cast<long long>(s), positions.size(), want.size());
    for (size_t i = 0; i < positions.size(); ++i) {
      const int64_t p = positions[i];
      PAGEDKV_FUZZ_CHECK(table[p / bs] != KVCacheManager::kNoBlock &&
                             slots[i] == int64_t{table[p / bs]} * bs + p % bs,
                         "sequence %lld slot of kept position %lld", static_cast<long long>(s),
                         static_cast<long long>(p));
    }
    return;
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    PAGEDKV_FUZZ_CHECK(
        positions[i] >= 0 && positions[i] < t && (i == 0 || positions[i - 1] < positions[i]),
        "sequence %lld kept positions not ascending in [0, %lld)", static_cast<long long>(s),
        static_cast<long long>(t));
    const BlockId b = static_cast<BlockId>(slots[i] / bs);
    PAGEDKV_FUZZ_CHECK(slots[i] >= 0 && std::find(table.begin(), table.end(), b) != table.end(),
                       "sequence %lld kept slot %lld not in its blocks", static_cast<long long>(s),
                       static_cast<long long>(slots[i]));
  }
  std::vector<Slot> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  PAGEDKV_FUZZ_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                     "sequence %lld keeps a slot twice", static_cast<long long>(s));
  for (int64_t p = std::max<int64_t>(0, t - pol.recent); p < t; ++p) {
    PAGEDKV_FUZZ_CHECK(std::binary_search(positions.begin(), positions.end(), p),
                       "sequence %lld evicted recent position %lld", static_cast<long long>(s),
                       static_cast<long long>(p));
  }
}

}  // namespace pagedkv::fuzz
