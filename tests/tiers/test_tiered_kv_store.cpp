// TieredKVStore (tiered_kv_store.hpp): stores reach every tier, lookup counts leading blocks,
// loads confirm every record and fall through to a farther tier on a fault, bounded queues,
// promotion, events. Tiers are HostMemoryTiers, some wrapped in a test double that corrupts,
// fails or holds its calls.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/tiers/host_tier.hpp"
#include "pagedkv/tiers/tiered_kv_store.hpp"

namespace pagedkv {
namespace {

constexpr int32_t kBlock = 4;
constexpr int64_t kPayload = 32;

// A host tier whose get() can corrupt a byte or fail, and whose put() can be held at a gate.
class TestTier final : public KVTier {
 public:
  explicit TestTier(int64_t budget) : inner_(budget) {}
  std::string_view name() const override { return "test"; }
  TierMedium medium() const override { return TierMedium::kDisk; }
  PutOutcome put(std::string_view key, std::span<const std::byte> value) override {
    std::unique_lock lock(mu_);
    gate_cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    if (fail) return PutOutcome::kFailed;
    return inner_.put(key, value);
  }
  std::optional<std::vector<std::byte>> get(std::string_view key) override {
    if (fail) return std::nullopt;
    auto v = inner_.get(key);
    if (v && corrupt) (*v)[v->size() / 2] ^= std::byte{1};
    return v;
  }
  std::vector<bool> contains(std::span<const std::string> keys) override {
    if (fail) return std::vector<bool>(keys.size(), false);
    return inner_.contains(keys);
  }
  std::vector<std::string> take_evicted() override { return inner_.take_evicted(); }
  TierStats stats() const override { return inner_.stats(); }
  void hold() {
    std::lock_guard lock(mu_);
    open_ = false;
  }
  void release() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    gate_cv_.notify_all();
  }
  HostMemoryTier& inner() { return inner_; }
  std::atomic<bool> corrupt{false};
  std::atomic<bool> fail{false};

