#pragma once
/// @file eviction_policy.hpp
/// Token eviction policies: which cached positions of a sequence stay visible to attention as
/// decoding proceeds, so that a long (streaming) sequence runs in bounded KV memory.
/// Host-only.
///
/// A policy is a strategy object with a narrow interface, shared (immutable) by every sequence
/// of a KVCacheManager. The manager calls the same methods under every policy and never asks
/// which kind it holds (the model is vLLM v1's SingleTypeKVCacheManager, whose
/// remove_skipped_blocks() drops the blocks a sliding window no longer sees):
///  - attention_mask(): the mask {window_left, sink_tokens} kernels apply over a positional
///    block table (AttentionParams::window_left / sink_tokens); unbounded for full causal;
///  - released_positions(first_query): the positions no query at or after `first_query` sees;
///    before an append at first_query the manager releases the full blocks that lie wholly
///    inside (empty for policies that keep every position or choose by score);
///  - scores_tokens() / select_victims(): a score-based policy (heavy hitters) keeps an explicit
///    kept list per sequence, fed with attention weights (KVCacheManager::accumulate_attention);
///    before an append it names the kept tokens to evict. Once one is evicted, the sequence's
///    table is no longer positional: attention runs over the kept list
///    (paged_attention_over_slots) and a slot freed by an evicted token is refilled by a later
///    token. K/V are stored with RoPE already applied at their original positions, so keys
///    never move. Positional policies score nothing and name no victims.
///
/// Worked example (block_size 2):
///  - SlidingWindowPolicy(4): attention_mask() = {4, 0}; before appending position 9,
///    released_positions(9) = [0, 6), so logical blocks 0, 1, 2 (positions 0..5) are released;
///  - AttentionSinksPolicy(3, 2): mask {2, 3}; released_positions(12) = [3, 11): blocks 2..4
///    (positions 4..9) are released, block 1 (positions 2, 3) stays for sink 2;
///  - HeavyHitterPolicy(2, 2) (budget 4), kept positions 0..4 with scores {5, 0.5, 3, 0.5, 1}:
///    before appending position 5, select_victims -> {1, 3} (the two lowest-scored tokens
///    outside the recent window {4, 5}; ties: the older first).
///
/// Sources: Xiao et al., "Efficient Streaming Language Models with Attention Sinks"
/// (StreamingLLM, 2023); Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative
/// Inference of Large Language Models" (NeurIPS 2023).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/attention_params.hpp"

namespace pagedkv {

/// Which policy an EvictionPolicyConfig describes.
enum class EvictionKind : uint8_t {
  kNone,            ///< keep every position (plain causal attention)
  kSlidingWindow,   ///< keep the last `window` positions
  kAttentionSinks,  ///< keep the first `sinks` positions plus the last `window` (StreamingLLM)
  kHeavyHitters,    ///< keep the last `recent` plus `heavy` top-scored positions (H2O)
};

/// "none", "window", "sinks", "h2o" ("unknown" for a value outside the enum).
[[nodiscard]] std::string eviction_kind_name(EvictionKind kind);

/// The kind named `name` ("none", "window", "sinks", "h2o"); empty for any other name.
[[nodiscard]] std::optional<EvictionKind> parse_eviction_kind(std::string_view name);

/// Parameters of an eviction policy, what make_eviction_policy() builds one from.
/// Units: tokens. The fields a kind does not use are ignored (left at 0 by convention).
struct EvictionPolicyConfig {
  EvictionKind kind = EvictionKind::kNone;  ///< the policy; kNone keeps every position
  int32_t window = 0;  ///< W >= 1 (kSlidingWindow, kAttentionSinks): includes the current token
  int32_t sinks = 0;   ///< S >= 1 (kAttentionSinks)
  int32_t recent = 0;  ///< R >= 1 (kHeavyHitters)
  int32_t heavy = 0;   ///< H >= 0 (kHeavyHitters)
};

/// The mask kernels apply for a policy or a KV cache group, with AttentionParams' meaning
/// (AttentionParams::visible): the query at position q sees key k <= q when the mask is not
/// local, else k >= first visible position (window: q - window_left + 1; chunk:
/// floor(q / chunk_size) x chunk_size; the later of both) or k < sink_tokens.
/// Units: tokens. Eviction policies never set chunk_size (only HybridKVCacheManager's chunked
/// groups do).
struct AttentionMask {
  int32_t window_left = -1;  ///< last positions visible, the query's own included; -1 = all
  int32_t sink_tokens = 0;   ///< leading positions always visible (under a local mask)
  int32_t chunk_size = 0;    ///< chunked local attention's chunk; 0 = none

