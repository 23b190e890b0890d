#include "model/layer_pattern.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "pagedkv/error.hpp"

namespace pagedkv::model {

std::vector<KVCacheGroupSpec> layer_attention_from_pattern(std::string_view pattern,
                                                           int32_t num_layers, int32_t window,
                                                           int32_t sink_tokens, int32_t chunk) {
  const auto fail = [&](const std::string& why) {
    throw Error(fmt::format("layer pattern \"{}\": {}",
                            pattern.substr(0, std::min<size_t>(pattern.size(), 64)), why));
  };
  if (pattern.empty()) fail("empty (one letter per layer: F full, S sliding window, C chunked)");
  if (pattern.size() > kMaxLayerPatternLength) {
    fail(fmt::format("{} letters, more than {}", pattern.size(), kMaxLayerPatternLength));
  }
  if (num_layers < 1) fail(fmt::format("the model has {} layers", num_layers));
  bool has_window = false;
  bool has_chunk = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    if (ch == 'S') {
      has_window = true;
    } else if (ch == 'C') {
      has_chunk = true;
    } else if (ch != 'F') {
      // A byte outside printable ASCII (a UTF-8 letter's first byte) is shown by its value.
      const auto byte = static_cast<unsigned char>(ch);
      const std::string shown = byte >= 0x20 && byte < 0x7F ? fmt::format("'{}'", ch)
                                                            : fmt::format("byte 0x{:02X}", byte);
      fail(
          fmt::format("letter {} at index {} is not F (full), S (sliding window) or C "
                      "(chunked local)",
                      shown, i));
    }
  }
  if (has_window && window < 1) fail(fmt::format("S layers need a window >= 1, got {}", window));
  if (has_chunk && chunk < 1) fail(fmt::format("C layers need a chunk >= 1, got {}", chunk));
  if (sink_tokens < 0) fail(fmt::format("sink tokens must be >= 0, got {}", sink_tokens));
  if (!has_window && (window > 0 || sink_tokens > 0)) {
    fail(fmt::format("window {} / sinks {} given but no S layer uses them", window, sink_tokens));
  }
  if (!has_chunk && chunk > 0) fail(fmt::format("chunk {} given but no C layer uses it", chunk));

  std::vector<KVCacheGroupSpec> out(static_cast<size_t>(num_layers));
  for (size_t l = 0; l < out.size(); ++l) {
    KVCacheGroupSpec& s = out[l];
    switch (pattern[l % pattern.size()]) {
      case 'S':
        s.kind = GroupAttention::kSlidingWindow;
        s.window = window;
        s.sink_tokens = sink_tokens;
        break;
      case 'C':
        s.kind = GroupAttention::kChunkedLocal;
        s.chunk = chunk;
        break;
      default:
        break;
    }
  }
  return out;
}

}  // namespace pagedkv::model
