#include "sim/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>

#include "core/check.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "sim/hybrid_layout.hpp"
#include "sim/replay_pools.hpp"

namespace pagedkv::sim {

namespace {

using replay_detail::Active;
using replay_detail::Admit;
using replay_detail::Pool;

// ---- metrics -----------------------------------------------------------------------------------

/// Fixed-size time series: buckets of `width_` steps; when they overflow, neighbours merge and the
/// width doubles, so memory stays O(points) however long the replay runs.
class SeriesBuilder {
 public:
  explicit SeriesBuilder(int32_t points) : max_buckets_(2 * static_cast<size_t>(points)) {}

  /// Adds `length` time units (of step_ms: a constant-model step is one) of identical state
  /// starting at time unit `start`.
  void add(double start, double length, double util, bool has_util, double running, double waiting,
           double reserved_fraction);

  std::vector<SeriesPoint> points(double unit_ms) const {
    std::vector<SeriesPoint> out;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const Bucket& k = buckets_[b];
      if (k.steps <= 0) continue;
      const double n = k.steps;
      SeriesPoint p;
      p.time_s = (static_cast<double>(b) * width_ + n / 2.0) * unit_ms / 1000.0;
      p.utilization = k.util_steps > 0 ? k.util_sum / k.util_steps : -1.0;
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
    double util_steps = 0;  // time units with reservations
    double running_sum = 0;
    double waiting_sum = 0;
    double reserved_sum = 0;
    double steps = 0;  // time units covered
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
  double width_ = 1;  // time units per bucket
  std::vector<Bucket> buckets_;
};

void SeriesBuilder::add(double start, double length, double util, bool has_util, double running,
                        double waiting, double reserved_fraction) {
  // Walks the buckets the interval covers by index, so rounding cannot stall the walk.
  auto b = static_cast<size_t>(std::max(0.0, start / width_));
  while (length > 0) {
    while (b >= max_buckets_) {
      merge();
      b /= 2;
    }
    if (b >= buckets_.size()) buckets_.resize(b + 1);
    const double end = (static_cast<double>(b) + 1) * width_;
    const double w = std::min(length, std::max(0.0, end - start));
    Bucket& k = buckets_[b];
    if (has_util) {
      k.util_sum += util * w;
      k.util_steps += w;
    }
    k.running_sum += running * w;
    k.waiting_sum += waiting * w;
    k.reserved_sum += reserved_fraction * w;
    k.steps += w;
    start += w;
    length -= w;
    ++b;
  }
}

/// Time-weighted accumulators over steps.
class Accumulator {
 public:
  static constexpr int kBins = 10000;  // utilization histogram resolution 1e-4

  Accumulator(int64_t budget_tokens, int32_t points)
      : budget_tokens_(static_cast<double>(std::max<int64_t>(budget_tokens, 1))),
        hist_(kBins + 1, 0.0),
        series_(points) {}

  /// Samples `count` time units (of step_ms) starting at unit `start` in one state.
  void sample(double start, double count, int64_t running, int64_t waiting, int64_t live,
              int64_t reserved) {
    PAGEDKV_CHECK(0 <= live && live <= reserved,
                  "replay: internal error at time unit {}: {} live positions but {} reserved",
                  start, live, reserved);
    const bool has_util = reserved > 0;
    const double util = has_util ? static_cast<double>(live) / static_cast<double>(reserved) : 0;
    if (has_util) {
      util_sum_ += util * count;
      util_steps_ += count;
      hist_[static_cast<size_t>(std::lround(util * kBins))] += count;
    }
    reserved_sum_ += static_cast<double>(reserved) * count;
    waste_sum_ += static_cast<double>(reserved - live) * count;
    running_sum_ += static_cast<double>(running) * count;
    peak_ = std::max(peak_, running);
    steps_ += count;
    series_.add(start, count, util, has_util, static_cast<double>(running),
                static_cast<double>(waiting), static_cast<double>(reserved) / budget_tokens_);
  }

  /// Samples the need ratio (needed / reserved bytes) of `count` time units with reservations.
  void sample_need(double ratio, double count) {
    need_sum_ += ratio * count;
    need_steps_ += count;
  }

