#include "sim/step_time.hpp"

#include <algorithm>
#include <cmath>

#include "core/check.hpp"

namespace pagedkv::sim {

namespace {

constexpr double kWeightBytesPerParam = 2.0;  // bf16 / fp16 checkpoints

void check_positive(double v, const char* what) {
  PAGEDKV_CHECK(v > 0 && std::isfinite(v), "step-time model: {} must be > 0 and finite, got {}",
                what, v);
}

void check_fraction(double v, const char* what) {
  PAGEDKV_CHECK(v > 0 && v <= 1, "step-time model: {} must be in (0, 1], got {}", what, v);
}

}  // namespace

void StepWork::add(int64_t start, int64_t n) {
  if (n == 0) return;  // nothing computed, nothing read (a swapped-in request's first step)
  tokens += n;
  kv_read += start + n;
  attention_pairs += n * start + n * (n + 1) / 2;
}

RooflineModel make_roofline(const ModelPreset& model, int64_t kv_bytes_per_token,
                            const HardwarePreset& hw, double bandwidth_efficiency,
                            double flops_efficiency, double overhead_ms) {
  PAGEDKV_CHECK(model.num_params > 0,
                "step-time model: model '{}' has no parameter count (needed for weight bytes "
                "and matmul FLOPs)",
                model.name);
  RooflineModel m;
  const auto params = static_cast<double>(model.num_params);
  m.weight_bytes = params * kWeightBytesPerParam;
  m.flops_per_token = 2.0 * params;
  m.kv_bytes_per_token = static_cast<double>(kv_bytes_per_token);
  m.flops_per_pair = 4.0 * model.num_layers * model.num_heads * static_cast<double>(model.head_dim);
  m.bandwidth_bytes_per_s = hw.bandwidth_bytes_per_s;
  m.flops_per_s = hw.bf16_flops_per_s;
  m.bandwidth_efficiency = bandwidth_efficiency;
  m.flops_efficiency = flops_efficiency;
  m.overhead_ms = overhead_ms;
  validate(m);
  return m;
}

void validate(const RooflineModel& m) {
  check_positive(m.weight_bytes, "weight bytes");
  check_positive(m.flops_per_token, "FLOPs per token");
  check_positive(m.kv_bytes_per_token, "KV bytes per token");
  check_positive(m.flops_per_pair, "attention FLOPs per pair");
  check_positive(m.bandwidth_bytes_per_s, "bandwidth");
  check_positive(m.flops_per_s, "FLOP/s");
  check_fraction(m.bandwidth_efficiency, "bandwidth efficiency");
  check_fraction(m.flops_efficiency, "FLOPs efficiency");
  PAGEDKV_CHECK(m.overhead_ms >= 0 && std::isfinite(m.overhead_ms),
                "step-time model: overhead must be >= 0 ms and finite, got {}", m.overhead_ms);
}

StepTime step_time(const RooflineModel& m, const StepWork& w) {
  const double bytes =
      m.weight_bytes + m.kv_bytes_per_token * static_cast<double>(w.kv_read + w.tokens);
  const double flops = m.flops_per_token * static_cast<double>(w.tokens) +
                       m.flops_per_pair * static_cast<double>(w.attention_pairs);
  StepTime t;
  t.memory_ms = 1000.0 * bytes / (m.bandwidth_bytes_per_s * m.bandwidth_efficiency);
  t.compute_ms = 1000.0 * flops / (m.flops_per_s * m.flops_efficiency);
  t.total_ms = m.overhead_ms + std::max(t.memory_ms, t.compute_ms);
  return t;
}

}  // namespace pagedkv::sim
