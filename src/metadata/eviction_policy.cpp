#include "pagedkv/metadata/eviction_policy.hpp"

#include <algorithm>

#include "core/check.hpp"

namespace pagedkv {

std::string eviction_kind_name(EvictionKind kind) {
  switch (kind) {
    case EvictionKind::kNone:
      return "none";
    case EvictionKind::kSlidingWindow:
      return "window";
    case EvictionKind::kAttentionSinks:
      return "sinks";
    case EvictionKind::kHeavyHitters:
      return "h2o";
  }
  return "unknown";
}

SlidingWindowPolicy::SlidingWindowPolicy(int32_t window)
    : config_{.kind = EvictionKind::kSlidingWindow, .window = window} {
  PAGEDKV_CHECK(window >= 1, "SlidingWindowPolicy: window must be >= 1 token, got {}", window);
}

void SlidingWindowPolicy::set_attention_mask(AttentionParams& params) const {
  params.window_left = config_.window;
  params.sink_tokens = 0;
}

// The earliest key any query at q >= first_query sees is first_query - W + 1.
bool SlidingWindowPolicy::is_needed(int64_t pos, int64_t first_query) const {
  return pos > first_query - config_.window;
}

bool SlidingWindowPolicy::is_visible(int64_t key, int64_t query) const {
  return key <= query && key > query - config_.window;
}

AttentionSinksPolicy::AttentionSinksPolicy(int32_t sinks, int32_t window)
    : config_{.kind = EvictionKind::kAttentionSinks, .window = window, .sinks = sinks} {
  PAGEDKV_CHECK(sinks >= 1, "AttentionSinksPolicy: sinks must be >= 1 token, got {}", sinks);
  PAGEDKV_CHECK(window >= 1, "AttentionSinksPolicy: window must be >= 1 token, got {}", window);
}

void AttentionSinksPolicy::set_attention_mask(AttentionParams& params) const {
  params.window_left = config_.window;
  params.sink_tokens = config_.sinks;
}

bool AttentionSinksPolicy::is_needed(int64_t pos, int64_t first_query) const {
  return pos < config_.sinks || pos > first_query - config_.window;
}

bool AttentionSinksPolicy::is_visible(int64_t key, int64_t query) const {
  return key <= query && (key < config_.sinks || key > query - config_.window);
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
