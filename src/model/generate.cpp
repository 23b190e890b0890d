#include "model/generate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "core/enum_names.hpp"
#include "model/tokenizer.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_groups.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv::model {

namespace {

using Clock = std::chrono::steady_clock;

constexpr ::pagedkv::detail::EnumName<WarmPass> kWarmPassNames[] = {
    {WarmPass::kNone, "none"}, {WarmPass::kPool, "pool"}, {WarmPass::kTiers, "tiers"}};

/// Largest page pool generate() allocates: a typo in --block-size or a huge prompt file should
/// be an error message, not an out-of-memory failure.
constexpr int64_t kMaxPoolBytes = int64_t{8} << 30;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// Token sampler of one sequence. Greedy is argmax with the first maximum winning (as the
/// reference runtime). With a temperature it is the runtime's multinomial sampler: softmax of
/// logits / T, then the first index whose cumulative probability exceeds a uniform coin from
/// its xorshift* generator (Marsaglia 2003; Vigna 2016).
class Sampler {
 public:
  Sampler(uint64_t seed, uint64_t stream) {
    // splitmix64 of (seed, stream): distinct non-zero xorshift states for every sequence.
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    state_ = (z ^ (z >> 31)) | 1;
  }

  TokenId sample(const float* logits, int32_t vocab, float temperature) {
    if (temperature == 0.0f) {
      return static_cast<TokenId>(std::max_element(logits, logits + vocab) - logits);
    }
    probs_.assign(logits, logits + vocab);
    const float max = *std::max_element(probs_.begin(), probs_.end());
    float sum = 0.0f;
    for (float& p : probs_) {
      p = std::exp((p - max) / temperature);
      sum += p;
    }
    const float coin = next_f32() * sum;  // scale the coin instead of normalizing
    float cdf = 0.0f;
    for (int32_t i = 0; i < vocab; ++i) {
      cdf += probs_[static_cast<size_t>(i)];
      if (coin < cdf) return i;
    }
    return vocab - 1;  // rounding
  }

 private:
  float next_f32() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    const auto u = static_cast<uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
    return static_cast<float>(u >> 8) / 16777216.0f;
  }
  uint64_t state_;
  std::vector<float> probs_;
};

/// The checks of generate() on its arguments (see generate.hpp, Errors), before any work.
void check_request(const LlamaConfig& c, const std::vector<std::vector<TokenId>>& prompts,
                   const GenerateOptions& opt) {
  if (prompts.empty()) throw Error("generate: no prompt");
  if (!opt.layer_attention.empty() && std::cmp_not_equal(opt.layer_attention.size(), c.n_layers)) {
    throw Error(fmt::format("generate: {} layer attention entries for a model of {} layers",
                            opt.layer_attention.size(), c.n_layers));
  }
  if (opt.steps < 1) throw Error(fmt::format("generate: steps {} must be >= 1", opt.steps));
  if (opt.block_size < 1) {
    throw Error(fmt::format("generate: block size {} must be >= 1", opt.block_size));
  }
  if (!(opt.temperature >= 0.0f) || !std::isfinite(opt.temperature)) {
    throw Error(fmt::format("generate: temperature {} must be finite and >= 0", opt.temperature));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    if (p.empty()) throw Error(fmt::format("generate: prompt {} has no token", i));
    if (static_cast<int64_t>(p.size()) > opt.steps) {
      throw Error(
          fmt::format("generate: prompt {} has {} tokens, more than the {} positions "
                      "to run (--steps)",
                      i, p.size(), opt.steps));
    }
    for (const TokenId t : p) {
      if (t < 0 || t >= c.vocab_size) {
        throw Error(
            fmt::format("generate: prompt {} has token id {} outside [0, {})", i, t, c.vocab_size));
      }
    }
  }
}

