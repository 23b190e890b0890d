// DiskTier: byte-for-byte round trips, overwrite, hand-worked LRU order, the documented errors,
// corrupt and torn slots (a miss, counted, never wrong bytes), persistence across instances and
// reinitialisation on another layout, the exclusive file lock, direct I/O, injected write and
// read errors, and a real full disk on a 64 KiB tmpfs (skipped where mounting is not allowed).

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/tiers/disk_tier.hpp"

namespace pagedkv::test_hooks {
struct DiskTierFaults {
  static void fail_next_write(DiskTier& t, int err) {
    const std::lock_guard lock(t.mu_);
    t.fail_next_write_ = err;
  }
  static void fail_next_read(DiskTier& t) {
    const std::lock_guard lock(t.mu_);
    t.fail_next_read_ = EIO;
  }
};
}  // namespace pagedkv::test_hooks

namespace pagedkv {
namespace {

namespace fs = std::filesystem;
using test_hooks::DiskTierFaults;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Bytes = std::vector<std::byte>;

constexpr int64_t kPage = DiskTier::kAlignment;

Bytes pattern(int64_t n, int seed) {
  Bytes b(n);
  for (int64_t i = 0; i < n; ++i)
    b[i] = static_cast<std::byte>((i * 131 + seed * 7 + i / 256) & 0xff);
  return b;
}

// Overwrites bytes of the tier's file behind its back (flock is advisory).
void poke(const std::string& path, int64_t offset, const Bytes& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), offset), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

std::string message_of(const DiskTierConfig& config) {
  try {
    const DiskTier tier(config);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/pagedkv_disk_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    path_ = dir_ + "/tier.bin";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Values up to 3840 bytes: one 4096-byte slot each.
  [[nodiscard]] DiskTierConfig config(int64_t slots, int64_t max_value = 3840) const {
    return {path_, slots * DiskTier::slot_bytes_for(max_value), max_value, false};
  }
  // Offset in the file of byte `i` of the value in `slot`.
  static int64_t value_offset(int64_t slot, int64_t slot_bytes, int64_t i) {
    return DiskTier::kFileHeaderBytes + slot * slot_bytes + DiskTier::kSlotHeaderBytes + i;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(DiskTierTest, SlotBytesRoundUpHeaderPlusValueToPages) {
  EXPECT_EQ(DiskTier::slot_bytes_for(1), 4096);
  EXPECT_EQ(DiskTier::slot_bytes_for(1000), 4096);
  EXPECT_EQ(DiskTier::slot_bytes_for(3840), 4096);
  EXPECT_EQ(DiskTier::slot_bytes_for(3841), 8192);
  EXPECT_EQ(DiskTier::slot_bytes_for(10000), 12288);
  EXPECT_THAT([] { (void)DiskTier::slot_bytes_for(0); },
              ::testing::ThrowsMessage<Error>(HasSubstr("got 0")));
  EXPECT_THROW((void)DiskTier::slot_bytes_for(DiskTier::kMaxValueBytes + 1), Error);
}

TEST_F(DiskTierTest, RoundTripIsByteForByteAndCounted) {
  DiskTier tier(config(4, 10000));
  EXPECT_EQ(tier.name(), "disk");
  EXPECT_EQ(tier.medium(), TierMedium::kDisk);
  EXPECT_EQ(tier.slot_bytes(), 12288);
  EXPECT_EQ(tier.num_slots(), 4);
  EXPECT_EQ(fs::file_size(path_), 4096u + 4u * 12288u);
  const Bytes big = pattern(10000, 1);
  const Bytes one = {std::byte{0xA5}};
  EXPECT_EQ(tier.put("big", big), PutOutcome::kStored);
  EXPECT_EQ(tier.put("one", one), PutOutcome::kStored);
  EXPECT_EQ(tier.get("big"), big);
  EXPECT_EQ(tier.get("one"), one);
  EXPECT_EQ(tier.get("absent"), std::nullopt);
  const TierStats s = tier.stats();
  EXPECT_EQ(s.budget_bytes, 4 * 12288);
  EXPECT_EQ(s.used_bytes, 10001);
  EXPECT_EQ(s.entries, 2);
  EXPECT_EQ(s.puts, 2);
  EXPECT_EQ(s.gets, 3);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.bytes_written, 10001);
  EXPECT_EQ(s.bytes_read, 10001);
  EXPECT_EQ(s.failures, 0);
  EXPECT_EQ(s.rejected, 0);
}

TEST_F(DiskTierTest, OverwriteReplacesTheValueInPlace) {
  DiskTier tier(config(2));
  ASSERT_EQ(tier.put("k", pattern(3000, 1)), PutOutcome::kStored);
  ASSERT_EQ(tier.put("k", pattern(10, 2)), PutOutcome::kStored);
  EXPECT_EQ(tier.get("k"), pattern(10, 2));
  const TierStats s = tier.stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.used_bytes, 10);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.bytes_written, 3010);
}

TEST_F(DiskTierTest, LruEvictionOrderWithThreeSlots) {
  DiskTier tier(config(3));
  for (const char* k : {"a", "b", "c"})
    ASSERT_EQ(tier.put(k, pattern(100, k[0])), PutOutcome::kStored);
  ASSERT_TRUE(tier.get("a"));  // LRU order now b, c, a
  EXPECT_EQ(tier.put("d", pattern(100, 'd')), PutOutcome::kStored);
  EXPECT_THAT(tier.take_evicted(), ElementsAre("b"));
  EXPECT_THAT(tier.take_evicted(), ElementsAre());
  const std::vector<std::string> keys = {"a", "b", "c", "d"};
  EXPECT_THAT(tier.contains(keys), ElementsAre(true, false, true, true));
  EXPECT_EQ(tier.put("e", pattern(100, 'e')), PutOutcome::kStored);  // order c, a, d -> c goes
  EXPECT_THAT(tier.take_evicted(), ElementsAre("c"));
  const TierStats s = tier.stats();
  EXPECT_EQ(s.evictions, 2);
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.used_bytes, 300);
  for (const char* k : {"a", "d", "e"}) EXPECT_EQ(tier.get(k), pattern(100, k[0])) << k;
}

