// The paged cache mode on a CUDA device (`pagedkv generate --device cuda`): the host
// KVCacheManager decides slots and copy-on-write copies exactly as for the CPU paged backend;
// the pools live in a cuda::DeviceKVCache and attention runs through cuda::DeviceDecodeRunner,
// whose calls take the same host spans as HostKVCache::write and paged_*_attention.
// Compiled in every build: without CUDA, make_cuda_paged_backend only reports why not.

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "model/kv_backend.hpp"
#include "pagedkv/config.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/supported_configs.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#if PAGEDKV_WITH_CUDA
#include "pagedkv/cuda/device_decode_runner.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"
#endif

namespace pagedkv::model {

#if PAGEDKV_WITH_CUDA
namespace {

class CudaPagedBackend final : public KVBackend {
 public:
  explicit CudaPagedBackend(const KVBackendConfig& c)
      : manager_(KVCacheManagerConfig{c.num_blocks, c.block_size}),
        cache_(KVCacheConfig{c.num_layers, c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim,
                             DType::kF32, KVLayout::kHND}),
        block_bytes_(kv_bytes_for_tokens(c.num_layers, c.num_kv_heads, c.head_dim, DType::kF32,
                                         c.block_size)) {
    params_.num_heads = c.num_heads;
    params_.num_kv_heads = c.num_kv_heads;
    params_.head_dim = c.head_dim;  // scale 0: 1/sqrt(head_dim), as Llama
  }

  CacheMode mode() const override { return CacheMode::kPaged; }
  void add_sequence(SeqId seq) override { manager_.add_sequence(seq); }
  void free_sequence(SeqId seq) override { manager_.free_sequence(seq); }
  int64_t num_tokens(SeqId seq) const override { return manager_.num_tokens(seq); }

  void begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) override {
    detail::append_step(manager_, seqs, n_new, [this](std::span<const BlockCopy> copies) {
      cache_.copy_blocks(copies, runner_.stream());
    });
    manager_.batch_metadata(seqs, n_new, meta_);  // reuses meta_'s storage every step
    decode_ = std::all_of(n_new.begin(), n_new.end(), [](int64_t n) { return n == 1; });
  }

  void attend(int32_t layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, std::span<float> out) override {
    // Copy-on-write copies were queued on the runner's stream, so they precede this write.
    runner_.write(cache_, layer, meta_.slot_mapping, k, v);
    if (decode_) {
      runner_.decode(params_, cache_, layer, meta_.padded.view(), q, out);
    } else {
      runner_.prefill(params_, cache_, layer, meta_.padded.view(), meta_.query_start, q, out);
    }
  }

  int64_t bytes_in_use() const override {
    const int64_t used = manager_.num_total_blocks() - manager_.num_free_blocks();
    return used * block_bytes_;
  }

 private:
  AttentionParams params_;
  KVCacheManager manager_;
  cuda::DeviceKVCache cache_;
  cuda::DeviceDecodeRunner runner_;
  int64_t block_bytes_;
  BatchMetadata meta_;
  bool decode_ = false;
};

}  // namespace
#endif  // PAGEDKV_WITH_CUDA

std::unique_ptr<KVBackend> make_cuda_paged_backend(const KVBackendConfig& config) {
  cuda::require_device();
  // Before any allocation, so an unsupported model fails with the supported set, not later in
  // the first attention call.
  cuda::check_decode_config(DType::kF32, config.head_dim, config.block_size);
#if PAGEDKV_WITH_CUDA
  return std::make_unique<CudaPagedBackend>(config);
#else
  throw Error("no CUDA device: pagedkv was built without CUDA (PAGEDKV_WITH_CUDA=0)");
#endif
}

}  // namespace pagedkv::model
