#include "sim/memory_growth.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv::sim {

namespace {
int64_t bytes(const ModelPreset& p, int64_t tokens) {
  return kv_bytes_for_tokens(p.num_layers, p.num_kv_heads, p.head_dim, p.dtype, tokens);
}

/// Throws unless `batch` sequences of `longest` tokens, rounded up to a block, fit int64 bytes:
/// every byte count of the table is at most that (local layers hold less, never more).
void check_fits_int64(const ModelPreset& p, int64_t batch, int32_t block_size, int64_t longest) {
  int64_t product = 1;
  int64_t rounded = 0;
  bool overflow = __builtin_add_overflow(longest, int64_t{block_size}, &rounded);
  for (int64_t f : {int64_t{2}, int64_t{p.num_layers}, int64_t{p.num_kv_heads}, int64_t{p.head_dim},
                    dtype_size(p.dtype), batch, rounded}) {
    overflow = overflow || __builtin_mul_overflow(product, f, &product);
  }
  PAGEDKV_CHECK(!overflow,
                "growth table: {} sequence(s) of {} tokens x 2 x {} layers x {} kv heads x "
                "head_dim {} x {} bytes overflows a 64-bit byte count",
                batch, longest, p.num_layers, p.num_kv_heads, p.head_dim, dtype_size(p.dtype));
}
}  // namespace

std::vector<int64_t> growth_lengths(int64_t max_context) {
  // Powers of two (block-aligned for every power-of-two block size) plus lengths that are not
  // (17, 100, 1000, ...), where paging's rounding to whole blocks shows.
  std::vector<int64_t> out = {1, 17};
  for (int64_t t = 16; t < max_context; t *= 2) out.push_back(t);
  for (int64_t t = 100; t < max_context; t *= 10) out.push_back(t);
  out.push_back(max_context);
  std::erase_if(out, [&](int64_t t) { return t > max_context; });
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t paged_bytes_for_tokens(const ModelPreset& preset, int64_t tokens, int32_t block_size) {
  return bytes(preset, blocks_for_tokens(tokens, block_size) * block_size);
}

std::vector<GrowthRow> growth_table(const ModelPreset& preset, int64_t batch, int32_t block_size,
                                    std::span<const int64_t> lengths, int64_t budget_bytes) {
  validate(preset);
  PAGEDKV_CHECK(batch >= 1, "growth table: batch must be >= 1, got {}", batch);
  PAGEDKV_CHECK(block_size >= 1, "growth table: block size must be >= 1, got {}", block_size);
  PAGEDKV_CHECK(budget_bytes >= 0, "growth table: budget must be >= 0, got {}", budget_bytes);
  int64_t longest = preset.max_context;
  for (int64_t t : lengths) longest = std::max(longest, t);
  check_fits_int64(preset, batch, block_size, longest);
  std::vector<GrowthRow> rows;
  rows.reserve(lengths.size());
  for (int64_t t : lengths) {
    PAGEDKV_CHECK(t >= 0, "growth table: context length must be >= 0, got {}", t);
    GrowthRow r;
    r.tokens = t;
    r.formula_bytes = batch * bytes(preset, t);
    r.window_bytes = batch * hybrid_kv_bytes(preset, t);
    r.window_paged_bytes = batch * hybrid_paged_bytes(preset, t, block_size);
    r.paged_bytes = batch * paged_bytes_for_tokens(preset, t, block_size);
    r.contiguous_max_bytes = batch * bytes(preset, preset.max_context);
    if (budget_bytes > 0) {
      const int64_t per_seq = paged_bytes_for_tokens(preset, t, block_size);
      r.paged_fit = per_seq > 0 ? budget_bytes / per_seq : 0;
      r.contiguous_fit = budget_bytes / bytes(preset, preset.max_context);
    }
    rows.push_back(r);
  }
  return rows;
}

}  // namespace pagedkv::sim
