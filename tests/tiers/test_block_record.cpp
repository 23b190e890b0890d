// Block records and tier keys (block_record.hpp, tier_key.hpp): the chains against an
// independent computation, the key format, and that no corruption or collision is accepted.
#define XXH_INLINE_ALL
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "pagedkv/error.hpp"
#include "pagedkv/tiers/block_record.hpp"
#include "pagedkv/tiers/tier_key.hpp"

namespace pagedkv {
namespace {

std::vector<std::byte> payload_of(size_t n, int seed) {
  std::vector<std::byte> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>((i * 31 + seed) & 0xFF);
  return p;
}

TEST(TierKey, FormatIsPrefixFingerprintAndHashInHex) {
  EXPECT_EQ(tier_key(0xFF, 0x0123456789ABCDEFull), "pagedkv:v1:00000000000000ff:0123456789abcdef");
}

TEST(TierKey, ChainMatchesPrefixCacheKeysAndAnIndependentCheckChain) {
  const std::vector<TokenId> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9};  // 2 full blocks of 4
  const auto blocks = chain_blocks(tokens, 4, 7);
  ASSERT_EQ(blocks.size(), 2u);
  const std::vector<TokenId> b0 = {1, 2, 3, 4}, b1 = {5, 6, 7, 8};
  const BlockHash h0 = block_hash(kRootBlockHash, b0, 7);
  EXPECT_EQ(blocks[0].hash, h0);
  EXPECT_EQ(blocks[0].parent_hash, kRootBlockHash);
  EXPECT_EQ(blocks[1].hash, block_hash(h0, b1, 7));
  EXPECT_EQ(blocks[1].parent_hash, h0);
  EXPECT_THAT(blocks[1].tokens, ::testing::ElementsAre(5, 6, 7, 8));
  // The check chain by hand: XXH3-64 (seed kCheckSeed) of [prev check, extra key, tokens].
  auto check = [](uint64_t prev, const std::vector<TokenId>& t) {
    std::vector<unsigned char> buf(16 + 4 * t.size());
    const uint64_t extra = 7;
    std::memcpy(buf.data(), &prev, 8);
    std::memcpy(buf.data() + 8, &extra, 8);
    std::memcpy(buf.data() + 16, t.data(), 4 * t.size());
    return XXH3_64bits_withSeed(buf.data(), buf.size(), kCheckSeed);
  };
  const uint64_t c0 = check(0, b0);
  EXPECT_EQ(blocks[0].check, c0);
  EXPECT_EQ(blocks[1].check, check(c0, b1));
  EXPECT_NE(blocks[0].check, blocks[0].hash);
  EXPECT_TRUE(chain_blocks(std::vector<TokenId>{1, 2, 3}, 4).empty());
  EXPECT_THROW((void)chain_blocks(tokens, 0), Error);
}

TEST(TierKey, FingerprintSeparatesEveryFieldThatChangesTheBytes) {
  KVCacheConfig c{2, 8, 16, 2, 64, DType::kF32, KVLayout::kHND};
  const uint64_t base = fingerprint_hash(kv_fingerprint(c, "m:1"));
  EXPECT_EQ(base, fingerprint_hash(kv_fingerprint(c, "m:1")));
  EXPECT_NE(base, fingerprint_hash(kv_fingerprint(c, "m:2")));
  auto changed = [&](auto edit) {
    KVCacheConfig d = c;
    edit(d);
    return fingerprint_hash(kv_fingerprint(d, "m:1"));
  };
  EXPECT_NE(base, changed([](KVCacheConfig& d) { d.num_layers = 3; }));
  EXPECT_NE(base, changed([](KVCacheConfig& d) { d.num_kv_heads = 1; }));
  EXPECT_NE(base, changed([](KVCacheConfig& d) { d.head_dim = 32; }));
  EXPECT_NE(base, changed([](KVCacheConfig& d) { d.block_size = 8; }));
  EXPECT_NE(base, changed([](KVCacheConfig& d) { d.dtype = DType::kF16; }));
  EXPECT_NE(base, changed([](KVCacheConfig& d) { d.layout = KVLayout::kNHD; }));
  // The pool size and placement do not change a block's bytes.
  EXPECT_EQ(base, changed([](KVCacheConfig& d) { d.num_blocks = 99; }));
  EXPECT_EQ(base, changed([](KVCacheConfig& d) { d.placement = KVPlacement::kSeparate; }));
  const std::vector<float> s1 = {0.5f, 0.25f}, s2 = {0.5f, 0.125f};
  EXPECT_NE(fingerprint_hash(kv_fingerprint(c, "m:1", s1)),
            fingerprint_hash(kv_fingerprint(c, "m:1", s2)));
}

class BlockRecordTest : public ::testing::Test {
 protected:
  std::vector<TokenId> tokens = {11, 12, 13, 14, 21, 22, 23, 24};
  std::vector<ChainedBlock> blocks = chain_blocks(tokens, 4);
  std::vector<std::byte> payload = payload_of(40, 3);
  uint64_t fp = 0xABCDEF;
};

TEST_F(BlockRecordTest, RoundTripGivesThePayloadBack) {
  const auto rec = encode_block_record(fp, blocks[1], payload);
  EXPECT_EQ(rec.size(), block_record_bytes(4, 40));
  EXPECT_EQ(rec.size(), 56u + 16u + 40u + 8u);
  std::span<const std::byte> out;
  ASSERT_EQ(decode_block_record(rec, fp, blocks[1], 40, out), RecordFault::kNone);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), payload.begin(), payload.end()));
}

