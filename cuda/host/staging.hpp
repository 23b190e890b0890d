#pragma once
// Device buffers that stage host inputs (DeviceKVCache::write, DeviceDecodeRunner): grown on
// demand, reused across calls. Only included when PAGEDKV_WITH_CUDA is 1. Not installed.

#include <algorithm>
#include <cstdint>

#include "pagedkv/cuda/device.hpp"

namespace pagedkv::cuda::detail {

/// Grows `buffer` to at least `bytes` (at least 256; contents not kept). Safe only between calls
/// that synchronize their stream before returning, so that no copy still reads the old buffer.
inline void ensure_bytes(DeviceBuffer& buffer, int64_t bytes) {
  if (buffer.bytes() < bytes) buffer = DeviceBuffer(std::max<int64_t>(bytes, 256));
}

}  // namespace pagedkv::cuda::detail
