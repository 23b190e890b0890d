#pragma once
/// @file llama.hpp
/// The Llama forward pass over a batch of sequences, with K/V and attention delegated to a
/// KVBackend (paged, contiguous or none).
///
/// Per layer l, for the N new tokens of a step (source: Touvron et al., "LLaMA", 2023, and the
/// llama2.c reference runtime, run.c forward()):
///   xb = RMSNorm(x) * rms_att[l]                       (Zhang & Sennrich 2019, eps 1e-5)
///   q = xb Wq^T, k = xb Wk^T, v = xb Wv^T             [N, dim], [N, kv_dim], [N, kv_dim]
///   rotate q and k pairwise by angle pos * 10000^(-j / head_size), j = 0, 2, ...  (RoPE,
///     Su et al. 2021), computed from each token's position: no position table
///   o = attention(q, cached k, v)                      KVBackend: GQA, causal
///   x += o Wo^T
///   xb = RMSNorm(x) * rms_ffn[l]
///   x += (silu(xb W1^T) * (xb W3^T)) W2^T             (SwiGLU, Shazeer 2020)
/// logits = RMSNorm(x) * rms_final Wcls^T.
/// Every matrix product is one BLAS call for the whole batch (cblas_sgemm; sgemv when N = 1),
/// on the threads MatmulThreads gives it.

#include <cstdint>
#include <span>
#include <vector>

#include "model/checkpoint.hpp"
#include "model/kv_backend.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv::model {

/// One forward step of a batch.
/// Shapes: seqs, n_new [num_seqs]; tokens [sum n_new], sequence by sequence. Sequence i's new
/// tokens take positions start_i .. start_i + n_new[i] - 1 with start_i = the backend's cached
/// token count (0 for the none backend, whose callers feed the whole history).
struct StepInput {
  std::span<const SeqId> seqs;
  std::span<const int64_t> n_new;
  std::span<const TokenId> tokens;
};

/// Thread policy of a process running the model. Both OpenBLAS (matrix products) and the CPU
/// attention kernels (OpenMP) keep a pool of threads that spin-wait between calls; running both
/// at full width puts 3+ busy threads on 2 cores (measured up to 6x slower on the none mode).
/// The matrix products are ~95% of the work of a no-cache step (attention at 256 positions is
/// ~5%), so `pagedkv generate` gives BLAS the cores (for the products big enough to split, see
/// MatmulThreads) and the attention one thread, unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS
/// is set. blas_threads: OpenBLAS threads (ignored with another BLAS); attention_threads: the
/// OpenMP threads of the calling thread's later parallel regions. 0 leaves a setting as it is.
void set_threads(int blas_threads, int attention_threads);

/// How many BLAS threads each matrix product of LlamaModel::forward runs on. Handing a product
/// to a second thread costs a wake-up (5-10 us on this project's 2-core machine, more when the
/// cores are shared), which a small product never earns back, and it leaves the worker
/// spin-waiting (sched_yield) on the other core after the call. OpenBLAS's own rule splits any
/// sgemv above 9216 multiply-adds, so every decode step of a small model (stories260K: 16 of
/// its 36 products, 11-33 K multiply-adds each) paid it: 0.8x run.c's tokens/s, more than half
/// of the process's CPU time in sched_yield (docs/benchmarks.md, 2026-12-05).
/// Measured there on one Zen 4 core: sgemv 1 x 1376 x 512 (704 K) 39 us on one thread, 45 us on
/// two; sgemm 8 x 512 x 512 (2.1 M) 96 vs 135 us; 8 x 1376 x 512 (5.6 M) 256 vs 168 us.
struct MatmulThreads {
  /// Products of fewer multiply-adds than this (rows x out x in) run on one thread; units:
  /// multiply-adds.
  static constexpr int64_t kDefaultMinParallelMacs = int64_t{1} << 22;

  /// Threads for the products of at least min_parallel_macs multiply-adds. 0: forward() leaves
  /// BLAS's thread count alone (BLAS's own rule splits each call), the default of a new model.
  /// With OpenBLAS only; another BLAS keeps its own rule.
  int32_t max_threads = 0;
  int64_t min_parallel_macs = kDefaultMinParallelMacs;
};

/// OpenBLAS's thread count now (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, else the cores, or what
/// set_threads set); 1 with another BLAS.
[[nodiscard]] int32_t blas_threads();

class LlamaModel {
 public:
  explicit LlamaModel(LlamaWeights weights);

  [[nodiscard]] const LlamaConfig& config() const { return weights_.config(); }
  [[nodiscard]] const LlamaWeights& weights() const { return weights_; }

  /// Backend geometry for this model with the given paging parameters.
  [[nodiscard]] KVBackendConfig backend_config(int32_t block_size, int32_t num_blocks) const;

  /// Runs one step through `backend` (begin_step, one attend per layer, end_step).
  /// Returns logits, valid until the next call: all_logits ? [sum n_new, vocab] (one row per
  /// new token) : [num_seqs, vocab] (each sequence's last new token).
  /// Errors: throws pagedkv::Error on size mismatches, n_new[i] < 1, or a token id outside
  /// [0, vocab); backend errors propagate.
  /// Not thread-safe (reuses workspace buffers, and sets OpenBLAS's process-wide thread count
  /// per product when matmul_threads().max_threads > 0).
  std::span<const float> forward(KVBackend& backend, const StepInput& in, bool all_logits);

  /// The BLAS threads of forward()'s matrix products (see MatmulThreads).
  /// Errors: throws pagedkv::Error if max_threads < 0 or min_parallel_macs < 0.
  void set_matmul_threads(const MatmulThreads& threads);
  [[nodiscard]] const MatmulThreads& matmul_threads() const { return matmul_threads_; }

 private:
  LlamaWeights weights_;
  MatmulThreads matmul_threads_;
  // Workspace, grown on demand. Shapes with N = tokens of the step.
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, logits_;  // [N, ...]
  std::vector<int64_t> positions_;                                   // [N]
  std::vector<float> rope_cos_, rope_sin_;                           // [N, head_size / 2]
};

}  // namespace pagedkv::model
