#pragma once
// Test helper: builds a paged KV cache whose block tables are deliberately scattered (physical
// block ids drawn from a seeded shuffle, so logical order != physical order), fills it with
// random K/V in [-1, 1], and computes the textbook reference for the same batch. Shared by the
// attention tests of every backend (plain CPU, SIMD, CUDA).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "common/attention_bound.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/reference/reference_attention.hpp"
#include "pagedkv/reference/reference_kv_cache.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv::testing {

/// One sequence of a batch: tokens in the cache (including the new ones) and new query tokens.
/// Decode: num_queries 1 (a padding row has context_len 0 and still one query row).
struct SeqSpec {
  int32_t context_len = 0;
  int32_t num_queries = 1;
};

/// A batch over a scattered paged cache, plus the unrounded fp32 K/V it was written from.
struct PagedScenario {
  static constexpr int32_t kLayer = 1;  ///< attended layer; layer 0 stays NaN-poisoned

  KVCacheConfig config;
  AttentionParams params;
  std::unique_ptr<HostKVCache> cache;
  std::vector<SeqSpec> seqs;
  std::vector<std::vector<BlockId>> tables;  // per sequence, logical order
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> padded;           // [num_seqs, max_blocks_per_seq], -1 past the last block
  std::vector<int32_t> context_lens;     // [num_seqs]
  std::vector<int32_t> query_start;      // [num_seqs + 1]
  std::vector<std::vector<float>> k, v;  // per sequence [context_len, num_kv_heads, head_dim]
  std::vector<float> q;                  // [query_start.back(), num_heads, head_dim]
  std::vector<BlockId> spare;            // NaN-filled blocks no table uses

  [[nodiscard]] BlockTableView view() const {
    return {padded.data(),      context_lens.data(), static_cast<int32_t>(seqs.size()),
            max_blocks_per_seq, config.block_size,   config.num_blocks};
  }
  [[nodiscard]] KVLayerView layer() const { return cache->layer(kLayer); }

  /// K (or V) of sequence `s` as stored, read back through the cache (i.e. rounded to dtype).
  [[nodiscard]] std::vector<float> stored(size_t s, bool value) const {
    std::vector<float> out;
    const int32_t bs = config.block_size;
    for (int64_t p = 0; p < seqs[s].context_len; ++p) {
      const Slot slot = static_cast<Slot>(tables[s][p / bs]) * bs + p % bs;
      for (int32_t h = 0; h < config.num_kv_heads; ++h) {
        const std::vector<float> x = cache->read(kLayer, slot, h, value);
        out.insert(out.end(), x.begin(), x.end());
      }
    }
    return out;
  }

  /// reference_attention per sequence over the stored (rounded) or the original fp32 K/V.
  /// Rows that see no key (context 0) are zeros, the kernels' convention.
  [[nodiscard]] std::vector<float> reference(bool rounded) const {
    const int64_t row = static_cast<int64_t>(params.num_heads) * params.head_dim;
    std::vector<float> out(q.size(), 0.0f);
    for (size_t s = 0; s < seqs.size(); ++s) {
      const int64_t n = query_start[s + 1] - query_start[s];
      if (n == 0 || seqs[s].context_len == 0) continue;
      const std::vector<float> ks = rounded ? stored(s, false) : k[s];
      const std::vector<float> vs = rounded ? stored(s, true) : v[s];
      const int64_t first = query_start[s] * row;
      reference_attention(params, std::span(q).subspan(first, n * row), ks, vs, seqs[s].context_len,
                          std::span(out).subspan(first, n * row));
    }
    return out;
  }
};