  /// `bytes_per_token`: bytes of one unit of the sampled positions (Pool::unit_bytes); `need`:
  /// whether need ratios were sampled (need_util_mean stays -1 otherwise).
  void finish(ReplayResult& r, int64_t bytes_per_token, double step_ms, bool need) const {
    const double steps = steps_ > 0 ? steps_ : 1.0;
    if (need) r.need_util_mean = need_steps_ > 0 ? need_sum_ / need_steps_ : 0.0;
    r.util_mean = util_steps_ > 0 ? util_sum_ / util_steps_ : 0.0;
    r.frag_mean = util_steps_ > 0 ? 1.0 - r.util_mean : 0.0;
    r.util_p5 = 0.0;
    if (util_steps_ > 0) {
      // Nearest rank, time-weighted: the first bin where the covered time reaches 5% (with
      // whole steps, the value at rank ceil(0.05 n)).
      const double rank = 0.05 * util_steps_;
      double seen = 0;
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
  double util_steps_ = 0;
  std::vector<double> hist_;
  double reserved_sum_ = 0;
  double waste_sum_ = 0;
  double running_sum_ = 0;
  int64_t peak_ = 0;
  double steps_ = 0;
  double need_sum_ = 0;
  double need_steps_ = 0;
  SeriesBuilder series_;
};

// ---- the scheduler
// ---------------------------------------------------------------------------------

/// One replay of a trace under one strategy: the queues, the clock and the counters. Each
/// phase of a step (replay.hpp, steps 1-4) is one member function.
class Scheduler {
 public:
  Scheduler(const Trace& trace, const ReplayConfig& config, const Strategy& strategy,
            ReplayResult& res)
      : reqs_(trace.requests),
        config_(config),
        res_(res),
        pool_(replay_detail::make_pool(trace, config, strategy, res)),
        acc_(pool_->capacity_units(res), config.series_points),
        // Needed bytes per request are defined where no block is shared (see ReplayResult).
        need_(config.model.has_value() && strategy.kind != StrategyKind::kPagedPrefix &&
              config.group_width == 1),
        report_every_(std::max<int64_t>(1, static_cast<int64_t>(reqs_.size()) / 200)) {}

  /// Steps until every request has finished or been rejected.
  void run(const ProgressFn& progress) {
    const auto total = static_cast<int64_t>(reqs_.size());
    int64_t next_report = 0;
    while (cursor_ < reqs_.size() || !waiting_.empty() || !running_.empty()) {
      skip_idle();
      take_arrivals();
      int64_t budget = config_.max_batch_tokens;
      work_ = StepWork{};
      step_swap_ms_ = 0;
      run_running(budget);
      admit_waiting(budget);
      step_ms_ = step_duration_ms();
      // The step's forward pass: what each running request computed now holds K/V, and only
      // now may a later prompt share it (a request admitted in this same step may not).
      // (A request whose tier load ends after this step publishes once it has.)
      for (const Active& r : running_) {
        if (r.ready_ms <= now_ms_ + step_ms_) pool_->commit(r);
      }
      PAGEDKV_CHECK(!running_.empty() || waiting_.empty(),
                    "replay: internal error: nothing runs at step {} but {} requests wait", step_,
                    waiting_.size());
      sample_and_retire();
      advance_clock();
      if (progress && done_ >= next_report) {
        progress(done_, total);
        next_report = done_ + report_every_;
      }
    }
    if (progress) progress(done_, total);
  }

  /// The whole-run results: pool statistics, means over steps, queueing delay.
  void finish() {
    pool_->finish(res_);
    res_.steps = step_;
    res_.swap_seconds = swap_ms_total_ / 1000.0;
    acc_.finish(res_, pool_->unit_bytes(config_), config_.step_ms, need_);
    const double steps = static_cast<double>(std::max<int64_t>(step_, 1));
    res_.tokens_per_step = static_cast<double>(res_.processed_tokens) / steps;
    res_.generated_per_step = static_cast<double>(res_.generated_tokens) / steps;
    if (!delays_.empty()) {
      double sum = 0;
      for (int64_t d : delays_) sum += static_cast<double>(d);
      res_.queue_mean_steps = sum / static_cast<double>(delays_.size());
      const auto rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(delays_.size())));
      std::nth_element(delays_.begin(), delays_.begin() + static_cast<std::ptrdiff_t>(rank - 1),
                       delays_.end());
      res_.queue_p99_steps = static_cast<double>(delays_[rank - 1]);
    }
    res_.ttft_p50_ms = nearest_rank(ttft_, 0.50);
    res_.ttft_p99_ms = nearest_rank(ttft_, 0.99);
    res_.tpot_p50_ms = nearest_rank(tpot_, 0.50);
    res_.tpot_p99_ms = nearest_rank(tpot_, 0.99);
    res_.normalized_latency_s = norm_n_ > 0 ? norm_sum_ / static_cast<double>(norm_n_) : 0.0;
    const double seconds = now_ms_ / 1000.0;
    res_.mean_step_ms = busy_steps_ > 0 ? busy_ms_ / static_cast<double>(busy_steps_) : 0.0;
    if (seconds > 0) {
      res_.throughput_rps = static_cast<double>(res_.completed) / seconds;
      res_.output_tokens_per_s = static_cast<double>(res_.generated_tokens) / seconds;
    }
  }

