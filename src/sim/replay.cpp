#include "sim/replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>

#include "core/check.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv::sim {

namespace {

// ---- strategies --------------------------------------------------------------------------------

constexpr std::array<int32_t, 5> kPagedBlockSizes = {1, 8, 16, 32, 128};
// vLLM's default block size, used for prefix caching in the default comparison.
constexpr int32_t kPrefixBlockSize = 16;

// ---- token synthesis ---------------------------------------------------------------------------

// splitmix64 finalizer (Steele et al., "Fast splittable pseudorandom number generators",
// OOPSLA 2014): a bijective mix, so distinct (key, position) pairs rarely collide.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

TokenId token_for(uint64_t key, int64_t position, int32_t vocab_size) {
  const uint64_t h = mix64(key ^ mix64(static_cast<uint64_t>(position)));
  return static_cast<TokenId>(3 + h % static_cast<uint64_t>(vocab_size - 3));
}

// ---- memory strategies -------------------------------------------------------------------------

enum class Admit { kOk, kLater, kNever };

/// Scheduler-side state of one waiting or running request. Only active requests exist.
/// Positions: `cached` are assigned to the request in the KV cache (the whole prefill target is
/// assigned at admission, as KVCacheManager::add_sequence does), `computed` of them have K/V
/// computed (prefill progress; prefix hits count as computed).
struct Active {
  size_t index = 0;  // trace index; also the manager's sequence id
  int64_t arrival_step = 0;
  int64_t prompt = 0;  // P
  int64_t output = 0;  // O
  int64_t target = 0;  // positions to prefill: P, or P + generated after a preemption
  int64_t cached = 0;
  int64_t computed = 0;
  int64_t generated = 0;  // output tokens so far
  int64_t reserved = 0;   // contiguous: positions reserved at admission
  bool admitted_once = false;
  std::vector<TokenId> tokens;  // prefix caching: ids of [0, target) while waiting
};

/// A memory strategy: admission, decode growth and release of requests' KV positions. Tracks
/// live positions (assigned to a token) and reserved positions (held for some request).
class Pool {
 public:
  virtual ~Pool() = default;
  /// Admission of the waiting request `r`; `alone` when nothing runs. On kOk the request holds
  /// r.target positions (r.cached = r.target) of which r.computed came from the prefix cache.
  virtual Admit admit(Active& r, bool alone) = 0;
  /// One decode position for a running request; false (nothing changed) when memory is short.
  virtual bool append_one(Active& r) = 0;
  /// Releases a finished request.
  virtual void release(Active& r) = 0;
  /// Recompute preemption: releases a running request that will be prefilled again.
  virtual void preempt(Active& r) { release(r); }
  [[nodiscard]] virtual int64_t live() const = 0;
  [[nodiscard]] virtual int64_t reserved() const = 0;
  virtual void finish(ReplayResult& /*res*/) const {}
};

class ContiguousPool final : public Pool {
 public:
  ContiguousPool(int64_t capacity_tokens, bool reserve_max, int64_t max_context)
      : capacity_(capacity_tokens), reserve_max_(reserve_max), max_context_(max_context) {}

  Admit admit(Active& r, bool /*alone*/) override {
    const int64_t need = reserve_max_ ? max_context_ : r.prompt + r.output;
    if (need > capacity_) return Admit::kNever;
    if (reserved_ + need > capacity_) return Admit::kLater;
    r.reserved = need;
    reserved_ += need;
    r.cached = r.target;
    live_ += r.target;
    return Admit::kOk;
  }
  // The reservation covers P + O positions, so a decode never runs out of memory.
  bool append_one(Active& /*r*/) override {
    ++live_;
    return true;
  }
  void release(Active& r) override {
    reserved_ -= r.reserved;
    live_ -= r.cached;
    r.reserved = 0;
  }
  int64_t live() const override { return live_; }
  int64_t reserved() const override { return reserved_; }

 private:
  int64_t capacity_;
  bool reserve_max_;
  int64_t max_context_;
  int64_t reserved_ = 0;
  int64_t live_ = 0;
};

/// Paged strategies: everything goes through KVCacheManager's own API (admission with its
/// watermark, add_sequence with the prompt, append, recompute preemption, prefix caching and
/// its LRU eviction of cached blocks).
class PagedPool final : public Pool {
 public:
  PagedPool(const Trace& trace, const ReplayConfig& config, int32_t num_blocks, int32_t block_size,
            bool prefix)
      : trace_(trace),
        vocab_size_(config.vocab_size),
        block_size_(block_size),
        prefix_(prefix),
        manager_(KVCacheManagerConfig{.num_blocks = num_blocks,
                                      .block_size = block_size,
                                      .enable_prefix_caching = prefix,
                                      .watermark = config.watermark,
                                      .max_model_len = config.max_context}) {}

