// DeviceKVCache: one cudaMalloc arena of per-layer K/V pools, a pinned host swap pool, batched
// swap copies. Kernel launches go through cuda::reshape_and_cache / cuda::copy_blocks.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "detail/check.hpp"
#include "detail/cuda_check.hpp"
#include "pagedkv/cuda/device_kv_cache.hpp"

namespace pagedkv::cuda {

namespace {

/// Runs of consecutive pairs (src and dst both incrementing by one): [first, first + length).
struct Run {
  size_t first;
  int64_t length;
};

std::vector<Run> consecutive_runs(std::span<const BlockCopy> pairs) {
  std::vector<Run> runs;
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (!runs.empty()) {
      Run& r = runs.back();
      const BlockCopy& first = pairs[r.first];
      if (pairs[i].src == first.src + r.length && pairs[i].dst == first.dst + r.length) {
        ++r.length;
        continue;
      }
    }
    runs.push_back({i, 1});
  }
  return runs;
}

void check_config_equal(const char* fn, const KVCacheConfig& a, const KVCacheConfig& b) {
  PAGEDKV_CHECK(a.num_layers == b.num_layers, "{}: num_layers {} != {}", fn, a.num_layers,
                b.num_layers);
  PAGEDKV_CHECK(a.num_blocks == b.num_blocks, "{}: num_blocks {} != {}", fn, a.num_blocks,
                b.num_blocks);
  PAGEDKV_CHECK(a.block_size == b.block_size, "{}: block_size {} != {}", fn, a.block_size,
                b.block_size);
  PAGEDKV_CHECK(a.num_kv_heads == b.num_kv_heads, "{}: num_kv_heads {} != {}", fn, a.num_kv_heads,
                b.num_kv_heads);
  PAGEDKV_CHECK(a.head_dim == b.head_dim, "{}: head_dim {} != {}", fn, a.head_dim, b.head_dim);
  PAGEDKV_CHECK(a.dtype == b.dtype, "{}: dtype {} != {}", fn, dtype_name(a.dtype),
                dtype_name(b.dtype));
  PAGEDKV_CHECK(a.placement == b.placement, "{}: placement {} != {}", fn,
                static_cast<int>(a.placement), static_cast<int>(b.placement));
  PAGEDKV_CHECK(a.layout == b.layout, "{}: layout {} != {}", fn, static_cast<int>(a.layout),
                static_cast<int>(b.layout));
}

}  // namespace

DeviceKVCache::DeviceKVCache(const KVCacheConfig& config, int32_t num_host_blocks)
    : config_(config), num_host_blocks_(num_host_blocks) {
  validate(config_);
  PAGEDKV_CHECK(config_.placement == KVPlacement::kSeparate,
                "DeviceKVCache: placement {} (interleaved) is not supported on the device; use "
                "separate K and V pools",
                static_cast<int>(config_.placement));
  PAGEDKV_CHECK(num_host_blocks >= 0, "DeviceKVCache: num_host_blocks must be >= 0, got {}",
                num_host_blocks);
  require_device();
  pool_block_bytes_ = int64_t{config_.block_size} * config_.num_kv_heads * config_.head_dim *
                      dtype_size(config_.dtype);
  pool_bytes_ = pool_elements(config_) * dtype_size(config_.dtype);
  arena_ = DeviceBuffer(bytes());
  arena_.zero();
  std::vector<void*> ptrs;
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    ptrs.push_back(pool(l, false));
    ptrs.push_back(pool(l, true));
  }
  pool_ptrs_ = DeviceBuffer(static_cast<int64_t>(ptrs.size() * sizeof(void*)));
  pool_ptrs_.upload(std::span<void* const>(ptrs));
  host_pool_ = PinnedHostBuffer(int64_t{num_host_blocks_} * block_bytes());
  synchronize(nullptr);
}

DeviceKVCache::~DeviceKVCache() = default;
DeviceKVCache::DeviceKVCache(DeviceKVCache&&) noexcept = default;
DeviceKVCache& DeviceKVCache::operator=(DeviceKVCache&&) noexcept = default;

std::byte* DeviceKVCache::pool(int32_t layer, bool value) const {
  return arena_.as<std::byte>() + (2 * int64_t{layer} + (value ? 1 : 0)) * pool_bytes_;
}

KVLayerView DeviceKVCache::layer(int32_t layer) const {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "DeviceKVCache::layer: layer {} out of range [0, {})", layer, config_.num_layers);
  KVLayerView view;
  view.k = pool(layer, false);
  view.v = pool(layer, true);
  view.dtype = config_.dtype;
  view.num_blocks = config_.num_blocks;
  view.block_size = config_.block_size;
  view.num_kv_heads = config_.num_kv_heads;
  view.head_dim = config_.head_dim;
  layout_strides(config_.layout, config_.block_size, config_.num_kv_heads, config_.head_dim,
                 &view.block_stride, &view.head_stride, &view.token_stride);
  return view;
}

void DeviceKVCache::write(int32_t layer, const NewKV& input, Stream stream) {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "DeviceKVCache::write: layer {} out of range [0, {})", layer, config_.num_layers);
  reshape_and_cache(this->layer(layer), input, stream);
}