/// Builds a scenario. Physical blocks come from a shuffled list of all block ids (seeded), so
/// tables are scattered; `spare_blocks` extra blocks stay unused. Every block is first filled
/// with NaN in all layers, so a kernel that reads an unwritten slot, an unused block, or the
/// wrong layer produces NaN.
inline PagedScenario make_scenario(KVCacheConfig geometry, AttentionParams params,
                                   std::vector<SeqSpec> seqs, uint32_t seed,
                                   int32_t spare_blocks = 3) {
  PagedScenario s;
  s.params = params;
  s.seqs = std::move(seqs);
  const int32_t bs = geometry.block_size;
  int32_t needed = 0;
  s.max_blocks_per_seq = 1;
  for (const SeqSpec& spec : s.seqs) {
    const auto blocks = static_cast<int32_t>(blocks_for_tokens(spec.context_len, bs));
    needed += blocks;
    s.max_blocks_per_seq = std::max(s.max_blocks_per_seq, blocks);
  }
  geometry.num_layers = 2;
  geometry.num_blocks = needed + spare_blocks;
  if (dtype_is_quantized(geometry.dtype)) geometry.scale_granularity = KVScaleGranularity::kPerHead;
  s.config = geometry;
  s.cache = std::make_unique<HostKVCache>(geometry);
  if (dtype_is_quantized(geometry.dtype)) {
    // K/V are uniform in [-1, 1]: per-head scales that differ across heads (and between K and
    // V) and leave each head's largest value below the format's max, so nothing saturates and
    // a kernel that applies one head's scale to another is off by 25% or more.
    std::vector<float> ks, vs;
    for (int32_t h = 0; h < geometry.num_kv_heads; ++h) {
      ks.push_back((1.0f + 0.25f * static_cast<float>(h)) / dtype_max_finite(geometry.dtype));
      vs.push_back((1.5f + 0.5f * static_cast<float>(h)) / dtype_max_finite(geometry.dtype));
    }
    for (int32_t l = 0; l < geometry.num_layers; ++l) s.cache->set_scales(l, ks, vs);
  }

  std::mt19937 rng(seed);
  std::vector<BlockId> ids(static_cast<size_t>(geometry.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  s.cache->fill_blocks(ids, std::numeric_limits<float>::quiet_NaN());

  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int64_t token_elems = static_cast<int64_t>(geometry.num_kv_heads) * geometry.head_dim;
  size_t next = 0;
  s.query_start.push_back(0);
  for (const SeqSpec& spec : s.seqs) {
    std::vector<BlockId> table;
    for (int64_t b = 0; b < blocks_for_tokens(spec.context_len, bs); ++b) {
      table.push_back(ids[next++]);
    }
    std::vector<Slot> slots;
    for (int64_t p = 0; p < spec.context_len; ++p) {
      slots.push_back(static_cast<Slot>(table[p / bs]) * bs + p % bs);
    }
    std::vector<float> ks(static_cast<size_t>(spec.context_len * token_elems));
    std::vector<float> vs(ks.size());
    for (float& x : ks) x = uni(rng);
    for (float& x : vs) x = uni(rng);
    s.cache->write(PagedScenario::kLayer, slots, ks, vs);
    s.k.push_back(std::move(ks));
    s.v.push_back(std::move(vs));
    s.context_lens.push_back(spec.context_len);
    s.query_start.push_back(s.query_start.back() + spec.num_queries);
    std::vector<int32_t> row(static_cast<size_t>(s.max_blocks_per_seq), -1);
    std::copy(table.begin(), table.end(), row.begin());
    s.padded.insert(s.padded.end(), row.begin(), row.end());
    s.tables.push_back(std::move(table));
  }
  s.spare.assign(ids.begin() + static_cast<std::ptrdiff_t>(next), ids.end());
  s.q.resize(static_cast<size_t>(s.query_start.back()) * params.num_heads * params.head_dim);
  for (float& x : s.q) x = uni(rng);
  return s;
}

/// What a hybrid manager's local group does to a table (HybridKVCacheManager's release rule):
/// every block that no query of its sequence sees under s.params' mask (window, chunk, sinks)
/// is released, and its entry in the kernels' padded table points at a spare block full of NaN
/// (the null block), so a kernel that reads a hidden key produces NaN. s.tables (the logical
/// tables stored() and reference() read) keep the real blocks. No-op under full attention or
/// without a spare block. Returns the entries redirected.
inline int64_t release_hidden_blocks(PagedScenario& s) {
  if (s.spare.empty()) return 0;
  const int32_t bs = s.config.block_size;
  int64_t released = 0;
  for (size_t i = 0; i < s.seqs.size(); ++i) {
    const int64_t ctx = s.context_lens[i];
    const int64_t n = s.query_start[i + 1] - s.query_start[i];
    for (size_t b = 0; b < s.tables[i].size(); ++b) {
      bool seen = false;
      for (int64_t pos = std::max<int64_t>(0, ctx - n); pos < ctx && !seen; ++pos) {
        for (int64_t k = static_cast<int64_t>(b) * bs; k < static_cast<int64_t>(b + 1) * bs; ++k) {
          if (s.params.visible(k, pos)) {
            seen = true;
            break;
          }
        }
      }
      if (!seen) {
        s.padded[i * static_cast<size_t>(s.max_blocks_per_seq) + b] = s.spare.front();
        ++released;
      }
    }
  }
  return released;
}

/// max |a - b| over all elements (NaN anywhere gives NaN, which fails every <= bound).
inline double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

/// Relative error used for fp16/bf16: max |out - ref| / max |ref| (a max-norm ratio, so values
/// near zero do not blow it up; tighter than a per-element ratio where it matters).
inline double rel_error(std::span<const float> out, std::span<const float> ref) {
  double scale = 0.0;
  for (float r : ref) scale = std::max(scale, std::abs(static_cast<double>(r)));
  return max_abs_diff(out, ref) / std::max(scale, 1e-30);
}

/// The storage rounding error, bounded relatively: outputs over fp16/bf16 K/V against the
/// reference on the unrounded fp32 inputs (DESIGN.md "Precision"). Comparisons on the same stored
/// K/V use the absolute kAttentionMaxAbs of common/attention_bound.hpp instead.
constexpr double kLowPrecisionRel = 2e-2;

/// The storage error bound (rel_error vs the unrounded fp32 K/V) of a dtype in these scenarios
/// (uniform K/V, make_scenario's scales): fp16/bf16 kLowPrecisionRel; the 8-bit formats by
/// their mantissa (e4m3 3 bits: half an ulp is 2^-4 relative; e5m2 2 bits: 2^-3) and int8 by
/// its step (scale / 2 against values up to 127 steps), each about 1.5x the worst measured on
/// the attention grid (0.053, 0.107, 0.012). Not a kernel bound: kernels are held to kF32MaxAbs
/// against the reference over the same stored values.
inline double storage_rel_bound(DType dtype) {
  switch (dtype) {
    case DType::kFP8E4M3:
      return 8e-2;
    case DType::kFP8E5M2:
      return 1.6e-1;
    case DType::kInt8:
      return 2e-2;
    default:
      return kLowPrecisionRel;
  }
}

/// make_scenario for a test-case struct with the usual fields (block_size, num_kv_heads,
/// head_dim, dtype, layout, group, window_left, sink_tokens; placement and chunk_size when it
/// has them): geometry and params from the case, num_heads = num_kv_heads * group; the blocks
/// the mask hides from every query are released (release_hidden_blocks).
template <typename Case>
PagedScenario scenario_from_case(const Case& c, std::vector<SeqSpec> seqs, uint32_t seed) {
  KVCacheConfig geometry;
  geometry.block_size = c.block_size;
  geometry.num_kv_heads = c.num_kv_heads;
  geometry.head_dim = c.head_dim;
  geometry.dtype = c.dtype;
  geometry.layout = c.layout;
  if constexpr (requires { c.placement; }) geometry.placement = c.placement;
  AttentionParams params;
  params.num_kv_heads = c.num_kv_heads;
  params.num_heads = c.num_kv_heads * c.group;
  params.head_dim = c.head_dim;
  params.window_left = c.window_left;
  params.sink_tokens = c.sink_tokens;
  if constexpr (requires { c.chunk_size; }) params.chunk_size = c.chunk_size;
  PagedScenario s = make_scenario(geometry, params, std::move(seqs), seed);
  release_hidden_blocks(s);
  return s;
}

}  // namespace pagedkv::testing