  Admit admit(Active& r, bool /*alone*/) override {
    // A request that could not finish even alone (above the watermark) would be preempted by
    // its own growth forever: reject it up front. With this check a lone request always gets
    // kOk, so the scheduler cannot stall.
    const int64_t limit = manager_.num_total_blocks() - manager_.watermark_blocks();
    if (blocks_for_tokens(r.prompt + r.output, block_size_) > limit) return Admit::kNever;
    std::span<const TokenId> ids;
    if (prefix_) {
      if (r.tokens.empty()) r.tokens = synthesize_tokens(trace_, r.index, 0, r.target, vocab_size_);
      ids = r.tokens;
    } else {
      // Without prefix caching only the prompt length matters; share one zero buffer.
      if (static_cast<int64_t>(zeros_.size()) < r.target) zeros_.resize(r.target, 0);
      ids = std::span<const TokenId>(zeros_).first(static_cast<size_t>(r.target));
    }
    switch (manager_.can_add_sequence(ids)) {
      case Admission::kNever:
        return Admit::kNever;
      case Admission::kLater:
        return Admit::kLater;
      case Admission::kOk:
        break;
    }
    const std::optional<AddResult> added = manager_.add_sequence(seq(r), ids);
    PAGEDKV_CHECK(added.has_value(), "replay: add_sequence failed after can_add_sequence kOk");
    r.cached = r.target;
    r.computed = added->num_computed_tokens;
    r.tokens = {};
    waste_ += waste(r.cached);
    return Admit::kOk;
  }

  bool append_one(Active& r) override {
    std::optional<AppendResult> appended;
    if (prefix_) {
      // Generated tokens are recorded too, so a recomputed request can hit its own blocks.
      const std::vector<TokenId> id =
          synthesize_tokens(trace_, r.index, r.cached, r.cached + 1, vocab_size_);
      appended = manager_.append_tokens(seq(r), id);
    } else {
      appended = manager_.append_slots(seq(r), 1);
    }
    if (!appended) return false;
    waste_ += waste(r.cached + 1) - waste(r.cached);
    return true;
  }

  void release(Active& r) override {
    manager_.free_sequence(seq(r));
    forget(r);
  }
  void preempt(Active& r) override {
    (void)manager_.preempt(seq(r));
    forget(r);
  }

  // Physical positions holding a token: a block shared by several requests counts once.
  int64_t live() const override { return reserved() - waste_; }
  int64_t reserved() const override {
    return static_cast<int64_t>(manager_.allocator().num_used()) * block_size_;
  }
  void finish(ReplayResult& res) const override {
    const KVCacheStats st = manager_.stats();
    res.prefix_query_tokens = st.prefix_query_tokens;
    res.prefix_hit_tokens = st.prefix_hit_tokens;
    res.prefix_hit_rate = st.prefix_hit_rate();
    res.prefix_evictions = st.prefix_evictions;
    PAGEDKV_CHECK(st.preemptions == res.preemptions,
                  "replay: manager counted {} preemptions, scheduler {}", st.preemptions,
                  res.preemptions);
  }

 private:
  static SeqId seq(const Active& r) { return static_cast<SeqId>(r.index); }
  // Empty positions of the last, partially filled block. Only full blocks are ever shared
  // (prefix caching), so reserved - live == the sum of this over running requests.
  int64_t waste(int64_t tokens) const {
    return blocks_for_tokens(tokens, block_size_) * block_size_ - tokens;
  }
  void forget(Active& r) { waste_ -= waste(r.cached); }

  const Trace& trace_;
  int32_t vocab_size_;
  int32_t block_size_;
  bool prefix_;
  KVCacheManager manager_;
  std::vector<TokenId> zeros_;
  int64_t waste_ = 0;  // sum over running requests of waste(cached)
};

// ---- metrics -----------------------------------------------------------------------------------

/// Fixed-size time series: buckets of `width_` steps; when they overflow, neighbours merge and the
/// width doubles, so memory stays O(points) however long the replay runs.
class SeriesBuilder {
 public:
  explicit SeriesBuilder(int32_t points) : max_buckets_(2 * static_cast<size_t>(points)) {}