  /// Nearest-rank percentile q of v (reordered), 0 when empty.
  static double nearest_rank(std::vector<double>& v, double q) {
    if (v.empty()) return 0.0;
    const auto rank =
        std::max<size_t>(1, static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank - 1), v.end());
    return v[rank - 1];
  }

 private:
  double arrival_ms(size_t i) const { return reqs_[i].arrival_ms / config_.rate_scale; }
  bool constant_model() const { return !config_.roofline.has_value(); }
  /// Constant model: the step (of the grid shifted by the swap time so far) in which request i
  /// arrives; it is visible from that step on, as in replay.hpp.
  int64_t arrival_step(size_t i) const {
    return static_cast<int64_t>(std::floor((arrival_ms(i) - extra_ms_) / config_.step_ms));
  }
  /// Whether request i has arrived for the step starting now: the constant model sees the
  /// arrivals of its whole step (its length is known in advance); the roofline model only those
  /// up to the step's start (its length depends on the batch it forms).
  bool arrived(size_t i) const {
    return constant_model() ? arrival_step(i) <= step_ : arrival_ms(i) <= now_ms_;
  }
  /// The current step's length: constant or roofline, plus its swap copies.
  double step_duration_ms() const {
    const double compute =
        constant_model() ? config_.step_ms : step_time(*config_.roofline, work_).total_ms;
    return compute + step_swap_ms_;
  }
  /// Moves the clock past the step just run.
  void advance_clock() {
    ++step_;
    ++busy_steps_;
    busy_ms_ += step_ms_;
    extra_ms_ += step_swap_ms_;
    now_ms_ = constant_model() ? static_cast<double>(step_) * config_.step_ms + extra_ms_
                               : now_ms_ + step_ms_;
  }
  /// Host-link copy time of `positions` K/V positions, ms.
  double swap_ms(int64_t positions) const {
    return 1000.0 * static_cast<double>(positions) *
           static_cast<double>(config_.kv_bytes_per_token) / config_.host_link_bytes_per_s;
  }
  /// Time units (of step_ms): ms / step_ms; the constant model counts whole steps exactly.
  double unit(double ms) const { return ms / config_.step_ms; }
  double now_unit() const {
    return constant_model() ? static_cast<double>(step_) + unit(extra_ms_) : unit(now_ms_);
  }

  /// The latency of a finished request (this step): TTFT, TPOT, normalized latency.
  void record_latency(const Active& r) {
    const double e2e = now_ms_ + step_ms_ - arrival_ms(r.index);
    const double ttft = r.first_token_ms - arrival_ms(r.index);
    ttft_.push_back(ttft);
    if (r.output >= 2) tpot_.push_back((e2e - ttft) / static_cast<double>(r.output - 1));
    if (r.output >= 1) {
      norm_sum_ += e2e / static_cast<double>(r.output) / 1000.0;
      ++norm_n_;
    }
  }

  /// Nothing runs or waits: jump to the next arrival, sampling the idle steps in O(1).
  void skip_idle() {
    if (!running_.empty() || !waiting_.empty()) return;
    if (constant_model()) {
      const int64_t next = arrival_step(cursor_);
      if (next > step_) {
        acc_.sample(now_unit(), static_cast<double>(next - step_), 0, 0, 0, 0);
        step_ = next;
        now_ms_ = static_cast<double>(step_) * config_.step_ms + extra_ms_;
      }
      return;
    }
    const double next = arrival_ms(cursor_);
    if (next > now_ms_) {
      acc_.sample(now_unit(), unit(next - now_ms_), 0, 0, 0, 0);
      now_ms_ = next;
    }
  }

  /// 1. Arrivals join the waiting queue; a request longer than max_context is rejected.
  void take_arrivals() {
    while (cursor_ < reqs_.size() && arrived(cursor_)) {
      const TraceRequest& q = reqs_[cursor_];
      if (q.prompt_tokens + q.output_tokens > config_.max_context) {
        ++res_.rejected_too_long;
        ++done_;
      } else {
        Active a;
        a.index = cursor_;
        a.arrival_step = step_;
        a.prompt = q.prompt_tokens;
        a.output = q.output_tokens;
        a.target = q.prompt_tokens;
        waiting_.push_back(std::move(a));
      }
      ++cursor_;
    }
  }