TEST_F(DiskTierTest, TooLargeIsRejectedAndKeepsTheOldValue) {
  DiskTier tier(config(2));
  ASSERT_EQ(tier.put("k", pattern(3840, 1)), PutOutcome::kStored);
  EXPECT_EQ(tier.put("k", pattern(3841, 2)), PutOutcome::kTooLarge);
  EXPECT_EQ(tier.get("k"), pattern(3840, 1));
  const TierStats s = tier.stats();
  EXPECT_EQ(s.rejected, 1);
  EXPECT_EQ(s.puts, 1);
  EXPECT_EQ(s.bytes_written, 3840);
}

TEST_F(DiskTierTest, ContainsDoesNotRefreshLru) {
  DiskTier tier(config(2));
  ASSERT_EQ(tier.put("a", pattern(5, 1)), PutOutcome::kStored);
  ASSERT_EQ(tier.put("b", pattern(5, 2)), PutOutcome::kStored);
  const std::vector<std::string> a = {"a"};
  EXPECT_THAT(tier.contains(a), ElementsAre(true));
  ASSERT_EQ(tier.put("c", pattern(5, 3)), PutOutcome::kStored);
  EXPECT_THAT(tier.take_evicted(), ElementsAre("a"));
  EXPECT_EQ(tier.stats().gets, 0);
}

TEST_F(DiskTierTest, KeyAndValueContractsThrowNamingTheValue) {
  DiskTier tier(config(1));
  const Bytes v = pattern(4, 1);
  const std::string longest(DiskTier::kMaxKeyBytes, 'k');
  const std::string too_long(DiskTier::kMaxKeyBytes + 1, 'k');
  EXPECT_THROW(tier.put("", v), Error);
  EXPECT_THAT([&] { tier.put("key", {}); }, ::testing::ThrowsMessage<Error>(HasSubstr("'key'")));
  EXPECT_THAT([&] { tier.put(too_long, v); }, ::testing::ThrowsMessage<Error>(HasSubstr("225")));
  EXPECT_THAT([&] { (void)tier.get(too_long); }, ::testing::ThrowsMessage<Error>(HasSubstr("225")));
  EXPECT_THROW((void)tier.get(""), Error);
  const std::vector<std::string> bad = {"x", ""};
  EXPECT_THROW((void)tier.contains(bad), Error);
  EXPECT_EQ(tier.put(longest, v), PutOutcome::kStored);
  EXPECT_EQ(tier.get(longest), v);
}

