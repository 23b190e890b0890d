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
/// Prefix caching across groups (opt-in, enable_prefix_caching): every group publishes its own
/// committed full blocks under the key (chained block hash, group), and a prompt hits the
/// longest prefix that every group can serve, each by its own rule (see lookup_prefix()).
/// Preemption (recompute, swap to a host pool) works per sequence across all its groups,
/// all-or-nothing. Source: vLLM v1 (vllm/v1/core/kv_cache_coordinator.py,
/// HybridKVCacheCoordinator; single_type_kv_cache_manager.py, find_longest_cache_hit).
///
/// Scriptable with `pagedkv ops` (`manager ... groups=`, docs/ops-script.md); the ops scripts
/// do not drive prefix caching or swapping yet. Not yet here (issue 17): token eviction
/// policies and events per group; KVCacheManager remains the manager for single-group models.

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/metadata/block_allocator.hpp"
#include "pagedkv/metadata/eviction_policy.hpp"
#include "pagedkv/metadata/kv_cache_manager.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"
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
  /// Publish committed full blocks of sequences whose token ids are known (add_sequence with a
  /// prompt, append_tokens), per group, and share them with later prompts of the same prefix.
  bool enable_prefix_caching = false;
  /// Usable blocks of the host swap pool (swap_out / swap_in), >= 0; 0 = no swapping. The host
  /// pool has one block more, its block 0, reserved like the device pool's null block, so a
  /// swapped table's host ids never read as kNullBlock.
  int32_t num_host_blocks = 0;
  /// Record KVCacheEvents for take_events(), each with its group: kStored when commit publishes
  /// a group's block, kEvicted when the pool reuses a cached block, kRemoved for the entries of
  /// a full group chained below an evicted one (no lookup from the root reaches them).
  bool enable_events = false;
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

/// What a prompt add produced. num_computed_tokens: leading prompt tokens every group already
/// has (prefix hits), a multiple of block_size, at most prompt length - 1. Shapes: append.slots
/// [num_groups][prompt length - num_computed_tokens], the slots of positions
/// num_computed_tokens .. prompt length - 1, which the prefill writes; append.copies is empty
/// and append.released lists nothing (hit blocks are full, out-of-view entries were never
/// taken).
struct HybridAddResult {
  int64_t num_computed_tokens = 0;  ///< tokens the prefill skips (a multiple of block_size)
  HybridAppendResult append;        ///< slots of the positions the prefill writes
};

/// Answer of lookup_prefix(): what add_sequence would share now, computed without changing
/// anything. Shapes: blocks [num_groups][num_computed_tokens / block_size]: the cached block
/// each group's new table would hold at each logical entry, kNullBlock where the group needs
/// nothing (out of its view at the hit point).
struct HybridPrefixLookup {
  int64_t num_computed_tokens = 0;           ///< tokens (a multiple of block_size)
  std::vector<std::vector<BlockId>> blocks;  ///< [num_groups][num_computed_tokens / bs]
};

/// Copies between the device pool and the host swap pool. swap_out: src a device block, dst a
/// host block; swap_in: src a host block, dst a device block. The storage copies the group's
/// layers of each pair before the sequence runs again. Shapes: copies [live entries of the
/// sequence over all groups], group by group, in table order; copy_groups [copies.size()].
struct HybridSwapResult {
  std::vector<BlockCopy> copies;     ///< (src, dst) pairs, each in copy_groups' group
  std::vector<int32_t> copy_groups;  ///< [copies.size()] the group of each copy
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
/// Prefix caching (config.enable_prefix_caching): the lifecycle of KVCacheManager, per group.
/// A full block is published by commit() once its K/V are written, in every group whose table
/// still holds it (a local group may have released it already), under (its chained
/// block_hash, the group). A published block whose ref count drops to 0 (released by the rule
/// above, a free, a preemption) stays cached, evictable least recently released first; an
/// allocation that takes it for other content drops its key (and, in a full group, the keys
/// chained below it, which no walk from the root could reach any more). A full group's keys
/// are confirmed along the chain of entries (as KVCacheManager's); a local group's keys stand
/// alone (its earlier blocks may be gone by design) and are confirmed on tokens, salt and
/// parent key.
///
/// Sequence states: running, or swapped (tables hold host ids; only free_sequence, swap_in and
/// read-only queries are allowed).
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
  /// no group, a group's window, chunk, sinks or layers are out of range for its kind, or
  /// num_host_blocks < 0.
  explicit HybridKVCacheManager(HybridKVCacheManagerConfig config);