  /// Adds `count` identical steps starting at `step`.
  void add(int64_t step, int64_t count, double util, bool has_util, double running, double waiting,
           double reserved_fraction) {
    while (count > 0) {
      size_t b = static_cast<size_t>(step / width_);
      while (b >= max_buckets_) {
        merge();
        b = static_cast<size_t>(step / width_);
      }
      if (b >= buckets_.size()) buckets_.resize(b + 1);
      const int64_t in_bucket = std::min(count, (static_cast<int64_t>(b) + 1) * width_ - step);
      Bucket& k = buckets_[b];
      const auto w = static_cast<double>(in_bucket);
      if (has_util) {
        k.util_sum += util * w;
        k.util_steps += in_bucket;
      }
      k.running_sum += running * w;
      k.waiting_sum += waiting * w;
      k.reserved_sum += reserved_fraction * w;
      k.steps += in_bucket;
      step += in_bucket;
      count -= in_bucket;
    }
  }

  std::vector<SeriesPoint> points(double step_ms) const {
    std::vector<SeriesPoint> out;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const Bucket& k = buckets_[b];
      if (k.steps == 0) continue;
      const double n = static_cast<double>(k.steps);
      SeriesPoint p;
      p.time_s = (static_cast<double>(b) * width_ + n / 2.0) * step_ms / 1000.0;
      p.utilization = k.util_steps > 0 ? k.util_sum / static_cast<double>(k.util_steps) : -1.0;
      p.concurrency = k.running_sum / n;
      p.waiting = k.waiting_sum / n;
      p.reserved_fraction = k.reserved_sum / n;
      out.push_back(p);
    }
    return out;
  }

 private:
  struct Bucket {
    double util_sum = 0;
    int64_t util_steps = 0;
    double running_sum = 0;
    double waiting_sum = 0;
    double reserved_sum = 0;
    int64_t steps = 0;
  };
  void merge() {
    std::vector<Bucket> merged((buckets_.size() + 1) / 2);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      Bucket& m = merged[i / 2];
      const Bucket& k = buckets_[i];
      m.util_sum += k.util_sum;
      m.util_steps += k.util_steps;
      m.running_sum += k.running_sum;
      m.waiting_sum += k.waiting_sum;
      m.reserved_sum += k.reserved_sum;
      m.steps += k.steps;
    }
    buckets_ = std::move(merged);
    width_ *= 2;
  }

  size_t max_buckets_;
  int64_t width_ = 1;
  std::vector<Bucket> buckets_;
};

/// Time-weighted accumulators over steps.
class Accumulator {
 public:
  static constexpr int kBins = 10000;  // utilization histogram resolution 1e-4

  Accumulator(int64_t budget_tokens, int32_t points)
      : budget_tokens_(static_cast<double>(std::max<int64_t>(budget_tokens, 1))),
        hist_(kBins + 1, 0),
        series_(points) {}

  void sample(int64_t step, int64_t count, int64_t running, int64_t waiting, int64_t live,
              int64_t reserved) {
    PAGEDKV_CHECK(0 <= live && live <= reserved,
                  "replay: internal error at step {}: {} live positions but {} reserved", step,
                  live, reserved);
    const bool has_util = reserved > 0;
    const double util = has_util ? static_cast<double>(live) / static_cast<double>(reserved) : 0;
    if (has_util) {
      util_sum_ += util * static_cast<double>(count);
      util_steps_ += count;
      hist_[static_cast<size_t>(std::lround(util * kBins))] += count;
    }
    reserved_sum_ += static_cast<double>(reserved) * static_cast<double>(count);
    waste_sum_ += static_cast<double>(reserved - live) * static_cast<double>(count);
    running_sum_ += static_cast<double>(running) * static_cast<double>(count);
    peak_ = std::max(peak_, running);
    steps_ += count;
    series_.add(step, count, util, has_util, static_cast<double>(running),
                static_cast<double>(waiting), static_cast<double>(reserved) / budget_tokens_);
  }

