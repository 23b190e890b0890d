#pragma once
/// @file step_time.hpp
/// Roofline step-time model of the replay: how long one continuous-batching step takes on a GPU
/// from the work it does, instead of a constant (ReplayConfig::step_ms).
///
/// Formula (per step; Williams, Waterman, Patterson, "Roofline", CACM 2009: a kernel takes the
/// longer of its memory time and its compute time):
///
///   bytes   = W + kv_bytes_per_token x (R + T)
///   flops   = 2 N x T + 4 x L x H_q x D x A
///   time_ms = overhead_ms + 1000 x max(bytes / (BW x eff_bw), flops / (F x eff_flops))
///
/// W: weight bytes, read once per step whatever the batch (N parameters x 2 bytes, bf16/fp16);
/// T: positions computed in the step (prefill chunk tokens + one per decoding sequence), each
/// writing its K/V; R: positions whose K/V the step's attention reads (a chunk of positions
/// [s, s + n) reads s + n, a decode at context c reads c + 1, per layer; kv_bytes_per_token is
/// 2 x L x H_kv x D x sizeof(KV dtype), so GQA and 8-bit KV shrink it); A: (query, key) pairs of
/// causal attention (n x s + n (n + 1) / 2 for the chunk); 2 N FLOPs per token for the matmuls
/// (Kaplan et al. 2020, "Scaling Laws", sec. 2.1: C_forward ~ 2N), 4 L H_q D per pair (QK^T
/// and PV, 2 FLOPs per multiply-add each). BW, F: the hardware preset's peak HBM bandwidth and
/// dense BF16 FLOP/s; eff_bw, eff_flops: the fraction a real kernel reaches.
///
/// max rather than a sum: memory and compute overlap within a fused kernel, so a decode step is
/// bandwidth-bound (weights + K/V) and a large prefill chunk compute-bound, and the cross-over
/// is where the two terms meet. A sum would charge both for every step and overstate mixed
/// steps. The fixed overhead covers what neither term sees (scheduling, sampling, launches).

#include <cstdint>

#include "sim/hardware_preset.hpp"
#include "sim/model_preset.hpp"

namespace pagedkv::sim {

/// What one step computes. Counts of positions and (query, key) pairs, all >= 0.
struct StepWork {
  int64_t tokens = 0;           ///< T: positions computed (K/V written)
  int64_t kv_read = 0;          ///< R: positions whose K/V attention reads
  int64_t attention_pairs = 0;  ///< A: causal (query, key) pairs
  /// Adds the computation of positions [start, start + n) of one sequence (a prefill chunk, or
  /// n = 1 for a decode at context `start`); n = 0 adds nothing. Precondition: start, n >= 0.
  void add(int64_t start, int64_t n);
};

/// The model's constants, from a model preset, a hardware preset and the efficiencies.
struct RooflineModel {
  double weight_bytes = 0;            ///< W, bytes
  double flops_per_token = 0;         ///< 2 N, FLOP
  double kv_bytes_per_token = 0;      ///< bytes per position, all layers, K and V
  double flops_per_pair = 0;          ///< 4 L H_q D, FLOP
  double bandwidth_bytes_per_s = 0;   ///< BW
  double flops_per_s = 0;             ///< F
  double bandwidth_efficiency = 0.5;  ///< eff_bw in (0, 1]
  double flops_efficiency = 0.5;      ///< eff_flops in (0, 1]
  double overhead_ms = 1.0;           ///< fixed per-step cost, ms, >= 0
};

/// The two roofline terms and the step time, ms.
struct StepTime {
  double memory_ms = 0;   ///< 1000 bytes / (BW eff_bw)
  double compute_ms = 0;  ///< 1000 flops / (F eff_flops)
  double total_ms = 0;    ///< overhead + max of the two
};

/// Default efficiencies (docs/memory.md, "Step-time model"): eff_bw 0.50 is what the project's
/// paged decode kernel read on an H200 (2,395-2,425 GB/s of the datasheet's 4,800 at batch
/// >= 64 and context >= 4k, bf16, GQA 4; docs/benchmarks.md, "CUDA backend on an NVIDIA H200");
/// eff_flops 0.5 is an assumption (the project has no GPU matmul benchmark).
inline constexpr double kDefaultBandwidthEfficiency = 0.50;
inline constexpr double kDefaultFlopsEfficiency = 0.50;
inline constexpr double kDefaultStepOverheadMs = 1.0;

/// The model for `model` on `hw`, with `kv_bytes_per_token` the replay's (dtype-aware) figure.
/// Errors: throws pagedkv::Error if the model has no parameter count, or as validate() does.
[[nodiscard]] RooflineModel make_roofline(const ModelPreset& model, int64_t kv_bytes_per_token,
                                          const HardwarePreset& hw,
                                          double bandwidth_efficiency = kDefaultBandwidthEfficiency,
                                          double flops_efficiency = kDefaultFlopsEfficiency,
                                          double overhead_ms = kDefaultStepOverheadMs);

/// Checks every field (peaks and sizes > 0, efficiencies in (0, 1], overhead >= 0, finite).
/// Errors: throws pagedkv::Error naming the field and value.
void validate(const RooflineModel& m);

/// The time of a step doing `work` (formula above). Pure; no validation.
[[nodiscard]] StepTime step_time(const RooflineModel& m, const StepWork& work);

}  // namespace pagedkv::sim
