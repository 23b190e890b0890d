// The CPU paged backend with automatic prefix caching and the tiers below its pool: prompts
// share published blocks (KVCacheManager::add_sequence with the prompt), full blocks are
// published at end_step (commit), and with tiers a prompt's missed prefix is onboarded from
// them before its prefill (kv_tiering.hpp, docs/tiers.md).

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "model/cpu_paged_backend.hpp"
#include "model/kv_tiering.hpp"
#include "pagedkv/error.hpp"

namespace pagedkv::model {

namespace {

class PrefixPagedBackend final : public CpuPagedBackend {
 public:
  explicit PrefixPagedBackend(const KVBackendConfig& c) : CpuPagedBackend(c) {
    if (c.tiering.enabled()) tiering_ = std::make_unique<KVTiering>(c.tiering, cache_.config());
  }

  int64_t add_prompt(SeqId seq, std::span<const TokenId> prompt) override {
    AddOptions options;
    options.first_chunk_tokens = 0;  // blocks for the hits only; the steps append the rest
    const auto added = manager_.add_sequence(seq, prompt, options);
    if (!added) {
      throw Error(
          fmt::format("paged KV pool exhausted: sequence {} cannot hold its prefix hits", seq));
    }
    handle_events();
    const int64_t computed = added->num_computed_tokens;
    if (tiering_ == nullptr) return computed;
    return tiering_->onboard(
        manager_, seq, prompt, computed, read_block(),
        [this](BlockId b, std::span<const std::byte> bytes) { cache_.set_block_bytes(b, bytes); });
  }

  void begin_step(std::span<const SeqId>, std::span<const int64_t>) override {
    throw Error("kv backend: prefix caching needs the step's token ids (begin_step_with_tokens)");
  }

  void begin_step_with_tokens(std::span<const SeqId> seqs, std::span<const int64_t> n_new,
                              std::span<const TokenId> tokens) override {
    if (seqs.size() != n_new.size()) {
      throw Error(fmt::format("kv backend: {} sequences but {} new-token counts", seqs.size(),
                              n_new.size()));
    }
    step_seqs_.assign(seqs.begin(), seqs.end());
    size_t at = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto n = static_cast<size_t>(n_new[i]);
      if (at + n > tokens.size()) {
        throw Error(fmt::format("kv backend: {} token ids for more new tokens", tokens.size()));
      }
      const auto r = manager_.append_tokens(seqs[i], tokens.subspan(at, n));
      if (!r) {
        throw Error(
            fmt::format("paged KV pool exhausted: sequence {} needs {} more blocks, {} "
                        "of {} free",
                        seqs[i], manager_.blocks_needed_to_append(seqs[i], n_new[i]),
                        manager_.num_free_blocks(), manager_.num_total_blocks()));
      }
      if (!r->copies.empty()) cache_.copy_blocks(r->copies);
      at += n;
    }
    handle_events();  // blocks the pool evicted are written down before the step overwrites them
    manager_.batch_metadata(seqs, n_new, meta_);
    decode_ = std::all_of(n_new.begin(), n_new.end(), [](int64_t n) { return n == 1; });
  }

  void end_step() override {
    CpuPagedBackend::end_step();  // commit: full blocks are published
    handle_events();
  }

  void finish() override {
    if (tiering_ != nullptr) tiering_->finish(read_block());
  }

  void drop_prefix_cache() override {
    (void)manager_.reset_prefix_cache();  // kRemoved events: the tiers write them down
    handle_events();
    if (tiering_ != nullptr) tiering_->flush();
  }

  TieringReport tiering_report() const override {
    return tiering_ == nullptr ? TieringReport{} : tiering_->report();
  }

 private:
  KVTiering::ReadBlock read_block() {
    return [this](BlockId b) { return cache_.block_bytes(b); };
  }
  void handle_events() {
    const std::vector<KVCacheEvent> events = manager_.take_events();
    if (tiering_ != nullptr) tiering_->on_events(events, read_block());
  }

  std::unique_ptr<KVTiering> tiering_;
};

}  // namespace

std::unique_ptr<KVBackend> make_prefix_paged_backend(const KVBackendConfig& config) {
  return std::make_unique<PrefixPagedBackend>(config);
}

}  // namespace pagedkv::model
