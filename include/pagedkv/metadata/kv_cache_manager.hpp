#pragma once
/// @file kv_cache_manager.hpp
/// The scheduler-facing block manager: owns the BlockAllocator and every sequence's block table.
/// Host-only metadata; it never touches K/V data. The storage (HostKVCache or the device cache)
/// is driven by what it returns: slots to write, block copies to perform.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagedkv/metadata/append_result.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/metadata/block_allocator.hpp"
#include "pagedkv/metadata/eviction_policy.hpp"
#include "pagedkv/metadata/kv_cache_stats.hpp"
#include "pagedkv/metadata/prefix_cache.hpp"
#include "pagedkv/types.hpp"

namespace pagedkv {

/// Configuration of a KVCacheManager.
struct KVCacheManagerConfig {
  int32_t num_blocks = 0;   ///< blocks in the pool, >= 1
  int32_t block_size = 16;  ///< tokens per block, >= 1
  /// Publish full blocks of sequences whose token ids are known (add_sequence with a prompt,
  /// append_tokens) once commit() says their K/V are written, and share them with later prompts
  /// of the same prefix.
  bool enable_prefix_caching = false;
  /// Blocks of the host swap pool (swap_out / swap_in); 0 = no swapping.
  int32_t num_host_blocks = 0;
  /// Fraction of the pool kept free when admitting (add_sequence with a prompt, swap_in), in
  /// [0, 1): watermark_blocks() = floor(watermark * num_blocks). Admission waits rather than
  /// dip below it, so running sequences can still grow (avoids preemption thrashing).
  double watermark = 0.0;
  /// Longest sequence (tokens) the model supports; 0 = unlimited. Longer prompts are NEVER
  /// admitted; appending past it throws. It must be reachable: the constructor rejects a value
  /// whose sequence could not fit the whole pool even alone (see min_blocks_held()).
  int64_t max_model_len = 0;
  /// Token eviction policy applied to every sequence (see eviction_policy.hpp).
  EvictionPolicyConfig eviction{};
  /// Record KVCacheEvents (stored / removed / evicted) for take_events().
  bool enable_events = false;
};

/// Answer of an admission query: can_add_sequence, and the "can it ever fit" queries of the
/// other operations (append_admission, swap_out_admission, swap_in_admission). A scheduler
/// retries kLater and drops (or fails) kNever: retrying it would never end.
enum class Admission : uint8_t {
  kOk,     ///< the operation would succeed now
  kLater,  ///< not enough blocks now (watermark included); may fit once others finish
  kNever,  ///< can never fit, even with every other sequence gone (longer than max_model_len,
           ///< more blocks than the pool, or no host pool to swap to)
};

/// "ok", "later", "never".
[[nodiscard]] std::string_view admission_name(Admission admission);

/// Answer of lookup_prefix(): what add_sequence would share now, computed without changing
/// anything (no allocation, no LRU reordering, no reference count, no stats).
/// Shapes: blocks [num_computed_tokens / block_size].
struct PrefixLookup {
  /// Leading prompt tokens add_sequence would skip: a multiple of block_size, at most
  /// (len - 1) / block_size blocks; 0 without prefix caching.
  int64_t num_computed_tokens = 0;
  /// The published blocks that would be shared, in position order.
  std::vector<BlockId> blocks;
};

/// Block copies between the device pool and the host swap pool: for swap_out, src is a device
/// block and dst a host block; for swap_in, src is a host block and dst a device block. The
/// storage copies every layer's K and V of each pair (e.g. dst_cache.set_block_bytes(dst,
/// src_cache.block_bytes(src))) before the sequence runs again.
struct SwapResult {
  /// [live blocks of the sequence] (src, dst) pairs in table order: device -> host for
  /// swap_out, host -> device for swap_in.
  std::vector<BlockCopy> copies;
};

/// What a recompute preemption leaves for the caller: the sequence is gone from the manager;
/// prefill `tokens` again later (add_sequence with them; prefix caching may hit its own blocks).
struct PreemptedSequence {
  SeqId seq = 0;                ///< the id it had (free again: it may be added anew)
  int64_t num_tokens = 0;       ///< tokens the sequence held
  std::vector<TokenId> tokens;  ///< its token ids when all were known, else empty
  uint64_t extra_key = 0;       ///< its prefix-cache salt: pass it back to add_sequence to hit
};

/// Explicit kept sets of a batch of sequences, CSR: sequence i keeps the tokens at
/// [indptr[i], indptr[i+1]). Input of paged_attention_over_slots (one decode query per
/// sequence); positions are for tests and scorers.
/// Shapes: indptr [num_seqs + 1] int32; slots, positions [indptr[num_seqs]] int64, ascending
/// position within each sequence.
struct KeptTokens {
  std::vector<int32_t> indptr;     ///< [num_seqs + 1] offsets into slots and positions
  std::vector<Slot> slots;         ///< [indptr[num_seqs]] slot of each kept token
  std::vector<int64_t> positions;  ///< [indptr[num_seqs]] token position of each kept token
};

/// Sequence id that marks a padding row in batch_metadata(): context length 0, no blocks.
inline constexpr SeqId kPaddingSeq = -1;

/// Block manager for one KV cache (all layers share one block id space).
///
/// Append allocates a block only when the sequence's last block is full; a slot is
/// block_id * block_size + offset. Every operation is all-or-nothing: lack of blocks returns an
/// empty result and changes nothing; contract violations throw pagedkv::Error and change nothing.
/// Every can_* query answers exactly whether the operation it names would succeed now (prefix
/// hits, copy-on-write and blocks released by token eviction included).
/// Not internally synchronized: callers serialize access (one scheduler thread).
///
/// Sequence states: running (blocks in the device pool) or swapped (blocks in the host pool;
/// only free_sequence, swap_in and read-only queries are allowed).
///
/// Block lifecycle under prefix caching: allocated (add_sequence, append_*) -> written (the
/// engine ran the forward step) -> published (commit(): a full block whose K/V are written enters
/// the prefix index) -> cached (its last holder released it; its data stay valid, LRU) ->
/// evicted (reused for other content). Only published blocks are ever shared with another
/// prompt. A block is published only under a parent entry that is still in the index, and
/// removing an entry removes every entry below it, so the index never holds an entry that a
/// lookup cannot reach (each kStored event names a stored parent, or the root).
///
/// Token eviction (config.eviction), see eviction_policy.hpp and docs/memory-policies.md. The
/// manager asks its EvictionPolicy the same questions under every policy, before every append:
///  - the positions no query at or after the first new position sees
///    (released_positions()): the full blocks inside are released; the table keeps their
///    logical place (block_table shows kNoBlock there) and batch_metadata() fills that place
///    with the id the block had, a placeholder that the kernels' mask (attention_mask())
///    guarantees is never read;
///  - the kept tokens to evict (select_victims(), heavy hitters): the manager keeps an explicit
///    kept list for a policy that scores tokens; attention for a sequence that has evicted
///    anything runs over kept_tokens() with paged_attention_over_slots, scores come back
///    through accumulate_attention(), and blocks left with no kept token are released.
///
/// Worked example (block_size 4, 8 blocks, fresh pool): add_sequence(7); append_slots(7, 6)
/// -> slots {0,1,2,3,4,5} in blocks {0,1}; append_slots(7, 1) -> {6}; fork(7, 8) shares {0,1};
/// append_slots(8, 1) -> copies {(1,2)}, slots {11}: sequence 8 now has blocks {0,2}.
class KVCacheManager {
 public:
  /// Table entry of a block released by token eviction (block_table() only).
  static constexpr BlockId kNoBlock = -1;
  /// Most tokens one append call or append query takes (look-ahead included): 2^24, a 128 MiB
  /// slot list; 2^31 tokens is an error naming the cap, not a 16 GiB allocation attempt.
  static constexpr int64_t kMaxTokensPerCall = int64_t{1} << 24;