/// A warm pass needs a cache it can leave blocks in: the paged mode with prefix caching (tiers
/// for WarmPass::kTiers), and no shadow caches (they would see the warm pass too).
void check_warm_pass(CacheMode mode, const GenerateOptions& opt) {
  if (opt.warm_pass == WarmPass::kNone) return;
  const char* name = warm_pass_name(opt.warm_pass);
  if (mode != CacheMode::kPaged || !(opt.prefix_caching || opt.tiering.enabled())) {
    throw Error(
        fmt::format("warm pass '{}' needs the paged cache with prefix caching (--prefix-caching "
                    "or a tier), not the {} cache{}",
                    name, cache_mode_name(mode), mode == CacheMode::kPaged ? " without it" : ""));
  }
  if (opt.warm_pass == WarmPass::kTiers && !opt.tiering.has_tier()) {
    throw Error("warm pass 'tiers' needs a tier (host, disk or Redis) to write to");
  }
  if (!opt.shadow_kv_dtypes.empty()) {
    throw Error(fmt::format("warm pass '{}' cannot run with shadow KV dtypes", name));
  }
}

/// The page pool of a run: blocks (all sequences) and bytes per block.
struct PagePool {
  int64_t blocks = 0;
  int64_t block_bytes = 0;  // all layers, one block
  int64_t bytes = 0;        // the pool allocated (paged and none modes)
};

/// Sizes the pool so that it never runs out: each sequence forwards at most `steps` positions.
/// Errors: too many blocks, or (paged and none modes) more than kMaxPoolBytes.
PagePool size_page_pool(const LlamaConfig& c, int64_t num_seqs, CacheMode mode,
                        const GenerateOptions& opt) {
  PagePool pool;
  pool.blocks = num_seqs * blocks_for_tokens(opt.steps, opt.block_size);
  if (pool.blocks > (int64_t{1} << 30)) {
    throw Error(fmt::format("generate: {} sequences x {} positions need {} blocks, too many",
                            num_seqs, opt.steps, pool.blocks));
  }
  const DType dtype = mode == CacheMode::kPaged ? opt.kv_dtype : DType::kF32;
  pool.block_bytes =
      kv_bytes_for_tokens(c.n_layers, c.n_kv_heads, c.head_size(), dtype, opt.block_size);
  // The hybrid paged pool (a layer pattern) holds as many blocks per group, pages of
  // layers_per_group layers (hybrid_backend.hpp): the bytes it allocates, for the bound.
  int64_t pool_bytes = pool.blocks * pool.block_bytes;
  if (mode == CacheMode::kPaged && !opt.layer_attention.empty()) {
    const KVCacheGroupLayout layout = group_layers(opt.layer_attention);
    pool_bytes = pool.blocks * static_cast<int64_t>(layout.groups.size()) *
                 kv_bytes_for_tokens(layout.layers_per_group, c.n_kv_heads, c.head_size(), dtype,
                                     opt.block_size);
  }
  pool.bytes = pool_bytes;
  if (mode != CacheMode::kContiguous && pool_bytes > kMaxPoolBytes) {
    throw Error(
        fmt::format("generate: the page pool would take {} bytes ({} sequences x {} "
                    "blocks of {} tokens), more than the {} allowed: use fewer prompts, "
                    "fewer steps or a smaller block size",
                    pool_bytes, num_seqs, pool.blocks / num_seqs, opt.block_size, kMaxPoolBytes));
  }
  return pool;
}

/// One forward step's input, rebuilt every step (the vectors keep their capacity).
struct StepBatch {
  std::vector<SeqId> seqs;
  std::vector<int64_t> n_new;
  std::vector<TokenId> tokens;
};

/// The next step's batch: every active sequence with what it feeds. Cached modes feed what is
/// not cached yet (the prompt, then the last token); none feeds everything forwarded so far plus
/// the new position.
void gather_step(const std::vector<SequenceOutput>& outs, const std::vector<uint8_t>& active,
                 bool caches, bool first, StepBatch& batch) {
  batch.seqs.clear();
  batch.n_new.clear();
  batch.tokens.clear();
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!active[i]) continue;
    const auto& s = outs[i];
    const int64_t from = caches ? s.positions_run : 0;
    const int64_t to = first ? static_cast<int64_t>(s.prompt_ids.size()) : s.positions_run + 1;
    batch.seqs.push_back(static_cast<SeqId>(i));
    batch.n_new.push_back(to - from);
    batch.tokens.insert(batch.tokens.end(), s.ids.begin() + from, s.ids.begin() + to);
  }
}

}  // namespace

