// Attention over explicit key lists (sparse kept sets such as heavy hitters), with the softmax
// probabilities as an optional output. A plain two-pass softmax rather than an online one:
// the probabilities themselves are wanted, and kept sets are small (a token budget).

#include <cmath>
#include <limits>
#include <vector>

#include "core/check.hpp"
#include "pagedkv/cpu/attention.hpp"

namespace pagedkv {

void paged_attention_over_slots(const AttentionParams& params, const KVLayerView& cache,
                                const SlotListView& keys, std::span<const float> q,
                                std::span<float> out, std::span<float> probs) {
  constexpr const char* kFn = "paged_attention_over_slots";
  check_attention_params(params, cache);
  check_table_geometry(kFn, cache, keys.block_size, keys.num_blocks);
  const std::span<const int32_t> indptr = keys.indptr;
  const std::span<const Slot> slots = keys.slots;
  PAGEDKV_CHECK(params.window_left == -1 && params.sink_tokens == 0 && params.chunk_size == 0,
                "{}: window_left {} / sink_tokens {} / chunk_size {} must be -1 / 0 / 0: the slot "
                "list is the mask",
                kFn, params.window_left, params.sink_tokens, params.chunk_size);
  PAGEDKV_CHECK(!indptr.empty() && indptr[0] == 0, "{}: indptr must start with 0 (size {})", kFn,
                indptr.size());
  const int64_t rows = static_cast<int64_t>(indptr.size()) - 1;
  for (int64_t i = 0; i < rows; ++i) {
    PAGEDKV_CHECK(indptr[i + 1] >= indptr[i], "{}: indptr decreases at row {} ({} -> {})", kFn, i,
                  indptr[i], indptr[i + 1]);
  }
  PAGEDKV_CHECK(static_cast<int64_t>(slots.size()) == indptr[rows],
                "{}: {} slots but indptr ends at {}", kFn, slots.size(), indptr[rows]);
  const int64_t num_slots = static_cast<int64_t>(cache.num_blocks) * cache.block_size;
  for (size_t j = 0; j < slots.size(); ++j) {
    PAGEDKV_CHECK(slots[j] >= 0 && slots[j] < num_slots,
                  "{}: slot {} (entry {}) out of range [0, {})", kFn, slots[j], j, num_slots);
  }
  const int64_t row_elems = static_cast<int64_t>(params.num_heads) * params.head_dim;
  PAGEDKV_CHECK(static_cast<int64_t>(q.size()) == rows * row_elems &&
                    static_cast<int64_t>(out.size()) == rows * row_elems,
                "{}: q has {} and out {} elements, expected {} rows x {} heads x {} dims", kFn,
                q.size(), out.size(), rows, params.num_heads, params.head_dim);
  PAGEDKV_CHECK(probs.empty() || probs.size() == slots.size(),
                "{}: probs has {} elements, expected 0 or {} (one per slot)", kFn, probs.size(),
                slots.size());

  const int32_t head_dim = params.head_dim;
  const int32_t group = params.num_heads / params.num_kv_heads;
  const float scale = params.softmax_scale();
  for (float& p : probs) p = 0.0f;
  std::vector<float> scores;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t begin = indptr[i];
    const int64_t n = indptr[i + 1] - begin;
    scores.resize(static_cast<size_t>(n));
    for (int32_t h = 0; h < params.num_heads; ++h) {
      const float* qh = q.data() + i * row_elems + static_cast<int64_t>(h) * head_dim;
      float* oh = out.data() + i * row_elems + static_cast<int64_t>(h) * head_dim;
      const int32_t kv_head = h / group;
      const float key_scale = scale * cache.key_scale(kv_head);
      const float value_scale = cache.value_scale(kv_head);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        const int64_t off = cache.slot_offset(slots[begin + j], kv_head);
        float dot = 0.0f;
        for (int32_t d = 0; d < head_dim; ++d)
          dot += qh[d] * load_as_f32(cache.k, cache.dtype, off + d);
        scores[j] = dot * key_scale;
        m = std::max(m, scores[j]);
      }
      for (int32_t d = 0; d < head_dim; ++d) oh[d] = 0.0f;
      if (n == 0) continue;
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - m);
        sum += scores[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < n; ++j) {
        const float p = scores[j] * inv;
        if (!probs.empty()) probs[begin + j] += p;
        const int64_t off = cache.slot_offset(slots[begin + j], kv_head);
        for (int32_t d = 0; d < head_dim; ++d)
          oh[d] += p * load_as_f32(cache.v, cache.dtype, off + d);
      }
      for (int32_t d = 0; d < head_dim; ++d) oh[d] *= value_scale;
    }
  }
}

}  // namespace pagedkv