  /// Sets params.window_left, sink_tokens and chunk_size to this mask's.
  void apply(AttentionParams& params) const {
    params.window_left = window_left;
    params.sink_tokens = sink_tokens;
    params.chunk_size = chunk_size;
  }
};

/// Half-open interval [begin, end) of token positions; empty when end <= begin.
struct PositionRange {
  int64_t begin = 0;  ///< first position of the range, tokens
  int64_t end = 0;    ///< one past the last position of the range, tokens
  /// True when begin <= pos < end.
  [[nodiscard]] bool contains(int64_t pos) const { return pos >= begin && pos < end; }
};

/// One kept token of a score-based policy, as the policy sees it when choosing victims.
struct KeptTokenScore {
  int64_t position;  ///< token position in the sequence
  double score;      ///< accumulated attention weight (sum over steps, heads and layers)
};

/// Strategy interface. Implementations are immutable and stateless: per-sequence state (kept
/// tokens, scores) lives in the manager. See the file comment for how the manager uses it.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  /// The kind, for names and reports; the manager never branches on it.
  [[nodiscard]] virtual EvictionKind kind() const = 0;
  /// The parameters this policy was built from, kind included; the fields its kind does not
  /// use are 0. Valid as long as the policy lives.
  [[nodiscard]] virtual const EvictionPolicyConfig& config() const = 0;

  /// The mask kernels must apply over a positional block table of a sequence under this
  /// policy (unbounded {-1, 0} when every position, or an explicit kept list, is attended).
  [[nodiscard]] virtual AttentionMask attention_mask() const = 0;

  /// Positions that no query at a position >= first_query sees, so that they need not stay
  /// cached: one interval, empty when the policy releases nothing by position.
  /// Precondition: first_query >= 0. Units: token positions.
  [[nodiscard]] virtual PositionRange released_positions(int64_t first_query) const = 0;

  /// True when the policy chooses victims by accumulated attention score: each sequence then
  /// keeps an explicit kept list with a score per token (fed by accumulate_attention).
  [[nodiscard]] virtual bool scores_tokens() const = 0;

  /// Score-based policies: at most this many tokens stay kept once decoding (recent + heavy);
  /// -1 when unbounded.
  [[nodiscard]] virtual int64_t budget() const = 0;

  /// Score-based policies: which of the `kept` tokens (ascending position) to evict before
  /// `num_new` tokens are appended at positions [next_position, next_position + num_new).
  /// Returns indices into `kept`, ascending. Candidates are the tokens that will not be among
  /// the last `recent` positions after the append; the lowest-scored candidates are evicted
  /// (ties: the older position first) until kept + num_new <= budget or no candidate is left.
  /// Empty for other policies.
  [[nodiscard]] virtual std::vector<size_t> select_victims(std::span<const KeptTokenScore> kept,
                                                           int64_t next_position,
                                                           int64_t num_new) const = 0;

  /// Writes attention_mask() into params.window_left / sink_tokens; leaves params untouched
  /// (full causal) when the mask is unbounded.
  void set_attention_mask(AttentionParams& params) const;

  /// True when the query at position `query` sees key position `key` under attention_mask()
  /// (key <= query and inside the window or a sink). Mirrors the kernels' mask exactly.
  [[nodiscard]] bool is_visible(int64_t key, int64_t query) const;

  /// True when position `pos` is visible to some query at a position >= `first_query`, so that
  /// it must stay cached: pos is outside released_positions(first_query). Precondition: 0 <= pos.
  [[nodiscard]] bool is_needed(int64_t pos, int64_t first_query) const;
};

/// Base of the policies whose kept set is a rule on positions (a mask): they score no token and
/// name no victims; blocks go by released_positions().
class PositionalEvictionPolicy : public EvictionPolicy {
 public:
  bool scores_tokens() const override { return false; }
  int64_t budget() const override { return -1; }
  std::vector<size_t> select_victims(std::span<const KeptTokenScore>, int64_t,
                                     int64_t) const override {
    return {};
  }
};

