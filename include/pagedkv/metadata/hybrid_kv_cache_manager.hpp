#pragma once
/// @file hybrid_kv_cache_manager.hpp
/// Block manager of a hybrid model: its layers form KV cache groups, each with its attention
/// kind (full, sliding window W with optional sinks S, chunked local with chunk C), and every
/// group allocates from ONE block pool, so memory moves freely between them. Each sequence has
/// one block table per group; a local group releases the blocks no later query can see (a
/// released entry holds kNullBlock, which kernels never read under the group's mask).
/// Host-only metadata, like KVCacheManager (docs/memory.md, "Hybrid models"; the design follows
/// vLLM v1's HybridKVCacheManager: groups over one BlockPool with a reserved null block).
///
/// Page-size rule: a block id names one page of block_size tokens of one group's layers, so a
/// storage backing the pool gives each page block_size x L_g x 2 x H_kv x D x sizeof(dtype)
/// bytes for group g. One pool with one page size therefore needs equal L_g across groups
/// (vLLM splits the layers into groups of equal size, padding the last); the manager itself
/// does not depend on it (it never touches K/V) and accepts any layer counts.
///
/// Scriptable with `pagedkv ops` (`manager ... groups=`, docs/ops-script.md). Not yet here
/// (issue 17): prefix caching across groups, swap and recompute preemption; KVCacheManager
/// remains the manager for single-group models.

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/metadata/block_allocator.hpp"
#include "pagedkv/metadata/eviction_policy.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Attention of one KV cache group.
enum class GroupAttention : uint8_t {
  kFull,           ///< every earlier position
  kSlidingWindow,  ///< the last `window` positions, the query's own included, plus `sinks`
  kChunkedLocal,   ///< positions of the query's chunk: [floor(p / chunk) x chunk, p] (Llama 4)
};

/// "full", "sliding_window", "chunked_local".
[[nodiscard]] const char* group_attention_name(GroupAttention kind);

/// One KV cache group: its attention and how many layers share its block tables.
struct KVCacheGroupSpec {
  GroupAttention kind = GroupAttention::kFull;  ///< the group's attention
  int32_t window = 0;                           ///< kSlidingWindow: positions seen, >= 1 (tokens)
  int32_t sink_tokens = 0;  ///< kSlidingWindow: leading positions always kept, >= 0 (tokens)
  int32_t chunk = 0;        ///< kChunkedLocal: chunk length, >= 1 (tokens)
  int32_t num_layers = 1;   ///< layers of the group, >= 1 (the storage's page holds them)

  /// First position the query at `pos` sees outside the sinks: 0 (full), max(0, pos - window
  /// + 1) (window), floor(pos / chunk) x chunk (chunked). Positions below it, other than the
  /// sinks, are never read again. Precondition: pos >= 0.
  [[nodiscard]] int64_t first_visible(int64_t pos) const;
  /// The kernels' mask of the group: {-1, 0, 0} (full), {window, sink_tokens, 0} (window),
  /// {-1, 0, chunk} (chunked). Under it a kernel never reads an entry the release rule
  /// released (the null block).
  [[nodiscard]] AttentionMask mask() const;
};

/// Configuration of a HybridKVCacheManager.
struct HybridKVCacheManagerConfig {
  /// Blocks in the pool, >= 2: block 0 is the reserved null block, so num_blocks - 1 are usable.
  int32_t num_blocks = 0;
  int32_t block_size = 16;               ///< tokens per block, >= 1
  std::vector<KVCacheGroupSpec> groups;  ///< [num_groups] >= 1 groups
};

/// What an append produced. Shapes: slots [num_groups][n] int64, slot of new token j in group
/// g = block * block_size + offset; copies [<= num_groups] (src, dst, group) copy-on-write of a
/// shared, partially filled last block, to copy BEFORE writing the slots; released [num_groups]
/// blocks each group released before allocating (entries now kNullBlock).
struct HybridAppendResult {
  std::vector<std::vector<Slot>> slots;        ///< [num_groups][n]
  std::vector<BlockCopy> copies;               ///< pairs to copy, each in copy_groups' group
  std::vector<int32_t> copy_groups;            ///< [copies.size()] the group of each copy
  std::vector<std::vector<BlockId>> released;  ///< [num_groups] block ids released
};

/// Per-group tables of one batch, for one kernel launch per group.
/// Shapes: as PaddedBlockTables and CsrBlockTables, rows = the batch's sequences; released
/// entries are kNullBlock.
struct GroupBatchMetadata {
  PaddedBlockTables padded;  ///< vLLM-style tables of the group
  CsrBlockTables csr;        ///< the same in FlashInfer's CSR format
  AttentionMask mask;        ///< what the group's kernels apply
};

/// Block manager over KV cache groups sharing one pool (see the file comment).
///
/// Release rule: before tokens are appended at position p, each group releases the logical
/// blocks that lie wholly below spec.first_visible(p) (sink blocks excepted): no query at or
/// after p reads them. The blocks the queries of this very append need stay until the next
/// append. Every operation is all-or-nothing: lack of blocks returns empty and changes nothing
/// (releases included); contract violations throw pagedkv::Error naming the value and change
/// nothing. Not internally synchronized.
///
/// Worked example (block_size 4, one window-8 group, 16 blocks): add_sequence(1);
/// append_slots(1, 12) -> blocks {1,2,3} (block 0 is null); append_slots(1, 1) at p = 12: the
/// query sees 5..12, so logical block 0 (positions 0..3) is released first, then block 4 is
/// taken: table {null, 2, 3, 4}.
class HybridKVCacheManager {
 public:
  /// The reserved block every released entry points at; never allocated to a sequence.
  static constexpr BlockId kNullBlock = 0;

