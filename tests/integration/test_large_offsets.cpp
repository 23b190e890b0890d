// int64 offsets in real calls: the cache write and the block copy (the code HostKVCache::write
// and ::copy_blocks run, storage/host_kv_cache_ops.hpp) and the CPU attention kernels, at block
// ids whose element offsets pass 2^31 and 2^32, on a pool of more than 2^32 fp16 elements (8 GiB)
// reserved as a sparse mapping: PROT_NONE and MAP_NORESERVE, only the blocks in use opened
// read-write, so only the touched pages are ever backed and a stray access faults.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "common/attention_bound.hpp"
#include "cpu/attention_plain.hpp"
#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/dtype.hpp"
#include "pagedkv/reference/reference_attention.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "storage/host_kv_cache_ops.hpp"

namespace pagedkv {
namespace {

#if defined(__linux__)

// HND fp16, 1 kv head, head_dim 128, block_size 16, interleaved: a block is 2048 elements of K
// then 2048 of V, so block b starts at element b * 4096 (byte b * 8192) of the pool.
constexpr int32_t kBlockSize = 16;
constexpr int32_t kHeadDim = 128;
constexpr int64_t kBlockElems = int64_t{kBlockSize} * kHeadDim;  // K (or V) of one block
constexpr int64_t kBlockStride = 2 * kBlockElems;                // elements, K and V
constexpr int64_t kBlockBytes = kBlockStride * 2;                // fp16
constexpr int32_t kNumBlocks = (1 << 20) + 8;                    // 2^32 + 32768 elements

// Element offsets: kLow 12288; kPast31 2^31 + 20480; kPast32 2^32 + 12288, which a 32-bit
// offset wraps onto kLow's (so a truncating write or read lands on live data, not a fault);
// kPast32b 2^32 + 28672 wraps onto block 7.
constexpr int32_t kLow = 3;
constexpr int32_t kPast31 = (1 << 19) + 5;
constexpr int32_t kPast32 = (1 << 20) + 3;
constexpr int32_t kPast32b = (1 << 20) + 7;
constexpr int32_t kSeven = 7;

/// Address space reserved without memory: mmap(PROT_NONE, MAP_NORESERVE); open() makes a range
/// readable and writable, and pages are backed only when first touched.
class SparseMapping {
 public:
  explicit SparseMapping(int64_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  ~SparseMapping() {
    if (base_ != nullptr) munmap(base_, static_cast<size_t>(bytes_));
  }
  SparseMapping(const SparseMapping&) = delete;
  SparseMapping& operator=(const SparseMapping&) = delete;

  [[nodiscard]] std::byte* data() const { return base_; }
  /// Opens [offset, offset + bytes) read-write (offset and bytes multiples of the page size).
  [[nodiscard]] bool open(int64_t offset, int64_t bytes) const {
    return mprotect(base_ + offset, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE) == 0;
  }
  /// Pages of the whole range resident in memory (mincore).
  [[nodiscard]] int64_t resident_pages() const {
    const int64_t page = sysconf(_SC_PAGESIZE);
    std::vector<unsigned char> in((static_cast<size_t>(bytes_ + page - 1) / page));
    if (mincore(base_, static_cast<size_t>(bytes_), in.data()) != 0) return -1;
    return std::count_if(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
  }

 private:
  int64_t bytes_;
  std::byte* base_ = nullptr;
};

/// The pool of kNumBlocks blocks on a sparse mapping, the blocks of the test opened.
class LargeOffsets : public ::testing::Test {
 protected:
  void SetUp() override {
    if (map_.data() == nullptr) GTEST_SKIP() << "mmap of " << kPoolBytes << " bytes refused";
    for (int32_t b : {kLow, kSeven, kPast31, kPast32, kPast32b}) {
      ASSERT_TRUE(map_.open(b * kBlockBytes, kBlockBytes)) << "block " << b;
    }
    KVCacheConfig c;
    c.num_blocks = kNumBlocks;
    c.block_size = kBlockSize;
    c.num_kv_heads = 1;
    c.head_dim = kHeadDim;
    c.dtype = DType::kF16;
    view_ = layer_view(c, map_.data(), map_.data() + kBlockElems * 2);
  }

  /// K (value false) or V element (token t of block b, dim d), read at an address computed
  /// here in bytes, independently of KVLayerView::offset.
  [[nodiscard]] float at(int64_t b, int64_t t, int64_t d, bool value) const {
    const std::byte* p =
        map_.data() + b * kBlockBytes + (value ? kBlockElems * 2 : 0) + (t * kHeadDim + d) * 2;
    return load_as_f32(p, DType::kF16, 0);
  }

  /// Fills block b's 16 tokens through write_slots with values exact in fp16 (multiples of
  /// 1/256 in [-1, 1)), distinct per block (`seed`); returns them as [token, dim] for K and V.
  std::pair<std::vector<float>, std::vector<float>> fill(int32_t b, int32_t seed) {
    std::vector<Slot> slots(kBlockSize);
    std::iota(slots.begin(), slots.end(), Slot{b} * kBlockSize);
    std::vector<float> k(static_cast<size_t>(kBlockElems)), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>(static_cast<int64_t>((i * 37 + seed * 101) % 512) - 256) / 256;
      v[i] = static_cast<float>(static_cast<int64_t>((i * 53 + seed * 29) % 512) - 256) / 256;
    }
    detail::write_slots(view_, slots, k, v);
    return {k, v};
  }

  static constexpr int64_t kPoolBytes = int64_t{kNumBlocks} * kBlockBytes;
  SparseMapping map_{kPoolBytes};
  KVLayerView view_;
};

TEST_F(LargeOffsets, WriteLandsAtTheInt64Offset) {
  ASSERT_GT(int64_t{kPast31} * kBlockStride, int64_t{1} << 31);
  ASSERT_GT(int64_t{kPast32} * kBlockStride, int64_t{1} << 32);
  const auto low = fill(kLow, 1);
  const auto past31 = fill(kPast31, 2);
  const auto past32 = fill(kPast32, 3);
  for (auto [b, kv] :
       {std::pair{kLow, &low}, std::pair{kPast31, &past31}, std::pair{kPast32, &past32}}) {
    for (int64_t i = 0; i < kBlockElems; ++i) {
      ASSERT_EQ(at(b, i / kHeadDim, i % kHeadDim, false), kv->first[i]) << "K block " << b;
      ASSERT_EQ(at(b, i / kHeadDim, i % kHeadDim, true), kv->second[i]) << "V block " << b;
    }
  }
  // Only the written blocks are backed: 3 blocks of 2 pages (plus any huge page the OS chose).
  const int64_t resident = map_.resident_pages();
  EXPECT_GE(resident, 6);
  EXPECT_LE(resident, 3 * 512 + 6);
}

TEST_F(LargeOffsets, CopyBlockMovesTheInt64Offsets) {
  const auto past32 = fill(kPast32, 4);
  const auto past31 = fill(kPast31, 5);
  fill(kSeven, 6);
  const std::vector<std::byte> seven(map_.data() + kSeven * kBlockBytes,
                                     map_.data() + (kSeven + 1) * kBlockBytes);
  detail::copy_block(view_, kPast32, kPast32b);  // both past 2^32
  detail::copy_block(view_, kPast31, kLow);      // down across 2^31
  for (int64_t i = 0; i < kBlockElems; ++i) {
    const int64_t t = i / kHeadDim, d = i % kHeadDim;
    ASSERT_EQ(at(kPast32b, t, d, false), past32.first[i]);
    ASSERT_EQ(at(kPast32b, t, d, true), past32.second[i]);
    ASSERT_EQ(at(kLow, t, d, false), past31.first[i]);
    ASSERT_EQ(at(kLow, t, d, true), past31.second[i]);
  }
  // Block 7, where a 32-bit offset of kPast32b lands, is untouched.
  EXPECT_EQ(std::memcmp(seven.data(), map_.data() + kSeven * kBlockBytes, seven.size()), 0);
}

TEST_F(LargeOffsets, AttentionReadsTheInt64Offsets) {
  // One sequence over blocks {kLow, kPast31, kPast32} (48 tokens), 4 query heads on the kv
  // head: the fast kernel (public), the plain one and the slot-list one against the reference
  // on the values written. kLow holds other data than kPast32, so reading kPast32 at a 32-bit
  // offset (= kLow's) changes the output.
  const int32_t table[] = {kLow, kPast31, kPast32};
  std::vector<float> k, v;
  for (auto [b, seed] : {std::pair{kLow, 7}, std::pair{kPast31, 8}, std::pair{kPast32, 9}}) {
    const auto kv = fill(b, seed);
    k.insert(k.end(), kv.first.begin(), kv.first.end());
    v.insert(v.end(), kv.second.begin(), kv.second.end());
  }
  AttentionParams params;
  params.num_heads = 4;
  params.num_kv_heads = 1;
  params.head_dim = kHeadDim;
  std::vector<float> q(4 * kHeadDim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 13) % 17) / 8 - 1;
  std::vector<float> ref(q.size());
  reference_attention(params, q, k, v, 3 * kBlockSize, ref);