/// Keeps every position: mask unbounded, nothing released (plain causal attention).
class NoEviction final : public PositionalEvictionPolicy {
 public:
  /// The policy of EvictionKind::kNone; its config() is all defaults.
  NoEviction() = default;
  EvictionKind kind() const override { return EvictionKind::kNone; }
  const EvictionPolicyConfig& config() const override { return config_; }
  AttentionMask attention_mask() const override { return {}; }
  PositionRange released_positions(int64_t) const override { return {}; }

 private:
  EvictionPolicyConfig config_{};
};

/// Sliding window of W tokens: the query at position p sees p - W < k <= p
/// (AttentionParams::window_left = W). Blocks wholly before the window of the next query are
/// released. Source: Longformer/Mistral-style local attention; see also StreamingLLM sec. 3.
/// Worked example (W 4, block_size 2): before appending position 9, positions < 6 are never
/// needed again (released_positions(9) = [0, 6)), so logical blocks 0, 1, 2 are released.
class SlidingWindowPolicy final : public PositionalEvictionPolicy {
 public:
  /// A window of `window` tokens (the query's own included).
  /// Errors: throws pagedkv::Error naming the value if window < 1.
  explicit SlidingWindowPolicy(int32_t window);
  EvictionKind kind() const override { return EvictionKind::kSlidingWindow; }
  const EvictionPolicyConfig& config() const override { return config_; }
  AttentionMask attention_mask() const override { return {config_.window, 0}; }
  /// [0, first_query - W + 1): the earliest key a query at >= first_query sees is
  /// first_query - W + 1.
  PositionRange released_positions(int64_t first_query) const override;

 private:
  EvictionPolicyConfig config_;
};

/// Attention sinks: the first S positions stay visible forever, plus the last W
/// (window_left = W, sink_tokens = S). Blocks holding a sink position are never released.
/// Source: Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (StreamingLLM,
/// 2023): keeping the initial tokens' K/V restores window attention's quality.
class AttentionSinksPolicy final : public PositionalEvictionPolicy {
 public:
  /// `sinks` leading positions plus a window of `window` tokens (the query's own included).
  /// Errors: throws pagedkv::Error naming the value if sinks < 1 or window < 1.
  AttentionSinksPolicy(int32_t sinks, int32_t window);
  EvictionKind kind() const override { return EvictionKind::kAttentionSinks; }
  const EvictionPolicyConfig& config() const override { return config_; }
  AttentionMask attention_mask() const override { return {config_.window, config_.sinks}; }
  /// [S, first_query - W + 1): between the sinks and the window of the next query.
  PositionRange released_positions(int64_t first_query) const override;

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
  /// The last `recent` positions plus `heavy` top-scored ones (budget recent + heavy tokens).
  /// Errors: throws pagedkv::Error naming the value if recent < 1 or heavy < 0.
  HeavyHitterPolicy(int32_t recent, int32_t heavy);
  EvictionKind kind() const override { return EvictionKind::kHeavyHitters; }
  const EvictionPolicyConfig& config() const override { return config_; }
  /// Unbounded: once tokens are evicted, attention runs over the kept list instead of a mask.
  AttentionMask attention_mask() const override { return {}; }
  /// Empty: blocks are released when their last kept token is evicted, not by position.
  PositionRange released_positions(int64_t) const override { return {}; }
  bool scores_tokens() const override { return true; }
  int64_t budget() const override { return int64_t{config_.recent} + config_.heavy; }
  std::vector<size_t> select_victims(std::span<const KeptTokenScore> kept, int64_t next_position,
                                     int64_t num_new) const override;

 private:
  EvictionPolicyConfig config_;
};

/// Builds the policy a config describes (shared and immutable: one serves every sequence).
/// Errors: throws pagedkv::Error if a parameter the kind needs is out of range (names it), or if
/// config.kind is not an EvictionKind value.
[[nodiscard]] std::shared_ptr<const EvictionPolicy> make_eviction_policy(
    const EvictionPolicyConfig& config);

}  // namespace pagedkv
