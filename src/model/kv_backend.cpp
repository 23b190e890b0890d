#include "model/kv_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/enum_names.hpp"
#include "model/cpu_paged_backend.hpp"
#include "model/hybrid_backend.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"

namespace pagedkv::model {

namespace {

constexpr ::pagedkv::detail::EnumName<CacheMode> kCacheModeNames[] = {
    {CacheMode::kPaged, "paged"},
    {CacheMode::kContiguous, "contiguous"},
    {CacheMode::kNone, "none"}};
constexpr ::pagedkv::detail::EnumName<Device> kDeviceNames[] = {{Device::kCpu, "cpu"},
                                                                {Device::kCuda, "cuda"}};

/// No cache: every step is a full prefill of each sequence's history into a scratch pool that
/// end_step() empties again, so nothing survives from one step to the next.
class NoCacheBackend final : public CpuPagedBackend {
 public:
  using CpuPagedBackend::CpuPagedBackend;
  CacheMode mode() const override { return CacheMode::kNone; }

  // Nothing is published: the scratch pool is emptied instead (begin_step records the seqs).
  void end_step() override {
    for (const SeqId s : step_seqs_) {
      manager_.free_sequence(s);
      manager_.add_sequence(s);
    }
    step_seqs_.clear();
  }
};

class ContiguousBackend final : public KVBackend {
 public:
  explicit ContiguousBackend(const KVBackendConfig& c)
      : layer_params_(detail::layer_params(c)), cache_(c.num_layers, c.num_kv_heads, c.head_dim) {}

  CacheMode mode() const override { return CacheMode::kContiguous; }
  void add_sequence(SeqId seq) override { cache_.add_sequence(seq); }
  void free_sequence(SeqId seq) override { cache_.free_sequence(seq); }
  int64_t num_tokens(SeqId seq) const override { return cache_.num_tokens(seq, 0); }

  void begin_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) override {
    detail::check_step(seqs, n_new);
    for (const SeqId s : seqs) {
      if (!cache_.has_sequence(s)) throw Error(fmt::format("kv backend: unknown sequence {}", s));
    }
    seqs_.assign(seqs.begin(), seqs.end());
    n_new_.assign(n_new.begin(), n_new.end());
  }

  void attend(int32_t layer, std::span<const float> q, std::span<const float> k,
              std::span<const float> v, std::span<float> out) override {
    const AttentionParams& params = layer_params_[static_cast<size_t>(layer)];
    const size_t q_row = static_cast<size_t>(params.num_heads) * params.head_dim;
    const size_t kv_row = static_cast<size_t>(params.num_kv_heads) * params.head_dim;
    size_t row = 0;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      const auto n = static_cast<size_t>(n_new_[i]);
      cache_.append(seqs_[i], layer, k.subspan(row * kv_row, n * kv_row),
                    v.subspan(row * kv_row, n * kv_row));
      reference_attention(params, q.subspan(row * q_row, n * q_row), cache_.keys(seqs_[i], layer),
                          cache_.values(seqs_[i], layer), cache_.num_tokens(seqs_[i], layer),
                          out.subspan(row * q_row, n * q_row));
      row += n;
    }
  }

  int64_t bytes_in_use() const override { return cache_.bytes_in_use(); }

 private:
  std::vector<AttentionParams> layer_params_;  // [num_layers], each layer's mask
  ReferenceKVCache cache_;
  std::vector<SeqId> seqs_;
  std::vector<int64_t> n_new_;
};

}  // namespace

namespace detail {

void check_step(std::span<const SeqId> seqs, std::span<const int64_t> n_new) {
  if (seqs.size() != n_new.size()) {
    throw Error(
        fmt::format("kv backend: {} sequences but {} new-token counts", seqs.size(), n_new.size()));
  }
}

void append_step(KVCacheManager& manager, std::span<const SeqId> seqs,
                 std::span<const int64_t> n_new,
                 const std::function<void(std::span<const BlockCopy>)>& copy_blocks) {
  check_step(seqs, n_new);
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto r = manager.append_slots(seqs[i], n_new[i]);
    if (!r) {
      throw Error(
          fmt::format("paged KV pool exhausted: sequence {} needs {} more blocks, {} of {} free",
                      seqs[i], manager.blocks_needed_to_append(seqs[i], n_new[i]),
                      manager.num_free_blocks(), manager.num_total_blocks()));
    }
    // No sequence is forked by generate, so there is never a shared block to copy; honoring
    // the contract keeps this correct if one ever is.
    if (!r->copies.empty()) copy_blocks(r->copies);
  }
}

}  // namespace detail

std::string_view device_name(Device device) {
  const std::string_view name = ::pagedkv::detail::enum_name<Device>(kDeviceNames, device);
  return name.empty() ? "?" : name;
}

std::optional<Device> parse_device(std::string_view name) {
  return ::pagedkv::detail::parse_enum<Device>(kDeviceNames, name);
}

void KVBackend::drop_prefix_cache() {
  throw Error(
      fmt::format("kv backend: the {} mode has no prefix cache to drop", cache_mode_name(mode())));
}

std::string_view cache_mode_name(CacheMode mode) {
  const std::string_view name = ::pagedkv::detail::enum_name<CacheMode>(kCacheModeNames, mode);
  return name.empty() ? "?" : name;
}

std::optional<CacheMode> parse_cache_mode(std::string_view name) {
  return ::pagedkv::detail::parse_enum<CacheMode>(kCacheModeNames, name);
}

std::unique_ptr<KVBackend> make_kv_backend(CacheMode mode, const KVBackendConfig& config,
                                           Device device) {
  const bool hybrid = !config.layer_attention.empty();
  if (hybrid) {
    if (std::cmp_not_equal(config.layer_attention.size(), config.num_layers)) {
      throw Error(fmt::format("kv backend: {} layer attention entries for {} layers",
                              config.layer_attention.size(), config.num_layers));
    }
    if (mode == CacheMode::kPaged && (config.prefix_caching || config.tiering.enabled())) {
      throw Error(
          "kv backend: a layer pattern runs the hybrid paged cache, which has no prefix caching "
          "or tiers here yet");
    }
  }
  if (device == Device::kCuda) {
    if (mode != CacheMode::kPaged) {
      throw Error(
          fmt::format("kv backend: the {} cache has no CUDA version (only paged runs on "
                      "the device)",
                      cache_mode_name(mode)));
    }
    return make_cuda_paged_backend(config);
  }
  switch (mode) {
    case CacheMode::kPaged:
      if (hybrid) {
        return std::make_unique<detail::HybridPagedBackend<HostKVCache, CpuPagedAttention>>(config);
      }
      if (config.prefix_caching || config.tiering.enabled()) {
        return make_prefix_paged_backend(config);
      }
      return std::make_unique<CpuPagedBackend>(config);
    case CacheMode::kContiguous:
      return std::make_unique<ContiguousBackend>(config);
    case CacheMode::kNone:
      return std::make_unique<NoCacheBackend>(config);
  }
  throw Error("kv backend: unknown cache mode");
}

}  // namespace pagedkv::model
