#include "pagedkv/attention_params.hpp"

#include <cmath>

namespace pagedkv {

float AttentionParams::softmax_scale() const {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace pagedkv