const char* warm_pass_name(WarmPass w) {
  // The table's names are string literals: data() is NUL-terminated.
  const std::string_view name = ::pagedkv::detail::enum_name<WarmPass>(kWarmPassNames, w);
  return name.empty() ? "?" : name.data();
}

std::optional<WarmPass> parse_warm_pass(std::string_view name) {
  return ::pagedkv::detail::parse_enum<WarmPass>(kWarmPassNames, name);
}

double RunStats::tokens_per_s() const {
  return total_ms > 0 ? static_cast<double>(tokens_generated) / (total_ms / 1000.0) : 0.0;
}

double RunStats::wasted_share() const {
  if (contiguous_reservation_bytes <= 0) return 0.0;
  return 1.0 -
         static_cast<double>(kv_bytes_in_use) / static_cast<double>(contiguous_reservation_bytes);
}

Summary summarize(std::vector<double> values) {
  Summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  auto rank = [&](double q) {
    // Nearest rank: the smallest value with at least q of the sample at or below it.
    const auto r = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
    return values[std::clamp<size_t>(r, 1, values.size()) - 1];
  };
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  return s;
}

/// One pass of the batch on `backend`: every prompt registered (prefix hits and onboarding
/// counted), prefilled in one step, then decoded one token per step until each stops; the
/// outputs, timings and token counts go to `result`; every sequence is freed at the end.
void run_pass(LlamaModel& model, KVBackend& backend,
              const std::vector<std::vector<TokenId>>& prompts, const GenerateOptions& opt,
              bool record_logits, int64_t block_bytes, GenerateResult& result) {
  const auto num_seqs = static_cast<int64_t>(prompts.size());
  const int32_t vocab = model.config().vocab_size;
  RunStats& st = result.stats;
  result.seqs.resize(static_cast<size_t>(num_seqs));
  std::vector<Sampler> samplers;
  std::vector<uint8_t> active(static_cast<size_t>(num_seqs), 1);
  for (int64_t i = 0; i < num_seqs; ++i) {
    auto& s = result.seqs[static_cast<size_t>(i)];
    s.prompt_ids = prompts[static_cast<size_t>(i)];
    s.ids = s.prompt_ids;
    samplers.emplace_back(opt.seed, static_cast<uint64_t>(i));
  }
  const auto t_start = Clock::now();  // onboarding from the tiers is part of the first step
  for (int64_t i = 0; i < num_seqs; ++i) {
    auto& s = result.seqs[static_cast<size_t>(i)];
    s.positions_run = backend.add_prompt(i, s.prompt_ids);
    st.prompt_tokens += static_cast<int64_t>(s.prompt_ids.size());
    st.prompt_tokens_cached += s.positions_run;
  }

  StepBatch batch;
  for (bool first = true;; first = false) {
    gather_step(result.seqs, active, backend.caches(), first, batch);
    if (batch.seqs.empty()) break;

    const auto t_step = Clock::now();
    // Prompt rows are only needed to record them; later steps have one new position each.
    const bool all_rows = record_logits && first;
    const std::span<const float> logits =
        model.forward(backend, StepInput{batch.seqs, batch.n_new, batch.tokens}, all_rows);

    int64_t row = -1;
    for (size_t b = 0; b < batch.seqs.size(); ++b) {
      const auto i = static_cast<size_t>(batch.seqs[b]);
      auto& s = result.seqs[i];
      const int64_t new_positions = first ? batch.n_new[b] : 1;
      row += all_rows ? batch.n_new[b] : 1;
      const float* last = logits.data() + row * vocab;
      if (record_logits) {
        const float* from = all_rows ? last - (new_positions - 1) * vocab : last;
        s.logits.insert(s.logits.end(), from, last + vocab);
      }
      s.positions_run += new_positions;
      const TokenId next = samplers[i].sample(last, vocab, opt.temperature);
      if (next == kBos) {
        s.stopped_on_bos = true;
        active[i] = 0;
        continue;
      }
      s.ids.push_back(next);
      ++s.num_generated;
      ++st.tokens_generated;
      if (s.positions_run >= opt.steps) active[i] = 0;
    }
    const double ms = ms_since(t_step);
    if (first) {
      st.ttft_ms = ms_since(t_start);
    } else {
      st.tpot_ms.push_back(ms);
    }
  }
  st.total_ms = ms_since(t_start);

  st.kv_bytes_in_use = backend.bytes_in_use();
  st.kv_groups = backend.group_usage();
  for (int64_t i = 0; i < num_seqs; ++i) {
    st.kv_tokens_in_use += backend.num_tokens(i);
    st.kv_bytes_all_full += blocks_for_tokens(backend.num_tokens(i), opt.block_size) * block_bytes;
    backend.free_sequence(i);
  }
}