TEST_F(DiskTierTest, CorruptValueByteIsAMissAndTheEntryIsGone) {
  DiskTier tier(config(2));
  const Bytes v = pattern(1000, 1);
  ASSERT_EQ(tier.put("k", v), PutOutcome::kStored);  // the first put takes slot 0
  poke(path_, value_offset(0, tier.slot_bytes(), 500), {v[500] ^ std::byte{0x01}});
  EXPECT_EQ(tier.get("k"), std::nullopt);
  const std::vector<std::string> k = {"k"};
  EXPECT_THAT(tier.contains(k), ElementsAre(false));
  TierStats s = tier.stats();
  EXPECT_EQ(s.failures, 1);
  EXPECT_EQ(s.hits, 0);
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.used_bytes, 0);
  ASSERT_EQ(tier.put("k", v), PutOutcome::kStored);  // the freed slot is written again
  EXPECT_EQ(tier.get("k"), v);
  EXPECT_EQ(tier.stats().evictions, 0);
}

TEST_F(DiskTierTest, SecondInstanceRecoversEntriesInWriteOrder) {
  {
    DiskTier first(config(4));
    for (const char* k : {"a", "b", "c"})
      ASSERT_EQ(first.put(k, pattern(700, k[0])), PutOutcome::kStored);
    ASSERT_TRUE(first.get("a"));  // LRU in memory only: the file keeps the write order
  }
  DiskTier second(config(4));
  EXPECT_EQ(second.recovered_entries(), 3);
  TierStats s = second.stats();
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.used_bytes, 2100);
  EXPECT_EQ(s.puts, 0);
  for (const char* k : {"a", "b", "c"}) EXPECT_EQ(second.get(k), pattern(700, k[0])) << k;
  // LRU order is a, b, c (the gets above went in write order): d fills the free slot, e evicts a.
  ASSERT_EQ(second.put("d", pattern(9, 4)), PutOutcome::kStored);
  ASSERT_EQ(second.put("e", pattern(9, 5)), PutOutcome::kStored);
  EXPECT_THAT(second.take_evicted(), ElementsAre("a"));
  EXPECT_EQ(second.stats().entries, 4);
}

TEST_F(DiskTierTest, RecoveredLruOrderIsWriteOrderNotSlotOrder) {
  {
    DiskTier first(config(3));
    for (const char* k : {"a", "b", "c"})
      ASSERT_EQ(first.put(k, pattern(50, k[0])), PutOutcome::kStored);
    ASSERT_EQ(first.put("a", pattern(60, 'A')), PutOutcome::kStored);  // slot 0, written last
  }
  DiskTier second(config(3));
  ASSERT_EQ(second.recovered_entries(), 3);
  ASSERT_EQ(second.put("d", pattern(5, 4)), PutOutcome::kStored);
  ASSERT_EQ(second.put("e", pattern(5, 5)), PutOutcome::kStored);
  EXPECT_THAT(second.take_evicted(), ElementsAre("b", "c"));
  EXPECT_EQ(second.get("a"), pattern(60, 'A'));
  EXPECT_EQ(second.stats().used_bytes, 70);
}

TEST_F(DiskTierTest, WriteOrderContinuesAcrossInstances) {
  {
    DiskTier first(config(3));
    for (const char* k : {"a", "b", "c"})
      ASSERT_EQ(first.put(k, pattern(50, k[0])), PutOutcome::kStored);
  }
  {
    DiskTier second(config(3));  // rewrites c, then a: they must count as newer than b
    ASSERT_EQ(second.put("c", pattern(50, 'c')), PutOutcome::kStored);
    ASSERT_EQ(second.put("a", pattern(50, 'a')), PutOutcome::kStored);
  }
  DiskTier third(config(3));
  ASSERT_EQ(third.put("d", pattern(5, 4)), PutOutcome::kStored);
  EXPECT_THAT(third.take_evicted(), ElementsAre("b"));
}