  void finish(ReplayResult& r, int64_t bytes_per_token, double step_ms) const {
    const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
    r.util_mean = util_steps_ > 0 ? util_sum_ / static_cast<double>(util_steps_) : 0.0;
    r.frag_mean = util_steps_ > 0 ? 1.0 - r.util_mean : 0.0;
    r.util_p5 = 0.0;
    if (util_steps_ > 0) {
      // Nearest rank: the value at rank ceil(0.05 n).
      const auto rank = static_cast<int64_t>(std::ceil(0.05 * static_cast<double>(util_steps_)));
      int64_t seen = 0;
      for (int b = 0; b <= kBins; ++b) {
        seen += hist_[b];
        if (seen >= rank) {
          r.util_p5 = static_cast<double>(b) / kBins;
          break;
        }
      }
    }
    r.reserved_mean_bytes = reserved_sum_ / steps * static_cast<double>(bytes_per_token);
    r.waste_mean_bytes = waste_sum_ / steps * static_cast<double>(bytes_per_token);
    r.mean_concurrency = running_sum_ / steps;
    r.peak_concurrency = static_cast<int32_t>(peak_);
    r.series = series_.points(step_ms);
  }

 private:
  double budget_tokens_;
  double util_sum_ = 0;
  int64_t util_steps_ = 0;
  std::vector<int64_t> hist_;
  double reserved_sum_ = 0;
  double waste_sum_ = 0;
  double running_sum_ = 0;
  int64_t peak_ = 0;
  int64_t steps_ = 0;
  SeriesBuilder series_;
};

}  // namespace

// ---- public ------------------------------------------------------------------------------------

std::string Strategy::name() const {
  switch (kind) {
    case StrategyKind::kContiguousMax:
      return "contiguous-max";
    case StrategyKind::kContiguousExact:
      return "contiguous-exact";
    case StrategyKind::kPaged:
      return fmt::format("paged-{}", block_size);
    case StrategyKind::kPagedPrefix:
      return fmt::format("prefix-{}", block_size);
  }
  return "?";
}

std::vector<Strategy> default_strategies() {
  std::vector<Strategy> out = {{StrategyKind::kContiguousMax, 0},
                               {StrategyKind::kContiguousExact, 0}};
  for (int32_t bs : kPagedBlockSizes) out.push_back({StrategyKind::kPaged, bs});
  out.push_back({StrategyKind::kPagedPrefix, kPrefixBlockSize});
  return out;
}

Strategy parse_strategy(std::string_view text) {
  if (text == "contiguous-max") return {StrategyKind::kContiguousMax, 0};
  if (text == "contiguous-exact") return {StrategyKind::kContiguousExact, 0};
  for (const auto& [prefix, kind] :
       {std::pair{std::string_view("paged-"), StrategyKind::kPaged},
        std::pair{std::string_view("prefix-"), StrategyKind::kPagedPrefix}}) {
    if (!text.starts_with(prefix)) continue;
    const std::string_view digits = text.substr(prefix.size());
    int32_t bs = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), bs);
    if (ec == std::errc() && end == digits.data() + digits.size() && bs >= 1 && bs <= 65536) {
      return {kind, bs};
    }
  }
  detail::fail(
      "unknown strategy '{}' (expected contiguous-max, contiguous-exact, paged-<block "
      "size>, prefix-<block size>; block size 1..65536)",
      text);
}

void validate(const ReplayConfig& c) {
  PAGEDKV_CHECK(c.kv_bytes_per_token >= 1, "replay: KV bytes per token must be >= 1, got {}",
                c.kv_bytes_per_token);
  PAGEDKV_CHECK(c.kv_memory_bytes >= c.kv_bytes_per_token,
                "replay: KV memory {} bytes holds no token (one token takes {} bytes)",
                c.kv_memory_bytes, c.kv_bytes_per_token);
  PAGEDKV_CHECK(c.max_context >= 1, "replay: max context must be >= 1, got {}", c.max_context);
  PAGEDKV_CHECK(c.step_ms > 0 && std::isfinite(c.step_ms), "replay: step must be > 0 ms, got {}",
                c.step_ms);
  PAGEDKV_CHECK(c.max_batch_tokens >= 1, "replay: max batch tokens must be >= 1, got {}",
                c.max_batch_tokens);
  PAGEDKV_CHECK(c.max_seqs >= 1, "replay: max seqs must be >= 1, got {}", c.max_seqs);
  PAGEDKV_CHECK(c.watermark >= 0 && c.watermark < 1, "replay: watermark must be in [0, 1), got {}",
                c.watermark);
  PAGEDKV_CHECK(c.series_points >= 2, "replay: series points must be >= 2, got {}",
                c.series_points);
  PAGEDKV_CHECK(c.vocab_size >= 4, "replay: vocab size must be >= 4, got {}", c.vocab_size);
}