  /// A manager with an empty pool of config.num_blocks blocks, no sequences, and the eviction
  /// policy config.eviction describes.
  /// Errors: throws pagedkv::Error naming the value if num_blocks < 1, block_size < 1,
  /// num_host_blocks < 0, watermark outside [0, 1), max_model_len < 0, the eviction config
  /// is invalid, or max_model_len is unreachable: min_blocks_held(max_model_len) > num_blocks
  /// (names both).
  explicit KVCacheManager(const KVCacheManagerConfig& config);
  /// Deep copies (tests snapshot a manager to check that a failed operation changed nothing):
  /// plain values throughout (the shared policy is immutable), so every member is defaulted.
  KVCacheManager(const KVCacheManager& other) = default;
  /// Deep copy assignment, as the copy constructor.
  KVCacheManager& operator=(const KVCacheManager& other) = default;
  /// Takes over `other`'s pool and sequences; `other` is left valid but unspecified (assign to
  /// it or destroy it).
  KVCacheManager(KVCacheManager&& other) noexcept = default;
  /// Move assignment, as the move constructor.
  KVCacheManager& operator=(KVCacheManager&& other) noexcept = default;
  /// Drops the bookkeeping; no storage is touched (the manager owns no K/V data).
  ~KVCacheManager() = default;

