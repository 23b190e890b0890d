// DeviceKVCache: one cudaMalloc arena of per-layer K/V pools (separate or interleaved), a pinned
// host swap pool, batched swap copies. Kernel launches go through cuda::reshape_and_cache /
// cuda::copy_blocks.

#include "pagedkv/config.hpp"

#if PAGEDKV_WITH_CUDA

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "core/check.hpp"
#include "cuda/host/cuda_check.hpp"
#include "cuda/host/staging.hpp"
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
  PAGEDKV_CHECK(num_host_blocks >= 0, "DeviceKVCache: num_host_blocks must be >= 0, got {}",
                num_host_blocks);
  require_device();
  pool_block_bytes_ = int64_t{config_.block_size} * config_.num_kv_heads * config_.head_dim *
                      dtype_size(config_.dtype);
  const bool interleaved = config_.placement == KVPlacement::kInterleaved;
  num_copy_pools_ = interleaved ? config_.num_layers : 2 * config_.num_layers;
  copy_block_bytes_ = interleaved ? 2 * pool_block_bytes_ : pool_block_bytes_;
  arena_ = DeviceBuffer(bytes() - kv_scale_bytes(config_));
  arena_.zero();
  init_scales();
  std::vector<void*> ptrs;
  for (int32_t p = 0; p < num_copy_pools_; ++p) ptrs.push_back(copy_pool(p));
  pool_ptrs_ = DeviceBuffer(static_cast<int64_t>(ptrs.size() * sizeof(void*)));
  pool_ptrs_.upload(std::span<void* const>(ptrs));
  host_pool_ = PinnedHostBuffer(int64_t{num_host_blocks_} * block_bytes());
  synchronize(nullptr);
}

DeviceKVCache::~DeviceKVCache() = default;
DeviceKVCache::DeviceKVCache(DeviceKVCache&&) noexcept = default;
DeviceKVCache& DeviceKVCache::operator=(DeviceKVCache&&) noexcept = default;

std::byte* DeviceKVCache::copy_pool(int32_t p) const {
  return arena_.as<std::byte>() + int64_t{p} * config_.num_blocks * copy_block_bytes_;
}

std::byte* DeviceKVCache::pool(int32_t layer, bool value) const {
  if (config_.placement == KVPlacement::kInterleaved) {
    return copy_pool(layer) + (value ? pool_block_bytes_ : 0);  // block 0 K, block 0 V, ...
  }
  return copy_pool(2 * layer + (value ? 1 : 0));
}

KVLayerView DeviceKVCache::layer(int32_t layer) const {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "DeviceKVCache::layer: layer {} out of range [0, {})", layer, config_.num_layers);
  KVLayerView view = layer_view(config_, pool(layer, false), pool(layer, true));
  if (dtype_is_quantized(config_.dtype)) {
    const float* base = scales_.as<const float>() + 2 * int64_t{layer} * config_.num_kv_heads;
    view.k_scale = base;
    view.v_scale = base + config_.num_kv_heads;
  }
  return view;
}

void DeviceKVCache::write(int32_t layer, std::span<const Slot> slot_mapping,
                          std::span<const float> k, std::span<const float> v, Stream stream) {
  constexpr const char* kFn = "DeviceKVCache::write";
  const KVCacheConfig& c = config_;
  PAGEDKV_CHECK(layer >= 0 && layer < c.num_layers, "{}: layer {} out of range [0, {})", kFn, layer,
                c.num_layers);
  const auto num_tokens = static_cast<int64_t>(slot_mapping.size());
  const int64_t expected = num_tokens * c.num_kv_heads * c.head_dim;
  PAGEDKV_CHECK(
      static_cast<int64_t>(k.size()) == expected && static_cast<int64_t>(v.size()) == expected,
      "{}: k has {} and v {} elements, expected {} ({} tokens x {} kv heads x {} dims)", kFn,
      k.size(), v.size(), expected, num_tokens, c.num_kv_heads, c.head_dim);
  const int64_t num_slots = int64_t{c.num_blocks} * c.block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    PAGEDKV_CHECK(slot_mapping[t] < num_slots, "{}: slot {} of token {} out of range [0, {})", kFn,
                  slot_mapping[t], t, num_slots);
  }
  if (num_tokens == 0) return;
  calibrate_if_unset(layer, k, v, stream);
  detail::ensure_bytes(slot_staging_, num_tokens * 8);
  detail::ensure_bytes(k_staging_, expected * 4);
  detail::ensure_bytes(v_staging_, expected * 4);
  slot_staging_.upload(slot_mapping.data(), num_tokens * 8, 0, stream);
  k_staging_.upload(k.data(), expected * 4, 0, stream);
  v_staging_.upload(v.data(), expected * 4, 0, stream);
  NewKV input;
  input.k = k_staging_.data();
  input.v = v_staging_.data();
  input.dtype = DType::kF32;
  input.slot_mapping = slot_staging_.as<const int64_t>();
  input.num_tokens = num_tokens;
  write(layer, input, stream);
  synchronize(stream);
}

