// _host_kv_cache_attention: the C++ HostKVCache path (set_scales, write, paged attention over
// its own pools) on the tests' inputs, so pytest can hold the ops on the engine's pools
// (write_kv + paged_*_attention with kv_dtype / k_scale / v_scale) to it byte for byte.
// Private (leading underscore): not part of the package's API, not in the stubs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv::py {

using namespace nb::literals;

namespace {

using F32 = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using I32 = nb::ndarray<const int32_t, nb::c_contig, nb::device::cpu>;
using I64 = nb::ndarray<const int64_t, nb::c_contig, nb::device::cpu>;
using Bytes = nb::ndarray<nb::numpy, uint8_t>;

/// The K (value false) or V pool of layer 0 as bytes [num_blocks, block bytes].
Bytes pool_bytes(const HostKVCache& cache, bool value) {
  const int32_t blocks = cache.config().num_blocks;
  std::vector<uint8_t> all;
  size_t half = 0;
  for (BlockId b = 0; b < blocks; ++b) {
    const std::vector<std::byte> bytes = cache.block_bytes(b);  // K then V
    half = bytes.size() / 2;
    const auto* first = reinterpret_cast<const uint8_t*>(bytes.data()) + (value ? half : 0);
    all.insert(all.end(), first, first + half);
  }
  auto* heap = new std::vector<uint8_t>(std::move(all));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  return Bytes(heap->data(), {static_cast<size_t>(blocks), half}, owner);
}

std::tuple<nb::object, Bytes, Bytes> host_kv_cache_attention(
    const F32& key, const F32& value, const I64& slot_mapping, const F32& q,
    const I32& block_tables, const I32& seq_lens, std::optional<std::vector<int32_t>> query_start,
    const std::string& kv_dtype, int32_t num_blocks, int32_t block_size, const std::string& layout,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale) {
  KVCacheConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.num_kv_heads = static_cast<int32_t>(key.shape(1));
  config.head_dim = static_cast<int32_t>(key.shape(2));
  config.dtype = parse_dtype(kv_dtype);
  config.layout = layout == "HND" ? KVLayout::kHND : KVLayout::kNHD;
  config.placement = KVPlacement::kSeparate;
  config.scale_granularity =
      k_scale.size() > 1 ? KVScaleGranularity::kPerHead : KVScaleGranularity::kPerTensor;
  HostKVCache cache(config);
  cache.set_scales(0, k_scale, v_scale);
  cache.write(0, {slot_mapping.data(), slot_mapping.size()},
              std::span<const float>(key.data(), key.size()),
              std::span<const float>(value.data(), value.size()));
  AttentionParams params;
  params.num_heads = static_cast<int32_t>(q.shape(1));
  params.num_kv_heads = config.num_kv_heads;
  params.head_dim = config.head_dim;
  const BlockTableView tables{block_tables.data(),
                              seq_lens.data(),
                              static_cast<int32_t>(block_tables.shape(0)),
                              static_cast<int32_t>(block_tables.shape(1)),
                              block_size,
                              num_blocks};
  std::vector<float> out(q.size());
  if (query_start) {
    paged_prefill_attention(params, cache.layer(0), tables, *query_start, {q.data(), q.size()},
                            out);
  } else {
    paged_decode_attention(params, cache.layer(0), tables, {q.data(), q.size()}, out);
  }
  auto* heap = new std::vector<float>(std::move(out));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  nb::object o = nb::cast(
      nb::ndarray<nb::numpy, float>(heap->data(), {q.shape(0), q.shape(1), q.shape(2)}, owner));
  return {o, pool_bytes(cache, false), pool_bytes(cache, true)};
}

}  // namespace

void bind_testing(nb::module_& m) {
  m.def("_host_kv_cache_attention", &host_kv_cache_attention, "key"_a, "value"_a, "slot_mapping"_a,
        "q"_a, "block_tables"_a, "seq_lens"_a, "query_start"_a.none(), "kv_dtype"_a, "num_blocks"_a,
        "block_size"_a, "layout"_a, "k_scale"_a, "v_scale"_a,
        "Tests only: one layer of a HostKVCache (separate pools) with these scales, the K/V "
        "written, attention over it: (out float32, K bytes, V bytes [num_blocks, block bytes]).");
}

}  // namespace pagedkv::py
