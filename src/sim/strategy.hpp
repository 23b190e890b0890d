#pragma once
/// @file strategy.hpp
/// The memory strategies the replay compares (see replay.hpp for what each one models), and
/// their names: "contiguous-max", "contiguous-exact", "paged-<block size>",
/// "prefix-<block size>".

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagedkv::sim {

enum class StrategyKind { kContiguousMax, kContiguousExact, kPaged, kPagedPrefix };

/// One memory strategy of the comparison.
struct Strategy {
  StrategyKind kind = StrategyKind::kPaged;
  int32_t block_size = 16;  ///< tokens per block (paged kinds only)
  /// "contiguous-max", "contiguous-exact", "paged-16", "prefix-16".
  [[nodiscard]] std::string name() const;
};

/// contiguous-max, contiguous-exact, paged-1, paged-8, paged-16, paged-32, paged-128, prefix-16.
[[nodiscard]] std::vector<Strategy> default_strategies();

/// Parses a name as Strategy::name() prints it ("paged-16", "prefix-32", ...); block sizes
/// 1..65536.
/// Errors: throws pagedkv::Error naming the text and the accepted forms.
[[nodiscard]] Strategy parse_strategy(std::string_view text);

}  // namespace pagedkv::sim
