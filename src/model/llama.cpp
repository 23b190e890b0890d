#include "model/llama.hpp"

#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <cmath>

#include "pagedkv/error.hpp"

namespace pagedkv::model {

namespace {

/// y[n, out] = x[n, in] W^T with W [out, in] row-major (the checkpoint's layout).
void linear(const float* x, int64_t n, int64_t in, const float* w, int64_t out, float* y) {
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

}  // namespace

void set_threads(int blas_threads, int attention_threads) {
#if defined(PAGEDKV_HAVE_OPENBLAS)
  if (blas_threads > 0) openblas_set_num_threads(blas_threads);
#else
  (void)blas_threads;
#endif
  if (attention_threads > 0) omp_set_num_threads(attention_threads);
}

LlamaModel::LlamaModel(LlamaWeights weights) : weights_(std::move(weights)) {}

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

  const int64_t dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, hs = c.head_size();
  const int64_t vocab = c.vocab_size;

  // Positions come from the backend before begin_step appends the new tokens.
  int64_t* pos = grow(positions_, n);
  {
    int64_t row = 0;
    for (size_t i = 0; i < in.seqs.size(); ++i) {
      const int64_t start = backend.caches() ? backend.num_tokens(in.seqs[i]) : 0;
      for (int64_t t = 0; t < in.n_new[i]; ++t) pos[row++] = start + t;
    }
  }

  float* x = grow(x_, n * dim);
  float* xb = grow(xb_, n * dim);
  float* q = grow(q_, n * dim);
  float* k = grow(k_, n * kv_dim);
  float* v = grow(v_, n * kv_dim);
  float* att = grow(att_, n * dim);
  float* hb = grow(hb_, n * hidden);
  float* hb2 = grow(hb2_, n * hidden);
  float* rc = grow(rope_cos_, hs / 2);
  float* rs = grow(rope_sin_, hs / 2);

  for (int64_t r = 0; r < n; ++r) {
    const float* e = w.token_embedding + static_cast<int64_t>(in.tokens[r]) * dim;
    std::copy(e, e + dim, x + r * dim);
  }

  backend.begin_step(in.seqs, in.n_new);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    for (int64_t r = 0; r < n; ++r) rmsnorm(xb + r * dim, x + r * dim, w.rms_att + l * dim, dim);
    linear(xb, n, dim, w.wq + l * dim * dim, dim, q);
    linear(xb, n, dim, w.wk + l * kv_dim * dim, kv_dim, k);
    linear(xb, n, dim, w.wv + l * kv_dim * dim, kv_dim, v);

    // RoPE from the position itself (no table, so any position works). The same float
    // expressions as the reference runtime: freq = 1 / 10000^(j / head_size), angle pos * freq.
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < hs; j += 2) {
        const float freq =
            1.0f / std::pow(10000.0f, static_cast<float>(j) / static_cast<float>(hs));
        const float val = static_cast<float>(pos[r]) * freq;
        rc[j / 2] = std::cos(val);
        rs[j / 2] = std::sin(val);
      }
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
      rotate(q + r * dim, c.n_heads);
      rotate(k + r * kv_dim, c.n_kv_heads);
    }

    backend.attend(l, {q, static_cast<size_t>(n * dim)}, {k, static_cast<size_t>(n * kv_dim)},
                   {v, static_cast<size_t>(n * kv_dim)}, {att, static_cast<size_t>(n * dim)});

    linear(att, n, dim, w.wo + l * dim * dim, dim, xb);
    for (int64_t i = 0; i < n * dim; ++i) x[i] += xb[i];

    for (int64_t r = 0; r < n; ++r) rmsnorm(xb + r * dim, x + r * dim, w.rms_ffn + l * dim, dim);
    linear(xb, n, dim, w.w1 + l * hidden * dim, hidden, hb);
    linear(xb, n, dim, w.w3 + l * hidden * dim, hidden, hb2);
    for (int64_t i = 0; i < n * hidden; ++i) {
      float val = hb[i];
      val *= 1.0f / (1.0f + std::exp(-val));  // silu
      hb[i] = val * hb2[i];
    }
    linear(hb, n, hidden, w.w2 + l * dim * hidden, dim, xb);
    for (int64_t i = 0; i < n * dim; ++i) x[i] += xb[i];
  }
  backend.end_step();

  // Final norm and classifier only for the rows whose logits are wanted.
  int64_t rows = 0;
  if (all_logits) {
    for (int64_t r = 0; r < n; ++r) rmsnorm(xb + r * dim, x + r * dim, w.rms_final, dim);
    rows = n;
  } else {
    int64_t last = -1;
    for (size_t i = 0; i < in.seqs.size(); ++i) {
      last += in.n_new[i];
      rmsnorm(xb + rows * dim, x + last * dim, w.rms_final, dim);
      ++rows;
    }
  }
  float* logits = grow(logits_, rows * vocab);
  linear(xb, rows, dim, w.wcls, vocab, logits);
  return {logits, static_cast<size_t>(rows * vocab)};
}

}  // namespace pagedkv::model