  /// Registers an empty sequence (0 tokens, no blocks: an empty prompt takes no block).
  /// Its token ids are known (empty), so later append_tokens() can feed the prefix cache.
  /// Errors: throws pagedkv::Error if `seq` already exists or equals kPaddingSeq.
  void add_sequence(SeqId seq);

  /// Admission query for a prompt: kOk exactly when add_sequence(seq, prompt, extra_key) would
  /// succeed now. Blocks needed = ceil(len / block_size) - prefix hits; hit blocks that are
  /// cached with ref count 0 also leave the available pool. kOk when num_free_blocks() minus
  /// those minus the blocks needed >= watermark_blocks(); kNever when len > max_model_len (if
  /// set) or ceil(len / block_size) > num_blocks - watermark_blocks(); else kLater.
  /// Units: len = prompt.size() tokens; blocks.
  [[nodiscard]] Admission can_add_sequence(std::span<const TokenId> prompt,
                                           uint64_t extra_key = 0) const;
  /// can_add_sequence with options: kOk exactly when add_sequence(seq, prompt, options) would
  /// succeed now. Blocks needed now: those of the prefix hits plus options.first_chunk_tokens
  /// prompt tokens (the whole prompt by default), minus the hits. kNever, in addition: when
  /// len + max_new_tokens > max_model_len (if set), or min_blocks_held(len + max_new_tokens) >
  /// num_blocks (appends may use the watermark's reserve).
  /// Errors: throws pagedkv::Error if max_new_tokens < 0 or first_chunk_tokens < -1.
  [[nodiscard]] Admission can_add_sequence(std::span<const TokenId> prompt,
                                           const AddOptions& options) const;

