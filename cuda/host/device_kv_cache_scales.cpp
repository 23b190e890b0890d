// DeviceKVCache's 8-bit scales: the host mirror every check reads, the device copy the kernels
// read (KVLayerView::k_scale / v_scale), and their calibration and transfer.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/check.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#include "pagedkv/storage/kv_write.hpp"

namespace pagedkv::cuda {

void DeviceKVCache::init_scales() {
  const auto n = static_cast<size_t>(2 * int64_t{config_.num_layers} * config_.num_kv_heads);
  host_scales_.assign(n, 1.0f);
  scales_set_.assign(static_cast<size_t>(config_.num_layers), false);
  if (!dtype_is_quantized(config_.dtype)) return;
  scales_ = DeviceBuffer(kv_scale_bytes(config_));
  scales_.upload(std::span<const float>(host_scales_));
}

std::span<const float> DeviceKVCache::scales(int32_t layer, bool value) const {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "DeviceKVCache::scales: layer {} out of range [0, {})", layer, config_.num_layers);
  const auto h = static_cast<size_t>(config_.num_kv_heads);
  return {host_scales_.data() + scale_offset(config_, layer, value), h};
}

void DeviceKVCache::set_scales(int32_t layer, std::span<const float> k_scale,
                               std::span<const float> v_scale, Stream stream) {
  constexpr const char* kFn = "DeviceKVCache::set_scales";
  PAGEDKV_CHECK(dtype_is_quantized(config_.dtype), "{}: dtype {} has no scales (8-bit only)", kFn,
                dtype_name(config_.dtype));
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers, "{}: layer {} out of range [0, {})", kFn,
                layer, config_.num_layers);
  const KVScales s = expand_kv_scales(kFn, config_, k_scale, v_scale);
  const int64_t heads = config_.num_kv_heads;
  const int64_t first = 2 * int64_t{layer} * heads;  // element index of the layer's K scales
  float* dst = host_scales_.data() + first;
  std::copy(s.k.begin(), s.k.end(), dst);
  std::copy(s.v.begin(), s.v.end(), dst + heads);
  // Pageable source: the copy has taken the values when upload returns.
  scales_.upload(dst, 2 * heads * 4, first * 4, stream);
  scales_set_[static_cast<size_t>(layer)] = true;
}

void DeviceKVCache::calibrate_if_unset(int32_t layer, std::span<const float> k,
                                       std::span<const float> v, Stream stream) {
  if (!dtype_is_quantized(config_.dtype) || scales_set_[static_cast<size_t>(layer)]) return;
  const KVScales s =
      calibrate_kv_scales(config_.dtype, config_.scale_granularity, config_.num_kv_heads,
                          config_.head_dim, k, v, config_.calibration_headroom);
  set_scales(layer, s.k, s.v, stream);
}

void DeviceKVCache::upload_scales(const HostKVCache& host) {
  if (!dtype_is_quantized(config_.dtype)) return;
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const std::span<const float> k = host.scales(l, false);
    const std::span<const float> v = host.scales(l, true);
    float* dst = host_scales_.data() + 2 * int64_t{l} * config_.num_kv_heads;
    std::copy(k.begin(), k.end(), dst);
    std::copy(v.begin(), v.end(), dst + config_.num_kv_heads);
    scales_set_[static_cast<size_t>(l)] = true;
  }
  scales_.upload(std::span<const float>(host_scales_));
  synchronize(nullptr);
}

void DeviceKVCache::download_scales(HostKVCache& host) const {
  if (!dtype_is_quantized(config_.dtype)) return;
  const bool per_head = config_.scale_granularity == KVScaleGranularity::kPerHead;
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    if (!scales_set_[static_cast<size_t>(l)]) continue;
    const std::span<const float> k = scales(l, false);
    const std::span<const float> v = scales(l, true);
    host.set_scales(l, per_head ? k : k.first(1), per_head ? v : v.first(1));
  }
}

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