  /// Registers an empty sequence; its token ids are known (none), so append_tokens() can feed
  /// the prefix cache. Errors: throws if `seq` exists.
  void add_sequence(SeqId seq);
  /// Admission query for a prompt: kOk exactly when add_sequence(seq, prompt, extra_key) would
  /// succeed now: fresh blocks num_groups x (ceil(len / bs) - hit blocks) plus the needed hit
  /// blocks that are cached with ref count 0 (they leave the available pool) <=
  /// num_free_blocks(). Otherwise kNever when num_groups x ceil(len / bs) > num_blocks - 1 (the
  /// prompt would not fit an empty pool without hits), else kLater.
  /// Units: len = prompt.size() tokens; blocks.
  [[nodiscard]] Admission can_add_sequence(std::span<const TokenId> prompt,
                                           uint64_t extra_key = 0) const;
  /// Registers `seq` with its prompt: each group's table references the cached blocks it needs
  /// at the hit point h = lookup_prefix(prompt, extra_key).num_computed_tokens (ref counts up;
  /// cached free blocks leave the LRU), kNullBlock at its other entries below h, and fresh
  /// blocks for positions h .. len - 1 (as append_slots from h). The hit positions count as
  /// committed; nothing else is published before commit(). Empty (nothing changed) unless
  /// can_add_sequence() is kOk. `extra_key` salts every block key of the sequence (adapter id,
  /// cache salt; 0 = none). Errors: throws if `seq` exists.
  [[nodiscard]] std::optional<HybridAddResult> add_sequence(SeqId seq,
                                                            std::span<const TokenId> prompt,
                                                            uint64_t extra_key = 0);
  /// Read-only prefix lookup across groups: the largest hit h, a multiple of block_size with
  /// h <= len - 1 (at least one token is left to compute, as KVCacheManager), such that every
  /// group has cached what its first query at h needs: its blocks covering positions
  /// [first_visible(h), h) and its sink blocks below h. A full group thus needs all of
  /// [0, h / bs), a window group the blocks of the last W - 1 positions before h (plus sinks),
  /// a chunked group those of [floor(h / C) x C, h). Search: each full group's longest hit from
  /// the root first, then each local group from the right, shrinking h to its largest valid
  /// point, repeated until no group shrinks it (a fixpoint, the largest h valid for all).
  /// Allocates nothing, touches no reference count or LRU order; 0 without prefix caching.
  /// Worked example (block_size 4, groups {full, window 8}, prompt of 17 tokens, at most 4 hit
  /// blocks): the full group has blocks 0..3 cached, the window group only 0..1 (its blocks 2
  /// and 3 were evicted): h = 16 needs window blocks {2, 3}, missing; h = 12 needs {1, 2},
  /// missing; h = 8 needs {0, 1}: the hit is 8 tokens.
  /// Source: vLLM v1 HybridKVCacheCoordinator.find_longest_cache_hit (keys (hash, group)).
  /// Units: tokens. Cost: O(len) hashing, O(num_groups x len / bs) lookups.
  [[nodiscard]] HybridPrefixLookup lookup_prefix(std::span<const TokenId> prompt,
                                                 uint64_t extra_key = 0) const;
  /// Blocks append_slots(seq, n) would take from the pool now, net of the blocks its releases
  /// return first: new blocks + copy-on-write copies - released blocks that become free.
  /// Errors: throws if `seq` is unknown or swapped, or n < 0.
  [[nodiscard]] int64_t blocks_needed(SeqId seq, int64_t n) const;
  /// True exactly when append_slots(seq, n) would succeed now.
  [[nodiscard]] bool can_append(SeqId seq, int64_t n) const;
  /// Appends n tokens to every group: releases what fell out of view (release rule), copies a
  /// shared or published partially filled last block, allocates the new blocks (evicting cached
  /// ones when no free block is left). Token ids become unknown (n > 0): the sequence stops
  /// feeding the prefix cache (use append_tokens). Empty (nothing changed) when the pool is
  /// short. Errors: throws if `seq` is unknown or swapped, or n < 0.
  [[nodiscard]] std::optional<HybridAppendResult> append_slots(SeqId seq, int64_t n);
  /// append_slots(seq, tokens.size()) that records the token ids, so blocks that become full
  /// can be published by commit(). Errors: as append_slots.
  [[nodiscard]] std::optional<HybridAppendResult> append_tokens(SeqId seq,
                                                                std::span<const TokenId> tokens);
  /// append_slots(seq, n) with `options`: AppendOptions::return_slots = false leaves the
  /// result's slots empty (no per-group lists; copies and released blocks are still reported).
  [[nodiscard]] std::optional<HybridAppendResult> append_slots(SeqId seq, int64_t n,
                                                               const AppendOptions& options);
  /// append_tokens(seq, tokens) with `options`, as append_slots(seq, n, options).
  [[nodiscard]] std::optional<HybridAppendResult> append_tokens(SeqId seq,
                                                                std::span<const TokenId> tokens,
                                                                const AppendOptions& options);
  /// Publish after write: positions [0, num_tokens) of `seq` have their K/V written. Each full
  /// block inside them whose ids are known is published in every group whose table still holds
  /// it (prefix caching on), in position order; a full group publishes a block only under its
  /// parent's live entry (its chain stops otherwise). Monotone: a smaller num_tokens than
  /// num_committed_tokens(seq) changes nothing. Returns the blocks published (all groups).
  /// Errors: throws if `seq` is unknown or swapped, or num_tokens is outside [0, tokens].
  int32_t commit(SeqId seq, int64_t num_tokens);
  /// Positions of `seq` committed so far (prefix hits count). Errors: throws if unknown.
  [[nodiscard]] int64_t num_committed_tokens(SeqId seq) const;
  /// `child` shares every live block of `parent` in every group (copy-on-write on the next
  /// append into a shared last block), with its token ids, keys and committed count.
  /// Errors: throws if parent is unknown or swapped, or child exists.
  void fork(SeqId parent, SeqId child);
  /// Keeps the first `num_tokens` tokens of every group, freeing the blocks past them (tail
  /// first; published ones stay cached); the committed count drops to at most num_tokens.
  /// Errors: throws naming the value if `seq` is unknown or swapped, num_tokens is outside
  /// [0, tokens], or a group already released a block the query at num_tokens would need
  /// (released K/V cannot come back); nothing changes then.
  void truncate(SeqId seq, int64_t num_tokens);
  /// Drops the sequence and its references, tail entries first in every group (cached tail
  /// blocks are evicted before the head blocks other prompts likelier share); a swapped
  /// sequence's host blocks are released instead. Errors: throws if `seq` is unknown.
  void free_sequence(SeqId seq);

