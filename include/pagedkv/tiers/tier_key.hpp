#pragma once
/// @file tier_key.hpp
/// Keys of the tiers below the pool: the chained block hashes of a prompt, a second independent
/// chain that confirms a hit, and the fingerprint of everything that makes K/V bytes differ, so
/// that two engines with different models (or dtypes, scales, block sizes, layouts) never share.
///
/// Source: vLLM's prefix-cache block hashes (the same chained XXH3-64 keys as PrefixCache,
/// prefix_cache.hpp) and LMCache's cache-engine key (model name, world size, fmt, chunk hash).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/dtype.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"
#include "pagedkv/storage/kv_cache_config.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// What makes the K/V bytes of a block differ between engines for the same tokens.
struct KVFingerprint {
  /// Identity of the model weights: a name plus a content hash, e.g. "stories260K:<xxh3 of the
  /// checkpoint file>". Two checkpoints of one architecture must differ here.
  std::string model_id;
  int32_t num_layers = 0;            ///< layers whose K/V a block record carries
  int32_t num_kv_heads = 0;          ///< K/V heads per layer
  int32_t head_dim = 0;              ///< elements per head vector
  int32_t block_size = 0;            ///< tokens per block
  DType dtype = DType::kF32;         ///< storage element type
  KVLayout layout = KVLayout::kHND;  ///< order of (head, token) inside a block's bytes
  /// The scales of a quantized pool (HostKVCache::scales of every layer, K then V), empty for
  /// the float dtypes: 8-bit bytes are only meaningful with the scales they were written with.
  std::vector<float> scales;
};

/// The fingerprint of a cache: config's geometry, dtype and layout, `model_id`, and `scales`
/// (empty for float dtypes). The placement is not part of it: block_bytes() is the same in both.
[[nodiscard]] KVFingerprint kv_fingerprint(const KVCacheConfig& config, std::string_view model_id,
                                           std::span<const float> scales = {});

/// XXH3-64 of every field of `fp` (strings by length and bytes, floats by their bit patterns).
[[nodiscard]] uint64_t fingerprint_hash(const KVFingerprint& fp);

/// Seed of the confirmation chain (check), distinct from PrefixCache's key chain (seed 0).
inline constexpr uint64_t kCheckSeed = 0x5AFE'C0DE'1234'5678ull;

/// One full block of a prompt, as the tiers see it.
struct ChainedBlock {
  BlockHash hash = 0;         ///< block_hash(parent_hash, tokens, extra_key): PrefixCache's key
  BlockHash parent_hash = 0;  ///< previous block's hash, kRootBlockHash for the first
  /// Second chain over the same prefix: XXH3-64 with kCheckSeed of [previous check (u64),
  /// extra_key (u64), tokens (i32 each)], starting from 0. A record is accepted only when its
  /// check equals the prompt's, so a wrong hit needs two independent 64-bit collisions.
  uint64_t check = 0;
  std::span<const TokenId> tokens;  ///< [block_size] the block's token ids (a view of the prompt)
};

/// One link of the confirmation chain: XXH3-64 with kCheckSeed of [parent_check (u64),
/// extra_key (u64), tokens (i32 each)]; the first block's parent_check is 0.
[[nodiscard]] uint64_t chain_check(uint64_t parent_check, std::span<const TokenId> tokens,
                                   uint64_t extra_key = 0);

/// The full blocks of `tokens` (floor(size / block_size) of them) with their chained keys.
/// Errors: throws pagedkv::Error if block_size < 1.
[[nodiscard]] std::vector<ChainedBlock> chain_blocks(std::span<const TokenId> tokens,
                                                     int32_t block_size, uint64_t extra_key = 0);

/// The key of a block in every tier: "pagedkv:v1:" + 16 hex digits of the fingerprint hash +
/// ":" + 16 hex digits of the block hash (e.g. "pagedkv:v1:00000000000000ff:0123456789abcdef").
[[nodiscard]] std::string tier_key(uint64_t fingerprint, BlockHash hash);

}  // namespace pagedkv
