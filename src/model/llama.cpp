#include "model/llama.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <cmath>

#include "pagedkv/error.hpp"

namespace pagedkv::model {

namespace {

/// Sets OpenBLAS's thread count for the next product of n x out x in multiply-adds, as
/// `threads` says (see MatmulThreads); the count is process-wide, so it is set only on a change.
void choose_threads(const MatmulThreads& threads, int64_t n, int64_t in, int64_t out) {
#if defined(PAGEDKV_HAVE_OPENBLAS)
  if (threads.max_threads <= 0) return;
  const int want = n * in * out < threads.min_parallel_macs ? 1 : threads.max_threads;
  if (openblas_get_num_threads() != want) openblas_set_num_threads(want);
#else
  (void)threads, (void)n, (void)in, (void)out;
#endif
}

/// y[n, out] = x[n, in] W^T with W [out, in] row-major (the checkpoint's layout).
void linear(const MatmulThreads& threads, const float* x, int64_t n, int64_t in, const float* w,
            int64_t out, float* y) {
  choose_threads(threads, n, in, out);
  if (n == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, w,
                static_cast<int>(in), x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
                static_cast<int>(in), 1.0f, x, static_cast<int>(in), w, static_cast<int>(in), 0.0f,
                y, static_cast<int>(out));
  }
}

/// out = x / sqrt(mean(x^2) + 1e-5) * weight, one row of `size`. The sum runs in float, in
/// order, as in the reference runtime, so logits match it closely.
void rmsnorm(float* out, const float* x, const float* weight, int64_t size) {
  float ss = 0.0f;
  for (int64_t i = 0; i < size; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(size);
  ss += 1e-5f;
  ss = 1.0f / std::sqrt(ss);
  for (int64_t i = 0; i < size; ++i) out[i] = weight[i] * (ss * x[i]);
}

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

/// Sizes of one forward step: N new tokens and the model's widths.
struct StepDims {
  int64_t n, dim, kv_dim, hidden, hs, vocab;
  int32_t n_heads, n_kv_heads;
};

/// The step's workspace, rows [N, ...] each (LlamaModel's buffers, grown for this step).
struct StepBuffers {
  float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
  float *rope_cos, *rope_sin;  // [N, head_size / 2], each row's angles (rope_angles)
  const int64_t* pos;          // [N]
  const MatmulThreads* threads;
};

/// Checks a step's input against the model (see LlamaModel::forward, Errors) and returns its
/// sizes.
StepDims check_step(const StepInput& in, const LlamaConfig& c) {
  if (in.seqs.size() != in.n_new.size()) {
    throw Error(fmt::format("forward: {} sequences but {} new-token counts", in.seqs.size(),
                            in.n_new.size()));
  }
  int64_t n = 0;
  for (size_t i = 0; i < in.n_new.size(); ++i) {
    if (in.n_new[i] < 1) {
      throw Error(fmt::format("forward: sequence {} has {} new tokens, must be >= 1", in.seqs[i],
                              in.n_new[i]));
    }
    n += in.n_new[i];
  }
  if (static_cast<int64_t>(in.tokens.size()) != n) {
    throw Error(
        fmt::format("forward: {} tokens given, the counts add up to {}", in.tokens.size(), n));
  }
  for (const TokenId t : in.tokens) {
    if (t < 0 || t >= c.vocab_size) {
      throw Error(fmt::format("forward: token id {} outside [0, {})", t, c.vocab_size));
    }
  }
  return {.n = n,
          .dim = c.dim,
          .kv_dim = c.kv_dim(),
          .hidden = c.hidden_dim,
          .hs = c.head_size(),
          .vocab = c.vocab_size,
          .n_heads = c.n_heads,
          .n_kv_heads = c.n_kv_heads};
}

/// Each row's RoPE angles, once per step (every layer rotates by the same ones): rope_cos /
/// rope_sin [N, head_size / 2]. The same float expressions as the reference runtime:
/// freq = 1 / 10000^(j / head_size), angle pos * freq; from the position itself (no table, so
/// any position works).
inline void rope_angles(const StepDims& d, const StepBuffers& b) {
  const int64_t half = d.hs / 2;
  for (int64_t r = 0; r < d.n; ++r) {
    for (int64_t j = 0; j < d.hs; j += 2) {
      const float freq =
          1.0f / std::pow(10000.0f, static_cast<float>(j) / static_cast<float>(d.hs));
      const float val = static_cast<float>(b.pos[r]) * freq;
      b.rope_cos[r * half + j / 2] = std::cos(val);
      b.rope_sin[r * half + j / 2] = std::sin(val);
    }
  }
}

/// RoPE of every row's q and k by the step's angles (rope_angles).
inline void rotate_rows(const StepDims& d, const StepBuffers& b) {
  const int64_t hs = d.hs;
  for (int64_t r = 0; r < d.n; ++r) {
    const float* rc = b.rope_cos + r * (hs / 2);
    const float* rs = b.rope_sin + r * (hs / 2);
    auto rotate = [&](float* vec, int64_t heads) {
      for (int64_t h = 0; h < heads; ++h) {
        float* p = vec + h * hs;
        for (int64_t j = 0; j < hs; j += 2) {
          const float v0 = p[j], v1 = p[j + 1];
          p[j] = v0 * rc[j / 2] - v1 * rs[j / 2];
          p[j + 1] = v0 * rs[j / 2] + v1 * rc[j / 2];
        }
      }
    };
    rotate(b.q + r * d.dim, d.n_heads);
    rotate(b.k + r * d.kv_dim, d.n_kv_heads);
  }
}

/// Layer l's attention half: x += attention(RMSNorm(x) * rms_att[l]) Wo^T.
inline void attention_block(const LlamaWeights& w, int32_t l, const StepDims& d,
                            const StepBuffers& b, KVBackend& backend) {
  const int64_t n = d.n, dim = d.dim, kv_dim = d.kv_dim;
  for (int64_t r = 0; r < n; ++r) rmsnorm(b.xb + r * dim, b.x + r * dim, w.rms_att + l * dim, dim);
  linear(*b.threads, b.xb, n, dim, w.wq + l * dim * dim, dim, b.q);
  linear(*b.threads, b.xb, n, dim, w.wk + l * kv_dim * dim, kv_dim, b.k);
  linear(*b.threads, b.xb, n, dim, w.wv + l * kv_dim * dim, kv_dim, b.v);
  rotate_rows(d, b);
  backend.attend(l, {b.q, static_cast<size_t>(n * dim)}, {b.k, static_cast<size_t>(n * kv_dim)},
                 {b.v, static_cast<size_t>(n * kv_dim)}, {b.att, static_cast<size_t>(n * dim)});
  linear(*b.threads, b.att, n, dim, w.wo + l * dim * dim, dim, b.xb);
  for (int64_t i = 0; i < n * dim; ++i) b.x[i] += b.xb[i];
}

/// Layer l's feed-forward half: x += (silu(xb W1^T) * (xb W3^T)) W2^T, xb = RMSNorm(x) *
/// rms_ffn[l].
inline void ffn_block(const LlamaWeights& w, int32_t l, const StepDims& d, const StepBuffers& b) {
  const int64_t n = d.n, dim = d.dim, hidden = d.hidden;
  for (int64_t r = 0; r < n; ++r) rmsnorm(b.xb + r * dim, b.x + r * dim, w.rms_ffn + l * dim, dim);
  linear(*b.threads, b.xb, n, dim, w.w1 + l * hidden * dim, hidden, b.hb);
  linear(*b.threads, b.xb, n, dim, w.w3 + l * hidden * dim, hidden, b.hb2);
  for (int64_t i = 0; i < n * hidden; ++i) {
    float val = b.hb[i];
    val *= 1.0f / (1.0f + std::exp(-val));  // silu
    b.hb[i] = val * b.hb2[i];
  }
  linear(*b.threads, b.hb, n, hidden, w.w2 + l * dim * hidden, dim, b.xb);
  for (int64_t i = 0; i < n * dim; ++i) b.x[i] += b.xb[i];
}

}  // namespace

void set_threads(int blas_threads, int attention_threads) {
#if defined(PAGEDKV_HAVE_OPENBLAS)
  if (blas_threads > 0) openblas_set_num_threads(blas_threads);
#else
  (void)blas_threads;
#endif
  if (attention_threads > 0) omp_set_num_threads(attention_threads);
}

int32_t blas_threads() {
#if defined(PAGEDKV_HAVE_OPENBLAS)
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

LlamaModel::LlamaModel(LlamaWeights weights) : weights_(std::move(weights)) {}

void LlamaModel::set_matmul_threads(const MatmulThreads& threads) {
  if (threads.max_threads < 0 || threads.min_parallel_macs < 0) {
    throw Error(
        fmt::format("set_matmul_threads: max_threads {} and min_parallel_macs {} must be >= 0",
                    threads.max_threads, threads.min_parallel_macs));
  }
  matmul_threads_ = threads;
}

KVBackendConfig LlamaModel::backend_config(int32_t block_size, int32_t num_blocks) const {
  const LlamaConfig& c = config();
  KVBackendConfig b;
  b.num_layers = c.n_layers;
  b.num_heads = c.n_heads;
  b.num_kv_heads = c.n_kv_heads;
  b.head_dim = c.head_size();
  b.block_size = block_size;
  b.num_blocks = num_blocks;
  return b;
}

std::span<const float> LlamaModel::forward(KVBackend& backend, const StepInput& in,
                                           bool all_logits) {
  const LlamaConfig& c = config();
  const LlamaWeights& w = weights_;
  const StepDims d = check_step(in, c);
  const int64_t n = d.n, dim = d.dim;

  // Positions come from the backend before begin_step appends the new tokens.
  int64_t* pos = grow(positions_, n);
  {
    int64_t row = 0;
    for (size_t i = 0; i < in.seqs.size(); ++i) {
      const int64_t start = backend.caches() ? backend.num_tokens(in.seqs[i]) : 0;
      for (int64_t t = 0; t < in.n_new[i]; ++t) pos[row++] = start + t;
    }
  }

  const StepBuffers b{.x = grow(x_, n * dim),
                      .xb = grow(xb_, n * dim),
                      .q = grow(q_, n * dim),
                      .k = grow(k_, n * d.kv_dim),
                      .v = grow(v_, n * d.kv_dim),
                      .att = grow(att_, n * dim),
                      .hb = grow(hb_, n * d.hidden),
                      .hb2 = grow(hb2_, n * d.hidden),
                      .rope_cos = grow(rope_cos_, n * (d.hs / 2)),
                      .rope_sin = grow(rope_sin_, n * (d.hs / 2)),
                      .pos = pos,
                      .threads = &matmul_threads_};

  for (int64_t r = 0; r < n; ++r) {
    const float* e = w.token_embedding + static_cast<int64_t>(in.tokens[r]) * dim;
    std::copy(e, e + dim, b.x + r * dim);
  }

  rope_angles(d, b);
  backend.begin_step_with_tokens(in.seqs, in.n_new, in.tokens);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    attention_block(w, l, d, b, backend);
    ffn_block(w, l, d, b);
  }
  backend.end_step();

  // Final norm and classifier only for the rows whose logits are wanted.
  int64_t rows = 0;
  if (all_logits) {
    for (int64_t r = 0; r < n; ++r) rmsnorm(b.xb + r * dim, b.x + r * dim, w.rms_final, dim);
    rows = n;
  } else {
    int64_t last = -1;
    for (size_t i = 0; i < in.seqs.size(); ++i) {
      last += in.n_new[i];
      rmsnorm(b.xb + rows * dim, b.x + last * dim, w.rms_final, dim);
      ++rows;
    }
  }
  float* logits = grow(logits_, rows * d.vocab);
  linear(matmul_threads_, b.xb, rows, dim, w.wcls, d.vocab, logits);
  return {logits, static_cast<size_t>(rows * d.vocab)};
}

}  // namespace pagedkv::model