  /// Recompute preemption: frees every group's blocks at once (published ones stay cached, so
  /// the re-prefill may hit them), forgets the sequence, returns what to prefill again
  /// (add_sequence(seq, out.tokens, out.extra_key)). Errors: throws if `seq` is unknown or
  /// swapped (free_sequence drops a swapped one).
  PreemptedSequence preempt(SeqId seq);
  /// True exactly when swap_out(seq) would succeed: the live (non-null) entries of all its
  /// groups fit in the free host blocks (always false without a host pool).
  /// Errors: throws if `seq` is unknown or swapped.
  [[nodiscard]] bool can_swap_out(SeqId seq) const;
  /// Swap preemption: each live entry of every group gets a host block (copies device -> host,
  /// group by group in table order), the device references are dropped (tail first), and the
  /// sequence becomes swapped. Null entries are not swapped (they stay kNullBlock). Empty
  /// (nothing changed) when the host pool is short. Errors: as can_swap_out.
  [[nodiscard]] std::optional<HybridSwapResult> swap_out(SeqId seq);
  /// True exactly when swap_in(seq) would succeed: its live entries fit in num_free_blocks().
  /// Errors: throws if `seq` is unknown or not swapped.
  [[nodiscard]] bool can_swap_in(SeqId seq) const;
  /// Restores a swapped sequence: fresh device blocks (ids may differ; cached ones may be
  /// evicted for them), copies host -> device in swap_out's order, host blocks released. Its
  /// keys stay; the fresh blocks are not published again (the content's key is already held,
  /// or was evicted). Empty (nothing changed) unless can_swap_in(seq).
  /// Errors: as can_swap_in.
  [[nodiscard]] std::optional<HybridSwapResult> swap_in(SeqId seq);
  /// True when `seq` is swapped out. Errors: throws if unknown.
  [[nodiscard]] bool is_swapped(SeqId seq) const;