TEST_F(DiskTierTest, RecoveryKeepsTheNewerOfTwoSlotsWithOneKey) {
  Bytes old_record(4096);
  {
    DiskTier first(config(3));
    ASSERT_EQ(first.put("a", pattern(50, 1)), PutOutcome::kStored);  // slot 0
    const int fd = ::open(path_.c_str(), O_RDONLY);
    ASSERT_EQ(::pread(fd, old_record.data(), old_record.size(), DiskTier::kFileHeaderBytes), 4096);
    ::close(fd);
    ASSERT_EQ(first.put("a", pattern(70, 2)), PutOutcome::kStored);  // slot 0 again, newer
  }
  poke(path_, DiskTier::kFileHeaderBytes + 2 * 4096, old_record);  // a's older record in slot 2
  DiskTier second(config(3));
  EXPECT_EQ(second.recovered_entries(), 1);
  EXPECT_EQ(second.get("a"), pattern(70, 2));
  EXPECT_EQ(second.stats().used_bytes, 70);
  for (const char* k : {"b", "c"}) ASSERT_EQ(second.put(k, pattern(5, k[0])), PutOutcome::kStored);
  EXPECT_EQ(second.stats().evictions, 0);  // the stale slot was free
}

TEST_F(DiskTierTest, SlotHoldingAnotherKeysRecordIsAMiss) {
  DiskTier tier(config(2));
  ASSERT_EQ(tier.put("a", pattern(100, 1)), PutOutcome::kStored);  // slot 0
  ASSERT_EQ(tier.put("b", pattern(100, 2)), PutOutcome::kStored);  // slot 1
  // Copy b's whole, valid record over a's slot: a checksum alone would accept it.
  Bytes slot1(tier.slot_bytes());
  const int fd = ::open(path_.c_str(), O_RDONLY);
  ASSERT_EQ(::pread(fd, slot1.data(), slot1.size(), DiskTier::kFileHeaderBytes + tier.slot_bytes()),
            tier.slot_bytes());
  ::close(fd);
  poke(path_, DiskTier::kFileHeaderBytes, slot1);
  EXPECT_EQ(tier.get("a"), std::nullopt);
  EXPECT_EQ(tier.get("b"), pattern(100, 2));
  const TierStats s = tier.stats();
  EXPECT_EQ(s.failures, 1);
  EXPECT_EQ(s.entries, 1);
}

TEST_F(DiskTierTest, RecoverySkipsTornAndGarbageSlots) {
  int64_t slot_bytes = 0;
  {
    DiskTier first(config(4));
    slot_bytes = first.slot_bytes();
    for (const char* k : {"a", "b", "c"})
      ASSERT_EQ(first.put(k, pattern(2000, k[0])), PutOutcome::kStored);
  }
  // Slot 1 ("b"): a torn write, the second half of the value never reached the disk.
  poke(path_, value_offset(1, slot_bytes, 1000), Bytes(1000, std::byte{0}));
  // Slot 2 ("c"): garbage over the slot header.
  poke(path_, DiskTier::kFileHeaderBytes + 2 * slot_bytes, pattern(256, 9));
  DiskTier second(config(4));
  EXPECT_EQ(second.recovered_entries(), 1);
  const std::vector<std::string> keys = {"a", "b", "c"};
  EXPECT_THAT(second.contains(keys), ElementsAre(true, false, false));
  EXPECT_EQ(second.get("a"), pattern(2000, 'a'));
  for (const char* k : {"x", "y", "z"})
    ASSERT_EQ(second.put(k, pattern(10, k[0])), PutOutcome::kStored);
  const TierStats s = second.stats();
  EXPECT_EQ(s.evictions, 0);  // the three bad slots were free
  EXPECT_EQ(s.entries, 4);
  EXPECT_EQ(s.failures, 0);
}

TEST_F(DiskTierTest, AnotherLayoutReinitialisesTheFile) {
  {
    DiskTier small(config(4, 1000));
    ASSERT_EQ(small.put("a", pattern(900, 1)), PutOutcome::kStored);
  }
  {
    DiskTier bigger(config(4, 5000));
    EXPECT_EQ(bigger.recovered_entries(), 0);
    const std::vector<std::string> a = {"a"};
    EXPECT_THAT(bigger.contains(a), ElementsAre(false));
    EXPECT_EQ(fs::file_size(path_), 4096u + 4u * 8192u);
  }
  // Back to the first layout: reinitialising truncated the file, so "a" is gone for good.
  DiskTier again(config(4, 1000));
  EXPECT_EQ(again.recovered_entries(), 0);
  EXPECT_EQ(again.stats().entries, 0);
}

TEST_F(DiskTierTest, ShortenedFileIsReinitialised) {
  {
    DiskTier first(config(3));
    ASSERT_EQ(first.put("a", pattern(10, 1)), PutOutcome::kStored);
  }
  fs::resize_file(path_, 4096 + 2 * 4096);
  DiskTier second(config(3));
  EXPECT_EQ(second.recovered_entries(), 0);
  EXPECT_EQ(fs::file_size(path_), 4096u + 3u * 4096u);
}