  /// Errors: throws pagedkv::Error naming the value if num_blocks < 2, block_size < 1, there is
  /// no group, or a group's window, chunk, sinks or layers are out of range for its kind.
  explicit HybridKVCacheManager(HybridKVCacheManagerConfig config);

  /// Registers an empty sequence. Errors: throws if `seq` exists.
  void add_sequence(SeqId seq);
  /// Blocks append_slots(seq, n) would take from the pool now, net of the blocks its releases
  /// return first: new blocks + copy-on-write copies - released blocks that become free.
  /// Errors: throws if `seq` is unknown or n < 0.
  [[nodiscard]] int64_t blocks_needed(SeqId seq, int64_t n) const;
  /// True exactly when append_slots(seq, n) would succeed now.
  [[nodiscard]] bool can_append(SeqId seq, int64_t n) const;
  /// Appends n tokens to every group: releases what fell out of view (release rule), copies a
  /// shared partially filled last block, allocates the new blocks. Empty (nothing changed) when
  /// the pool is short. Errors: throws if `seq` is unknown or n < 0.
  [[nodiscard]] std::optional<HybridAppendResult> append_slots(SeqId seq, int64_t n);
  /// `child` shares every live block of `parent` in every group (copy-on-write on the next
  /// append into a shared last block). Errors: throws if parent is unknown or child exists.
  void fork(SeqId parent, SeqId child);
  /// Keeps the first `num_tokens` tokens of every group, freeing the blocks past them.
  /// Errors: throws naming the value if `seq` is unknown, num_tokens is outside [0, tokens], or
  /// a group already released a block the query at num_tokens would need (released K/V cannot
  /// come back); nothing changes then.
  void truncate(SeqId seq, int64_t num_tokens);
  /// Drops the sequence and its references. Errors: throws if `seq` is unknown.
  void free_sequence(SeqId seq);

  /// Whether `seq` is registered.
  [[nodiscard]] bool has_sequence(SeqId seq) const { return seqs_.contains(seq); }
  /// Registered sequences.
  [[nodiscard]] int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  /// Registered sequence ids, ascending.
  [[nodiscard]] std::vector<SeqId> sequences() const;
  /// Tokens of `seq`. Errors: throws if unknown.
  [[nodiscard]] int64_t num_tokens(SeqId seq) const;
  /// Group `group`'s table of `seq`: ceil(tokens / block_size) entries, kNullBlock where
  /// released. Valid until the next mutation. Errors: throws if unknown or group out of range.
  [[nodiscard]] std::span<const BlockId> block_table(SeqId seq, int32_t group) const;
  /// Non-null entries of group `group` over all sequences (shared blocks counted once per
  /// table). Errors: throws if group is out of range.
  [[nodiscard]] int64_t blocks_in_tables(int32_t group) const;
  /// Per-group tables of a batch; rows in `seqs` order, context = tokens of each sequence.
  /// Errors: throws if a sequence is unknown.
  [[nodiscard]] std::vector<GroupBatchMetadata> batch_metadata(std::span<const SeqId> seqs) const;

  /// Usable blocks still free (num_blocks - 1 minus those in use).
  [[nodiscard]] int32_t num_free_blocks() const { return pool_.num_free(); }
  /// Groups of the configuration.
  [[nodiscard]] int32_t num_groups() const { return static_cast<int32_t>(config_.groups.size()); }
  /// The pool, read-only (tests and dumps).
  [[nodiscard]] const BlockAllocator& allocator() const { return pool_; }
  /// The configuration.
  [[nodiscard]] const HybridKVCacheManagerConfig& config() const { return config_; }

  /// Checks: each block's ref count equals the table entries holding it (the null block held
  /// once by the manager, never by a table); each table has ceil(tokens / block_size) entries;
  /// every entry the next query (at position tokens) sees, and every sink block, is live; the
  /// pool's own invariants.
  /// Errors: throws pagedkv::Error describing the first violation.
  void check_invariants() const;

 private:
  struct Sequence {
    int64_t num_tokens = 0;
    std::vector<std::vector<BlockId>> tables;  // [num_groups]
  };
  struct Plan {
    std::vector<std::vector<int64_t>> release;  // [group] logical entries to release
    std::vector<int32_t> cow;                   // groups whose last block needs a private copy
    int64_t new_blocks = 0;                     // fresh blocks for new entries
    int64_t freed = 0;                          // released blocks whose ref count reaches 0
  };
  [[nodiscard]] const Sequence& get(SeqId seq, const char* op) const;
  [[nodiscard]] Sequence& get(SeqId seq, const char* op);
  [[nodiscard]] Plan plan(const Sequence& s, int64_t n) const;
  [[nodiscard]] int64_t sink_blocks(const KVCacheGroupSpec& g) const;
  [[nodiscard]] int64_t first_live_entry(const KVCacheGroupSpec& g, int64_t pos) const;

  HybridKVCacheManagerConfig config_;
  BlockAllocator pool_;
  std::unordered_map<SeqId, Sequence> seqs_;
};

}  // namespace pagedkv
