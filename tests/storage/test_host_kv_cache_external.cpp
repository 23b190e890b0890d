// HostKVCache over pools the caller owns (the ExternalKVPools constructor, issue 21 item 3):
// writes land at the byte offsets of vLLM's separate K/V tensors and FlashInfer's combined
// [num_blocks, 2, block] tensor, computed here from the shapes alone; copy_blocks and the CPU
// attention kernels over its layer views equal an owning cache holding the same data; nothing
// is allocated or zeroed; every documented error names its value.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr int32_t kLayers = 2;
constexpr int32_t kBlocks = 6;
constexpr int32_t kBlockSize = 4;
constexpr int32_t kHeads = 2;
constexpr int32_t kDim = 5;
constexpr int64_t kBlockElems = int64_t{kBlockSize} * kHeads * kDim;  // one block of K (or V)
constexpr int64_t kPoolElems = kBlocks * kBlockElems;

struct ExternalCase {
  KVPlacement placement;
  KVLayout layout;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<ExternalCase>& info) {
  return std::string(info.param.placement == KVPlacement::kSeparate ? "separate_" : "combined_") +
         (info.param.layout == KVLayout::kHND ? "hnd_" : "nhd_") +
         std::string(dtype_name(info.param.dtype));
}

KVCacheConfig config_of(const ExternalCase& c) {
  return {.num_layers = kLayers,
          .num_blocks = kBlocks,
          .block_size = kBlockSize,
          .num_kv_heads = kHeads,
          .head_dim = kDim,
          .dtype = c.dtype,
          .layout = c.layout,
          .placement = c.placement};
}

/// The caller's memory, as an engine allocates it: per layer, separate K and V tensors
/// [num_blocks, block] (vLLM) or one combined [num_blocks, 2, block] tensor (FlashInfer),
/// each filled with the byte 0xA5 so that a byte the cache must not touch shows.
struct CallerPools {
  explicit CallerPools(const ExternalCase& c) : placement(c.placement), esize(dtype_size(c.dtype)) {
    const size_t per_tensor = static_cast<size_t>(2 * kPoolElems * esize);  // K+V or combined
    for (int32_t l = 0; l < kLayers; ++l) {
      // Allocated as floats: 4-byte aligned for every dtype (the constructor requires the
      // dtype's alignment).
      memory.emplace_back((per_tensor + 3) / 4);
      std::memset(memory.back().data(), 0xA5, per_tensor);
    }
  }
  std::byte* base(int32_t l) { return reinterpret_cast<std::byte*>(memory[l].data()); }
  std::vector<ExternalKVPools> pools() {
    std::vector<ExternalKVPools> out;
    for (int32_t l = 0; l < kLayers; ++l) {
      // Separate: K tensor then V tensor in the same allocation (disjoint halves); combined:
      // V of block 0 is one block of K after the combined tensor's first byte.
      const int64_t v_off = placement == KVPlacement::kSeparate ? kPoolElems : kBlockElems;
      out.push_back({base(l), base(l) + v_off * esize});
    }
    return out;
  }
  /// Byte offset, from base(l), of element d of (slot, head) of K (value false) or V, from
  /// the tensors' shapes: block = slot / block_size, token = slot % block_size; within a block
  /// NHD is [block_size, heads, dim], HND [heads, block_size, dim].
  int64_t byte_offset(KVLayout layout, Slot slot, int32_t head, int32_t d, bool value) const {
    const int64_t block = slot / kBlockSize;
    const int64_t token = slot % kBlockSize;
    const int64_t inner = layout == KVLayout::kNHD ? (token * kHeads + head) * kDim + d
                                                   : (head * kBlockSize + token) * kDim + d;
    int64_t elem = 0;
    if (placement == KVPlacement::kSeparate) {
      elem = (value ? kPoolElems : 0) + block * kBlockElems + inner;
    } else {
      elem = (block * 2 + (value ? 1 : 0)) * kBlockElems + inner;
    }
    return elem * esize;
  }

  KVPlacement placement;
  int64_t esize;
  std::vector<std::vector<float>> memory;  // [num_layers] allocations
};