TEST_F(DiskTierTest, ConstructorErrorsNameTheValue) {
  DiskTierConfig c = config(1);
  c.budget_bytes = 4095;
  EXPECT_THAT(message_of(c), HasSubstr("budget_bytes 4095 is below one slot of 4096 bytes"));
  c = config(1);
  c.path = dir_ + "/missing/tier.bin";
  EXPECT_THAT(message_of(c), HasSubstr("cannot open '" + c.path + "'"));
  c = config(1);
  c.path.clear();
  EXPECT_THAT(message_of(c), HasSubstr("path is empty"));
  c = config(1);
  c.max_value_bytes = 0;
  EXPECT_THAT(message_of(c), HasSubstr("got 0"));
  EXPECT_FALSE(fs::exists(path_));
}

TEST_F(DiskTierTest, SecondTierOnALiveFileThrows) {
  auto first = std::make_unique<DiskTier>(config(2));
  ASSERT_EQ(first->put("a", pattern(10, 1)), PutOutcome::kStored);
  EXPECT_THAT(message_of(config(2)), HasSubstr("'" + path_ + "' is in use by another DiskTier"));
  EXPECT_EQ(first->get("a"), pattern(10, 1));  // untouched by the refused second one
  first.reset();
  DiskTier second(config(2));
  EXPECT_EQ(second.recovered_entries(), 1);
}

TEST_F(DiskTierTest, DirectIoRoundTripAndRecovery) {
  const int probe = ::open((dir_ + "/probe").c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
  if (probe < 0 && errno == EINVAL) GTEST_SKIP() << "O_DIRECT refused (EINVAL) on " << dir_;
  ASSERT_GE(probe, 0) << std::strerror(errno);
  ::close(probe);
  DiskTierConfig c = config(3, 10000);
  c.direct_io = true;
  {
    DiskTier tier(c);
    for (const int64_t n : {1, 3840, 10000}) {
      ASSERT_EQ(tier.put("k" + std::to_string(n), pattern(n, 3)), PutOutcome::kStored);
    }
    EXPECT_EQ(tier.get("k10000"), pattern(10000, 3));
    EXPECT_EQ(tier.stats().failures, 0);
  }
  DiskTier again(c);
  EXPECT_EQ(again.recovered_entries(), 3);
  for (const int64_t n : {1, 3840, 10000})
    EXPECT_EQ(again.get("k" + std::to_string(n)), pattern(n, 3));
}

TEST_F(DiskTierTest, WriteErrorIsFailedAndDropsTheOldEntry) {
  DiskTier tier(config(2));
  ASSERT_EQ(tier.put("k", pattern(10, 1)), PutOutcome::kStored);
  DiskTierFaults::fail_next_write(tier, EIO);
  EXPECT_EQ(tier.put("k", pattern(10, 2)), PutOutcome::kFailed);
  const std::vector<std::string> k = {"k"};
  EXPECT_THAT(tier.contains(k), ElementsAre(false));
  TierStats s = tier.stats();
  EXPECT_EQ(s.failures, 1);
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.used_bytes, 0);
  EXPECT_TRUE(tier.accepting());
  EXPECT_EQ(tier.put("k", pattern(10, 3)), PutOutcome::kStored);
  EXPECT_EQ(tier.put("j", pattern(10, 4)), PutOutcome::kStored);
  EXPECT_EQ(tier.get("k"), pattern(10, 3));
  EXPECT_EQ(tier.stats().evictions, 0);  // the failed write gave its slot back
}

TEST_F(DiskTierTest, EnospcStopsAccepting) {
  DiskTier tier(config(3));
  ASSERT_EQ(tier.put("a", pattern(10, 1)), PutOutcome::kStored);
  DiskTierFaults::fail_next_write(tier, ENOSPC);
  EXPECT_EQ(tier.put("b", pattern(10, 2)), PutOutcome::kFull);
  EXPECT_EQ(tier.put("c", pattern(10, 3)), PutOutcome::kFull);  // no write tried
  EXPECT_FALSE(tier.accepting());
  EXPECT_EQ(tier.get("a"), pattern(10, 1));
  const TierStats s = tier.stats();
  EXPECT_EQ(s.rejected, 2);
  EXPECT_EQ(s.failures, 0);
  EXPECT_EQ(s.puts, 1);
  EXPECT_EQ(s.entries, 1);
}

