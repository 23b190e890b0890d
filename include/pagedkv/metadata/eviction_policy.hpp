#pragma once
/// @file eviction_policy.hpp
/// Token eviction policies: which cached positions of a sequence stay visible to attention as
/// decoding proceeds, so that a long (streaming) sequence runs in bounded KV memory.
/// Strategy objects; KVCacheManager applies the one its config names to every sequence.
/// Host-only.
///
/// Two families:
///  - positional (sliding window, attention sinks): the kept set is a rule on positions, which
///    the attention kernels apply as a mask (AttentionParams::window_left / sink_tokens); the
///    manager releases whole blocks that no future query can see;
///  - score based (heavy hitters): the kept set is arbitrary, so the manager keeps an explicit
///    list of kept (position, slot) pairs, attention runs over that list
///    (paged_attention_over_slots), and a slot freed by an evicted token is refilled by a later
///    token. K/V are stored with RoPE already applied at their original positions, so keys
///    never move.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagedkv/attention_params.hpp"

namespace pagedkv {

/// Which policy a EvictionPolicyConfig describes.
enum class EvictionKind : uint8_t {
  kNone,            ///< keep every position (plain causal attention)
  kSlidingWindow,   ///< keep the last `window` positions
  kAttentionSinks,  ///< keep the first `sinks` positions plus the last `window` (StreamingLLM)
  kHeavyHitters,    ///< keep the last `recent` plus `heavy` top-scored positions (H2O)
};

/// "none", "window", "sinks", "h2o".
[[nodiscard]] std::string eviction_kind_name(EvictionKind kind);

/// Parameters of an eviction policy. Units: tokens.
struct EvictionPolicyConfig {
  EvictionKind kind = EvictionKind::kNone;
  int32_t window = 0;  ///< W >= 1 (kSlidingWindow, kAttentionSinks): includes the current token
  int32_t sinks = 0;   ///< S >= 1 (kAttentionSinks)
  int32_t recent = 0;  ///< R >= 1 (kHeavyHitters)
  int32_t heavy = 0;   ///< H >= 0 (kHeavyHitters)
};

/// One kept token of a score-based policy, as the policy sees it when choosing victims.
struct KeptTokenScore {
  int64_t position;  ///< token position in the sequence
  double score;      ///< accumulated attention weight (sum over steps, heads and layers)
};

/// Strategy interface. Implementations are immutable and stateless: per-sequence state (kept
/// positions, scores) lives in the manager.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  [[nodiscard]] virtual EvictionKind kind() const = 0;
  [[nodiscard]] virtual const EvictionPolicyConfig& config() const = 0;

  /// Sets the attention mask kernels must use for sequences under this policy: window_left /
  /// sink_tokens for positional policies; untouched (full causal) otherwise.
  virtual void set_attention_mask(AttentionParams& params) const = 0;

  /// True for policies whose kept set is a rule on positions (masks + block release).
  [[nodiscard]] virtual bool is_positional() const = 0;

  /// Positional policies: true when position `pos` is visible to some query at a position
  /// >= `first_query`, i.e. must stay cached. Always true for non-positional policies.
  /// Precondition: 0 <= pos.
  [[nodiscard]] virtual bool is_needed(int64_t pos, int64_t first_query) const = 0;

  /// Positional policies: true when the query at position `query` sees key position `key`
  /// (key <= query). Mirrors the kernels' mask exactly.
  [[nodiscard]] virtual bool is_visible(int64_t key, int64_t query) const = 0;

  /// Score-based policies: at most this many tokens stay kept once decoding (recent + heavy);
  /// -1 when unbounded.
  [[nodiscard]] virtual int64_t budget() const = 0;

  /// Score-based policies: which of the `kept` tokens (ascending position) to evict before
  /// `num_new` tokens are appended at positions next_position .. next_position + num_new - 1.
  /// Returns indices into `kept`, ascending. Candidates are the tokens that will not be among
  /// the last `recent` positions after the append; the lowest-scored candidates are evicted
  /// (ties: the older position first) until kept + num_new <= budget or no candidate is left.
  /// Empty for other policies.
  [[nodiscard]] virtual std::vector<size_t> select_victims(std::span<const KeptTokenScore> kept,
                                                           int64_t next_position,
                                                           int64_t num_new) const = 0;
};

