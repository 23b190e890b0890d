#pragma once
/// @file memory_growth.hpp
/// KV-cache memory as a function of context length, from the formula
///   bytes = 2 (K and V) x L layers x B sequences x T tokens x H_kv kv-heads x D head_dim
///           x sizeof(dtype)
/// (source: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
/// PagedAttention", SOSP 2023, sec. 2-3), next to what a paged cache and a max-length
/// contiguous reservation take for the same contexts.

#include <cstdint>
#include <span>
#include <vector>

#include "sim/model_preset.hpp"

namespace pagedkv::sim {

/// One context length of the growth table. Units: bytes, tokens.
struct GrowthRow {
  int64_t tokens = 0;         ///< T, context length of each sequence
  int64_t formula_bytes = 0;  ///< B x T positions: the formula
  /// B x hybrid_kv_bytes(T): each layer keeps only what its attention sees (full layers T
  /// positions, local layers cached_positions(T)); == formula_bytes without local layers.
  int64_t window_bytes = 0;
  /// B x hybrid_paged_bytes(T): the hybrid cache's whole blocks per KV cache group (full group
  /// ceil(T / bs), local group local_blocks_held()); == paged_bytes without local layers.
  int64_t window_paged_bytes = 0;
  int64_t paged_bytes = 0;           ///< B x ceil(T / block_size) whole blocks
  int64_t contiguous_max_bytes = 0;  ///< B x max_context reserved up front
  /// Sequences of T tokens a budget holds when paged (whole blocks per sequence); 0 when no
  /// budget was given.
  int64_t paged_fit = 0;
  /// The same with a max_context reservation per sequence.
  int64_t contiguous_fit = 0;
};

/// Context lengths for a table, ascending, each <= max_context: 1, 17, powers of two from 16,
/// powers of ten from 100, and max_context itself. Precondition: max_context >= 1.
[[nodiscard]] std::vector<int64_t> growth_lengths(int64_t max_context);

/// The growth table of `preset` for `batch` sequences at each of `lengths`.
/// Units: budget_bytes (0 = none) and block_size tokens.
/// Errors: throws pagedkv::Error if batch < 1, block_size < 1, a length is negative, or the
/// preset is invalid.
[[nodiscard]] std::vector<GrowthRow> growth_table(const ModelPreset& preset, int64_t batch,
                                                  int32_t block_size,
                                                  std::span<const int64_t> lengths,
                                                  int64_t budget_bytes);

/// One step of a real model run through both caches (see `pagedkv memory`).
/// Units: bytes, tokens, blocks.
struct MeasuredStep {
  int64_t step = 0;                  ///< forward step (0 = the prompt's prefill)
  int64_t tokens = 0;                ///< positions cached after the step, per sequence
  int64_t formula_bytes = 0;         ///< the formula for `tokens` positions (fp32)
  int64_t contiguous_bytes = 0;      ///< measured: ReferenceKVCache::bytes_in_use()
  int64_t paged_bytes = 0;           ///< measured: blocks in use x bytes per block
  int64_t paged_expected_bytes = 0;  ///< formula rounded up to whole blocks
};

/// The formula rounded up to whole blocks: kv bytes of ceil(tokens / block_size) * block_size
/// positions. Precondition: tokens >= 0, block_size >= 1.
[[nodiscard]] int64_t paged_bytes_for_tokens(const ModelPreset& preset, int64_t tokens,
                                             int32_t block_size);

}  // namespace pagedkv::sim