  /// Whether `seq` is registered.
  [[nodiscard]] bool has_sequence(SeqId seq) const { return seqs_.contains(seq); }
  /// Registered sequences.
  [[nodiscard]] int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  /// Registered sequence ids, ascending.
  [[nodiscard]] std::vector<SeqId> sequences() const;
  /// Tokens of `seq`. Errors: throws if unknown.
  [[nodiscard]] int64_t num_tokens(SeqId seq) const;
  /// Group `group`'s table of `seq`: ceil(tokens / block_size) entries, kNullBlock where
  /// released; host ids while swapped. Valid until the next mutation. Errors: throws if unknown
  /// or group out of range.
  [[nodiscard]] std::span<const BlockId> block_table(SeqId seq, int32_t group) const;
  /// Non-null entries of group `group` over all running sequences (shared blocks counted once
  /// per table). Errors: throws if group is out of range.
  [[nodiscard]] int64_t blocks_in_tables(int32_t group) const;
  /// Per-group tables of a batch; rows in `seqs` order, context = tokens of each sequence.
  /// Errors: throws if a sequence is unknown or swapped.
  [[nodiscard]] std::vector<GroupBatchMetadata> batch_metadata(std::span<const SeqId> seqs) const;

  /// Usable blocks an allocation can still get: free plus cached with ref count 0 (evictable);
  /// num_blocks - 1 minus those in use.
  [[nodiscard]] int32_t num_free_blocks() const { return pool_.num_available(); }
  /// Cached blocks with ref count 0 (published, evictable, least recently released first).
  [[nodiscard]] int32_t num_cached_blocks() const { return pool_.num_cached(); }
  /// Groups of the configuration.
  [[nodiscard]] int32_t num_groups() const { return static_cast<int32_t>(config_.groups.size()); }
  /// The pool, read-only (tests and dumps).
  [[nodiscard]] const BlockAllocator& allocator() const { return pool_; }
  /// Host swap pool (num_host_blocks + 1 blocks, block 0 reserved); null without one.
  [[nodiscard]] const BlockAllocator* host_allocator() const { return host_ ? &*host_ : nullptr; }
  /// Group `group`'s key index (empty without prefix caching). Errors: throws if group is out
  /// of range.
  [[nodiscard]] const PrefixCache& prefix_cache(int32_t group) const;
  /// The configuration.
  [[nodiscard]] const HybridKVCacheManagerConfig& config() const { return config_; }
  /// Snapshot of the pool and the cumulative counters, in KVCacheManager's units and with its
  /// invariants (kv_cache_stats.hpp; the null block counts as used). Per hybrid meaning: a
  /// prefix hit of k blocks counts k in prefix_hits and k x block_size in prefix_hit_tokens
  /// (positions every group shares; each group holds what its rule needs of them);
  /// prefix_misses counts eligible prompt blocks past the hit; prefix_cached_entries sums the
  /// groups' key indexes; released_blocks and evicted_tokens stay 0 (window and chunk
  /// releases are the groups' rule, not token eviction). preemptions counts swap_out and
  /// preempt calls that succeeded; swapped_out / swapped_in_blocks the live entries moved.
  [[nodiscard]] KVCacheStats stats() const;
  /// The events recorded since the last call, oldest first (empty unless
  /// config.enable_events), and clears them: for routers that mirror which prefixes, per
  /// group, this worker holds (vLLM's BlockStored / BlockRemoved).
  [[nodiscard]] std::vector<KVCacheEvent> take_events();