std::vector<TokenId> synthesize_tokens(const Trace& trace, size_t index, int64_t begin, int64_t end,
                                       int32_t vocab_size) {
  PAGEDKV_CHECK(index < trace.requests.size(), "synthesize_tokens: request {} out of range ({})",
                index, trace.requests.size());
  PAGEDKV_CHECK(0 <= begin && begin <= end, "synthesize_tokens: bad range [{}, {})", begin, end);
  PAGEDKV_CHECK(vocab_size >= 4, "synthesize_tokens: vocab size must be >= 4, got {}", vocab_size);
  const TraceRequest& r = trace.requests[index];
  const std::span<const int64_t> hashes = trace.hashes(r);
  const int64_t hb = trace.hash_block_tokens;
  // Keys of unique content have the top bit set; hash-id keys never do (ids are < 2^63).
  const uint64_t own_key = (uint64_t{1} << 63) | static_cast<uint64_t>(index);
  std::vector<TokenId> out;
  out.reserve(static_cast<size_t>(end - begin));
  for (int64_t pos = begin; pos < end; ++pos) {
    const int64_t block = hb > 0 ? pos / hb : 0;
    if (hb > 0 && pos < r.prompt_tokens && block < static_cast<int64_t>(hashes.size())) {
      out.push_back(token_for(static_cast<uint64_t>(hashes[block]), pos % hb, vocab_size));
    } else {
      out.push_back(token_for(own_key, pos, vocab_size));
    }
  }
  return out;
}