  /// 2. Running requests, oldest first: the next prefill chunk or one decode token.
  void run_running(int64_t& budget) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      if (loading(running_[i])) continue;
      if (running_[i].computed < running_[i].target) {
        const int64_t n = std::min(running_[i].target - running_[i].computed, budget);
        work_.add(running_[i].computed, n);
        running_[i].computed += n;
        budget -= n;
        res_.processed_tokens += n;
        continue;
      }
      // A group decodes all its sequences in one step, within the token budget.
      if (budget < config_.group_width) break;
      bool self_preempted = false;
      while (!pool_->append_one(running_[i])) {
        self_preempted = i + 1 == running_.size();
        preempt_newest();
        if (self_preempted) break;
      }
      if (self_preempted) return;
      Active& r = running_[i];
      for (int32_t k = 0; k < r.members; ++k) work_.add(r.computed, 1);
      ++r.cached;
      ++r.computed;
      ++r.generated;
      budget -= r.members;
      res_.processed_tokens += r.members;
      res_.generated_tokens += r.members;
    }
  }

  /// Preemption of the newest running request (vLLM's victim choice): recompute discards its
  /// K/V; swap copies its positions to host memory over the host link (this step pays the time).
  void preempt_newest() {
    Active v = std::move(running_.back());
    running_.pop_back();
    pool_->preempt(v);
    ++res_.preemptions;
    if (config_.preemption == Preemption::kSwap) {
      v.swapped = true;
      res_.swapped_tokens += v.cached;
      charge_swap(v.cached);
    } else {
      res_.recomputed_tokens += v.computed;
    }
    v.target = v.prompt + v.generated;
    v.ready_ms = 0;
    v.members = 1;  // a group comes back as one sequence and forks again at its next decode
    v.cached = 0;
    v.computed = 0;
    waiting_.push_front(std::move(v));
  }

