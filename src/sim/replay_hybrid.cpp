// The replay's hybrid-<bs> strategy (replay.hpp): the real HybridKVCacheManager over the model's
// KV cache groups (hybrid_layout.hpp), with the admission rules paged-<bs> gets from
// KVCacheManager (watermark, never-fits), which the hybrid manager does not have yet.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "core/check.hpp"
#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"
#include "sim/hybrid_layout.hpp"
#include "sim/replay_pools.hpp"

namespace pagedkv::sim {

namespace {

using replay_detail::Active;
using replay_detail::Admit;
using replay_detail::Pool;

/// The replay writes no K/V: no slots (the pages and counts are the same either way).
constexpr AppendOptions kNoSlots{.return_slots = false};

/// Live and reserved are counted in layer-positions (one position of one layer): live = what
/// the real layers need (needed_layer_positions), reserved = the pages in use x block_size x G,
/// padded layer slots included. So util = needed / reserved bytes, dtype- and layer-aware.
class HybridPool final : public Pool {
 public:
  HybridPool(const ReplayConfig& config, HybridLayout layout, int32_t pages, int32_t block_size)
      : model_(*config.model),
        layout_(std::move(layout)),
        block_size_(block_size),
        pages_(pages),
        // floor(watermark x pages), as KVCacheManager's watermark_blocks().
        watermark_pages_(static_cast<int32_t>(std::floor(config.watermark * pages))),
        piece_(config.max_batch_tokens),
        // The null block is not charged to the budget: paged-<bs>'s KVCacheManager has none,
        // and so both hold `pages` usable pages (an all-full model then replays identically).
        manager_(HybridKVCacheManagerConfig{
            .num_blocks = pages + 1, .block_size = block_size, .groups = layout_.groups}) {}

  Admit admit(Active& r, bool /*alone*/) override {
    // As paged-<bs>: a request whose peak alone does not fit above the watermark would preempt
    // itself forever. With this bound a lone request always gets kOk (the scheduler cannot stall).
    if (peak_pages(r) > pages_ - watermark_pages_) return Admit::kNever;
    if (manager_.num_free_blocks() - prompt_pages(r.target) < watermark_pages_) {
      return Admit::kLater;
    }
    // prompt_pages is exact for the final state; an intermediate piece may still find the pool
    // short (a local group's pages peak before its last release): then undo.
    const SeqId s = seq(r);
    manager_.add_sequence(s);
    if (!append_prompt(s, r.target) || manager_.num_free_blocks() < watermark_pages_) {
      manager_.free_sequence(s);
      return Admit::kLater;
    }
    r.cached = r.target;
    r.computed = 0;
    live_ += needed_layer_positions(model_, r.target);
    return Admit::kOk;
  }

  bool append_one(Active& r) override {
    if (!manager_.append_slots(seq(r), 1, kNoSlots)) return false;
    live_ +=
        needed_layer_positions(model_, r.cached + 1) - needed_layer_positions(model_, r.cached);
    r.members = 1;
    return true;
  }

  void release(Active& r) override {
    manager_.free_sequence(seq(r));
    live_ -= needed_layer_positions(model_, r.cached);
  }

  int64_t live() const override { return live_; }
  int64_t reserved() const override {
    return int64_t{pages_ - manager_.num_free_blocks()} * block_size_ * layout_.layers_per_group;
  }
  int64_t unit_bytes(const ReplayConfig& /*config*/) const override {
    return layout_.layer_position_bytes;
  }
  int64_t capacity_units(const ReplayResult& /*res*/) const override {
    return int64_t{pages_} * block_size_ * layout_.layers_per_group;
  }

 private:
  static SeqId seq(const Active& r) { return static_cast<SeqId>(r.index); }

  /// The local groups' spec (all alike); null without local groups.
  const KVCacheGroupSpec* local_spec() const {
    return layout_.local_groups > 0 ? &layout_.groups.back() : nullptr;
  }

  /// Appends a `tokens`-token prompt: at once without local groups, else in pieces of
  /// piece_ tokens, the remainder first, so the local groups release before each piece and
  /// end holding what the last (largest) piece's queries read. False when the pool is short.
  bool append_prompt(SeqId s, int64_t tokens) {
    if (local_spec() == nullptr || tokens <= piece_) {
      return manager_.append_slots(s, tokens, kNoSlots).has_value();
    }
    int64_t done = 0;
    while (done < tokens) {
      const int64_t rest = (tokens - done) % piece_;
      const int64_t n = rest > 0 ? rest : piece_;
      if (!manager_.append_slots(s, n, kNoSlots)) return false;
      done += n;
    }
    return true;
  }