GenerateResult generate(LlamaModel& model, const std::vector<std::vector<TokenId>>& prompts,
                        CacheMode mode, const GenerateOptions& opt) {
  const LlamaConfig& c = model.config();
  check_request(c, prompts, opt);
  const auto num_seqs = static_cast<int64_t>(prompts.size());
  check_warm_pass(mode, opt);
  const PagePool pool = size_page_pool(c, num_seqs, mode, opt);
  KVBackendConfig backend_config =
      model.backend_config(opt.block_size, static_cast<int32_t>(pool.blocks));
  if (mode == CacheMode::kPaged) backend_config.kv_dtype = opt.kv_dtype;
  backend_config.kv_scale_headroom = opt.kv_scale_headroom;
  backend_config.layer_attention = opt.layer_attention;
  if (mode == CacheMode::kPaged) {
    if ((opt.prefix_caching || opt.tiering.enabled()) && opt.device != Device::kCpu) {
      throw Error(
          fmt::format("generate: prefix caching and tiers run with the cpu pool only, "
                      "not on {}",
                      device_name(opt.device)));
    }
    backend_config.prefix_caching = opt.prefix_caching;
    backend_config.tiering = opt.tiering;
  }
  std::unique_ptr<KVBackend> backend = make_kv_backend(mode, backend_config, opt.device);
  const ShadowKVBackend* shadow = nullptr;
  if (!opt.shadow_kv_dtypes.empty()) {
    if (mode != CacheMode::kPaged || opt.device != Device::kCpu) {
      throw Error(
          fmt::format("generate: shadow KV dtypes need the paged cache on the cpu, not {} on {}",
                      cache_mode_name(mode), device_name(opt.device)));
    }
    auto wrapped =
        std::make_unique<ShadowKVBackend>(std::move(backend), backend_config, opt.shadow_kv_dtypes);
    shadow = wrapped.get();
    backend = std::move(wrapped);
  }

  GenerateResult result;
  RunStats& st = result.stats;
  st.mode = mode;
  st.device = opt.device;
  st.contiguous_reservation_bytes =
      num_seqs *
      kv_bytes_for_tokens(c.n_layers, c.n_kv_heads, c.head_size(), DType::kF32, c.seq_len);
  if (mode != CacheMode::kContiguous) st.pool_bytes = pool.bytes;

  if (opt.warm_pass != WarmPass::kNone) {
    GenerateResult warm;  // the same prompts and samplers; only the cache it leaves matters
    run_pass(model, *backend, prompts, opt, /*record_logits=*/false, pool.block_bytes, warm);
    if (opt.warm_pass == WarmPass::kTiers) backend->drop_prefix_cache();
  }
  const TieringReport before = backend->tiering_report();
  run_pass(model, *backend, prompts, opt, opt.record_logits, pool.block_bytes, result);
  backend->finish();
  st.tiering = backend->tiering_report();
  // What the measured pass onboarded (the tiers' own counters cover both passes).
  st.tiering.onboarded_tokens -= before.onboarded_tokens;
  for (size_t t = 0; t < before.loaded_blocks.size(); ++t) {
    st.tiering.loaded_blocks[t] -= before.loaded_blocks[t];
  }
  if (shadow != nullptr) result.shadow_errors = shadow->errors();
  return result;
}

