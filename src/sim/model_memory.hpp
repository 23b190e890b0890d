#pragma once
/// @file model_memory.hpp
/// Measured KV-cache growth of a real model: one sequence runs through the contiguous cache and
/// the paged cache in lockstep (model layer's LlamaModel::forward with two KVBackends), and
/// after every step the bytes each cache holds are read back next to the formula.
/// Part of the pagedkv_sim_model library (needs the model layer).

#include <cstdint>
#include <vector>

#include "model/llama.hpp"
#include "pagedkv/types.hpp"
#include "sim/memory_growth.hpp"

namespace pagedkv::sim {

/// Runs `model` on one sequence: the prompt in one prefill step, then greedy decoding (argmax
/// of the contiguous run's logits, fed to both caches) until `num_positions` positions are
/// cached. Returns one MeasuredStep per forward step (the first is the prefill).
/// Expected: contiguous_bytes == formula_bytes and paged_bytes == paged_expected_bytes at
/// every step (the caller checks and reports).
/// Units: positions in tokens, bytes as MeasuredStep says; the caches store fp32.
/// Errors: throws pagedkv::Error if the prompt is empty, longer than num_positions, if
/// num_positions exceeds the model's seq_len, block_size < 1, or a token id is out of range.
[[nodiscard]] std::vector<MeasuredStep> measure_model_growth(model::LlamaModel& model,
                                                             const std::vector<TokenId>& prompt,
                                                             int64_t num_positions,
                                                             int32_t block_size);

}  // namespace pagedkv::sim
