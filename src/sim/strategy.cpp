#include "sim/strategy.hpp"

#include <fmt/format.h>

#include <array>
#include <charconv>

#include "core/check.hpp"
#include "core/enum_names.hpp"

namespace pagedkv::sim {

namespace {

constexpr std::array<int32_t, 5> kPagedBlockSizes = {1, 8, 16, 32, 128};
// vLLM's default block size, used for prefix caching in the default comparison.
constexpr int32_t kPrefixBlockSize = 16;
constexpr int32_t kMaxBlockSize = 65536;

// The name of each kind; a kind with a block size is written "<name>-<block size>".
constexpr detail::EnumName<StrategyKind> kStrategyKindNames[] = {
    {StrategyKind::kContiguousMax, "contiguous-max"},
    {StrategyKind::kContiguousExact, "contiguous-exact"},
    {StrategyKind::kPaged, "paged"},
    {StrategyKind::kPagedPrefix, "prefix"},
    {StrategyKind::kHybrid, "hybrid"},
};

bool has_block_size(StrategyKind kind) {
  return kind == StrategyKind::kPaged || kind == StrategyKind::kPagedPrefix ||
         kind == StrategyKind::kHybrid;
}

/// "contiguous-max, contiguous-exact, paged-<block size>, prefix-<block size>, hybrid-<block
/// size>".
std::string accepted_forms() {
  std::string out;
  for (const auto& e : kStrategyKindNames) {
    if (!out.empty()) out += ", ";
    out += e.name;
    if (has_block_size(e.value)) out += "-<block size>";
  }
  return out;
}

}  // namespace

std::string Strategy::name() const {
  const std::string_view kind_name = detail::enum_name<StrategyKind>(kStrategyKindNames, kind);
  if (kind_name.empty()) return "?";
  if (!has_block_size(kind)) return std::string(kind_name);
  return fmt::format("{}-{}", kind_name, block_size);
}

std::vector<Strategy> default_strategies() {
  std::vector<Strategy> out = {{StrategyKind::kContiguousMax, 0},
                               {StrategyKind::kContiguousExact, 0}};
  for (int32_t bs : kPagedBlockSizes) out.push_back({StrategyKind::kPaged, bs});
  out.push_back({StrategyKind::kPagedPrefix, kPrefixBlockSize});
  return out;
}

Strategy parse_strategy(std::string_view text) {
  if (const auto kind = detail::parse_enum<StrategyKind>(kStrategyKindNames, text);
      kind && !has_block_size(*kind)) {
    return {*kind, 0};
  }
  // "<name>-<digits>": the digits never hold a '-', so the name ends at the last one.
  if (const size_t dash = text.rfind('-'); dash != std::string_view::npos) {
    const auto kind = detail::parse_enum<StrategyKind>(kStrategyKindNames, text.substr(0, dash));
    const std::string_view digits = text.substr(dash + 1);
    int32_t bs = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), bs);
    if (kind && has_block_size(*kind) && ec == std::errc() &&
        end == digits.data() + digits.size() && bs >= 1 && bs <= kMaxBlockSize) {
      return {*kind, bs};
    }
  }
  PAGEDKV_CHECK(!text.starts_with("hybrid-prefix"),
                "strategy '{}': prefix caching with hybrid allocation is not available yet "
                "(the replay's hybrid pool does not drive HybridKVCacheManager's prefix cache "
                "yet, issue 17); "
                "use hybrid-<block size> or prefix-<block size>",
                text);
  detail::fail("unknown strategy '{}' (expected {}; block size 1..{})", text, accepted_forms(),
               kMaxBlockSize);
}

}  // namespace pagedkv::sim
