#pragma once
/// @file layer_pattern.hpp
/// A model's per-layer attention from a layer pattern, as `pagedkv generate --layer-pattern`
/// takes it: one letter per layer, repeated cyclically over the model's layers.
///   F  full (causal) attention
///   S  sliding window of `window` positions (the query's own included), plus `sink_tokens`
///   C  chunked local attention of `chunk` positions (Llama 4)
/// Gemma 3 is "SSSSSF", gpt-oss "SF", Llama 4 "CCCF" (docs/model.md).

#include <cstdint>
#include <string_view>
#include <vector>

#include "pagedkv/metadata/hybrid_kv_cache_manager.hpp"

namespace pagedkv::model {

/// Longest pattern accepted, letters.
inline constexpr size_t kMaxLayerPatternLength = 4096;

/// [num_layers] the attention of each layer: layer l takes letter pattern[l % size]; each spec
/// has num_layers 1.
/// Errors: throws pagedkv::Error naming the value if the pattern is empty or longer than
/// kMaxLayerPatternLength, holds a letter other than F, S, C (naming it and its index), has an S
/// with window < 1 or a C with chunk < 1, sink_tokens < 0, sinks without an S, a window or chunk
/// given (> 0) with no letter that uses it, or num_layers < 1.
[[nodiscard]] std::vector<KVCacheGroupSpec> layer_attention_from_pattern(std::string_view pattern,
                                                                         int32_t num_layers,
                                                                         int32_t window,
                                                                         int32_t sink_tokens,
                                                                         int32_t chunk);

}  // namespace pagedkv::model
