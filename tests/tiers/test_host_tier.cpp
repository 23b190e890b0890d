// The host-memory tier (host_tier.hpp): byte budget, LRU order worked by hand, stats.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/tiers/host_tier.hpp"

namespace pagedkv {
namespace {

std::vector<std::byte> bytes(size_t n, int v) { return std::vector<std::byte>(n, std::byte(v)); }

TEST(HostMemoryTier, RoundTripAndOverwrite) {
  HostMemoryTier t(100);
  EXPECT_EQ(t.put("a", bytes(10, 1)), PutOutcome::kStored);
  EXPECT_EQ(t.get("a"), bytes(10, 1));
  EXPECT_EQ(t.put("a", bytes(20, 2)), PutOutcome::kStored);
  EXPECT_EQ(t.get("a"), bytes(20, 2));
  EXPECT_EQ(t.get("b"), std::nullopt);
  const TierStats s = t.stats();
  EXPECT_EQ(s.used_bytes, 20);
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.puts, 2);
  EXPECT_EQ(s.gets, 3);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.bytes_read, 30);
  EXPECT_EQ(s.bytes_written, 30);
  EXPECT_EQ(t.name(), "host");
  EXPECT_EQ(tier_medium_name(t.medium()), "CPU");
}

TEST(HostMemoryTier, EvictsLeastRecentlyUsedWithinTheBudget) {
  HostMemoryTier t(30);  // three values of 10 bytes
  ASSERT_EQ(t.put("a", bytes(10, 1)), PutOutcome::kStored);
  ASSERT_EQ(t.put("b", bytes(10, 2)), PutOutcome::kStored);
  ASSERT_EQ(t.put("c", bytes(10, 3)), PutOutcome::kStored);
  ASSERT_TRUE(t.get("a"));  // order now (most recent first): a c b
  const std::vector<std::string> keys = {"a", "b", "c", "d"};
  EXPECT_EQ(t.contains(keys), (std::vector<bool>{true, true, true, false}));  // no LRU change
  ASSERT_EQ(t.put("d", bytes(10, 4)), PutOutcome::kStored);                   // evicts b
  EXPECT_EQ(t.take_evicted(), std::vector<std::string>{"b"});
  EXPECT_EQ(t.contains(keys), (std::vector<bool>{true, false, true, true}));
  ASSERT_EQ(t.put("e", bytes(20, 5)), PutOutcome::kStored);  // evicts c, then a
  EXPECT_EQ(t.take_evicted(), (std::vector<std::string>{"c", "a"}));
  EXPECT_TRUE(t.take_evicted().empty());
  EXPECT_EQ(t.stats().evictions, 3);
  EXPECT_EQ(t.stats().used_bytes, 30);
}

TEST(HostMemoryTier, RejectsWhatCannotFitAndBadArguments) {
  HostMemoryTier t(30);
  ASSERT_EQ(t.put("a", bytes(10, 1)), PutOutcome::kStored);
  EXPECT_EQ(t.put("big", bytes(31, 1)), PutOutcome::kTooLarge);
  EXPECT_EQ(t.get("a"), bytes(10, 1));  // nothing was evicted for it
  EXPECT_EQ(t.stats().rejected, 1);
  EXPECT_THROW(t.put("", bytes(1, 1)), Error);
  EXPECT_THROW(t.put("k", {}), Error);
  EXPECT_THROW((void)t.get(""), Error);
  try {
    HostMemoryTier bad(0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("budget_bytes 0"));
  }
}

}  // namespace
}  // namespace pagedkv
