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
/// Every matrix product is one BLAS call for the whole batch (cblas_sgemm; sgemv when N = 1).

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
/// The matrix products are ~95% of the work here (attention at 256 positions is ~5% of a
/// no-cache step, ~8% of a cached decode step), so `pagedkv generate` gives BLAS the cores and
/// the attention one thread, unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set.
/// blas_threads: OpenBLAS threads (ignored with another BLAS); attention_threads: the OpenMP
/// threads of the calling thread's later parallel regions. 0 leaves a setting as it is.
void set_threads(int blas_threads, int attention_threads);

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
  /// Not thread-safe (reuses workspace buffers).
  std::span<const float> forward(KVBackend& backend, const StepInput& in, bool all_logits);

 private:
  LlamaWeights weights_;
  // Workspace, grown on demand. Shapes with N = tokens of the step.
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, logits_;  // [N, ...]
  std::vector<int64_t> positions_;                                   // [N]
  std::vector<float> rope_cos_, rope_sin_;                           // [head_size / 2]
};

}  // namespace pagedkv::model