  /// Checks: each block's ref count equals the table entries holding it (the null block held
  /// once by the manager, never by a table); each table has ceil(tokens / block_size) entries;
  /// every entry the next query (at position tokens) sees, and every sink block, is live; the
  /// pools' and key indexes' own invariants; every published block is cached in the pool and
  /// registered in exactly one group, every cached block is published; a table entry
  /// registered in its group holds the content its sequence's key names; committed <= tokens,
  /// keys <= committed / block_size; swapped tables hold host blocks whose ref counts match.
  /// Errors: throws pagedkv::Error describing the first violation.
  void check_invariants() const;

 private:
  struct Sequence {
    int64_t num_tokens = 0;
    std::vector<std::vector<BlockId>> tables;  // [num_groups]; host ids while swapped
    // [num_groups]: entries [sink blocks, released_to[g]) of group g are all released (null),
    // so plan's release scan starts there and a decode step costs O(1), not O(table size).
    std::vector<int64_t> released_to;
    bool swapped = false;
    // Prefix caching: token ids while all are known; the keys of the first committed full
    // blocks (shared by every group) and per group the serial of the entry holding each
    // (0: none; a full group's chain stops there).
    bool ids_known = true;
    int64_t committed = 0;
    uint64_t extra_key = 0;
    std::vector<TokenId> token_ids;
    std::vector<BlockHash> hashes;
    std::vector<std::vector<uint64_t>> serials;  // [num_groups][hashes.size()]
  };
  struct Plan {
    std::vector<std::pair<int32_t, int64_t>> release;  // (group, logical entry) to release
    std::vector<int32_t> cow;  // groups whose last block needs a private copy
    int64_t new_blocks = 0;    // fresh blocks for new entries
    int64_t freed = 0;         // released blocks whose ref count reaches 0
  };
  struct Hit;  // hybrid_kv_cache_manager_prefix.cpp
  [[nodiscard]] const Sequence& get(SeqId seq, const char* op) const;
  [[nodiscard]] Sequence& get(SeqId seq, const char* op);
  [[nodiscard]] const Sequence& get_running(SeqId seq, const char* op) const;
  [[nodiscard]] Sequence new_sequence() const;
  [[nodiscard]] Plan plan(const Sequence& s, int64_t n) const;
  /// End of group g's release scan before an append: entries [sink blocks, end) fell out of
  /// view of the next query (at s.num_tokens).
  [[nodiscard]] int64_t release_end(const Sequence& s, size_t g) const;
  [[nodiscard]] int64_t sink_blocks(const KVCacheGroupSpec& g) const;
  [[nodiscard]] int64_t first_live_entry(const KVCacheGroupSpec& g, int64_t pos) const;
  std::optional<HybridAppendResult> do_append(SeqId seq, int64_t n, std::span<const TokenId> ids,
                                              bool record_ids, bool slots, const char* op);
  static void release_tables(const std::vector<std::vector<BlockId>>& tables, BlockAllocator& pool);
  // hybrid_kv_cache_manager_prefix.cpp
  [[nodiscard]] Hit find_hit(std::span<const TokenId> prompt, uint64_t extra_key) const;
  std::vector<BlockId> allocate_evicting(int32_t n);
  void drop_evicted(BlockId b);
  void emit(KVCacheEvent event);
  [[nodiscard]] uint64_t publish_block(Sequence& s, size_t g, int64_t j, BlockHash h,
                                       int32_t& published);
  // hybrid_kv_cache_manager_invariants.cpp
  void check_sequence(SeqId id, const Sequence& s, std::vector<int32_t>& holders,
                      std::vector<int32_t>& host_holders) const;
  void check_prefix() const;

  HybridKVCacheManagerConfig config_;
  BlockAllocator pool_;
  std::optional<BlockAllocator> host_;  // the swap pool; empty when num_host_blocks == 0
  std::vector<PrefixCache> prefix_;     // [num_groups]: keys (hash, group)
  std::unordered_map<SeqId, Sequence> seqs_;
  std::vector<BlockId> evicted_;      // scratch of allocate_evicting, empty between calls
  std::vector<KVCacheEvent> events_;  // since the last take_events (enable_events only)
  KVCacheStats counters_;             // the cumulative fields of stats()
};

}  // namespace pagedkv