ReplayResult replay(const Trace& trace, const ReplayConfig& config, const Strategy& strategy,
                    const ProgressFn& progress) {
  validate(config);
  const auto t0 = std::chrono::steady_clock::now();

  ReplayResult res;
  res.strategy = strategy.name();
  res.requests = static_cast<int64_t>(trace.requests.size());
  const int64_t budget_tokens = config.kv_memory_bytes / config.kv_bytes_per_token;

  std::unique_ptr<Pool> pool;
  switch (strategy.kind) {
    case StrategyKind::kContiguousMax:
    case StrategyKind::kContiguousExact:
      res.capacity_tokens = budget_tokens;
      pool = std::make_unique<ContiguousPool>(
          budget_tokens, strategy.kind == StrategyKind::kContiguousMax, config.max_context);
      break;
    case StrategyKind::kPaged:
    case StrategyKind::kPagedPrefix: {
      PAGEDKV_CHECK(strategy.block_size >= 1, "replay: block size must be >= 1, got {}",
                    strategy.block_size);
      const int64_t blocks = std::min<int64_t>(budget_tokens / strategy.block_size, 1 << 30);
      PAGEDKV_CHECK(blocks >= 1,
                    "replay: KV memory {} bytes holds no block of {} tokens ({} bytes each)",
                    config.kv_memory_bytes, strategy.block_size,
                    config.kv_bytes_per_token * strategy.block_size);
      res.block_size = strategy.block_size;
      res.num_blocks = static_cast<int32_t>(blocks);
      res.capacity_tokens = blocks * strategy.block_size;
      pool = std::make_unique<PagedPool>(trace, config, res.num_blocks, strategy.block_size,
                                         strategy.kind == StrategyKind::kPagedPrefix);
      break;
    }
  }

  const std::vector<TraceRequest>& reqs = trace.requests;
  const size_t n_req = reqs.size();
  auto arrival_step = [&](size_t i) {
    return static_cast<int64_t>(std::floor(reqs[i].arrival_ms / config.step_ms));
  };

  Accumulator acc(res.capacity_tokens, config.series_points);
  std::deque<Active> waiting;
  std::vector<Active> running;
  std::vector<int64_t> delays;
  size_t cursor = 0;
  int64_t step = 0;
  int64_t done = 0;
  int64_t next_report = 0;
  const int64_t report_every = std::max<int64_t>(1, static_cast<int64_t>(n_req) / 200);

  // Recompute preemption of the newest running request (vLLM's victim choice).
  auto preempt_newest = [&] {
    Active v = std::move(running.back());
    running.pop_back();
    pool->preempt(v);
    ++res.preemptions;
    res.recomputed_tokens += v.computed;
    v.target = v.prompt + v.generated;
    v.cached = 0;
    v.computed = 0;
    waiting.push_front(std::move(v));
  };

  while (cursor < n_req || !waiting.empty() || !running.empty()) {
    if (running.empty() && waiting.empty()) {
      const int64_t next = arrival_step(cursor);
      if (next > step) {
        acc.sample(step, next - step, 0, 0, 0, 0);
        step = next;
      }
    }
    // 1. Arrivals.
    while (cursor < n_req && arrival_step(cursor) <= step) {
      const TraceRequest& q = reqs[cursor];
      if (q.prompt_tokens + q.output_tokens > config.max_context) {
        ++res.rejected_too_long;
        ++done;
      } else {
        Active a;
        a.index = cursor;
        a.arrival_step = arrival_step(cursor);
        a.prompt = q.prompt_tokens;
        a.output = q.output_tokens;
        a.target = q.prompt_tokens;
        waiting.push_back(std::move(a));
      }
      ++cursor;
    }

    int64_t budget = config.max_batch_tokens;
    // 2. Running requests, oldest first: the next prefill chunk or one decode token.
    for (size_t i = 0; i < running.size() && budget > 0; ++i) {
      if (running[i].computed < running[i].target) {
        const int64_t n = std::min(running[i].target - running[i].computed, budget);
        running[i].computed += n;
        budget -= n;
        res.processed_tokens += n;
        continue;
      }
      bool self_preempted = false;
      while (!pool->append_one(running[i])) {
        self_preempted = i + 1 == running.size();
        preempt_newest();
        if (self_preempted) break;
      }
      if (self_preempted) break;
      Active& r = running[i];
      ++r.cached;
      ++r.computed;
      ++r.generated;
      --budget;
      ++res.processed_tokens;
      ++res.generated_tokens;
    }

    // 3. Admission, first come first served.
    while (!waiting.empty() && static_cast<int32_t>(running.size()) < config.max_seqs &&
           budget > 0) {
      Active& r = waiting.front();
      const Admit a = pool->admit(r, running.empty());
      if (a == Admit::kLater) break;
      if (a == Admit::kNever) {
        ++res.rejected_too_large;
        ++done;
        waiting.pop_front();
        continue;
      }
      if (!r.admitted_once) {
        r.admitted_once = true;
        delays.push_back(step - r.arrival_step);
        res.prompt_tokens += r.prompt;
      }
      const int64_t n = std::min(r.target - r.computed, budget);
      r.computed += n;
      budget -= n;
      res.processed_tokens += n;
      running.push_back(std::move(r));
      waiting.pop_front();
    }
    PAGEDKV_CHECK(!running.empty() || waiting.empty(),
                  "replay: internal error: nothing runs at step {} but {} requests wait", step,
                  waiting.size());

    // 4. Sample, then retire finished requests.
    acc.sample(step, 1, static_cast<int64_t>(running.size()), static_cast<int64_t>(waiting.size()),
               pool->live(), pool->reserved());
    std::erase_if(running, [&](Active& r) {
      if (r.computed < r.target || r.generated < r.output) return false;
      pool->release(r);
      ++res.completed;
      ++done;
      return true;
    });
    ++step;
    if (progress && done >= next_report) {
      progress(done, static_cast<int64_t>(n_req));
      next_report = done + report_every;
    }
  }
  if (progress) progress(done, static_cast<int64_t>(n_req));
  pool->finish(res);

  res.steps = step;
  acc.finish(res, config.kv_bytes_per_token, config.step_ms);
  const double steps = static_cast<double>(std::max<int64_t>(step, 1));
  res.tokens_per_step = static_cast<double>(res.processed_tokens) / steps;
  res.generated_per_step = static_cast<double>(res.generated_tokens) / steps;
  if (!delays.empty()) {
    double sum = 0;
    for (int64_t d : delays) sum += static_cast<double>(d);
    res.queue_mean_steps = sum / static_cast<double>(delays.size());
    const auto rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(delays.size())));
    std::nth_element(delays.begin(), delays.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                     delays.end());
    res.queue_p99_steps = static_cast<double>(delays[rank - 1]);
  }
  res.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace pagedkv::sim
