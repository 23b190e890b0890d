#include "cpu/attention_plain.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype_dispatch.hpp"

namespace pagedkv::detail {

namespace {

/// One (query, head) row: online softmax over the visible keys, read in place through the
/// block table. kDType is a template parameter so the per-element dtype switch folds away.
/// Source: online softmax, Milakov & Gimelshein, "Online normalizer calculation for softmax"
/// (2018): keep a running max m, rescale the running sum l and accumulator when m grows.
template <DType kDType>
void attend_row(const KVLayerView& cache, const int32_t* table, int32_t kv_head, int64_t pos,
                const AttentionParams& mask, float scale, const float* q, float* acc, float* out) {
  const int32_t head_dim = cache.head_dim;
  const int32_t bs = cache.block_size;
  // The 8-bit formats' scales fold into the scores (K) and the output (V): x = stored * scale.
  scale *= cache.key_scale(kv_head);
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
  std::fill(acc, acc + head_dim, 0.0f);

  auto visit = [&](int64_t key_pos) {
    const int64_t block = table[key_pos / bs];
    const int64_t off = cache.offset(block, kv_head, key_pos % bs);
    float dot = 0.0f;
    for (int32_t d = 0; d < head_dim; ++d) dot += q[d] * load_as_f32(cache.k, kDType, off + d);
    const float s = dot * scale;
    if (s > m) {
      // exp(-inf) = 0 on the first key, which clears the (already zero) state.
      const float correction = std::exp(m - s);
      l *= correction;
      for (int32_t d = 0; d < head_dim; ++d) acc[d] *= correction;
      m = s;
    }
    const float p = std::exp(s - m);
    l += p;
    for (int32_t d = 0; d < head_dim; ++d) acc[d] += p * load_as_f32(cache.v, kDType, off + d);
  };

  // Visible keys: [0, min(sinks, lo)) then [lo, pos], lo = first position of the window or
  // chunk.
  const int64_t lo = mask.first_visible(pos);
  const int64_t sink_end =
      AttentionParams::mask_sink_end(lo, mask.window_left, mask.chunk_size, mask.sink_tokens);
  for (int64_t k = 0; k < sink_end; ++k) visit(k);
  for (int64_t k = lo; k <= pos; ++k) visit(k);

  if (l == 0.0f) {  // no visible key: padding row or an empty window
    std::fill(out, out + head_dim, 0.0f);
    return;
  }
  const float inv = cache.value_scale(kv_head) / l;
  for (int32_t d = 0; d < head_dim; ++d) out[d] = acc[d] * inv;
}

template <DType kDType>
void prefill(const AttentionParams& params, const KVLayerView& cache, const BlockTableView& tables,
             std::span<const int32_t> query_start, std::span<const float> q, std::span<float> out) {
  const int32_t num_heads = params.num_heads;
  const int32_t head_dim = params.head_dim;
  const int32_t group = params.num_heads / params.num_kv_heads;
  const float scale = params.softmax_scale();
  std::vector<float> acc(static_cast<size_t>(head_dim));
  for (int32_t i = 0; i < tables.num_seqs; ++i) {
    const int32_t* table =
        tables.block_tables + static_cast<int64_t>(i) * tables.max_blocks_per_seq;
    const int64_t ctx = tables.context_lens[i];
    const int64_t n = query_start[i + 1] - query_start[i];
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = ctx - n + t;
      const int64_t row = query_start[i] + t;
      for (int32_t h = 0; h < num_heads; ++h) {
        const int64_t off = (row * num_heads + h) * head_dim;
        attend_row<kDType>(cache, table, h / group, pos, params, scale, q.data() + off, acc.data(),
                           out.data() + off);
      }
    }
  }
}

}  // namespace

void plain_paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                                   const BlockTableView& tables,
                                   std::span<const int32_t> query_start, std::span<const float> q,
                                   std::span<float> out) {
  dispatch_dtype(cache.dtype, [&](auto tag) {
    prefill<decltype(tag)::value>(params, cache, tables, query_start, q, out);
  });
}

}  // namespace pagedkv::detail
