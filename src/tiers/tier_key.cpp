#include "pagedkv/tiers/tier_key.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <cstring>

#include "pagedkv/error.hpp"

namespace pagedkv {

KVFingerprint kv_fingerprint(const KVCacheConfig& config, std::string_view model_id,
                             std::span<const float> scales) {
  KVFingerprint fp;
  fp.model_id = std::string(model_id);
  fp.num_layers = config.num_layers;
  fp.num_kv_heads = config.num_kv_heads;
  fp.head_dim = config.head_dim;
  fp.block_size = config.block_size;
  fp.dtype = config.dtype;
  fp.layout = config.layout;
  fp.scales.assign(scales.begin(), scales.end());
  return fp;
}

namespace {

template <typename T>
void append_bytes(std::vector<unsigned char>& out, const T& value) {
  const auto* p = reinterpret_cast<const unsigned char*>(&value);
  out.insert(out.end(), p, p + sizeof(T));
}

}  // namespace

uint64_t fingerprint_hash(const KVFingerprint& fp) {
  std::vector<unsigned char> bytes;
  append_bytes(bytes, static_cast<uint64_t>(fp.model_id.size()));
  bytes.insert(bytes.end(), fp.model_id.begin(), fp.model_id.end());
  for (const int32_t v : {fp.num_layers, fp.num_kv_heads, fp.head_dim, fp.block_size,
                          static_cast<int32_t>(fp.dtype), static_cast<int32_t>(fp.layout)}) {
    append_bytes(bytes, v);
  }
  append_bytes(bytes, static_cast<uint64_t>(fp.scales.size()));
  for (const float s : fp.scales) append_bytes(bytes, std::bit_cast<uint32_t>(s));
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t chain_check(uint64_t parent_check, std::span<const TokenId> tokens, uint64_t extra_key) {
  std::vector<unsigned char> buf;
  buf.reserve(16 + tokens.size_bytes());
  append_bytes(buf, parent_check);
  append_bytes(buf, extra_key);
  for (const TokenId t : tokens) append_bytes(buf, t);
  return XXH3_64bits_withSeed(buf.data(), buf.size(), kCheckSeed);
}

std::vector<ChainedBlock> chain_blocks(std::span<const TokenId> tokens, int32_t block_size,
                                       uint64_t extra_key) {
  if (block_size < 1) throw Error(fmt::format("chain_blocks: block_size {} < 1", block_size));
  const size_t n = tokens.size() / static_cast<size_t>(block_size);
  std::vector<ChainedBlock> out(n);
  BlockHash parent = kRootBlockHash;
  uint64_t check = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto block = tokens.subspan(i * block_size, block_size);
    check = chain_check(check, block, extra_key);
    const BlockHash hash = block_hash(parent, block, extra_key);
    out[i] = ChainedBlock{hash, parent, check, block};
    parent = hash;
  }
  return out;
}

std::string tier_key(uint64_t fingerprint, BlockHash hash) {
  return fmt::format("pagedkv:v1:{:016x}:{:016x}", fingerprint, hash);
}

}  // namespace pagedkv
