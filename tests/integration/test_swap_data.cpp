// Swap preemption with real storage: the manager's swap copies, carried out by HostKVCache,
// restore bit-identical K/V at new block ids (the metadata half is tests/metadata).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/storage/host_kv_cache.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::vector<BlockId> table_of(const KVCacheManager& m, SeqId s) {
  auto t = m.block_table(s);
  return {t.begin(), t.end()};
}

// Fills every slot of the given blocks with distinct values, through the storage API.
void write_pattern(HostKVCache& cache, std::span<const BlockId> blocks, float base) {
  const auto& c = cache.config();
  const int64_t row = int64_t{c.num_kv_heads} * c.head_dim;
  for (int32_t layer = 0; layer < c.num_layers; ++layer) {
    for (BlockId b : blocks) {
      std::vector<Slot> slots;
      std::vector<float> k, v;
      for (int32_t t = 0; t < c.block_size; ++t) {
        slots.push_back(int64_t{b} * c.block_size + t);
        for (int64_t e = 0; e < row; ++e) {
          k.push_back(base + static_cast<float>(layer * 1000 + b * 100 + t * 10) + e * 0.01f);
          v.push_back(-k.back());
        }
      }
      cache.write(layer, slots, k, v);
    }
  }
}

TEST(KVCacheManager, SwapOutAndInRestoresBitIdenticalDataAtNewIds) {
  const KVCacheConfig geom{.num_layers = 2,
                           .num_blocks = 6,
                           .block_size = 4,
                           .num_kv_heads = 2,
                           .head_dim = 8,
                           .dtype = DType::kF16};
  KVCacheConfig host_geom = geom;
  host_geom.num_blocks = 3;
  HostKVCache device(geom);
  HostKVCache host(host_geom);
  KVCacheManager m({.num_blocks = 6, .block_size = 4, .num_host_blocks = 3});
  m.add_sequence(1);
  ASSERT_TRUE(m.append_slots(1, 10));  // blocks 0, 1, 2
  write_pattern(device, m.block_table(1), 0.5f);
  std::vector<std::vector<std::byte>> before;
  for (BlockId b : m.block_table(1)) before.push_back(device.block_bytes(b));

  EXPECT_TRUE(m.can_swap_out(1));
  auto out = m.swap_out(1);
  ASSERT_TRUE(out);
  EXPECT_THAT(out->copies, ElementsAre(BlockCopy{0, 0}, BlockCopy{1, 1}, BlockCopy{2, 2}));
  for (const BlockCopy& c : out->copies) host.set_block_bytes(c.dst, device.block_bytes(c.src));
  EXPECT_TRUE(m.is_swapped(1));
  EXPECT_EQ(m.num_free_blocks(), 6);
  KVCacheStats st = m.stats();
  EXPECT_EQ(st.host_used_blocks, 3);
  EXPECT_EQ(st.num_swapped_sequences, 1);
  EXPECT_EQ(st.preemptions, 1);
  m.check_invariants();
  EXPECT_THAT([&] { (void)m.append_slots(1, 1); }, ThrowsMessage<Error>(HasSubstr("swapped out")));

  // Swap-out released 2, 1, 0 (tail first); the freed blocks are poisoned and someone else
  // takes 3, 4, 5, 2.
  device.fill_blocks(std::vector<BlockId>{0, 1, 2}, std::nanf(""));
  m.add_sequence(2);
  ASSERT_TRUE(m.append_slots(2, 16));
  EXPECT_THAT(table_of(m, 2), ElementsAre(3, 4, 5, 2));
  EXPECT_FALSE(m.can_swap_in(1));  // 2 blocks left, 3 needed
  EXPECT_EQ(m.swap_in(1), std::nullopt);
  EXPECT_TRUE(m.is_swapped(1));
  m.free_sequence(2);  // free list: 1, 0, 2, 5, 4, 3 (tail first)
  ASSERT_TRUE(m.can_swap_in(1));
  auto in = m.swap_in(1);
  ASSERT_TRUE(in);
  EXPECT_THAT(in->copies, ElementsAre(BlockCopy{0, 1}, BlockCopy{1, 0}, BlockCopy{2, 2}));
  for (const BlockCopy& c : in->copies) device.set_block_bytes(c.dst, host.block_bytes(c.src));
  EXPECT_THAT(table_of(m, 1), ElementsAre(1, 0, 2));  // different ids, remapped table
  for (size_t j = 0; j < before.size(); ++j) {
    EXPECT_EQ(device.block_bytes(m.block_table(1)[j]), before[j]) << "logical block " << j;
  }
  st = m.stats();
  EXPECT_EQ(st.swapped_out_blocks, 3);
  EXPECT_EQ(st.swapped_in_blocks, 3);
  EXPECT_EQ(st.host_used_blocks, 0);
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