void DeviceKVCache::write(int32_t layer, const NewKV& input, Stream stream) {
  PAGEDKV_CHECK(layer >= 0 && layer < config_.num_layers,
                "DeviceKVCache::write: layer {} out of range [0, {})", layer, config_.num_layers);
  PAGEDKV_CHECK(!dtype_is_quantized(config_.dtype) || input.num_tokens == 0 ||
                    scales_set_[static_cast<size_t>(layer)],
                "DeviceKVCache::write: layer {} ({}) has no scales yet: device inputs are not "
                "calibrated, call set_scales (or write host spans once, which calibrates)",
                layer, dtype_name(config_.dtype));
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
  cuda::copy_blocks(pool_pointers(), num_copy_pools_, copy_block_bytes_,
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
  const auto dev_pitch = static_cast<size_t>(copy_block_bytes_);
  // One 2D copy per copy pool per run: a run of n consecutive blocks is n rows of
  // copy_block_bytes, contiguous in the device pool and host_pitch apart in the block-major
  // host pool. Copy pool p's block is bytes [p, p + 1) x copy_block_bytes of a host block in
  // both placements (per layer K then V).
  for (const Run& run : consecutive_runs(pairs)) {
    const BlockCopy& first = pairs[run.first];
    const BlockId dev_block = out ? first.src : first.dst;
    const BlockId host_block = out ? first.dst : first.src;
    for (int32_t p = 0; p < num_copy_pools_; ++p) {
      std::byte* dev = copy_pool(p) + int64_t{dev_block} * copy_block_bytes_;
      std::byte* host =
          host_pool_.data() + int64_t{host_block} * block_bytes() + int64_t{p} * copy_block_bytes_;
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

std::byte* DeviceKVCache::host_copy_pool(const HostKVCache& host, int32_t p) const {
  // A HostKVCache layer is either two pools (K at view.k, V at view.v) or, interleaved, one
  // pool starting at view.k; both are laid out as the device's copy pools (without the host's
  // 64-byte padding between pools, which is why the copies go pool by pool).
  if (config_.placement == KVPlacement::kInterleaved)
    return static_cast<std::byte*>(host.layer(p).k);
  const KVLayerView h = host.layer(p / 2);
  return static_cast<std::byte*>(p % 2 == 0 ? h.k : h.v);
}

void DeviceKVCache::upload(const HostKVCache& host) {
  check_config_equal("DeviceKVCache::upload", config_, host.config());
  const auto bytes = static_cast<size_t>(int64_t{config_.num_blocks} * copy_block_bytes_);
  for (int32_t p = 0; p < num_copy_pools_; ++p) {
    PAGEDKV_CUDA_CHECK(
        cudaMemcpy(copy_pool(p), host_copy_pool(host, p), bytes, cudaMemcpyHostToDevice));
  }
  upload_scales(host);
}

void DeviceKVCache::download(HostKVCache& host) const {
  check_config_equal("DeviceKVCache::download", config_, host.config());
  const auto bytes = static_cast<size_t>(int64_t{config_.num_blocks} * copy_block_bytes_);
  for (int32_t p = 0; p < num_copy_pools_; ++p) {
    PAGEDKV_CUDA_CHECK(
        cudaMemcpy(host_copy_pool(host, p), copy_pool(p), bytes, cudaMemcpyDeviceToHost));
  }
  download_scales(host);
}

void DeviceKVCache::zero(Stream stream) { arena_.zero(stream); }

}  // namespace pagedkv::cuda

#endif  // PAGEDKV_WITH_CUDA
