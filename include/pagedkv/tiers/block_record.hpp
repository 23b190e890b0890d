#pragma once
/// @file block_record.hpp
/// The value a tier stores for one block: its keys, token ids and every layer's K/V bytes, with
/// a checksum. A loader accepts a record only when the checksum holds AND its fingerprint, hash,
/// parent hash, check chain and token ids equal what the prompt expects: a corrupt value or a
/// hash collision is a miss, counted by its fault, never a wrong hit.
///
/// Format v1 (little-endian, no padding between fields), docs/tiers.md:
///   u32 magic "PKVR" | u16 version (1) | u16 reserved (0) | u32 num_tokens | u32 reserved (0)
///   | u64 fingerprint | u64 hash | u64 parent_hash | u64 check | u64 payload_bytes
///   | i32 tokens[num_tokens] | payload[payload_bytes] | u64 XXH3-64 of every preceding byte.
/// Size: kBlockRecordHeaderBytes + 4 * num_tokens + payload_bytes + 8.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pagedkv/tiers/tier_key.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Bytes of the fixed header of a block record (before the token ids).
inline constexpr size_t kBlockRecordHeaderBytes = 56;

/// Encoded size of a record of `num_tokens` tokens and `payload_bytes` K/V bytes. Units: bytes.
[[nodiscard]] constexpr size_t block_record_bytes(int32_t num_tokens, int64_t payload_bytes) {
  return kBlockRecordHeaderBytes + 4 * static_cast<size_t>(num_tokens) +
         static_cast<size_t>(payload_bytes) + 8;
}

/// Encodes one block: `fingerprint` (fingerprint_hash), the block's keys and tokens, and
/// `payload`, every layer's K then V bytes (HostKVCache::block_bytes).
/// Errors: throws pagedkv::Error if tokens is empty; std::bad_alloc when memory runs out.
[[nodiscard]] std::vector<std::byte> encode_block_record(uint64_t fingerprint,
                                                         const ChainedBlock& block,
                                                         std::span<const std::byte> payload);

/// Why a record was refused.
enum class RecordFault : uint8_t {
  kNone,          ///< accepted
  kTruncated,     ///< shorter (or longer) than its header says
  kBadMagic,      ///< not a block record
  kBadVersion,    ///< a format version this build does not read
  kBadChecksum,   ///< the bytes changed after encoding (a corrupt value)
  kWrongKey,      ///< fingerprint, hash, parent hash or check differ: a collision or another model
  kWrongContent,  ///< the keys match but the token ids or payload size differ
};

/// "none", "truncated", "bad_magic", "bad_version", "bad_checksum", "wrong_key", "wrong_content".
[[nodiscard]] std::string_view record_fault_name(RecordFault fault);

/// Checks `record` against the block the prompt expects (fingerprint, block.hash, parent_hash,
/// check, tokens) and a payload of `payload_bytes`; on kNone, `payload` views the record's K/V
/// bytes (valid while `record` is). Never throws: every malformed input is a fault.
[[nodiscard]] RecordFault decode_block_record(std::span<const std::byte> record,
                                              uint64_t fingerprint, const ChainedBlock& block,
                                              int64_t payload_bytes,
                                              std::span<const std::byte>& payload);

}  // namespace pagedkv