TEST_F(BlockRecordTest, EveryFlippedByteIsRefused) {
  const auto rec = encode_block_record(fp, blocks[1], payload);
  for (size_t i = 0; i < rec.size(); ++i) {
    auto bad = rec;
    bad[i] ^= std::byte{0x10};
    std::span<const std::byte> out;
    EXPECT_NE(decode_block_record(bad, fp, blocks[1], 40, out), RecordFault::kNone) << i;
  }
}

TEST_F(BlockRecordTest, EveryTruncationIsRefused) {
  auto rec = encode_block_record(fp, blocks[1], payload);
  for (size_t n = 0; n < rec.size(); ++n) {
    std::span<const std::byte> out;
    EXPECT_NE(decode_block_record(std::span(rec).first(n), fp, blocks[1], 40, out),
              RecordFault::kNone)
        << n;
  }
  rec.push_back(std::byte{0});
  std::span<const std::byte> out;
  EXPECT_EQ(decode_block_record(rec, fp, blocks[1], 40, out), RecordFault::kTruncated);
}

TEST_F(BlockRecordTest, CollisionsAndOtherModelsAreRefusedByTheirFault) {
  const auto rec = encode_block_record(fp, blocks[1], payload);
  std::span<const std::byte> out;
  EXPECT_EQ(decode_block_record(rec, fp + 1, blocks[1], 40, out), RecordFault::kWrongKey);
  ChainedBlock other_prefix = blocks[1];
  other_prefix.check ^= 1;  // same key, another prefix: only the check chain tells
  EXPECT_EQ(decode_block_record(rec, fp, other_prefix, 40, out), RecordFault::kWrongKey);
  ChainedBlock other_parent = blocks[1];
  other_parent.parent_hash ^= 1;
  EXPECT_EQ(decode_block_record(rec, fp, other_parent, 40, out), RecordFault::kWrongKey);
  const std::vector<TokenId> forged = {11, 12, 13, 15};
  ChainedBlock other_tokens = blocks[1];
  other_tokens.tokens = forged;  // a full 128-bit collision: the tokens still tell
  EXPECT_EQ(decode_block_record(rec, fp, other_tokens, 40, out), RecordFault::kWrongContent);
  EXPECT_EQ(decode_block_record(rec, fp, blocks[1], 48, out), RecordFault::kWrongContent);
  auto magic = rec;
  magic[0] = std::byte{'X'};
  EXPECT_EQ(decode_block_record(magic, fp, blocks[1], 40, out), RecordFault::kBadMagic);
  EXPECT_EQ(record_fault_name(RecordFault::kBadChecksum), "bad_checksum");
  EXPECT_THROW((void)encode_block_record(fp, ChainedBlock{}, payload), Error);
}

}  // namespace
}  // namespace pagedkv