void DeviceKVCache::copy_blocks(std::span<const BlockCopy> pairs, Stream stream) {
  constexpr const char* kFn = "DeviceKVCache::copy_blocks";
  std::unordered_set<BlockId> srcs;
  std::unordered_set<BlockId> dsts;
  for (const BlockCopy& p : pairs) {
    PAGEDKV_CHECK(p.src >= 0 && p.src < config_.num_blocks,
                  "{}: source block {} out of range [0, {})", kFn, p.src, config_.num_blocks);
    PAGEDKV_CHECK(p.dst >= 0 && p.dst < config_.num_blocks,
                  "{}: destination block {} out of range [0, {})", kFn, p.dst, config_.num_blocks);
    PAGEDKV_CHECK(dsts.insert(p.dst).second, "{}: destination block {} appears twice", kFn, p.dst);
    srcs.insert(p.src);
  }
  for (const BlockCopy& p : pairs) {
    PAGEDKV_CHECK(!srcs.contains(p.dst),
                  "{}: block {} is both a source and a destination (pairs run in parallel)", kFn,
                  p.dst);
  }
  if (pairs.empty()) return;
  const auto need = static_cast<int64_t>(pairs.size_bytes());
  if (pair_staging_.bytes() < need) pair_staging_ = DeviceBuffer(need);
  pair_staging_.upload(pairs.data(), need, 0, stream);
  cuda::copy_blocks(pool_pointers(), 2 * config_.num_layers, pool_block_bytes_,
                    pair_staging_.as<const BlockCopy>(), static_cast<int32_t>(pairs.size()),
                    stream);
}

void DeviceKVCache::swap_out(std::span<const BlockCopy> pairs, Stream stream) {
  swap(pairs, true, stream);
}

void DeviceKVCache::swap_in(std::span<const BlockCopy> pairs, Stream stream) {
  swap(pairs, false, stream);
}

void DeviceKVCache::swap(std::span<const BlockCopy> pairs, bool out, Stream stream) {
  const char* fn = out ? "DeviceKVCache::swap_out" : "DeviceKVCache::swap_in";
  const int32_t num_src = out ? config_.num_blocks : num_host_blocks_;
  const int32_t num_dst = out ? num_host_blocks_ : config_.num_blocks;
  const char* src_kind = out ? "device" : "host";
  const char* dst_kind = out ? "host" : "device";
  std::unordered_set<BlockId> dsts;
  for (const BlockCopy& p : pairs) {
    PAGEDKV_CHECK(p.src >= 0 && p.src < num_src, "{}: source {} block {} out of range [0, {})", fn,
                  src_kind, p.src, num_src);
    PAGEDKV_CHECK(p.dst >= 0 && p.dst < num_dst, "{}: destination {} block {} out of range [0, {})",
                  fn, dst_kind, p.dst, num_dst);
    PAGEDKV_CHECK(dsts.insert(p.dst).second, "{}: destination {} block {} appears twice", fn,
                  dst_kind, p.dst);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  const auto host_pitch = static_cast<size_t>(block_bytes());
  const auto dev_pitch = static_cast<size_t>(pool_block_bytes_);
  // One 2D copy per pool per run: a run of n consecutive blocks is n rows of pool_block_bytes,
  // contiguous in the device pool and host_pitch apart in the block-major host pool.
  for (const Run& run : consecutive_runs(pairs)) {
    const BlockCopy& first = pairs[run.first];
    const BlockId dev_block = out ? first.src : first.dst;
    const BlockId host_block = out ? first.dst : first.src;
    for (int32_t p = 0; p < 2 * config_.num_layers; ++p) {
      std::byte* dev = pool(p / 2, p % 2 == 1) + int64_t{dev_block} * pool_block_bytes_;
      std::byte* host =
          host_pool_.data() + int64_t{host_block} * block_bytes() + int64_t{p} * pool_block_bytes_;
      if (out) {
        PAGEDKV_CUDA_CHECK(cudaMemcpy2DAsync(host, host_pitch, dev, dev_pitch, dev_pitch,
                                             static_cast<size_t>(run.length),
                                             cudaMemcpyDeviceToHost, s));
      } else {
        PAGEDKV_CUDA_CHECK(cudaMemcpy2DAsync(dev, dev_pitch, host, host_pitch, dev_pitch,
                                             static_cast<size_t>(run.length),
                                             cudaMemcpyHostToDevice, s));
      }
    }
  }
}

std::span<const std::byte> DeviceKVCache::host_block(int32_t block) const {
  PAGEDKV_CHECK(block >= 0 && block < num_host_blocks_,
                "DeviceKVCache::host_block: block {} out of range [0, {})", block,
                num_host_blocks_);
  return {host_pool_.data() + int64_t{block} * block_bytes(), static_cast<size_t>(block_bytes())};
}

void DeviceKVCache::upload(const HostKVCache& host) {
  check_config_equal("DeviceKVCache::upload", config_, host.config());
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const KVLayerView h = host.layer(l);
    PAGEDKV_CUDA_CHECK(
        cudaMemcpy(pool(l, false), h.k, static_cast<size_t>(pool_bytes_), cudaMemcpyHostToDevice));
    PAGEDKV_CUDA_CHECK(
        cudaMemcpy(pool(l, true), h.v, static_cast<size_t>(pool_bytes_), cudaMemcpyHostToDevice));
  }
}

void DeviceKVCache::download(HostKVCache& host) const {
  check_config_equal("DeviceKVCache::download", config_, host.config());
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    const KVLayerView h = host.layer(l);
    PAGEDKV_CUDA_CHECK(
        cudaMemcpy(h.k, pool(l, false), static_cast<size_t>(pool_bytes_), cudaMemcpyDeviceToHost));
    PAGEDKV_CUDA_CHECK(
        cudaMemcpy(h.v, pool(l, true), static_cast<size_t>(pool_bytes_), cudaMemcpyDeviceToHost));
  }
}

void DeviceKVCache::zero(Stream stream) { arena_.zero(stream); }

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