namespace {

/// |x - y| for the agreement check: a NaN on one side only is a difference, and an infinite
/// one, so no tolerance accepts it (std::max would silently drop a NaN).
double logit_diff(float x, float y) {
  if (x == y || (std::isnan(x) && std::isnan(y))) return 0.0;  // x == y: equal infinities too
  const double d = std::abs(static_cast<double>(x) - static_cast<double>(y));
  return std::isnan(d) ? std::numeric_limits<double>::infinity() : d;
}

/// Rows of a sequence's logits ([positions_run, vocab]): their vocabulary, 0 when the size is
/// not positions_run whole rows.
size_t logits_vocab(const SequenceOutput& s) {
  if (s.positions_run <= 0) return 0;
  const auto rows = static_cast<size_t>(s.positions_run);
  return s.logits.size() % rows == 0 ? s.logits.size() / rows : 0;
}

/// The lengths of sa and sb are explained by their ids (`same` = length of the common prefix):
/// equal ids need equal positions and stop reason; a strict prefix needs the shorter run to
/// have stopped on BOS where the other sampled a token; a divergence inside both leaves the
/// lengths after it free.
bool lengths_explained(const SequenceOutput& sa, const SequenceOutput& sb, size_t same) {
  const bool a_ends = same == sa.ids.size();
  const bool b_ends = same == sb.ids.size();
  if (a_ends && b_ends) {
    return sa.positions_run == sb.positions_run && sa.stopped_on_bos == sb.stopped_on_bos;
  }
  if (a_ends) return sa.stopped_on_bos;
  if (b_ends) return sb.stopped_on_bos;
  return true;
}

}  // namespace

Agreement compare_runs(const GenerateResult& a, const GenerateResult& b) {
  Agreement g;
  if (a.seqs.size() != b.seqs.size()) {
    g.same_tokens = false;
    g.same_lengths = false;
    g.diverge_seq = static_cast<int64_t>(std::min(a.seqs.size(), b.seqs.size()));
    g.diverge_index = 0;
    g.length_seq = g.diverge_seq;
    return g;
  }
  bool logits = true;
  double max_diff = 0;
  double sum_diff = 0;
  int64_t num_diffs = 0;
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    const auto& sa = a.seqs[i];
    const auto& sb = b.seqs[i];
    const size_t n = std::min(sa.ids.size(), sb.ids.size());
    size_t same = 0;  // length of the common prefix of ids
    while (same < n && sa.ids[same] == sb.ids[same]) ++same;
    const bool equal =
        same == sa.ids.size() && same == sb.ids.size() && sa.stopped_on_bos == sb.stopped_on_bos;
    if (!equal && g.same_tokens) {
      g.same_tokens = false;
      g.diverge_seq = static_cast<int64_t>(i);
      g.diverge_index = static_cast<int64_t>(same);
    }
    bool lengths_ok = lengths_explained(sa, sb, same);
    if (sa.logits.empty() || sb.logits.empty()) {
      logits = false;
    } else {
      const size_t vocab = logits_vocab(sa);
      if (vocab == 0 || vocab != logits_vocab(sb)) {
        lengths_ok = false;
      } else {
        // Row p depends on ids[0..p]: comparable while those agree.
        const auto rows =
            std::min<int64_t>({static_cast<int64_t>(same), sa.positions_run, sb.positions_run});
        for (size_t at = 0; at < static_cast<size_t>(rows) * vocab; ++at) {
          const double d = logit_diff(sa.logits[at], sb.logits[at]);
          max_diff = std::max(max_diff, d);
          sum_diff += d;
        }
        num_diffs += rows * static_cast<int64_t>(vocab);
        g.positions_compared += rows;
      }
    }
    if (!lengths_ok && g.same_lengths) {
      g.same_lengths = false;
      g.length_seq = static_cast<int64_t>(i);
    }
  }
  g.max_abs_logit_diff = logits ? max_diff : -1.0;
  g.mean_abs_logit_diff = !logits         ? -1.0
                          : num_diffs > 0 ? sum_diff / static_cast<double>(num_diffs)
                                          : 0.0;
  return g;
}

}  // namespace pagedkv::model