std::vector<float> uniform(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& e : x) e = uni(rng);
  return x;
}

/// A pointer as the error messages print it ("0x7f..."; fmt and glibc's %p agree).
std::string fmt_pointer(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

/// x in the storage dtype's bytes (the conversion the write documents: RNE).
std::vector<std::byte> stored_bytes(DType dtype, float x) {
  std::vector<std::byte> b(static_cast<size_t>(dtype_size(dtype)));
  store_from_f32(b.data(), dtype, 0, x);
  return b;
}

class ExternalPools : public ::testing::TestWithParam<ExternalCase> {};

TEST_P(ExternalPools, WriteLandsAtTheTensorsOffsetsAndNowhereElse) {
  const ExternalCase c = GetParam();
  CallerPools mem(c);
  const std::vector<ExternalKVPools> pools = mem.pools();
  HostKVCache cache(config_of(c), pools);
  EXPECT_TRUE(cache.wraps_external_memory());
  // 8-bit: scales of 1, so a stored byte is the value's own conversion (no calibration).
  if (dtype_is_quantized(c.dtype)) cache.set_scales(1, std::vector{1.0f}, std::vector{1.0f});
  EXPECT_EQ(cache.layer(1).k, pools[1].k);
  EXPECT_EQ(cache.layer(1).v, pools[1].v);

  // Slots 13 (block 3, token 1), 0, 23 (the last) and one padding row in layer 1.
  const std::vector<Slot> slots = {13, -1, 0, 23};
  const std::vector<float> k = uniform(slots.size() * kHeads * kDim, 1);
  const std::vector<float> v = uniform(k.size(), 2);
  cache.write(1, slots, k, v);

  std::vector<bool> written(mem.memory[1].size() * 4, false);
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0) continue;
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int32_t d = 0; d < kDim; ++d) {
        const size_t src = (i * kHeads + h) * kDim + d;
        for (bool value : {false, true}) {
          const int64_t off = mem.byte_offset(c.layout, slots[i], h, d, value);
          const std::vector<std::byte> want = stored_bytes(c.dtype, (value ? v : k)[src]);
          ASSERT_EQ(std::memcmp(mem.base(1) + off, want.data(), want.size()), 0)
              << "slot " << slots[i] << " head " << h << " dim " << d << " value " << value;
          for (int64_t b = 0; b < mem.esize; ++b) written[off + b] = true;
        }
      }
    }
  }
  // Every other byte of layer 1, and all of layer 0, still holds the caller's 0xA5.
  const size_t bytes = static_cast<size_t>(2 * kPoolElems * mem.esize);
  for (size_t b = 0; b < bytes; ++b) {
    if (!written[b]) ASSERT_EQ(mem.base(1)[b], std::byte{0xA5}) << "layer 1 byte " << b;
    ASSERT_EQ(mem.base(0)[b], std::byte{0xA5}) << "layer 0 byte " << b;
  }
}

TEST_P(ExternalPools, ReadsWhatTheCallerAlreadyStored) {
  // Nothing is zeroed: a value the engine put there before wrapping is what read() returns
  // (2.0 is exact in every dtype, int8 at its unset scale of 1 included).
  const ExternalCase c = GetParam();
  CallerPools mem(c);
  const std::vector<ExternalKVPools> pools = mem.pools();
  const int64_t off = mem.byte_offset(c.layout, 9, 1, 3, true);  // block 2, token 1
  const std::vector<std::byte> x = stored_bytes(c.dtype, 2.0f);
  std::memcpy(mem.base(0) + off, x.data(), x.size());
  const HostKVCache cache(config_of(c), pools);
  EXPECT_EQ(cache.read(0, 9, 1, true)[3], 2.0f);
  EXPECT_EQ(cache.read(0, 9, 1, false)[3],
            load_as_f32(mem.base(0) + mem.byte_offset(c.layout, 9, 1, 3, false), c.dtype, 0));
}