  /// Registers `seq` with its prompt: shares the longest published prefix of full blocks (prefix
  /// caching on; at most (len - 1) / block_size blocks, so one token is always left to
  /// compute), allocates the rest, counts prefix stats. The new blocks are published only once
  /// commit() says their K/V are written (the hit positions count as committed).
  /// Empty (nothing changed) unless can_add_sequence() is kOk. `extra_key` salts every block
  /// key of this sequence (adapter id, cache salt; 0 = none).
  /// Errors: throws if `seq` exists or is kPaddingSeq.
  [[nodiscard]] std::optional<AddResult> add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                                      uint64_t extra_key = 0);
  /// add_sequence with options: chunked prefill (first_chunk_tokens: the sequence then holds
  /// num_computed_tokens + that many tokens; append the rest of the prompt with append_tokens)
  /// and max_new_tokens for admission. Nothing is published until commit().
  /// Example (block_size 4, 16-token prompt, first_chunk_tokens 4, nothing cached): slots of
  /// positions 0..3, one block; then append_tokens(seq, prompt[4..8)), commit(seq, 8), ...
  /// Errors: as add_sequence, and as can_add_sequence(prompt, options).
  [[nodiscard]] std::optional<AddResult> add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                                      const AddOptions& options);

  /// Read-only prefix lookup (vLLM v1's get_computed_blocks, SGLang's match_prefix): the
  /// published blocks add_sequence(seq, prompt, extra_key) would share now. Allocates no
  /// block, touches no reference count, LRU order or counter.
  /// Units: num_computed_tokens in tokens. Cost: O(len) hashing.
  [[nodiscard]] PrefixLookup lookup_prefix(std::span<const TokenId> prompt,
                                           uint64_t extra_key = 0) const;

  /// Publish after write: the first `num_tokens` positions of `seq` now have their K/V in the
  /// cache (call it after each forward step, e.g. with num_tokens(seq)). Full blocks inside
  /// [0, num_tokens) whose token ids are known are published in position order (prefix caching
  /// on; kStored events), each only while its parent's entry is in the index. Commits are
  /// monotone: a num_tokens below num_committed_tokens(seq) changes nothing. Returns the number
  /// of blocks published by this call.
  /// Worked example (block_size 4): add_sequence(1, 9-token prompt); commit(1, 4) publishes
  /// block 0 only; free_sequence(1) then leaves only block 0 findable.
  /// Errors: throws pagedkv::Error if `seq` is unknown or swapped, or num_tokens is negative or
  /// greater than num_tokens(seq) (names both).
  int32_t commit(SeqId seq, int64_t num_tokens);
  /// Positions of `seq` committed so far (prefix hits count as committed).
  /// Errors: throws if `seq` is unknown.
  [[nodiscard]] int64_t num_committed_tokens(SeqId seq) const;

  /// Rollback (speculative decoding rejects draft tokens): keeps the first `num_tokens` tokens
  /// of `seq` and releases the blocks past the new end, tail first. Released blocks stay
  /// published if they were (another sequence may use them); the committed count drops to at
  /// most num_tokens. If the new last block is partially filled and shared or published, the
  /// next append copies it first (copy-on-write): a block others may read is never written.
  /// Errors: throws pagedkv::Error if `seq` is unknown or swapped, num_tokens is negative or
  /// greater than num_tokens(seq), the sequence has evicted heavy-hitter tokens (its table is
  /// not positional), or token eviction released a block that the query at num_tokens - 1 sees
  /// (its data are gone). Nothing changes then.
  void truncate(SeqId seq, int64_t num_tokens);

  /// Releases every block of `seq` (tail blocks first, so cached tail blocks are evicted before
  /// the head blocks other prompts are likelier to share) and forgets it. A swapped sequence's
  /// host blocks are released instead.
  /// Errors: throws pagedkv::Error if `seq` is unknown.
  void free_sequence(SeqId seq);

  /// Copy-on-write fork: `child` gets the parent's tokens and shares every block (ref counts +1).
  /// No block is allocated. Errors: throws if `parent` is unknown or swapped, or `child` exists
  /// or equals kPaddingSeq.
  void fork(SeqId parent, SeqId child);

  /// Blocks append_slots(seq, n) (with a look-ahead: of n + num_lookahead_slots, as can_append
  /// counts) takes from the pool, copy-on-write included, before token eviction's releases.
  /// Units: tokens; blocks. Errors: as can_append.
  [[nodiscard]] int32_t blocks_needed_to_append(SeqId seq, int64_t n,
                                                int64_t num_lookahead_slots = 0) const;

  /// True exactly when append_slots(seq, n + num_lookahead_slots) would succeed now: with a
  /// look-ahead (vLLM v0's num_lookahead_slots), a successful append of n is guaranteed room for
  /// that many more slots in the same step. Look-ahead slots past max_model_len are not counted.
  /// Errors: throws if `seq` is unknown or swapped, n < 0 or num_lookahead_slots < 0, n +
  /// num_lookahead_slots > kMaxTokensPerCall (naming the cap), or the append of n would pass
  /// max_model_len.
  [[nodiscard]] bool can_append(SeqId seq, int64_t n, int64_t num_lookahead_slots = 0) const;

  /// Can append_slots(seq, n) ever succeed: kOk exactly when can_append(seq, n, lookahead);
  /// kNever past max_model_len (an answer, not an error) or when the blocks seq would hold after
  /// it (n + counted look-ahead, eviction and copy-on-write included) exceed the pool; else
  /// kLater. Errors: as can_append, except past max_model_len.
  [[nodiscard]] Admission append_admission(SeqId seq, int64_t n,
                                           int64_t num_lookahead_slots = 0) const;

  /// Appends n tokens to `seq` and returns their slots (and any copy-on-write copies). Token
  /// eviction runs first (blocks released, heavy-hitter victims dropped). Token ids are unknown
  /// afterwards, so the sequence stops feeding the prefix cache (use append_tokens for that).
  /// Empty (and nothing changed) when the pool cannot cover all n tokens.
  /// Units: n in tokens. Errors: throws if `seq` is unknown or swapped, n < 0, n >
  /// kMaxTokensPerCall (naming the cap; nothing is allocated), or the sequence would pass
  /// max_model_len.
  [[nodiscard]] std::optional<AppendResult> append_slots(SeqId seq, int64_t n);
  /// append_slots(seq, n) with `options` (AppendOptions::return_slots = false: no slots).
  [[nodiscard]] std::optional<AppendResult> append_slots(SeqId seq, int64_t n,
                                                         const AppendOptions& options);

  /// append_slots(seq, tokens.size()) that also records the token ids, so blocks that become
  /// full are registered in the prefix cache (prefix caching on). Errors: as append_slots.
  [[nodiscard]] std::optional<AppendResult> append_tokens(SeqId seq,
                                                          std::span<const TokenId> tokens);
  /// append_tokens(seq, tokens) with `options` (AppendOptions::return_slots = false: no slots).
  [[nodiscard]] std::optional<AppendResult> append_tokens(SeqId seq,
                                                          std::span<const TokenId> tokens,
                                                          const AppendOptions& options);

  /// Metadata for a batch step: sequence i contributes its whole table and context length
  /// num_tokens(seqs[i]); its slot mapping lists its last num_new_tokens[i] positions (the
  /// tokens this step writes). A seq equal to kPaddingSeq gives a padding row (context 0, no
  /// slots) and must have num_new_tokens 0. Entries released by a positional eviction policy
  /// hold a placeholder (the id the block had): the kernels must run with that policy's mask
  /// (eviction_policy().set_attention_mask), which never reads them.
  /// Errors: throws if sizes differ, a seq is unknown or swapped, num_new_tokens[i] is negative
  /// or greater than the sequence's token count, a new token's block was released, a
  /// heavy-hitter sequence has evicted tokens (use kept_tokens()), or the batch overflows the
  /// int32 offsets (query_start, CSR indptr).
  [[nodiscard]] BatchMetadata batch_metadata(std::span<const SeqId> seqs,
                                             std::span<const int64_t> num_new_tokens) const;

  /// batch_metadata() into caller-owned storage, what a serving loop calls every step: `out`
  /// is overwritten (same shapes and contents as the returning form) and its vectors keep their
  /// capacity, so steps allocate nothing once the batch stops growing.
  /// Errors: as the returning form; all checks run before `out` is written, so a throw leaves
  /// `out` (and the manager) unchanged.
  void batch_metadata(std::span<const SeqId> seqs, std::span<const int64_t> num_new_tokens,
                      BatchMetadata& out) const;

  /// The kept sets of `seqs` (see KeptTokens): for a heavy-hitter sequence its kept list; for a
  /// positional policy the positions the query at num_tokens - 1 sees (all of them without a
  /// policy); kPaddingSeq gives an empty row. Errors: throws if a seq is unknown or swapped, or
  /// the batch keeps more than 2^31 - 1 tokens (int32 indptr).
  [[nodiscard]] KeptTokens kept_tokens(std::span<const SeqId> seqs) const;

  /// Heavy hitters: adds attention weights to the kept tokens' scores.
  /// Shapes: weights [kept count of seq], in kept_tokens() order (ascending position): e.g. the
  /// probs of paged_attention_over_slots summed over layers (and over query rows for a prefill).
  /// Errors: throws if `seq` is unknown or swapped, the policy is not heavy hitters, the size
  /// differs from the kept count, or a weight is negative or not finite.
  void accumulate_attention(SeqId seq, std::span<const float> weights);

  /// True exactly when swap_out(seq) would succeed: the live (non-released) blocks of its table
  /// fit in the free host blocks (always false without a host pool, num_host_blocks 0).
  /// Errors: throws if `seq` is unknown or swapped.
  [[nodiscard]] bool can_swap_out(SeqId seq) const;
  /// Preempts `seq` by swapping: each live block gets a host block (copies device -> host),
  /// device references are dropped, the sequence becomes swapped. Empty (nothing changed) when
  /// the host pool is short. Counts a preemption.
  /// Errors: throws if `seq` is unknown or already swapped.
  [[nodiscard]] std::optional<SwapResult> swap_out(SeqId seq);
  /// Whether swap_out(seq) can ever succeed: kOk exactly when can_swap_out(seq); kNever without
  /// a host pool (num_host_blocks 0) or when its live blocks exceed the whole host pool; else
  /// kLater. Errors: as can_swap_out.
  [[nodiscard]] Admission swap_out_admission(SeqId seq) const;
  /// True exactly when swap_in(seq, num_lookahead_slots) would succeed: live blocks plus the
  /// blocks an append of num_lookahead_slots tokens would then take (vLLM v0's look-ahead, so
  /// the step's append after a swap-in cannot fail) <= available - watermark_blocks().
  /// Errors: throws if `seq` is unknown or not swapped, or num_lookahead_slots < 0.
  [[nodiscard]] bool can_swap_in(SeqId seq, int64_t num_lookahead_slots = 0) const;
  /// Whether swap_in(seq, num_lookahead_slots) can ever succeed: kOk exactly when can_swap_in;
  /// kNever when the blocks it needs exceed num_blocks - watermark_blocks(); else kLater.
  /// Errors: as can_swap_in.
  [[nodiscard]] Admission swap_in_admission(SeqId seq, int64_t num_lookahead_slots = 0) const;
  /// Restores a swapped sequence: fresh device blocks (ids may differ from before), copies
  /// host -> device, table remapped, host blocks released. Data are bit-identical once the
  /// copies are done. Empty (nothing changed) unless can_swap_in(seq, num_lookahead_slots);
  /// the look-ahead blocks are checked, not allocated.
  /// Errors: throws if `seq` is unknown or not swapped, or num_lookahead_slots < 0.
  [[nodiscard]] std::optional<SwapResult> swap_in(SeqId seq, int64_t num_lookahead_slots = 0);
  /// True when `seq` is swapped out. Errors: throws if unknown.
  [[nodiscard]] bool is_swapped(SeqId seq) const;

  /// Preempts `seq` by recompute: frees its blocks (full prefix-cached ones stay cached, so the
  /// re-prefill may hit them), forgets it, counts a preemption, returns what to prefill again.
  /// Errors: throws if `seq` is unknown or swapped (free_sequence drops a swapped one).
  PreemptedSequence preempt(SeqId seq);

  /// Drops every prefix-cache registration: cached ref-0 blocks become free, registered blocks
  /// in use stay with their sequences but are no longer shareable, and nothing a sequence
  /// computed before the reset is published afterwards: a sequence with committed tokens at the
  /// reset publishes no block for the rest of its life (K/V computed before a reset, e.g. under
  /// old weights, and every block after them, which attends to them, are stale). Returns the
  /// registrations dropped: one kRemoved event each (block order), then one kAllCleared.
  int32_t reset_prefix_cache();

  /// Tokens held by `seq` (positions processed, evicted ones included). Errors: throws if unknown.
  [[nodiscard]] int64_t num_tokens(SeqId seq) const;
  /// Physical blocks of `seq` in logical order (kNoBlock where token eviction released one); for
  /// a swapped sequence, host pool ids. For a heavy-hitter sequence that evicted tokens, the
  /// order is allocation order, not positions. Valid until the next mutation.
  /// Errors: throws if unknown.
  [[nodiscard]] std::span<const BlockId> block_table(SeqId seq) const;
  /// True when `seq` is registered (running or swapped).
  [[nodiscard]] bool has_sequence(SeqId seq) const { return seqs_.contains(seq); }
  /// Sequence ids in ascending order.
  [[nodiscard]] std::vector<SeqId> sequences() const;
  /// Registered sequences, swapped ones included.
  [[nodiscard]] int32_t num_sequences() const { return static_cast<int32_t>(seqs_.size()); }

  /// Blocks an allocation can still get (free + evictable cached).
  [[nodiscard]] int32_t num_free_blocks() const { return allocator_.num_available(); }
  /// Device pool size (config.num_blocks), in blocks.
  [[nodiscard]] int32_t num_total_blocks() const { return allocator_.num_blocks(); }
  /// floor(watermark * num_blocks).
  [[nodiscard]] int32_t watermark_blocks() const { return watermark_blocks_; }
  /// The fewest blocks a sequence of `num_tokens` tokens can hold under the eviction policy: a
  /// sequence grown one token at a time, after every release token eviction allows
  /// (ceil(num_tokens / block_size) without eviction). What "can never fit" is measured by.
  /// Units: tokens in, blocks out. Errors: throws if num_tokens < 0.
  [[nodiscard]] int64_t min_blocks_held(int64_t num_tokens) const;
  /// Fraction of blocks in use (ref count >= 1), in [0, 1].
  [[nodiscard]] double usage() const;

  /// Counters; see KVCacheStats for the invariants.
  [[nodiscard]] KVCacheStats stats() const;
  /// Returns and clears the event log (always empty unless config.enable_events).
  std::vector<KVCacheEvent> take_events();

  /// The device pool (ref counts, free list, LRU of cached blocks), read-only: tests, dumps.
  [[nodiscard]] const BlockAllocator& allocator() const { return allocator_; }
  /// Host swap pool (num_host_blocks blocks); null when num_host_blocks == 0.
  [[nodiscard]] const BlockAllocator* host_allocator() const { return host_ ? &*host_ : nullptr; }
  /// The prefix-cache index, read-only; empty unless config.enable_prefix_caching.
  [[nodiscard]] const PrefixCache& prefix_cache() const { return prefix_; }
  /// The token eviction policy built from config.eviction (NoEviction by default); kernels
  /// over batch_metadata() take its mask through set_attention_mask().
  [[nodiscard]] const EvictionPolicy& eviction_policy() const { return *policy_; }
  /// The configuration the manager was built with.
  [[nodiscard]] const KVCacheManagerConfig& config() const { return config_; }

  /// Checks every invariant: the pools' and the prefix index's own (their check_invariants);
  /// each block's ref count == tables holding it; each positional table has ceil(tokens /
  /// block_size) entries; prefix entries only on cached blocks; host pool counts; stats. O(total
  /// blocks + total tokens). Errors: throws pagedkv::Error describing the first violation.
  void check_invariants() const;

 private:
  friend struct test_hooks::ManagerCorruptor;
  struct Sequence;
  struct AppendPlan;  // src/metadata/manager_internal.hpp

  /// The kept set of one sequence, what token eviction leaves of it (src/metadata/kept_set.cpp).
  /// Under a positional policy it is implicit: the policy's mask decides and nothing is stored.
  /// Under a policy that scores tokens (heavy hitters) it is an explicit list of the kept tokens
  /// with their slots and scores; once a token is evicted the table is sparse: entries no longer
  /// follow positions and new tokens refill freed slots.
  class KeptSet {
   public:
    KeptSet() = default;
    explicit KeptSet(bool scored) : scored_(scored) {}
    [[nodiscard]] bool sparse() const { return sparse_; }
    /// Records positions [first, first + n) at their positional slots (scored sets only).
    void add_positional(int64_t first, int64_t n, int32_t block_size) {
      if (scored_) add_tokens(first, n, block_size);
    }
    /// Plans what token eviction does to a listed set before n tokens are appended at `next`:
    /// plan.victims, the tokens `policy` evicts, and when the table is sparse or the victims
    /// make it so, the refill (entries emptied by the victims, holes to fill, fresh blocks and
    /// where they go). Returns false, leaving `plan` as it was, when the table stays positional
    /// (an unlisted set, i.e. a positional policy's, or no victim yet).
    bool plan_refill(const EvictionPolicy& policy, std::span<const BlockId> blocks,
                     const BlockAllocator& pool, int32_t block_size, int64_t next, int64_t n,
                     AppendPlan& plan) const {
      if (tokens_.empty() && !sparse_) return false;
      return plan_listed(policy, blocks, pool, block_size, next, n, plan);
    }
    /// Commits a refill plan: drops the victims, puts the `fresh` blocks at their entries,
    /// records the n tokens appended at `first` and writes their slots.
    void place_refill(std::vector<BlockId>& blocks, std::vector<BlockId>& placeholders,
                      const AppendPlan& plan, std::span<const BlockId> fresh, int32_t block_size,
                      int64_t first, int64_t n, std::vector<Slot>& slots);
    /// Appends the kept tokens' slots and positions: the list, or the positions the query at
    /// num_tokens - 1 sees under `mask`.
    void append_kept(std::span<const BlockId> blocks, int64_t num_tokens, AttentionMask mask,
                     int32_t block_size, KeptTokens& out) const;
    /// Drops the kept tokens at positions >= n (truncate of a positional table).
    void truncate(int64_t n) {
      std::erase_if(tokens_, [n](const Token& k) { return k.position >= n; });
    }
    /// Adds attention weights to the scores. Errors: throws naming the policy `kind` if the set
    /// is not scored, naming the sizes if weights.size() differs, the weight if one is negative
    /// or not finite.
    void accumulate(SeqId seq, std::span<const float> weights, EvictionKind kind);
    /// Checks the list against the table (scored sets). Errors: throws on the first violation.
    void check(SeqId seq, std::span<const BlockId> blocks, int64_t num_tokens,
               int32_t block_size) const;

   private:
    friend struct test_hooks::ManagerCorruptor;
    void add_tokens(int64_t first, int64_t n, int32_t block_size);
    bool plan_listed(const EvictionPolicy& policy, std::span<const BlockId> blocks,
                     const BlockAllocator& pool, int32_t block_size, int64_t next, int64_t n,
                     AppendPlan& plan) const;
    void plan_sparse(std::span<const BlockId> blocks, const BlockAllocator& pool,
                     int32_t block_size, int64_t n, AppendPlan& plan) const;
    void erase(std::span<const size_t> victims);

    struct Token {
      int64_t position;
      int32_t entry;   // index into Sequence::blocks
      int32_t offset;  // token offset in that block
      double score;
    };
    std::vector<Token> tokens_;  // ascending position
    bool scored_ = false;
    bool sparse_ = false;
  };

  struct Sequence {
    std::vector<BlockId> blocks;        // kNoBlock for released entries
    std::vector<BlockId> placeholders;  // [blocks.size()]: id a released entry had, else -1
    int64_t num_tokens = 0;
    bool swapped = false;
    // Prefix caching: token ids while all are known; per full block its key and the serial of
    // the registered entry holding that content (0: none, the chain stops there).
    bool ids_known = true;
    int64_t committed = 0;    // positions whose K/V the engine has written (commit())
    bool publishable = true;  // false once reset_prefix_cache saw K/V of it (computed before)
    std::vector<TokenId> token_ids;
    std::vector<BlockHash> hashes;
    std::vector<uint64_t> serials;
    uint64_t extra_key = 0;
    KeptSet kept;
  };

  // kv_cache_manager.cpp
  const Sequence& get(SeqId seq, const char* op) const;
  Sequence& get(SeqId seq, const char* op);
  const Sequence& get_running(SeqId seq, const char* op) const;
  Sequence new_sequence() const;
  void emit(KVCacheEvent event);
  // The members declared `inline` are defined in the one source (or private header) that calls
  // them: the library is built -fPIC, and GCC does not inline a call to an interposable
  // (non-inline, default-visibility) function there; these sit on the append hot path.
  // kv_cache_manager_prefix.cpp (allocate_blocks: manager_internal.hpp)
  inline std::optional<std::vector<BlockId>> allocate_blocks(int32_t n);
  std::optional<std::vector<BlockId>> allocate_evicting(int32_t n);
  void drop_evicted(BlockId b);
  void drop_descendants(BlockId b);
  [[nodiscard]] bool entry_alive(BlockHash hash, uint64_t serial) const;
  int32_t register_full_blocks(Sequence& s);
  [[nodiscard]] Admission never_fits(int64_t len, const AddOptions& options) const;
  // kv_cache_manager_rollback.cpp (truncate); kv_cache_manager_swap.cpp (lookahead_blocks)
  void check_truncate(SeqId seq, const Sequence& s, int64_t num_tokens) const;
  [[nodiscard]] int64_t lookahead_blocks(const Sequence& s, int64_t n) const;
  // manager_internal.hpp: [first, last) logical blocks an append at position t releases
  [[nodiscard]] inline std::pair<int64_t, int64_t> released_block_range(int64_t t) const;
  AppendPlan plan_append(const Sequence& s, int64_t n, const char* op) const;  // _append.cpp
  AppendPlan plan_lookahead(const Sequence& s, int64_t n, int64_t k, const char* op) const;
  inline void plan_positional(const Sequence& s, int64_t n, AppendPlan& plan) const;
  std::optional<AppendResult> do_append(SeqId seq, int64_t n, std::span<const TokenId> ids,
                                        bool slots, const char* op);
  inline void release_entries(Sequence& s, const std::vector<int32_t>& entries);
  [[nodiscard]] inline bool fills_last_block(const Sequence& s, int64_t n) const;
  inline static void record_ids(Sequence& s, int64_t n, std::span<const TokenId> ids);
  inline void place_positional(Sequence& s, const AppendPlan& plan,
                               const std::vector<BlockId>& fresh, int64_t n, bool slots,
                               AppendResult& result);
  // kv_cache_manager_batch.cpp
  int64_t check_batch(std::span<const SeqId> seqs, std::span<const int64_t> num_new_tokens,
                      std::vector<const Sequence*>& rows) const;
  // kv_cache_manager_invariants.cpp
  void check_sequence(SeqId id, const Sequence& s, std::vector<int32_t>& holders,
                      std::vector<int32_t>& host_holders, int32_t& host_live) const;
  void check_blocks(std::span<const int32_t> holders) const;
  void check_host_pool(std::span<const int32_t> host_holders, int32_t host_live) const;
  KVCacheManagerConfig config_;
  BlockAllocator allocator_;
  std::optional<BlockAllocator> host_;  // the swap pool; empty when num_host_blocks == 0
  PrefixCache prefix_;
  std::shared_ptr<const EvictionPolicy> policy_;
  int32_t watermark_blocks_ = 0;
  std::unordered_map<SeqId, Sequence> seqs_;
  KVCacheStats counters_;
  std::vector<KVCacheEvent> events_;
  std::vector<BlockId> evicted_;  // scratch of allocate_evicting, empty between calls
};

}  // namespace pagedkv
