#include "pagedkv/tiers/block_record.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "pagedkv/error.hpp"

namespace pagedkv {

static_assert(std::endian::native == std::endian::little,
              "block records are little-endian; a big-endian host needs byte swaps here");

namespace {

constexpr uint32_t kMagic = 0x52564B50u;  // "PKVR" read as a little-endian u32
constexpr uint16_t kVersion = 1;

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t reserved0 = 0;
  uint32_t num_tokens = 0;
  uint32_t reserved1 = 0;
  uint64_t fingerprint = 0;
  uint64_t hash = 0;
  uint64_t parent_hash = 0;
  uint64_t check = 0;
  uint64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == kBlockRecordHeaderBytes);

}  // namespace

std::vector<std::byte> encode_block_record(uint64_t fingerprint, const ChainedBlock& block,
                                           std::span<const std::byte> payload) {
  if (block.tokens.empty()) throw Error("encode_block_record: a block of 0 tokens");
  Header h;
  h.num_tokens = static_cast<uint32_t>(block.tokens.size());
  h.fingerprint = fingerprint;
  h.hash = block.hash;
  h.parent_hash = block.parent_hash;
  h.check = block.check;
  h.payload_bytes = payload.size();
  std::vector<std::byte> out(block_record_bytes(static_cast<int32_t>(block.tokens.size()),
                                                static_cast<int64_t>(payload.size())));
  std::byte* p = out.data();
  std::memcpy(p, &h, sizeof h);
  p += sizeof h;
  std::memcpy(p, block.tokens.data(), block.tokens.size_bytes());
  p += block.tokens.size_bytes();
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
  p += payload.size();
  const uint64_t sum = XXH3_64bits(out.data(), static_cast<size_t>(p - out.data()));
  std::memcpy(p, &sum, sizeof sum);
  return out;
}

std::string_view record_fault_name(RecordFault fault) {
  switch (fault) {
    case RecordFault::kNone:
      return "none";
    case RecordFault::kTruncated:
      return "truncated";
    case RecordFault::kBadMagic:
      return "bad_magic";
    case RecordFault::kBadVersion:
      return "bad_version";
    case RecordFault::kBadChecksum:
      return "bad_checksum";
    case RecordFault::kWrongKey:
      return "wrong_key";
    case RecordFault::kWrongContent:
      return "wrong_content";
  }
  return "?";
}

RecordFault decode_block_record(std::span<const std::byte> record, uint64_t fingerprint,
                                const ChainedBlock& block, int64_t payload_bytes,
                                std::span<const std::byte>& payload) {
  Header h;
  if (record.size() < sizeof h + 8) return RecordFault::kTruncated;
  std::memcpy(&h, record.data(), sizeof h);
  if (h.magic != kMagic) return RecordFault::kBadMagic;
  if (h.version != kVersion) return RecordFault::kBadVersion;
  // Sizes from the header are bounded by the record's own length before any arithmetic.
  const uint64_t body = record.size() - sizeof h - 8;
  if (h.num_tokens > body / 4 || h.payload_bytes != body - 4 * uint64_t{h.num_tokens}) {
    return RecordFault::kTruncated;
  }
  uint64_t sum = 0;
  std::memcpy(&sum, record.data() + record.size() - 8, sizeof sum);
  if (XXH3_64bits(record.data(), record.size() - 8) != sum) return RecordFault::kBadChecksum;
  if (h.fingerprint != fingerprint || h.hash != block.hash || h.parent_hash != block.parent_hash ||
      h.check != block.check) {
    return RecordFault::kWrongKey;
  }
  const std::byte* tokens = record.data() + sizeof h;
  if (h.num_tokens != block.tokens.size() ||
      std::memcmp(tokens, block.tokens.data(), block.tokens.size_bytes()) != 0 ||
      h.payload_bytes != static_cast<uint64_t>(payload_bytes)) {
    return RecordFault::kWrongContent;
  }
  payload = record.subspan(sizeof h + 4 * size_t{h.num_tokens}, h.payload_bytes);
  return RecordFault::kNone;
}

}  // namespace pagedkv
