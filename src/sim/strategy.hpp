#pragma once
/// @file strategy.hpp
/// The memory strategies the replay compares (see replay.hpp for what each one models), and
/// their names: "contiguous-max", "contiguous-exact", "paged-<block size>",
/// "prefix-<block size>", "hybrid-<block size>".

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv::sim {

enum class StrategyKind {
  kContiguousMax,
  kContiguousExact,
  kPaged,
  kPagedPrefix,
  kHybrid,  ///< HybridKVCacheManager over the model's KV cache groups (replay.hpp)
};

/// One memory strategy of the comparison.
struct Strategy {
  StrategyKind kind = StrategyKind::kPaged;
  int32_t block_size = 16;  ///< tokens per block (paged kinds only)
  /// "contiguous-max", "contiguous-exact", "paged-16", "prefix-16", "hybrid-16".
  [[nodiscard]] std::string name() const;
};

/// contiguous-max, contiguous-exact, paged-1, paged-8, paged-16, paged-32, paged-128, prefix-16
/// (no hybrid: it needs the model's layers; `pagedkv replay` adds hybrid-16 for a model with
/// local layers).
[[nodiscard]] std::vector<Strategy> default_strategies();

/// Parses a name as Strategy::name() prints it ("paged-16", "prefix-32", "hybrid-16", ...);
/// block sizes 1..65536.
/// Errors: throws pagedkv::Error naming the text and the accepted forms ("hybrid-prefix-<bs>":
/// that prefix caching across KV cache groups is not available yet).
[[nodiscard]] Strategy parse_strategy(std::string_view text);

}  // namespace pagedkv::sim
