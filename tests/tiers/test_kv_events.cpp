// pagedkv/tiers/kv_events.hpp: the manager's log as vLLM's KV events and their JSON lines,
// checked on a real manager's reset (kRemoved per entry, then kAllCleared -> AllBlocksCleared).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/tiers/kv_events.hpp"

namespace pagedkv {
namespace {

using ::testing::ElementsAre;

TEST(KVEvents, PoolEventsOfAStoreAndAResetAreVllmsClasses) {
  KVCacheManager m(
      {.num_blocks = 4, .block_size = 2, .enable_prefix_caching = true, .enable_events = true});
  ASSERT_TRUE(m.add_sequence(1, std::vector<TokenId>{7, 8, 9}));
  EXPECT_EQ(m.commit(1, 3), 1);  // block 0 = {7, 8} published
  EXPECT_EQ(m.reset_prefix_cache(), 1);
  const std::vector<KVCacheEvent> log = m.take_events();
  ASSERT_EQ(log.size(), 3u);  // stored, removed, all cleared
  const BlockHash h = log[0].hash;
  EXPECT_EQ(h, block_hash(kRootBlockHash, std::vector<TokenId>{7, 8}, 0));

  const std::vector<KVEvent> ev = pool_events(log, 2, "POOL");
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].type, KVEvent::Type::kBlockStored);
  EXPECT_THAT(ev[0].block_hashes, ElementsAre(h));
  EXPECT_FALSE(ev[0].parent_block_hash.has_value());  // a first block: no parent
  EXPECT_THAT(ev[0].token_ids, ElementsAre(7, 8));
  EXPECT_EQ(ev[1].type, KVEvent::Type::kBlockRemoved);
  EXPECT_THAT(ev[1].block_hashes, ElementsAre(h));
  EXPECT_EQ(ev[2].type, KVEvent::Type::kAllBlocksCleared);
  EXPECT_TRUE(ev[2].block_hashes.empty());
  EXPECT_EQ(ev[2].medium, "POOL");

  const nlohmann::json j = nlohmann::json::parse(kv_event_batch_json(1.5, ev));
  EXPECT_EQ(j["ts"], 1.5);
  ASSERT_EQ(j["events"].size(), 3u);
  EXPECT_EQ(j["events"][0]["type"], "BlockStored");
  EXPECT_EQ(j["events"][0]["block_hashes"][0].get<uint64_t>(), h);
  EXPECT_EQ(j["events"][1],
            nlohmann::json({{"type", "BlockRemoved"}, {"block_hashes", {h}}, {"medium", "POOL"}}));
  EXPECT_EQ(j["events"][2], nlohmann::json({{"type", "AllBlocksCleared"}, {"medium", "POOL"}}));
}

}  // namespace
}  // namespace pagedkv
