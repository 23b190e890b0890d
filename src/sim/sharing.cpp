#include "sim/sharing.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <optional>

#include "core/check.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::sim {

namespace {

// splitmix64 (Steele et al., OOPSLA 2014): a portable stream, unlike std:: distributions.
uint64_t next_random(uint64_t& state) {
  uint64_t x = (state += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void check_config(const SharingConfig& c) {
  PAGEDKV_CHECK(c.width >= 1, "sharing: width (samples or beams) must be >= 1, got {}", c.width);
  PAGEDKV_CHECK(c.block_size >= 1, "sharing: block size must be >= 1, got {}", c.block_size);
}

/// One request's group on its own manager: the sequences alive and the next free id.
class Group {
 public:
  Group(int64_t tail_tokens, int64_t output, const SharingConfig& c)
      : width_(c.width), manager_(config_for(tail_tokens, output, c)) {
    const std::vector<TokenId> prompt(static_cast<size_t>(tail_tokens), 0);
    PAGEDKV_CHECK(manager_.add_sequence(0, prompt).has_value(),
                  "sharing: internal: the prompt does not fit the group's pool");
    seqs_.push_back(0);
  }

  /// Step 1: the prompt sequence forks into width sequences, each appends its first token.
  void first_step() {
    for (int32_t k = 1; k < width_; ++k) fork(seqs_[0]);
    append_all();
  }
  void sampling_step() { append_all(); }
  /// A beam step: `parents[i]` is the beam whose candidate i survives.
  void beam_step(const std::vector<int32_t>& parents) {
    PAGEDKV_CHECK(static_cast<int32_t>(parents.size()) == width_,
                  "sharing: beam chooser returned {} survivors, expected {}", parents.size(),
                  width_);
    std::vector<int32_t> children(static_cast<size_t>(width_), 0);
    for (int32_t p : parents) {
      PAGEDKV_CHECK(p >= 0 && p < width_,
                    "sharing: beam chooser returned parent {}, not in [0, {})", p, width_);
      ++children[static_cast<size_t>(p)];
    }
    // Forks first (they allocate nothing), then the dead beams go, then every survivor appends.
    const std::vector<SeqId> beams = seqs_;
    std::vector<SeqId> next;
    for (size_t b = 0; b < beams.size(); ++b) {
      if (children[b] == 0) continue;
      next.push_back(beams[b]);
      for (int32_t k = 1; k < children[b]; ++k) next.push_back(fork(beams[b]));
    }
    for (size_t b = 0; b < beams.size(); ++b) {
      if (children[b] == 0) manager_.free_sequence(beams[b]);
    }
    seqs_ = std::move(next);
    append_all();
  }
  [[nodiscard]] int64_t used_blocks() const { return manager_.allocator().num_used(); }

 private:
  static KVCacheManagerConfig config_for(int64_t tail, int64_t output, const SharingConfig& c) {
    // Each sequence holds at most ceil((tail + output) / bs) blocks, plus one copy-on-write
    // block per sequence in flight.
    const int64_t per_seq = (tail + output + c.block_size - 1) / c.block_size + 1;
    const int64_t blocks = per_seq * c.width + 1;
    PAGEDKV_CHECK(blocks <= int64_t{1} << 30, "sharing: a group of {} x {} tokens is too large",
                  c.width, tail + output);
    return {.num_blocks = static_cast<int32_t>(blocks), .block_size = c.block_size};
  }
  SeqId fork(SeqId parent) {
    const SeqId child = next_id_++;
    manager_.fork(parent, child);
    seqs_.push_back(child);
    return child;
  }
  void append_all() {
    for (SeqId s : seqs_) {
      PAGEDKV_CHECK(manager_.append_slots(s, 1).has_value(),
                    "sharing: internal: sequence {} could not append", s);
    }
  }

  int32_t width_;
  KVCacheManager manager_;
  std::vector<SeqId> seqs_;
  SeqId next_id_ = 1;
};

}  // namespace

BeamChooser seeded_beam_chooser(uint64_t seed, int32_t width) {
  PAGEDKV_CHECK(width >= 1, "sharing: beam width must be >= 1, got {}", width);
  auto state = std::make_shared<uint64_t>(seed);
  auto ids = std::make_shared<std::vector<int32_t>>();
  return [state, ids](int32_t w) {
    std::vector<int32_t>& cand = *ids;
    cand.resize(static_cast<size_t>(w) * static_cast<size_t>(w));
    std::iota(cand.begin(), cand.end(), 0);
    std::vector<int32_t> parents;
    parents.reserve(static_cast<size_t>(w));
    for (int32_t i = 0; i < w; ++i) {
      const uint64_t left = cand.size() - static_cast<size_t>(i);
      const size_t j = static_cast<size_t>(i) + static_cast<size_t>(next_random(*state) % left);
      std::swap(cand[static_cast<size_t>(i)], cand[j]);
      parents.push_back(cand[static_cast<size_t>(i)] / w);
    }
    return parents;
  };
}

GroupSteps simulate_group(int64_t prompt, int64_t output, const SharingConfig& config,
                          const BeamChooser& choose, bool full_prompt) {
  check_config(config);
  PAGEDKV_CHECK(prompt >= 1, "sharing: prompt must be >= 1 token, got {}", prompt);
  PAGEDKV_CHECK(output >= 0, "sharing: output must be >= 0 tokens, got {}", output);
  PAGEDKV_CHECK(config.mode != SharingMode::kBeamSearch || choose,
                "sharing: beam search of width {} needs a survivor chooser", config.width);
  const int64_t bs = config.block_size;
  // Full prompt blocks below the last prompt token: shared by all, never written.
  const int64_t full = full_prompt ? 0 : (prompt - 1) / bs;
  Group group(prompt - full * bs, output, config);
  GroupSteps out;
  out.shared.reserve(static_cast<size_t>(output));
  out.independent.reserve(static_cast<size_t>(output));
  for (int64_t t = 1; t <= output; ++t) {
    if (t == 1) {
      group.first_step();
    } else if (config.mode == SharingMode::kParallelSampling) {
      group.sampling_step();
    } else {
      group.beam_step(choose(config.width));
    }
    out.shared.push_back(group.used_blocks() + full);
    out.independent.push_back(int64_t{config.width} * ((prompt + t + bs - 1) / bs));
  }
  return out;
}

SharingResult simulate_sharing(const Trace& trace, const SharingConfig& config, int64_t limit) {
  check_config(config);
  const auto t0 = std::chrono::steady_clock::now();
  SharingResult res;
  res.workload = (config.mode == SharingMode::kParallelSampling ? "parallel-" : "beam-") +
                 std::to_string(config.width);
  const BeamChooser choose = seeded_beam_chooser(config.seed, config.width);
  const size_t n = limit > 0 ? std::min(trace.requests.size(), static_cast<size_t>(limit))
                             : trace.requests.size();
  for (size_t i = 0; i < n; ++i) {
    const TraceRequest& r = trace.requests[i];
    if (r.output_tokens < 1 || r.prompt_tokens < 1) continue;
    const GroupSteps g = simulate_group(r.prompt_tokens, r.output_tokens, config, choose);
    ++res.requests;
    res.decode_steps += r.output_tokens;
    for (int64_t v : g.shared) res.shared_block_steps += static_cast<double>(v);
    for (int64_t v : g.independent) res.independent_block_steps += static_cast<double>(v);
  }
  if (res.independent_block_steps > 0) {
    res.saving = 1.0 - res.shared_block_steps / res.independent_block_steps;
    res.capacity_gain = res.independent_block_steps / res.shared_block_steps;
  }
  res.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace pagedkv::sim