  const int32_t context[] = {3 * kBlockSize};
  const BlockTableView tables{table, context, 1, 3, kBlockSize, kNumBlocks};
  const auto nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> fast(q.size(), nan), plain(q.size(), nan), listed(q.size(), nan);
  paged_decode_attention(params, view_, tables, q, fast);
  const std::vector<int32_t> rows = {0, 1};
  detail::plain_paged_prefill_attention(params, view_, tables, rows, q, plain);
  std::vector<Slot> slots;
  for (int32_t b : table) {
    for (int32_t t = 0; t < kBlockSize; ++t) slots.push_back(Slot{b} * kBlockSize + t);
  }
  const std::vector<int32_t> indptr = {0, 3 * kBlockSize};
  paged_attention_over_slots(params, view_, {indptr, slots, kBlockSize, kNumBlocks}, q, listed);
  EXPECT_TRUE(testing::attention_within(fast, ref, 4 * kHeadDim));
  EXPECT_TRUE(testing::attention_within(plain, ref, 4 * kHeadDim));
  EXPECT_TRUE(testing::attention_within(listed, ref, 4 * kHeadDim));
}

#else  // !__linux__

TEST(LargeOffsets, SkippedWithoutLinuxMmap) { GTEST_SKIP() << "needs mmap(MAP_NORESERVE)"; }

#endif

}  // namespace
}  // namespace pagedkv
