// HostBuffer: size, zero fill, alignment (cache line; 2 MiB when huge pages are advised), the
// huge-page advice itself where the kernel offers THP, moves, and the documented error.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/storage/host_buffer.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

constexpr int64_t kMiB = int64_t{1} << 20;

bool all_zero(const HostBuffer& b) {
  return std::all_of(b.data(), b.data() + b.size(), [](std::byte x) { return x == std::byte{0}; });
}

uintptr_t address(const HostBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); }

/// The THP mode the kernel reports ("always", "madvise", "never"), or "" if not Linux / no THP.
std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "";
  const auto open = line.find('[');
  const auto close = line.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : line.substr(open + 1, close - open - 1);
}

TEST(HostBuffer, EmptyAndSmall) {
  const HostBuffer empty(0);
  EXPECT_EQ(empty.size(), 0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_FALSE(empty.huge_pages_advised());

  const HostBuffer small(1000);  // below the huge-page size: never advised, cache-line aligned
  EXPECT_EQ(small.size(), 1000);
  EXPECT_EQ(address(small) % HostBuffer::kAlignment, 0u);
  EXPECT_FALSE(small.huge_pages_advised());
  EXPECT_TRUE(all_zero(small));
}

TEST(HostBuffer, LargeIsHugePageAlignedAndZero) {
  // 5 MiB + 3 bytes: two whole huge pages and a tail that cannot be one.
  const HostBuffer big(5 * kMiB + 3);
  EXPECT_EQ(big.size(), 5 * kMiB + 3);
  EXPECT_EQ(address(big) % HostBuffer::kHugePageBytes, 0u);
  EXPECT_TRUE(all_zero(big));
  const std::string mode = thp_mode();
  if (mode == "always" || mode == "madvise") {
    EXPECT_TRUE(big.huge_pages_advised()) << "THP mode " << mode;
  } else {
    std::printf("THP mode '%s': the advice may be refused, not checked\n", mode.c_str());
  }
}

TEST(HostBuffer, HugePagesOff) {
  const HostBuffer plain(3 * kMiB, HostMemoryOptions{.huge_pages = false});
  EXPECT_FALSE(plain.huge_pages_advised());
  EXPECT_EQ(address(plain) % HostBuffer::kAlignment, 0u);
  EXPECT_TRUE(all_zero(plain));
}

TEST(HostBuffer, MoveTransfersOwnership) {
  HostBuffer a(4096);
  a.as<float>()[10] = 2.5f;
  std::byte* const p = a.data();
  HostBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), 4096);
  EXPECT_EQ(b.as<float>()[10], 2.5f);
  HostBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
}

TEST(HostBuffer, SizesAroundTheHugePageThreshold) {
  // 1 and 63 bytes (less than one alignment unit), one byte short of the threshold (never
  // advised, cache-line aligned) and exactly the threshold (one whole huge page, 2 MiB aligned).
  for (int64_t bytes : {int64_t{1}, int64_t{63}, HostBuffer::kHugePageBytes - 1}) {
    SCOPED_TRACE(bytes);
    const HostBuffer b(bytes);
    EXPECT_EQ(b.size(), bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(address(b) % HostBuffer::kAlignment, 0u);
    EXPECT_FALSE(b.huge_pages_advised());
    EXPECT_TRUE(all_zero(b));
  }
  const HostBuffer exact(HostBuffer::kHugePageBytes);
  EXPECT_EQ(exact.size(), HostBuffer::kHugePageBytes);
  EXPECT_EQ(address(exact) % HostBuffer::kHugePageBytes, 0u);
  EXPECT_TRUE(all_zero(exact));
  const std::string mode = thp_mode();
  if (mode == "always" || mode == "madvise") EXPECT_TRUE(exact.huge_pages_advised());
}

TEST(HostBuffer, MovedFromIsEmpty) {
  // A moved-from buffer must not report the bytes it no longer owns: size() > 0 with
  // data() == nullptr sends a caller that loops over [data(), data() + size()) to address 0.
  HostBuffer a(3 * kMiB);
  const bool advised = a.huge_pages_advised();
  HostBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the state under test
  EXPECT_EQ(a.size(), 0);
  EXPECT_FALSE(a.huge_pages_advised());
  EXPECT_EQ(b.size(), 3 * kMiB);
  EXPECT_EQ(b.huge_pages_advised(), advised);

  HostBuffer c(100);
  c = std::move(b);  // the old 100 bytes are freed, c takes b's
  EXPECT_EQ(c.size(), 3 * kMiB);
  EXPECT_EQ(c.huge_pages_advised(), advised);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), 0);
  EXPECT_FALSE(b.huge_pages_advised());
  EXPECT_TRUE(all_zero(c));
}

TEST(HostBuffer, SelfMoveKeepsTheBuffer) {
  HostBuffer a(4096);
  a.as<int32_t>()[7] = 42;
  std::byte* const p = a.data();
  HostBuffer& alias = a;  // through a reference: the compiler's self-move warning stays quiet
  a = std::move(alias);
  EXPECT_EQ(a.data(), p);
  EXPECT_EQ(a.size(), 4096);
  EXPECT_EQ(a.as<int32_t>()[7], 42);
}

TEST(HostBuffer, NegativeSizeNamesIt) {
  EXPECT_THAT([] { HostBuffer b(-5); }, ThrowsMessage<Error>(HasSubstr("-5")));
}

TEST(HostBuffer, HostKVCacheWithAndWithoutHugePagesHoldsTheSameValues) {
  // 4 layers x 64 blocks x 16 tokens x 4 heads x 64 dims x 4 B = 4 MiB per pool: large enough
  // for the advice; the option changes the memory backing only.
  KVCacheConfig c{.num_layers = 4,
                  .num_blocks = 64,
                  .block_size = 16,
                  .num_kv_heads = 4,
                  .head_dim = 64,
                  .dtype = DType::kF32};
  HostKVCache with(c);
  HostKVCache without(c, HostMemoryOptions{.huge_pages = false});
  EXPECT_EQ(with.bytes(), without.bytes());
  const std::vector<Slot> slots = {5, 700};
  std::vector<float> k(2 * 4 * 64), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i) * 0.5f;
    v[i] = -static_cast<float>(i);
  }
  with.write(3, slots, k, v);
  without.write(3, slots, k, v);
  for (HostKVCache* cache : {&with, &without}) {
    for (int32_t t = 0; t < 2; ++t) {
      for (int32_t h = 0; h < 4; ++h) {
        const auto first = k.begin() + (t * 4 + h) * 64;
        EXPECT_EQ(cache->read(3, slots[t], h, false), std::vector<float>(first, first + 64));
        const auto vfirst = v.begin() + (t * 4 + h) * 64;
        EXPECT_EQ(cache->read(3, slots[t], h, true), std::vector<float>(vfirst, vfirst + 64));
      }
    }
    EXPECT_EQ(cache->read(2, slots[1], 0, false), std::vector<float>(64, 0.0f));  // zero fill
  }
}

}  // namespace
}  // namespace pagedkv
