#pragma once
/// @file kv_cache_manager.hpp
/// The scheduler-facing block manager: owns the BlockAllocator and every sequence's block table.
/// Host-only metadata; it never touches K/V data. The storage (HostKVCache or the device cache)
/// is driven by what it returns: slots to write, block copies to perform.

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagedkv/batch_metadata.hpp"
#include "pagedkv/block_allocator.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Configuration of a KVCacheManager.
struct KVCacheManagerConfig {
  int32_t num_blocks = 0;   ///< blocks in the pool, >= 1
  int32_t block_size = 16;  ///< tokens per block, >= 1
};

/// What an append produced.
/// slots [n] int64: the slot of each new token, in position order.
/// copies: (src, dst) block pairs the storage must copy (all layers) BEFORE writing the slots:
/// copy-on-write of a shared, partially filled last block. Empty when nothing is shared.
struct AppendResult {
  std::vector<Slot> slots;
  std::vector<BlockCopy> copies;
};

/// Sequence id that marks a padding row in batch_metadata(): context length 0, no blocks.
inline constexpr SeqId kPaddingSeq = -1;

/// Block manager for one KV cache (all layers share one block id space).
///
/// Append allocates a block only when the sequence's last block is full; a slot is
/// block_id * block_size + offset. Every operation is all-or-nothing: lack of blocks returns an
/// empty result and changes nothing; contract violations throw pagedkv::Error and change nothing.
/// Not internally synchronized: callers serialize access (one scheduler thread).
///
/// Worked example (block_size 4, 8 blocks, fresh pool): add_sequence(7); append_slots(7, 6)
/// -> slots {0,1,2,3,4,5} in blocks {0,1}; append_slots(7, 1) -> {6}; fork(7, 8) shares {0,1};
/// append_slots(8, 1) -> copies {(1,2)}, slots {11}: sequence 8 now has blocks {0,2}.
class KVCacheManager {
 public:
  /// Errors: throws pagedkv::Error if num_blocks < 1 or block_size < 1 (naming the value).
  explicit KVCacheManager(const KVCacheManagerConfig& config);

  /// Registers an empty sequence (0 tokens, no blocks: an empty prompt takes no block).
  /// Errors: throws pagedkv::Error if `seq` already exists or equals kPaddingSeq.
  void add_sequence(SeqId seq);

  /// Releases every block of `seq` (tail blocks first) and forgets it.
  /// Errors: throws pagedkv::Error if `seq` is unknown.
  void free_sequence(SeqId seq);

  /// Copy-on-write fork: `child` gets the parent's tokens and shares every block (ref counts +1).
  /// No block is allocated. Errors: throws if `parent` is unknown or `child` already exists.
  void fork(SeqId parent, SeqId child);

  /// Blocks that append_slots(seq, n) would take from the pool, copy-on-write included.
  /// Errors: throws if `seq` is unknown or n < 0.
  [[nodiscard]] int32_t blocks_needed_to_append(SeqId seq, int64_t n) const;

  /// True exactly when append_slots(seq, n) would succeed now.
  /// Errors: throws if `seq` is unknown or n < 0.
  [[nodiscard]] bool can_append(SeqId seq, int64_t n) const;

  /// Appends n tokens to `seq` and returns their slots (and any copy-on-write copies).
  /// Empty (and nothing changed) when the pool cannot cover all n tokens.
  /// Units: n in tokens. Errors: throws if `seq` is unknown or n < 0.
  [[nodiscard]] std::optional<AppendResult> append_slots(SeqId seq, int64_t n);

  /// Metadata for a batch step: sequence i contributes its whole table and context length
  /// num_tokens(seqs[i]); its slot mapping lists its last num_new_tokens[i] positions (the
  /// tokens this step writes). A seq equal to kPaddingSeq gives a padding row (context 0, no
  /// slots) and must have num_new_tokens 0.
  /// Errors: throws if sizes differ, a seq is unknown, or num_new_tokens[i] is negative or
  /// greater than the sequence's token count.
  [[nodiscard]] BatchMetadata batch_metadata(std::span<const SeqId> seqs,
                                             std::span<const int64_t> num_new_tokens) const;

  /// Tokens held by `seq`. Errors: throws if unknown.
  [[nodiscard]] int64_t num_tokens(SeqId seq) const;
  /// Physical blocks of `seq` in logical order; valid until the next mutation.
  /// Errors: throws if unknown.
  [[nodiscard]] std::span<const BlockId> block_table(SeqId seq) const;
  [[nodiscard]] bool has_sequence(SeqId seq) const { return seqs_.contains(seq); }
  /// Sequence ids in ascending order.
  [[nodiscard]] std::vector<SeqId> sequences() const;
  [[nodiscard]] int32_t num_sequences() const { return static_cast<int32_t>(seqs_.size()); }

  /// Blocks an allocation can still get (free + evictable cached).
  [[nodiscard]] int32_t num_free_blocks() const { return allocator_.num_available(); }
  [[nodiscard]] int32_t num_total_blocks() const { return allocator_.num_blocks(); }
  /// Fraction of blocks in use (ref count >= 1), in [0, 1].
  [[nodiscard]] double usage() const;

  [[nodiscard]] const BlockAllocator& allocator() const { return allocator_; }
  [[nodiscard]] const KVCacheManagerConfig& config() const { return config_; }

  /// Checks every invariant (ref count of each block == number of tables holding it; free +
  /// used + cached == total; each table has exactly ceil(tokens / block_size) blocks).
  /// O(total blocks). Errors: throws pagedkv::Error describing the first violation.
  void check_invariants() const;

 private:
  struct Sequence {
    std::vector<BlockId> blocks;
    int64_t num_tokens = 0;
  };
  const Sequence& get(SeqId seq, const char* op) const;
  Sequence& get(SeqId seq, const char* op);

  KVCacheManagerConfig config_;
  BlockAllocator allocator_;
  std::unordered_map<SeqId, Sequence> seqs_;
};

}  // namespace pagedkv
