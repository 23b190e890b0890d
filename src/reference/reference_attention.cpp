// Textbook attention, the ground truth of every kernel test. Written for clarity: the whole
// score matrix of a head in double, an explicit mask, a max-subtracted softmax, then P . V.

#include "pagedkv/reference/reference_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.hpp"

namespace pagedkv {

namespace {

void check_geometry(const char* fn, const AttentionParams& params) {
  PAGEDKV_CHECK(params.num_heads >= 1 && params.num_kv_heads >= 1 && params.head_dim >= 1,
                "{}: sizes must be >= 1, got num_heads {}, num_kv_heads {}, head_dim {}", fn,
                params.num_heads, params.num_kv_heads, params.head_dim);
  PAGEDKV_CHECK(params.num_heads % params.num_kv_heads == 0,
                "{}: num_heads {} is not a multiple of num_kv_heads {}", fn, params.num_heads,
                params.num_kv_heads);
  PAGEDKV_CHECK(params.window_left >= -1 && params.sink_tokens >= 0 && params.chunk_size >= 0,
                "{}: window_left must be >= -1, sink_tokens and chunk_size >= 0, got {}, {} and "
                "{}",
                fn, params.window_left, params.sink_tokens, params.chunk_size);
}

/// The softmax scale, computed here in double rather than through AttentionParams so the
/// ground truth does not share code with the kernels it checks.
double scale_of(const AttentionParams& params) {
  return params.scale != 0.0f ? static_cast<double>(params.scale)
                              : 1.0 / std::sqrt(static_cast<double>(params.head_dim));
}

void check_kv(const char* fn, const AttentionParams& params, std::span<const float> k,
              std::span<const float> v, int64_t num_kv_tokens) {
  PAGEDKV_CHECK(num_kv_tokens >= 0, "{}: num_kv_tokens must be >= 0, got {}", fn, num_kv_tokens);
  const int64_t expected = num_kv_tokens * params.num_kv_heads * params.head_dim;
  PAGEDKV_CHECK(static_cast<int64_t>(k.size()) == expected && k.size() == v.size(),
                "{}: k has {} and v has {} elements, expected {} ({} tokens x {} kv heads x {} "
                "dims)",
                fn, k.size(), v.size(), expected, num_kv_tokens, params.num_kv_heads,
                params.head_dim);
}

/// Is key position `key` visible from a query at position `pos`? The rule of attention.hpp,
/// written independently of AttentionParams::visible: causal (key <= pos); with a window,
/// only pos - window_left < key; with chunks, only keys of the query's own chunk
/// (key / chunk_size == pos / chunk_size); under either, the first sink_tokens positions too.
bool visible(const AttentionParams& params, int64_t pos, int64_t key) {
  if (key > pos) return false;
  const bool windowed = params.window_left >= 0;
  const bool chunked = params.chunk_size > 0;
  if (!windowed && !chunked) return true;
  if (key < params.sink_tokens) return true;
  const bool in_window = !windowed || key > pos - params.window_left;
  const bool in_chunk = !chunked || key / params.chunk_size == pos / params.chunk_size;
  return in_window && in_chunk;
}

/// softmax(scores) . V for one query row of one head; scores of masked keys are -inf.
/// All keys masked -> zeros (the kernels' convention for padding rows and empty windows).
void softmax_times_v(const std::vector<double>& scores, std::span<const float> v,
                     int64_t kv_row_stride, int64_t kv_head_offset, int32_t head_dim, float* out) {
  double max_score = -std::numeric_limits<double>::infinity();
  for (double s : scores) max_score = std::max(max_score, s);
  std::vector<double> o(static_cast<size_t>(head_dim), 0.0);
  if (max_score == -std::numeric_limits<double>::infinity()) {
    for (int32_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
    return;
  }
  // Subtracting the max keeps exp() <= 1: no overflow, same result (softmax is shift-invariant).
  double sum = 0.0;
  std::vector<double> p(scores.size());
  for (size_t j = 0; j < scores.size(); ++j) {
    p[j] = std::exp(scores[j] - max_score);  // exp(-inf) = 0 for masked keys
    sum += p[j];
  }
  for (size_t j = 0; j < scores.size(); ++j) {
    if (p[j] == 0.0) continue;
    const float* vj = v.data() + static_cast<int64_t>(j) * kv_row_stride + kv_head_offset;
    for (int32_t d = 0; d < head_dim; ++d) o[d] += p[j] / sum * vj[d];
  }
  for (int32_t d = 0; d < head_dim; ++d) out[d] = static_cast<float>(o[d]);
}

double dot(const float* a, const float* b, int32_t n) {
  double s = 0.0;
  for (int32_t d = 0; d < n; ++d) s += static_cast<double>(a[d]) * b[d];
  return s;
}

}  // namespace

void reference_attention(const AttentionParams& params, std::span<const float> q,
                         std::span<const float> k, std::span<const float> v, int64_t num_kv_tokens,
                         std::span<float> out) {
  constexpr const char* kFn = "reference_attention";
  check_geometry(kFn, params);
  check_kv(kFn, params, k, v, num_kv_tokens);
  const int64_t q_row = static_cast<int64_t>(params.num_heads) * params.head_dim;
  PAGEDKV_CHECK(static_cast<int64_t>(q.size()) % q_row == 0,
                "{}: q has {} elements, not a multiple of num_heads x head_dim = {}", kFn, q.size(),
                q_row);
  PAGEDKV_CHECK(out.size() == q.size(), "{}: out has {} elements, q has {}", kFn, out.size(),
                q.size());
  const int64_t n_q = static_cast<int64_t>(q.size()) / q_row;
  PAGEDKV_CHECK(n_q <= num_kv_tokens, "{}: {} query tokens but only {} kv tokens", kFn, n_q,
                num_kv_tokens);

  const int32_t group = params.num_heads / params.num_kv_heads;
  const double scale = scale_of(params);
  const int64_t kv_row = static_cast<int64_t>(params.num_kv_heads) * params.head_dim;
  for (int32_t h = 0; h < params.num_heads; ++h) {
    const int64_t kv_head_offset = static_cast<int64_t>(h / group) * params.head_dim;
    // S = Q K^T * scale + mask for this head: [n_q, num_kv_tokens].
    std::vector<std::vector<double>> scores(static_cast<size_t>(n_q));
    for (int64_t i = 0; i < n_q; ++i) {
      const int64_t pos = num_kv_tokens - n_q + i;
      const float* qi = q.data() + i * q_row + static_cast<int64_t>(h) * params.head_dim;
      scores[i].assign(static_cast<size_t>(num_kv_tokens),
                       -std::numeric_limits<double>::infinity());
      for (int64_t j = 0; j < num_kv_tokens; ++j) {
        if (!visible(params, pos, j)) continue;
        scores[i][j] = scale * dot(qi, k.data() + j * kv_row + kv_head_offset, params.head_dim);
      }
    }
    for (int64_t i = 0; i < n_q; ++i) {
      softmax_times_v(scores[i], v, kv_row, kv_head_offset, params.head_dim,
                      out.data() + i * q_row + static_cast<int64_t>(h) * params.head_dim);
    }
  }
}

void reference_attention_subset(const AttentionParams& params, std::span<const float> q,
                                std::span<const float> k, std::span<const float> v,
                                int64_t num_kv_tokens, std::span<const int64_t> positions,
                                std::span<float> out) {
  constexpr const char* kFn = "reference_attention_subset";
  check_geometry(kFn, params);
  check_kv(kFn, params, k, v, num_kv_tokens);
  const int64_t q_row = static_cast<int64_t>(params.num_heads) * params.head_dim;
  PAGEDKV_CHECK(static_cast<int64_t>(q.size()) == q_row && out.size() == q.size(),
                "{}: q has {} and out {} elements, expected num_heads x head_dim = {}", kFn,
                q.size(), out.size(), q_row);
  // A mask rather than a list, so a position given twice still counts once.
  std::vector<bool> keep(static_cast<size_t>(num_kv_tokens), false);
  for (int64_t p : positions) {
    PAGEDKV_CHECK(p >= 0 && p < num_kv_tokens, "{}: position {} out of range [0, {})", kFn, p,
                  num_kv_tokens);
    keep[static_cast<size_t>(p)] = true;
  }
  const int32_t group = params.num_heads / params.num_kv_heads;
  const double scale = scale_of(params);
  const int64_t kv_row = static_cast<int64_t>(params.num_kv_heads) * params.head_dim;
  for (int32_t h = 0; h < params.num_heads; ++h) {
    const int64_t kv_head_offset = static_cast<int64_t>(h / group) * params.head_dim;
    const float* qh = q.data() + static_cast<int64_t>(h) * params.head_dim;
    std::vector<double> scores(static_cast<size_t>(num_kv_tokens),
                               -std::numeric_limits<double>::infinity());
    for (int64_t j = 0; j < num_kv_tokens; ++j) {
      if (keep[j])
        scores[j] = scale * dot(qh, k.data() + j * kv_row + kv_head_offset, params.head_dim);
    }
    softmax_times_v(scores, v, kv_row, kv_head_offset, params.head_dim,
                    out.data() + static_cast<int64_t>(h) * params.head_dim);
  }
}

}  // namespace pagedkv
