#include "pagedkv/metadata/batch_metadata.hpp"

#include <algorithm>
#include <limits>

#include "core/check.hpp"

namespace pagedkv {
namespace {

void check_tables(std::span<const std::span<const BlockId>> tables,
                  std::span<const int32_t> context_lens, int32_t block_size, const char* op) {
  PAGEDKV_CHECK(block_size >= 1, "{}: block_size must be >= 1, got {}", op, block_size);
  PAGEDKV_CHECK(tables.size() == context_lens.size(), "{}: {} block tables but {} context lengths",
                op, tables.size(), context_lens.size());
  PAGEDKV_CHECK(tables.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                "{}: {} sequences overflow the int32 num_seqs", op, tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    PAGEDKV_CHECK(context_lens[i] >= 0, "{}: sequence {} has negative context length {}", op, i,
                  context_lens[i]);
    const int64_t need = blocks_for_tokens(context_lens[i], block_size);
    PAGEDKV_CHECK(static_cast<int64_t>(tables[i].size()) >= need,
                  "{}: sequence {} has context length {} (needs {} blocks) but a table of {}", op,
                  i, context_lens[i], need, tables[i].size());
  }
}

}  // namespace

void build_padded_block_tables(std::span<const std::span<const BlockId>> tables,
                               std::span<const int32_t> context_lens, int32_t block_size,
                               PaddedBlockTables& out) {
  check_tables(tables, context_lens, block_size, "build_padded_block_tables");
  out.num_seqs = static_cast<int32_t>(tables.size());
  out.block_size = block_size;
  out.num_blocks = 0;
  int64_t width = out.num_seqs > 0 ? 1 : 0;
  for (int32_t len : context_lens) width = std::max(width, blocks_for_tokens(len, block_size));
  out.max_blocks_per_seq = static_cast<int32_t>(width);
  out.block_tables.assign(static_cast<size_t>(out.num_seqs) * width, -1);
  out.context_lens.assign(context_lens.begin(), context_lens.end());
  for (size_t i = 0; i < tables.size(); ++i) {
    const int64_t used = blocks_for_tokens(context_lens[i], block_size);
    std::copy_n(tables[i].begin(), used, out.block_tables.begin() + i * width);
  }
}

void build_csr_block_tables(std::span<const std::span<const BlockId>> tables,
                            std::span<const int32_t> context_lens, int32_t block_size,
                            CsrBlockTables& out) {
  check_tables(tables, context_lens, block_size, "build_csr_block_tables");
  // Size everything before writing: growing `indices` one sequence at a time reallocated and
  // copied it at every doubling, each time into freshly mapped pages (page faults), which made
  // this builder 26x slower than the padded one.
  int64_t nnz = 0;
  for (int32_t len : context_lens) nnz += blocks_for_tokens(len, block_size);
  PAGEDKV_CHECK(nnz <= std::numeric_limits<int32_t>::max(),
                "build_csr_block_tables: {} blocks in the batch overflow the int32 indptr", nnz);
  out.indptr.clear();
  out.indices.clear();
  out.last_page_len.clear();
  out.indptr.reserve(tables.size() + 1);
  out.indices.reserve(static_cast<size_t>(nnz));
  out.last_page_len.reserve(tables.size());
  out.indptr.push_back(0);
  for (size_t i = 0; i < tables.size(); ++i) {
    const int64_t used = blocks_for_tokens(context_lens[i], block_size);
    out.indices.insert(out.indices.end(), tables[i].begin(), tables[i].begin() + used);
    out.indptr.push_back(static_cast<int32_t>(out.indices.size()));
    out.last_page_len.push_back(
        context_lens[i] == 0 ? 0 : context_lens[i] - static_cast<int32_t>(used - 1) * block_size);
  }
}

PaddedBlockTables build_padded_block_tables(std::span<const std::span<const BlockId>> tables,
                                            std::span<const int32_t> context_lens,
                                            int32_t block_size) {
  PaddedBlockTables out;
  build_padded_block_tables(tables, context_lens, block_size, out);
  return out;
}

CsrBlockTables build_csr_block_tables(std::span<const std::span<const BlockId>> tables,
                                      std::span<const int32_t> context_lens, int32_t block_size) {
  CsrBlockTables out;
  build_csr_block_tables(tables, context_lens, block_size, out);
  return out;
}

Slot slot_for_position(std::span<const BlockId> table, int64_t pos, int32_t block_size) {
  PAGEDKV_CHECK(block_size >= 1, "slot_for_position: block_size must be >= 1, got {}", block_size);
  PAGEDKV_CHECK(pos >= 0 && pos / block_size < static_cast<int64_t>(table.size()),
                "slot_for_position: position {} outside a table of {} blocks of {} tokens", pos,
                table.size(), block_size);
  return static_cast<Slot>(table[pos / block_size]) * block_size + pos % block_size;
}

void append_position_slots(std::span<const BlockId> table, int64_t first, int64_t n,
                           int32_t block_size, std::vector<Slot>& out) {
  PAGEDKV_CHECK(block_size >= 1, "append_position_slots: block_size must be >= 1, got {}",
                block_size);
  PAGEDKV_CHECK(first >= 0 && n >= 0,
                "append_position_slots: first {} and n {} must be >= 0 (tokens)", first, n);
  PAGEDKV_CHECK(n == 0 || (first + n - 1) / block_size < static_cast<int64_t>(table.size()),
                "append_position_slots: position {} outside a table of {} blocks of {} tokens",
                first + n - 1, table.size(), block_size);
  const size_t base = out.size();
  out.resize(base + static_cast<size_t>(n));
  Slot* o = out.data() + base;
  if (block_size == 1) {  // one token per block: the slots are the block ids themselves
    for (int64_t i = 0; i < n; ++i) o[i] = table[static_cast<size_t>(first + i)];
    return;
  }
  for (int64_t pos = first, end = first + n; pos < end;) {
    const int64_t entry = pos / block_size;
    const int64_t stop = std::min(end, (entry + 1) * block_size);
    Slot slot = static_cast<Slot>(table[static_cast<size_t>(entry)]) * block_size +
                (pos - entry * block_size);
    for (; pos < stop; ++pos) *o++ = slot++;
  }
}

}  // namespace pagedkv