  /// Pages a `tokens`-token prompt holds once append_prompt is done: ceil(T / bs) in each full
  /// group; in each local group the blocks from the one holding first_visible(start of the
  /// last piece) to the end.
  int64_t prompt_pages(int64_t tokens) const {
    const int64_t all = blocks_for_tokens(tokens, block_size_);
    int64_t local = 0;
    if (const KVCacheGroupSpec* g = local_spec(); g != nullptr && tokens > 0) {
      const int64_t last = std::min(tokens, piece_);  // the last piece is a whole one
      local = all - g->first_visible(tokens - last) / block_size_;
    }
    return layout_.full_groups * all + layout_.local_groups * local;
  }

  /// An upper bound of the pages the request holds at any time alone, the larger of its two
  /// phases. Prefill (of up to max(P, T - 1) positions, T = P + O, a re-admission's
  /// included): each full group ceil(that / bs), each local group what a piece of n <=
  /// max_batch_tokens tokens at p keeps, [first_visible(p), p + n): at most span - 1 + n positions
  /// (span = window or chunk). Decode: ceil(T / bs) per full group, at most span positions per
  /// local group. m positions touch at most ceil((m - 1) / bs) + 1 blocks.
  int64_t peak_pages(const Active& r) const {
    const int64_t total = r.prompt + r.output;
    const KVCacheGroupSpec* g = local_spec();
    if (g == nullptr) return layout_.full_groups * blocks_for_tokens(total, block_size_);
    const int64_t span = g->kind == GroupAttention::kSlidingWindow ? g->window : g->chunk;
    auto phase = [&](int64_t tokens, int64_t kept) {
      const int64_t all = blocks_for_tokens(tokens, block_size_);
      const int64_t local = std::min(all, blocks_for_tokens(kept - 1, block_size_) + 1);
      return layout_.full_groups * all + layout_.local_groups * local;
    };
    const int64_t prefill = std::max(r.prompt, total - 1);  // P itself when O = 0
    const int64_t n = std::max<int64_t>(1, std::min(piece_, prefill));
    return std::max(phase(prefill, span - 1 + n), phase(total, span));
  }

  ModelPreset model_;
  HybridLayout layout_;
  int32_t block_size_;
  int32_t pages_;
  int32_t watermark_pages_;
  int64_t piece_;
  HybridKVCacheManager manager_;
  int64_t live_ = 0;  // layer-positions the running requests need
};

}  // namespace

std::unique_ptr<Pool> replay_detail::make_hybrid_pool(const ReplayConfig& config,
                                                      const Strategy& strategy, ReplayResult& res) {
  PAGEDKV_CHECK(config.model.has_value(),
                "replay: strategy {} needs the model's layers (ReplayConfig::model is unset)",
                strategy.name());
  HybridLayout layout = hybrid_layout(*config.model, strategy.block_size);
  // The manager adds the null block: stay below 2^31 - 1 blocks with it.
  const int64_t pages = std::min<int64_t>(config.kv_memory_bytes / layout.page_bytes, (1 << 30));
  PAGEDKV_CHECK(pages >= 1,
                "replay: KV memory {} bytes holds no page of {} ({} tokens x {} layers, {} bytes "
                "each)",
                config.kv_memory_bytes, strategy.name(), strategy.block_size,
                layout.layers_per_group, layout.page_bytes);
  res.block_size = strategy.block_size;
  res.num_blocks = static_cast<int32_t>(pages);
  res.capacity_tokens = pages * layout.page_bytes / config.kv_bytes_per_token;
  res.layers_per_group = layout.layers_per_group;
  res.kv_groups = static_cast<int32_t>(layout.groups.size());
  res.padded_layers = layout.padded_layers;
  return std::make_unique<HybridPool>(config, std::move(layout), res.num_blocks,
                                      strategy.block_size);
}

void validate(const ReplayConfig& c, const Strategy& strategy) {
  if (strategy.kind != StrategyKind::kHybrid) return;
  const std::string name = strategy.name();
  PAGEDKV_CHECK(c.model.has_value(),
                "replay: strategy {} needs the model's layers (ReplayConfig::model is unset)",
                name);
  PAGEDKV_CHECK(c.preemption == Preemption::kRecompute,
                "replay: strategy {} supports recompute preemption only (the replay's hybrid "
                "pool does not drive the manager's swap yet, issue 17)",
                name);
  PAGEDKV_CHECK(c.group_width == 1,
                "replay: strategy {} does not run sharing groups (width {}): forked hybrid "
                "sequences are not replayed yet",
                name, c.group_width);
}

}  // namespace pagedkv::sim
