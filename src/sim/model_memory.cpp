#include "sim/model_memory.hpp"

#include <algorithm>
#include <array>
#include <memory>

#include "core/check.hpp"
#include "model/kv_backend.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv::sim {

std::vector<MeasuredStep> measure_model_growth(model::LlamaModel& llama,
                                               const std::vector<TokenId>& prompt,
                                               int64_t num_positions, int32_t block_size) {
  const model::LlamaConfig& cfg = llama.config();
  PAGEDKV_CHECK(!prompt.empty(), "measure_model_growth: the prompt is empty");
  PAGEDKV_CHECK(block_size >= 1, "measure_model_growth: block size must be >= 1, got {}",
                block_size);
  PAGEDKV_CHECK(
      num_positions >= static_cast<int64_t>(prompt.size()) && num_positions <= cfg.seq_len,
      "measure_model_growth: positions {} must be in [prompt length {}, seq_len {}]", num_positions,
      prompt.size(), cfg.seq_len);

  // The pool holds exactly the blocks the run needs, so running out would be a bug.
  const auto num_blocks = static_cast<int32_t>(blocks_for_tokens(num_positions, block_size));
  const model::KVBackendConfig geometry = llama.backend_config(block_size, num_blocks);
  std::unique_ptr<model::KVBackend> contiguous =
      model::make_kv_backend(model::CacheMode::kContiguous, geometry);
  std::unique_ptr<model::KVBackend> paged =
      model::make_kv_backend(model::CacheMode::kPaged, geometry);
  constexpr SeqId kSeq = 0;
  contiguous->add_sequence(kSeq);
  paged->add_sequence(kSeq);

  // Formula inputs as the model stores them: fp32, its own L, H_kv and D.
  ModelPreset shape;
  shape.num_layers = cfg.n_layers;
  shape.num_kv_heads = cfg.n_kv_heads;
  shape.head_dim = cfg.head_size();
  shape.dtype = DType::kF32;

  std::vector<MeasuredStep> steps;
  std::vector<TokenId> feed = prompt;
  const std::array<SeqId, 1> seqs = {kSeq};
  for (int64_t step = 0;; ++step) {
    const std::array<int64_t, 1> n_new = {static_cast<int64_t>(feed.size())};
    const model::StepInput in{seqs, n_new, feed};
    const std::span<const float> logits = llama.forward(*contiguous, in, /*all_logits=*/false);
    // Greedy choice from the reference cache; the paged run gets the same token so both caches
    // grow identically even if their logits differ in the last bits.
    const auto next = static_cast<TokenId>(
        std::distance(logits.begin(), std::max_element(logits.begin(), logits.end())));
    (void)llama.forward(*paged, in, /*all_logits=*/false);

    MeasuredStep m;
    m.step = step;
    m.tokens = contiguous->num_tokens(kSeq);
    PAGEDKV_CHECK(paged->num_tokens(kSeq) == m.tokens,
                  "measure_model_growth: caches disagree on positions ({} vs {})",
                  paged->num_tokens(kSeq), m.tokens);
    m.formula_bytes = kv_bytes_for_tokens(shape.num_layers, shape.num_kv_heads, shape.head_dim,
                                          shape.dtype, m.tokens);
    m.contiguous_bytes = contiguous->bytes_in_use();
    m.paged_bytes = paged->bytes_in_use();
    m.paged_expected_bytes = paged_bytes_for_tokens(shape, m.tokens, block_size);
    steps.push_back(m);
    if (m.tokens >= num_positions) break;
    feed.assign(1, next);
  }
  return steps;
}

}  // namespace pagedkv::sim
