#include "pagedkv/metadata/eviction_policy.hpp"

#include <algorithm>

#include "core/check.hpp"
#include "core/enum_names.hpp"

namespace pagedkv {

namespace {
constexpr detail::EnumName<EvictionKind> kEvictionKindNames[] = {
    {EvictionKind::kNone, "none"},
    {EvictionKind::kSlidingWindow, "window"},
    {EvictionKind::kAttentionSinks, "sinks"},
    {EvictionKind::kHeavyHitters, "h2o"},
};
}  // namespace

std::string eviction_kind_name(EvictionKind kind) {
  const std::string_view name = detail::enum_name<EvictionKind>(kEvictionKindNames, kind);
  return std::string(name.empty() ? "unknown" : name);
}

std::optional<EvictionKind> parse_eviction_kind(std::string_view name) {
  return detail::parse_enum<EvictionKind>(kEvictionKindNames, name);
}

void EvictionPolicy::set_attention_mask(AttentionParams& params) const {
  const AttentionMask mask = attention_mask();
  if (mask.window_left < 0) return;
  mask.apply(params);
}

bool EvictionPolicy::is_visible(int64_t key, int64_t query) const {
  const AttentionMask mask = attention_mask();
  return key <= query &&
         (mask.window_left < 0 || key > query - mask.window_left || key < mask.sink_tokens);
}

bool EvictionPolicy::is_needed(int64_t pos, int64_t first_query) const {
  return !released_positions(first_query).contains(pos);
}

SlidingWindowPolicy::SlidingWindowPolicy(int32_t window)
    : config_{.kind = EvictionKind::kSlidingWindow, .window = window} {
  PAGEDKV_CHECK(window >= 1, "SlidingWindowPolicy: window must be >= 1 token, got {}", window);
}

PositionRange SlidingWindowPolicy::released_positions(int64_t first_query) const {
  return {0, std::max<int64_t>(0, first_query - config_.window + 1)};
}

AttentionSinksPolicy::AttentionSinksPolicy(int32_t sinks, int32_t window)
    : config_{.kind = EvictionKind::kAttentionSinks, .window = window, .sinks = sinks} {
  PAGEDKV_CHECK(sinks >= 1, "AttentionSinksPolicy: sinks must be >= 1 token, got {}", sinks);
  PAGEDKV_CHECK(window >= 1, "AttentionSinksPolicy: window must be >= 1 token, got {}", window);
}

PositionRange AttentionSinksPolicy::released_positions(int64_t first_query) const {
  const int64_t sinks = config_.sinks;
  return {sinks, std::max(sinks, first_query - config_.window + 1)};
}

HeavyHitterPolicy::HeavyHitterPolicy(int32_t recent, int32_t heavy)
    : config_{.kind = EvictionKind::kHeavyHitters, .recent = recent, .heavy = heavy} {
  PAGEDKV_CHECK(recent >= 1, "HeavyHitterPolicy: recent must be >= 1 token, got {}", recent);
  PAGEDKV_CHECK(heavy >= 0, "HeavyHitterPolicy: heavy must be >= 0 tokens, got {}", heavy);
}

std::vector<size_t> HeavyHitterPolicy::select_victims(std::span<const KeptTokenScore> kept,
                                                      int64_t next_position,
                                                      int64_t num_new) const {
  const int64_t excess = static_cast<int64_t>(kept.size()) + num_new - budget();
  if (excess <= 0) return {};
  // After the append the recent window is [next_position + num_new - R, ...): tokens before it
  // compete on score; the new tokens (score 0) are never candidates.
  const int64_t recent_start = next_position + num_new - config_.recent;
  std::vector<size_t> candidates;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (kept[i].position < recent_start) candidates.push_back(i);
  }
  // Lowest score first; among equal scores the older position goes first (deterministic).
  std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
    if (kept[a].score != kept[b].score) return kept[a].score < kept[b].score;
    return kept[a].position < kept[b].position;
  });
  candidates.resize(std::min<size_t>(candidates.size(), static_cast<size_t>(excess)));
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

std::shared_ptr<const EvictionPolicy> make_eviction_policy(const EvictionPolicyConfig& config) {
  switch (config.kind) {
    case EvictionKind::kNone:
      return std::make_shared<NoEviction>();
    case EvictionKind::kSlidingWindow:
      return std::make_shared<SlidingWindowPolicy>(config.window);
    case EvictionKind::kAttentionSinks:
      return std::make_shared<AttentionSinksPolicy>(config.sinks, config.window);
    case EvictionKind::kHeavyHitters:
      return std::make_shared<HeavyHitterPolicy>(config.recent, config.heavy);
  }
  detail::fail("make_eviction_policy: unknown eviction kind {}", static_cast<int>(config.kind));
}

}  // namespace pagedkv