TEST_F(DiskTierTest, ReadErrorIsACountedMiss) {
  DiskTier tier(config(2));
  ASSERT_EQ(tier.put("k", pattern(10, 1)), PutOutcome::kStored);
  DiskTierFaults::fail_next_read(tier);
  EXPECT_EQ(tier.get("k"), std::nullopt);
  const TierStats s = tier.stats();
  EXPECT_EQ(s.failures, 1);
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.gets, 1);
  EXPECT_EQ(s.hits, 0);
}

TEST_F(DiskTierTest, ConcurrentCallersKeepTheIndexConsistent) {
  DiskTier tier(config(8));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&tier, t] {
      for (int i = 0; i < 200; ++i) {
        const std::string key = "t" + std::to_string(t) + "_" + std::to_string(i % 5);
        ASSERT_EQ(tier.put(key, pattern(64 + i, t)), PutOutcome::kStored);
        const auto got = tier.get(key);
        if (got) {  // else evicted meanwhile by another thread
          ASSERT_EQ(got->size(), static_cast<size_t>(64 + i));
        }
        (void)tier.contains(std::vector<std::string>{key});
      }
    });
  }
  for (auto& th : threads) th.join();
  // Conservation: 20 distinct keys, 8 slots; what contains() sees is what stats() counts.
  std::vector<std::string> keys;
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 5; ++i) keys.push_back("t" + std::to_string(t) + "_" + std::to_string(i));
  }
  const std::vector<bool> held = tier.contains(keys);
  int64_t held_bytes = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (held[i]) held_bytes += static_cast<int64_t>(tier.get(keys[i]).value().size());
  }
  const TierStats s = tier.stats();
  EXPECT_EQ(std::count(held.begin(), held.end(), true), 8);
  EXPECT_EQ(s.entries, 8);
  EXPECT_EQ(s.used_bytes, held_bytes);
  EXPECT_EQ(s.puts, 800);
  EXPECT_EQ(s.failures, 0);
  EXPECT_EQ(static_cast<int64_t>(tier.take_evicted().size()), s.evictions);
}

// A real full disk: a 64 KiB tmpfs (16 pages of 4096 bytes) and a 33-page tier file.
TEST_F(DiskTierTest, FullTmpfsFailsPreallocationOrStopsAccepting) {
  const std::string mnt = dir_ + "/small";
  fs::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a 64 KiB tmpfs (" << std::strerror(errno) << "): needs root";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mnt};
  DiskTierConfig c = config(32);
  c.path = mnt + "/tier.bin";
  EXPECT_THAT(message_of(c), ::testing::AllOf(HasSubstr("135168 bytes for '" + c.path + "'"),
                                              HasSubstr("ENOSPC")));
  // A sparse file with a valid header, as left where preallocation is unsupported: the disk
  // fills while putting. The header comes from a tier of the same layout on the roomy disk.
  { const DiskTier roomy(config(32)); }
  Bytes header(DiskTier::kFileHeaderBytes);
  const int src = ::open(path_.c_str(), O_RDONLY);
  ASSERT_EQ(::pread(src, header.data(), header.size(), 0), 4096);
  ::close(src);
  poke(c.path, 0, header);
  fs::resize_file(c.path, 4096 + 32 * 4096);
  DiskTier tier(c);
  EXPECT_EQ(tier.recovered_entries(), 0);
  int stored = 0;
  PutOutcome last = PutOutcome::kStored;
  while (stored < 32 && (last = tier.put("k" + std::to_string(stored), pattern(3840, stored))) ==
                            PutOutcome::kStored) {
    ++stored;
  }
  EXPECT_EQ(last, PutOutcome::kFull);
  EXPECT_EQ(stored, 15);  // 16 pages: the file header and 15 slots
  EXPECT_EQ(tier.put("after", pattern(10, 1)), PutOutcome::kFull);
  for (int i = 0; i < stored; ++i) EXPECT_EQ(tier.get("k" + std::to_string(i)), pattern(3840, i));
  const TierStats s = tier.stats();
  EXPECT_EQ(s.rejected, 2);
  EXPECT_EQ(s.failures, 0);
  EXPECT_EQ(s.entries, 15);
}

}  // namespace
}  // namespace pagedkv