/// Keeps every position.
class NoEviction final : public EvictionPolicy {
 public:
  NoEviction() = default;
  EvictionKind kind() const override { return EvictionKind::kNone; }
  const EvictionPolicyConfig& config() const override { return config_; }
  void set_attention_mask(AttentionParams&) const override {}
  bool is_positional() const override { return true; }
  bool is_needed(int64_t, int64_t) const override { return true; }
  bool is_visible(int64_t key, int64_t query) const override { return key <= query; }
  int64_t budget() const override { return -1; }
  std::vector<size_t> select_victims(std::span<const KeptTokenScore>, int64_t,
                                     int64_t) const override {
    return {};
  }

 private:
  EvictionPolicyConfig config_{};
};

/// Sliding window of W tokens: the query at position p sees p - W < k <= p
/// (AttentionParams::window_left = W). Blocks wholly before the window of the next query are
/// released. Source: Longformer/Mistral-style local attention; see also StreamingLLM sec. 3.
/// Worked example (W 4, block_size 2): before appending position 9, positions < 6 are never
/// needed again, so logical blocks 0, 1, 2 (positions 0..5) are released.
class SlidingWindowPolicy final : public EvictionPolicy {
 public:
  /// Errors: throws pagedkv::Error if window < 1.
  explicit SlidingWindowPolicy(int32_t window);
  EvictionKind kind() const override { return EvictionKind::kSlidingWindow; }
  const EvictionPolicyConfig& config() const override { return config_; }
  void set_attention_mask(AttentionParams& params) const override;
  bool is_positional() const override { return true; }
  bool is_needed(int64_t pos, int64_t first_query) const override;
  bool is_visible(int64_t key, int64_t query) const override;
  int64_t budget() const override { return -1; }
  std::vector<size_t> select_victims(std::span<const KeptTokenScore>, int64_t,
                                     int64_t) const override {
    return {};
  }

 private:
  EvictionPolicyConfig config_;
};

/// Attention sinks: the first S positions stay visible forever, plus the last W
/// (window_left = W, sink_tokens = S). Blocks holding a sink position are never released.
/// Source: Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (StreamingLLM,
/// 2023): keeping the initial tokens' K/V restores window attention's quality.
class AttentionSinksPolicy final : public EvictionPolicy {
 public:
  /// Errors: throws pagedkv::Error if sinks < 1 or window < 1.
  AttentionSinksPolicy(int32_t sinks, int32_t window);
  EvictionKind kind() const override { return EvictionKind::kAttentionSinks; }
  const EvictionPolicyConfig& config() const override { return config_; }
  void set_attention_mask(AttentionParams& params) const override;
  bool is_positional() const override { return true; }
  bool is_needed(int64_t pos, int64_t first_query) const override;
  bool is_visible(int64_t key, int64_t query) const override;
  int64_t budget() const override { return -1; }
  std::vector<size_t> select_victims(std::span<const KeptTokenScore>, int64_t,
                                     int64_t) const override {
    return {};
  }

 private:
  EvictionPolicyConfig config_;
};

/// Heavy hitters: keep the last R positions plus the H positions with the largest accumulated
/// attention weight (budget R + H). The prompt is prefilled whole (all positions kept, so the
/// prefill is exact); from the next append on, victims are evicted so the kept set is back
/// within budget.
/// Source: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
/// Language Models" (NeurIPS 2023), greedy eviction by accumulated attention score. Unlike the
/// paper (one kept set per head), one kept set serves all heads and layers: scores are summed
/// over them, because one block table serves every layer.
class HeavyHitterPolicy final : public EvictionPolicy {
 public:
  /// Errors: throws pagedkv::Error if recent < 1 or heavy < 0.
  HeavyHitterPolicy(int32_t recent, int32_t heavy);
  EvictionKind kind() const override { return EvictionKind::kHeavyHitters; }
  const EvictionPolicyConfig& config() const override { return config_; }
  void set_attention_mask(AttentionParams&) const override {}
  bool is_positional() const override { return false; }
  bool is_needed(int64_t, int64_t) const override { return true; }
  bool is_visible(int64_t key, int64_t query) const override { return key <= query; }
  int64_t budget() const override { return int64_t{config_.recent} + config_.heavy; }
  std::vector<size_t> select_victims(std::span<const KeptTokenScore> kept, int64_t next_position,
                                     int64_t num_new) const override;

 private:
  EvictionPolicyConfig config_;
};

/// Builds the policy a config describes.
/// Errors: throws pagedkv::Error if a parameter the kind needs is out of range (names it).
[[nodiscard]] std::shared_ptr<const EvictionPolicy> make_eviction_policy(
    const EvictionPolicyConfig& config);

}  // namespace pagedkv