  /// 3. Admission, first come first served, with the first prefill chunk.
  void admit_waiting(int64_t& budget) {
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < config_.max_seqs &&
           budget > 0) {
      Active& r = waiting_.front();
      const Admit a = pool_->admit(r, running_.empty());
      if (a == Admit::kLater) break;
      if (a == Admit::kNever) {
        ++res_.rejected_too_large;
        ++done_;
        waiting_.pop_front();
        continue;
      }
      if (!r.admitted_once) {
        r.admitted_once = true;
        delays_.push_back(step_ - r.arrival_step);
        res_.prompt_tokens += r.prompt;
      }
      if (r.load_ms > 0) {
        // Blocks onboarded from the tiers load asynchronously (vLLM's KV connector: the request
        // waits for its KV while the batch runs on): loads queue on one load link, and the
        // request computes from the first step after its load completed.
        load_free_ms_ = std::max(load_free_ms_, now_ms_) + r.load_ms;
        r.ready_ms = load_free_ms_;
        r.load_ms = 0;
      }
      if (r.swapped) {  // swap-in: what the prefix cache did not supply comes back from host
        r.swapped = false;
        charge_swap(r.target - r.computed);
        r.computed = r.target;
      }
      const int64_t n = loading(r) ? 0 : std::min(r.target - r.computed, budget);
      work_.add(r.computed, n);
      r.computed += n;
      budget -= n;
      res_.processed_tokens += n;
      running_.push_back(std::move(r));
      waiting_.pop_front();
    }
  }

  /// Needed bytes of the running requests (each real layer what its attention sees) / the
  /// bytes the pool reserves (ReplayResult::need_util_mean).
  double need_ratio() const {
    const ModelPreset& m = *config_.model;
    int64_t needed = 0;
    for (const Active& r : running_) needed += needed_layer_positions(m, r.cached);
    const int64_t layer_bytes = kv_bytes_for_tokens(1, m.num_kv_heads, m.head_dim, m.dtype, 1);
    return static_cast<double>(needed) * static_cast<double>(layer_bytes) /
           (static_cast<double>(pool_->reserved()) *
            static_cast<double>(pool_->unit_bytes(config_)));
  }

  /// Whether r's blocks from the tiers are still loading at the start of this step.
  bool loading(const Active& r) const { return r.ready_ms > now_ms_; }

  void charge_swap(int64_t positions) {
    const double ms = swap_ms(positions);
    step_swap_ms_ += ms;
    swap_ms_total_ += ms;
  }

  /// 4. Sample the step, then retire finished requests.
  void sample_and_retire() {
    const double length = constant_model() ? 1.0 + unit(step_swap_ms_) : unit(step_ms_);
    acc_.sample(now_unit(), length, static_cast<int64_t>(running_.size()),
                static_cast<int64_t>(waiting_.size()), pool_->live(), pool_->reserved());
    if (need_ && pool_->reserved() > 0) acc_.sample_need(need_ratio(), length);
    for (Active& r : running_) {
      const bool delivered = r.output > 0 ? r.generated >= 1 : r.computed >= r.target;
      if (r.first_token_ms < 0 && delivered) r.first_token_ms = now_ms_ + step_ms_;
    }
    std::erase_if(running_, [&](Active& r) {
      if (r.computed < r.target || r.generated < r.output) return false;
      record_latency(r);
      pool_->release(r);
      ++res_.completed;
      ++done_;
      return true;
    });
  }

  const std::vector<TraceRequest>& reqs_;
  const ReplayConfig& config_;
  ReplayResult& res_;
  std::unique_ptr<Pool> pool_;
  Accumulator acc_;
  const bool need_;  ///< need_util_mean is sampled
  const int64_t report_every_;
  std::deque<Active> waiting_;
  std::vector<Active> running_;
  std::vector<int64_t> delays_;  ///< first admission step - arrival step, per admitted request
  std::vector<double> ttft_;     ///< ms, per completed request
  std::vector<double> tpot_;     ///< ms, per completed request with output >= 2
  double norm_sum_ = 0;          ///< s per token, summed over completed requests with output >= 1
  int64_t norm_n_ = 0;
  size_t cursor_ = 0;        ///< next trace request to arrive
  int64_t step_ = 0;         ///< steps so far (constant model: including idle grid steps)
  double now_ms_ = 0;        ///< start of the current step, simulated ms
  double step_ms_ = 0;       ///< length of the current step, ms
  double extra_ms_ = 0;      ///< swap time so far (constant model: shifts the step grid), ms
  double load_free_ms_ = 0;  ///< when the tier load link is free again, ms
  double step_swap_ms_ = 0;  ///< swap copies of the current step, ms
  double swap_ms_total_ = 0;
  double busy_ms_ = 0;  ///< time in steps that ran something, ms
  int64_t busy_steps_ = 0;
  StepWork work_;     ///< what the current step computes
  int64_t done_ = 0;  ///< requests finished or rejected
};

}  // namespace

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
  PAGEDKV_CHECK(c.rate_scale > 0 && std::isfinite(c.rate_scale),
                "replay: rate scale must be > 0 and finite, got {}", c.rate_scale);
  PAGEDKV_CHECK(c.host_link_bytes_per_s > 0 && std::isfinite(c.host_link_bytes_per_s),
                "replay: host link bandwidth must be > 0 bytes/s, got {}", c.host_link_bytes_per_s);
  PAGEDKV_CHECK(c.group_width >= 1 && c.group_width <= 64,
                "replay: group width (samples or beams) must be in [1, 64], got {}", c.group_width);
  PAGEDKV_CHECK(c.group_width == 1 || c.preemption == Preemption::kRecompute,
                "replay: sharing groups (width {}) support recompute preemption only",
                c.group_width);
  for (const ReplayTier& t : c.tiers) {
    PAGEDKV_CHECK(t.bytes >= 0, "replay: tier '{}' size must be >= 0 bytes, got {}", t.name,
                  t.bytes);
    PAGEDKV_CHECK(t.load_bytes_per_s > 0 && std::isfinite(t.load_bytes_per_s),
                  "replay: tier '{}' load bandwidth must be > 0 bytes/s, got {}", t.name,
                  t.load_bytes_per_s);
  }
  if (c.roofline) validate(*c.roofline);
  if (c.model) {
    validate(*c.model);
    PAGEDKV_CHECK(kv_bytes_per_token(*c.model) == c.kv_bytes_per_token,
                  "replay: KV bytes per token {} disagree with model '{}' ({} bytes per token)",
                  c.kv_bytes_per_token, c.model->name, kv_bytes_per_token(*c.model));
  }
}

ReplayResult replay(const Trace& trace, const ReplayConfig& config, const Strategy& strategy,
                    const ProgressFn& progress) {
  validate(config);
  validate(config, strategy);
  const auto t0 = std::chrono::steady_clock::now();
  ReplayResult res;
  res.strategy = strategy.name();
  res.requests = static_cast<int64_t>(trace.requests.size());
  Scheduler scheduler(trace, config, strategy, res);
  scheduler.run(progress);
  scheduler.finish();
  res.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace pagedkv::sim