 private:
  HostMemoryTier inner_;
  std::mutex mu_;
  std::condition_variable gate_cv_;
  bool open_ = true;
};

std::vector<std::byte> payload(int seed) {
  std::vector<std::byte> p(kPayload);
  for (int64_t i = 0; i < kPayload; ++i) p[i] = static_cast<std::byte>(seed * 7 + i);
  return p;
}

class TieredStoreTest : public ::testing::Test {
 protected:
  void make(size_t max_stores = 1024, size_t max_loads = 64) {
    auto n = std::make_unique<TestTier>(1 << 20);
    auto f = std::make_unique<TestTier>(1 << 20);
    near = n.get();
    far = f.get();
    std::vector<std::unique_ptr<KVTier>> tiers;
    tiers.push_back(std::move(n));
    tiers.push_back(std::move(f));
    TieredKVStoreConfig c{0x77,       kBlock,   kPayload, WritePolicy::kWriteThrough,
                          max_stores, max_loads};
    store = std::make_unique<TieredKVStore>(c, std::move(tiers));
  }
  void store_blocks(std::initializer_list<size_t> which) {
    for (size_t i : which) ASSERT_TRUE(store->store(blocks[i], payload(static_cast<int>(i))));
    store->flush();
  }
  std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  std::vector<ChainedBlock> blocks = chain_blocks(tokens, kBlock);
  TestTier* near = nullptr;
  TestTier* far = nullptr;
  std::unique_ptr<TieredKVStore> store;
};

TEST_F(TieredStoreTest, StoredBlocksLoadBackFromTheNearestTier) {
  make();
  store_blocks({0, 1, 2, 3});
  EXPECT_EQ(store->lookup(blocks), 4);
  const LoadResult r = store->wait(store->load(blocks));
  ASSERT_EQ(r.num_blocks, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.payloads[i], payload(i)) << i;
    EXPECT_EQ(r.tier[i], 0) << i;
  }
  const TieredKVStoreStats s = store->stats();
  EXPECT_EQ(s.tiers[0].entries, 4);
  EXPECT_EQ(s.tiers[1].entries, 4);  // write-through reaches every tier
  EXPECT_EQ(s.loaded_blocks, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(s.lookup_hits, 4);
  // Storing again writes nothing (every tier holds them): skipped, no new events.
  (void)store->take_events();
  store_blocks({0, 1});
  EXPECT_EQ(store->stats().stores_skipped, 4);
  EXPECT_TRUE(store->take_events().empty());
}

TEST_F(TieredStoreTest, LookupAndLoadStopAtTheFirstMissingBlock) {
  make();
  store_blocks({0, 1, 3});
  EXPECT_EQ(store->lookup(blocks), 2);
  EXPECT_EQ(store->lookup(std::span(blocks).subspan(2)), 0);
  const LoadResult r = store->wait(store->load(blocks));
  EXPECT_EQ(r.num_blocks, 2);
  EXPECT_EQ(r.payloads.size(), 2u);
}

TEST_F(TieredStoreTest, ACorruptCopyIsAMissAndTheFartherTierServes) {
  make();
  store_blocks({0, 1});
  near->corrupt = true;
  const LoadResult r = store->wait(store->load(blocks));
  ASSERT_EQ(r.num_blocks, 2);
  EXPECT_EQ(r.payloads[0], payload(0));
  EXPECT_EQ(r.payloads[1], payload(1));
  EXPECT_EQ(r.tier, (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(store->stats().faults[static_cast<size_t>(RecordFault::kBadChecksum)], 2);
  far->corrupt = true;
  EXPECT_EQ(store->wait(store->load(blocks)).num_blocks, 0);  // never a wrong hit
}

TEST_F(TieredStoreTest, TheNextStoreOfARefusedBlockRepairsIt) {
  make();
  store_blocks({0});
  // A bad value under block 0's key in the far tier only.
  const std::string key0 = tier_key(0x77, blocks[0].hash);
  ASSERT_EQ(far->inner().put(key0, std::vector<std::byte>(8, std::byte{1})), PutOutcome::kStored);
  near->fail = true;  // the near copy is unreachable: only the bad one answers
  EXPECT_EQ(store->wait(store->load(blocks)).num_blocks, 0);
  EXPECT_EQ(store->stats().faults[static_cast<size_t>(RecordFault::kTruncated)], 1);
  near->fail = false;
  store_blocks({0});  // the tier holds the key, yet the refused copy is written over
  near->fail = true;
  const LoadResult r = store->wait(store->load(blocks));
  ASSERT_EQ(r.num_blocks, 1);
  EXPECT_EQ(r.payloads[0], payload(0));
  EXPECT_EQ(r.tier[0], 1);
}

TEST_F(TieredStoreTest, AForgedValueUnderAKeyIsRefused) {
  make();
  store_blocks({1});
  // Block 1's record placed under block 0's key (a collision, or a hostile writer).
  const std::string key0 = tier_key(0x77, blocks[0].hash);
  ASSERT_EQ(far->inner().put(key0, *far->inner().get(tier_key(0x77, blocks[1].hash))),
            PutOutcome::kStored);
  EXPECT_EQ(store->lookup(blocks), 2);  // by key it looks like a hit
  EXPECT_EQ(store->wait(store->load(blocks)).num_blocks, 0);
  EXPECT_EQ(store->stats().faults[static_cast<size_t>(RecordFault::kWrongKey)], 1);
}

TEST_F(TieredStoreTest, AFailedTierIsSkippedAndAFarHitIsPromoted) {
  make();
  near->fail = true;
  store_blocks({0});
  near->fail = false;
  EXPECT_EQ(near->inner().stats().entries, 0);
  EXPECT_EQ(store->lookup(blocks), 1);
  const LoadResult r = store->wait(store->load(blocks));
  ASSERT_EQ(r.num_blocks, 1);
  EXPECT_EQ(r.tier[0], 1);
  EXPECT_EQ(near->inner().stats().entries, 1);  // promoted into the nearer tier
  EXPECT_EQ(store->wait(store->load(blocks)).tier[0], 0);
}

TEST_F(TieredStoreTest, FullQueuesDropAndRefuseWithoutBlocking) {
  make(/*max_stores=*/2, /*max_loads=*/1);
  near->hold();  // the worker blocks inside its first put
  EXPECT_TRUE(store->store(blocks[0], payload(0)));
  int accepted = 1;
  for (int i = 0; i < 8; ++i) accepted += store->store(blocks[1], payload(1)) ? 1 : 0;
  // One batch may be in the worker; at most 2 more wait.
  EXPECT_LE(accepted, 3);
  EXPECT_GE(store->stats().stores_dropped, 6);
  const LoadTicket t = store->load(blocks);
  ASSERT_NE(t, 0u);
  EXPECT_FALSE(store->poll(t));  // the worker is still held
  EXPECT_EQ(store->load(blocks), 0u);
  EXPECT_EQ(store->stats().loads_refused, 1);
  near->release();
  (void)store->wait(t);
  store->flush();
  EXPECT_THROW((void)store->poll(t), Error);  // handed over already
}

TEST_F(TieredStoreTest, EventsNameTheTierOfEachStoreAndEviction) {
  auto small = std::make_unique<HostMemoryTier>(
      static_cast<int64_t>(2 * block_record_bytes(kBlock, kPayload)));
  std::vector<std::unique_ptr<KVTier>> tiers;
  tiers.push_back(std::move(small));
  TieredKVStore s(TieredKVStoreConfig{1, kBlock, kPayload}, std::move(tiers));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.store(blocks[i], payload(i)));
  s.flush();
  const auto ev = s.take_events();
  ASSERT_EQ(ev.size(), 4u);  // three stored, block 0 removed when block 2 came
  EXPECT_TRUE(ev[0].stored);
  EXPECT_EQ(ev[0].hash, blocks[0].hash);
  EXPECT_EQ(ev[0].parent_hash, kRootBlockHash);
  EXPECT_THAT(ev[0].tokens, ::testing::ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(ev[1].hash, blocks[1].hash);
  EXPECT_EQ(ev[1].parent_hash, blocks[0].hash);
  EXPECT_TRUE(ev[2].stored);
  EXPECT_FALSE(ev[3].stored);
  EXPECT_EQ(ev[3].hash, blocks[0].hash);
  EXPECT_EQ(ev[3].medium, TierMedium::kHost);
}

TEST(TieredKVStore, RejectsInvalidConfigurationsNamingTheValue) {
  auto one = [] {
    std::vector<std::unique_ptr<KVTier>> t;
    t.push_back(std::make_unique<HostMemoryTier>(100));
    return t;
  };
  EXPECT_THROW(TieredKVStore(TieredKVStoreConfig{0, 4, 32}, {}), Error);
  try {
    TieredKVStore s(TieredKVStoreConfig{0, 0, 32}, one());
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("block_size 0"));
  }
  EXPECT_THROW(TieredKVStore(TieredKVStoreConfig{0, 4, 0}, one()), Error);
  TieredKVStore s(TieredKVStoreConfig{0, 4, 32}, one());
  const std::vector<TokenId> t4 = {1, 2, 3, 4};
  const auto b = chain_blocks(t4, 4);
  EXPECT_THROW(s.store(b[0], std::vector<std::byte>(31)), Error);
  EXPECT_THROW((void)s.poll(12345), Error);
}

}  // namespace
}  // namespace pagedkv