TEST_P(ExternalPools, CopyBlocksAndAttentionEqualAnOwningCache) {
  const ExternalCase c = GetParam();
  CallerPools mem(c);
  const std::vector<ExternalKVPools> pools = mem.pools();
  HostKVCache ext(config_of(c), pools);
  HostKVCache own(config_of(c));
  // Every slot of every layer written with the same values (the owning cache's zeros and the
  // caller's 0xA5 bytes both overwritten), then the same block copies.
  std::vector<Slot> all(kBlocks * kBlockSize);
  std::iota(all.begin(), all.end(), 0);
  for (int32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> k = uniform(all.size() * kHeads * kDim, 10 + l);
    const std::vector<float> v = uniform(k.size(), 20 + l);
    ext.write(l, all, k, v);
    own.write(l, all, k, v);
  }
  // Block 1 -> 4, then 4 -> 5 (applied in order: block 1's data ends in 5), and a no-op 2 -> 2.
  const std::vector<std::byte> block1 = own.block_bytes(1);
  const std::vector<BlockCopy> pairs = {{1, 4}, {4, 5}, {2, 2}};
  ext.copy_blocks(pairs);
  own.copy_blocks(pairs);
  for (BlockId b = 0; b < kBlocks; ++b) ASSERT_EQ(ext.block_bytes(b), own.block_bytes(b)) << b;
  EXPECT_EQ(ext.block_bytes(5), block1);
  // Block 5's K in the caller's layer 0 tensor now holds block 1's K bytes.
  const int64_t k1 = mem.byte_offset(c.layout, 1 * kBlockSize, 0, 0, false);
  const int64_t k5 = mem.byte_offset(c.layout, 5 * kBlockSize, 0, 0, false);
  EXPECT_EQ(std::memcmp(mem.base(0) + k1, mem.base(0) + k5, kBlockElems * mem.esize), 0);

  // Decode and a prefill chunk over both caches' views: the same kernel on the same values.
  const std::vector<int32_t> table = {5, 0, 3, 2, 4, -1};  // rows of 3 and 2 blocks
  const std::vector<int32_t> lens = {10, 7};
  const BlockTableView tables{table.data(), lens.data(), 2, 3, kBlockSize, kBlocks};
  const AttentionParams params{.num_heads = 4, .num_kv_heads = kHeads, .head_dim = kDim};
  for (int32_t l = 0; l < kLayers; ++l) {
    const std::vector<float> q = uniform(2 * 4 * kDim, 30 + l);
    std::vector<float> out_ext(q.size()), out_own(q.size());
    paged_decode_attention(params, ext.layer(l), tables, q, out_ext);
    paged_decode_attention(params, own.layer(l), tables, q, out_own);
    EXPECT_EQ(out_ext, out_own) << "decode, layer " << l;
    const std::vector<int32_t> query_start = {0, 3, 5};
    const std::vector<float> pq = uniform(5 * 4 * kDim, 40 + l);
    std::vector<float> pext(pq.size()), pown(pq.size());
    paged_prefill_attention(params, ext.layer(l), tables, query_start, pq, pext);
    paged_prefill_attention(params, own.layer(l), tables, query_start, pq, pown);
    EXPECT_EQ(pext, pown) << "prefill, layer " << l;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Storage, ExternalPools,
    ::testing::Values(ExternalCase{KVPlacement::kSeparate, KVLayout::kHND, DType::kF32},
                      ExternalCase{KVPlacement::kSeparate, KVLayout::kNHD, DType::kF32},
                      ExternalCase{KVPlacement::kInterleaved, KVLayout::kHND, DType::kF32},
                      ExternalCase{KVPlacement::kInterleaved, KVLayout::kNHD, DType::kF32},
                      ExternalCase{KVPlacement::kSeparate, KVLayout::kNHD, DType::kBF16},
                      ExternalCase{KVPlacement::kInterleaved, KVLayout::kHND, DType::kF16},
                      ExternalCase{KVPlacement::kInterleaved, KVLayout::kNHD, DType::kInt8}),
    case_name);

// --- errors ------------------------------------------------------------------------------

class ExternalErrors : public ::testing::Test {
 protected:
  ExternalCase separate{KVPlacement::kSeparate, KVLayout::kNHD, DType::kF32};
  ExternalCase combined{KVPlacement::kInterleaved, KVLayout::kNHD, DType::kF32};
};

TEST_F(ExternalErrors, LayerCountNamesBoth) {
  CallerPools mem(separate);
  std::vector<ExternalKVPools> pools = mem.pools();
  pools.pop_back();
  EXPECT_THAT([&] { HostKVCache cache(config_of(separate), pools); },
              ThrowsMessage<Error>(HasSubstr("1 layers of pools for a config of 2 layers")));
}

TEST_F(ExternalErrors, NullPointerNamesLayerAndPool) {
  CallerPools mem(separate);
  std::vector<ExternalKVPools> pools = mem.pools();
  pools[1].v = nullptr;
  EXPECT_THAT([&] { HostKVCache cache(config_of(separate), pools); },
              ThrowsMessage<Error>(HasSubstr("layer 1 v is null")));
  pools = mem.pools();
  pools[0].k = nullptr;
  EXPECT_THAT([&] { HostKVCache cache(config_of(separate), pools); },
              ThrowsMessage<Error>(HasSubstr("layer 0 k is null")));
}

TEST_F(ExternalErrors, MisalignedPointerNamesItAndTheDtype) {
  CallerPools mem(separate);
  std::vector<ExternalKVPools> pools = mem.pools();
  pools[1].k = static_cast<std::byte*>(pools[1].k) + 2;  // fp32 needs 4
  const std::string text = fmt_pointer(pools[1].k);
  EXPECT_THAT([&] { HostKVCache cache(config_of(separate), pools); },
              ThrowsMessage<Error>(AllOf(HasSubstr("layer 1 k (" + text + ") is not aligned"),
                                         HasSubstr("4-byte dtype fp32"))));
}

TEST_F(ExternalErrors, InterleavedVMustBeOneBlockAfterK) {
  CallerPools mem(combined);
  std::vector<ExternalKVPools> pools = mem.pools();
  // One block of K is 4 x 2 x 5 fp32 = 160 bytes; a v 4 bytes further is refused.
  pools[0].v = static_cast<std::byte*>(pools[0].v) + 4;
  EXPECT_THAT([&] { HostKVCache cache(config_of(combined), pools); },
              ThrowsMessage<Error>(AllOf(HasSubstr("layer 0 is interleaved"),
                                         HasSubstr("v must be k + 160 bytes"),
                                         HasSubstr("v " + fmt_pointer(pools[0].v)))));
  // v before k (a separate-pools pair handed to an interleaved config) as well.
  pools = mem.pools();
  std::swap(pools[1].k, pools[1].v);
  EXPECT_THAT([&] { HostKVCache cache(config_of(combined), pools); },
              ThrowsMessage<Error>(HasSubstr("layer 1 is interleaved")));
}

TEST_F(ExternalErrors, OverlappingPoolsAreRefused) {
  CallerPools mem(separate);
  std::vector<ExternalKVPools> pools = mem.pools();
  // Layer 0's V starts one block before the end of its K pool (960 bytes).
  pools[0].v = static_cast<std::byte*>(pools[0].k) + (kPoolElems - kBlockElems) * 4;
  EXPECT_THAT([&] { HostKVCache cache(config_of(separate), pools); },
              ThrowsMessage<Error>(
                  AllOf(HasSubstr("layer 0 v (" + fmt_pointer(pools[0].v) + ") overlaps layer 0 k"),
                        HasSubstr("each spans 960 bytes"))));
  // Two layers over one combined tensor.
  CallerPools two(combined);
  pools = two.pools();
  pools[1] = pools[0];
  EXPECT_THAT(
      [&] { HostKVCache cache(config_of(combined), pools); },
      ThrowsMessage<Error>(AllOf(HasSubstr("overlaps layer"), HasSubstr("each spans 1920 bytes"))));
}

TEST(ExternalPoolsOwning, OwningCacheDoesNotWrap) {
  const HostKVCache cache(KVCacheConfig{.num_blocks = 2});
  EXPECT_FALSE(cache.wraps_external_memory());
}

}  // namespace
}  // namespace pagedkv
