#pragma once
/// @file append_result.hpp
/// What a sequence's growth takes and returns in both managers (KVCacheManager and
/// HybridKVCacheManager): the options of an append or a prompt add, and the slots and copies
/// the storage must honour. Host-only vocabulary; the behaviour is the managers' (their tests,
/// tests/metadata/test_kv_cache_manager.cpp and test_hybrid_kv_cache_manager.cpp, cover it).

#include <cstdint>
#include <vector>

#include "pagedkv/types.hpp"

namespace pagedkv {

/// What an append produced (append_slots, append_tokens): where the new tokens go and which
/// blocks the storage must copy first.
/// Shapes: slots [n] for an append of n tokens; copies [0 or 1] (only the last block, the one
/// written into, can need a private copy).
struct AppendResult {
  /// [n] int64 slot of each new token, in position order: block_id * block_size + offset.
  std::vector<Slot> slots;
  /// (src, dst) block pairs the storage must copy (all layers) BEFORE writing the slots:
  /// copy-on-write of a shared, partially filled last block. Empty when nothing is shared.
  std::vector<BlockCopy> copies;
};

/// What an append reports besides the blocks it takes (append_slots, append_tokens; the same
/// choice for a prompt is AddOptions::return_slots).
struct AppendOptions {
  /// false: the result's slots stay empty; copies are still reported (the storage must make
  /// them). For a caller that builds its slot mapping with batch_metadata(), or needs none (a
  /// scheduler simulation): it saves writing 8 bytes per new token. The blocks, the tables and
  /// every count are the same either way.
  bool return_slots = true;
};

/// What a prompt add produced.
/// num_computed_tokens: leading prompt tokens already in the cache (prefix hits), a multiple of
/// block_size, always <= prompt length - 1 so the model has at least one token to run.
/// append.slots [prompt length - num_computed_tokens]: slots of positions
/// num_computed_tokens .. prompt length - 1, which the prefill must write. append.copies is
/// always empty (hit blocks are full, never written).
struct AddResult {
  /// Leading prompt tokens already cached (prefix hits, a multiple of block_size, at most
  /// prompt length - 1): the prefill skips positions [0, num_computed_tokens).
  int64_t num_computed_tokens = 0;
  /// append.slots [prompt length - num_computed_tokens]: the slots of the positions the prefill
  /// writes; append.copies is empty.
  AppendResult append;
};

/// How add_sequence admits a prompt; the defaults admit the whole prompt at once.
struct AddOptions {
  /// Prefix-cache salt of every block key of the sequence (adapter id, cache salt; 0 = none).
  uint64_t extra_key = 0;
  /// Tokens the request may still generate after its prompt (the engine's max_tokens), >= 0:
  /// admission answers kNever when prompt + max_new_tokens can never fit (max_model_len, or
  /// blocks the sequence would hold at that length, after token eviction, beyond the pool).
  /// No block is reserved for them (only room in the sequence's list of token ids, so that
  /// appends up to there do not copy it again). Units: tokens.
  int64_t max_new_tokens = 0;
  /// Chunked prefill: blocks are allocated now only for the prefix hits and this many prompt
  /// tokens after them (clamped to the prompt); the caller appends the rest of the prompt later
  /// with append_tokens, chunk by chunk as its token budget allows. The prefix hits are still
  /// computed from the whole prompt (at most (len - 1) / block_size blocks). -1 (default): the
  /// whole prompt. Units: tokens.
  int64_t first_chunk_tokens = -1;
  /// false: AddResult::append.slots stays empty (as AppendOptions::return_slots).
  bool return_slots = true;
};

}  // namespace pagedkv
