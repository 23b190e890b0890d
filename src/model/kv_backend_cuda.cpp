// The paged cache mode on a CUDA device (`pagedkv generate --device cuda`): the one paged
// backend (paged_backend.hpp) over a cuda::DeviceKVCache, with cuda::DeviceDecodeRunner as its
// attention. The host KVCacheManager decides slots and copy-on-write copies exactly as for the
// CPU paged backend. Compiled in every build: without CUDA, make_cuda_paged_backend only
// reports why not.

#include <memory>

#include "model/kv_backend.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/supported_configs.hpp"
#include "pagedkv/error.hpp"
#if PAGEDKV_WITH_CUDA
#include "model/hybrid_backend.hpp"
#include "model/paged_backend.hpp"
#include "pagedkv/cuda/device_decode_runner.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::model {

std::unique_ptr<KVBackend> make_cuda_paged_backend(const KVBackendConfig& config) {
  cuda::require_device();
  // Before any allocation, so an unsupported model fails with the supported set, not later in
  // the first attention call.
  cuda::check_decode_config(DType::kF32, config.head_dim, config.block_size);
#if PAGEDKV_WITH_CUDA
  if (!config.layer_attention.empty()) {
    return std::make_unique<
        detail::HybridPagedBackend<cuda::DeviceKVCache, cuda::DeviceDecodeRunner>>(config);
  }
  return std::make_unique<detail::PagedBackend<cuda::DeviceKVCache, cuda::DeviceDecodeRunner>>(
      config);
#else
  throw Error("no CUDA device: pagedkv was built without CUDA (PAGEDKV_WITH_CUDA=0)");
#endif
}

}  // namespace pagedkv::model
