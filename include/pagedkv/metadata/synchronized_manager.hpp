#pragma once
/// @file synchronized_manager.hpp
/// A KVCacheManager behind one mutex, for callers that drive the cache from several threads: an
/// API thread admitting and aborting requests while the scheduler thread appends, for example.
///
/// KVCacheManager itself is deliberately NOT internally synchronized: the common deployment is
/// one scheduler thread, which should not pay for a lock on every append. This wrapper makes the
/// other deployment safe without touching the manager: every call takes the lock for its whole
/// duration, so each forwarded operation is atomic with respect to the others and keeps the
/// manager's guarantees (all-or-nothing, strong exception safety, conservation).
///
/// Calls that return views into the manager (block_table) return copies here, because a view
/// would dangle as soon as the lock is released. A sequence of calls that must be atomic as a
/// whole (e.g. "can_append then append_slots", "swap_out the youngest running sequence") goes
/// through with_lock(), which runs a callable on the manager under the lock.
///
/// Worked example (two threads):
///   SynchronizedKVCacheManager m({.num_blocks = 64, .block_size = 16});
///   // thread A                              // thread B
///   m.add_sequence(1);                       m.add_sequence(2);
///   auto r = m.append_slots(1, 20);          m.free_sequence(2);
///   // check-and-act atomically:
///   auto slots = m.with_lock([](KVCacheManager& k) {
///     return k.can_append(1, 1) ? k.append_slots(1, 1) : std::nullopt; });

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "pagedkv/metadata/kv_cache_manager.hpp"

namespace pagedkv {

/// Internally synchronized KVCacheManager: every member takes one std::mutex.
/// Errors: exactly those of the forwarded KVCacheManager call (the lock is released on throw).
/// Not copyable or movable (it owns the mutex); share it by reference or pointer.
class SynchronizedKVCacheManager {
 public:
  /// Wraps a fresh KVCacheManager(config). Errors: as KVCacheManager(config).
  explicit SynchronizedKVCacheManager(const KVCacheManagerConfig& config) : manager_(config) {}
  /// Takes over an existing manager, such as one restored from a snapshot().
  explicit SynchronizedKVCacheManager(KVCacheManager&& manager) : manager_(std::move(manager)) {}
  /// Not copyable: it owns the mutex (snapshot() copies the manager).
  SynchronizedKVCacheManager(const SynchronizedKVCacheManager&) = delete;
  /// Not copy-assignable: it owns the mutex.
  SynchronizedKVCacheManager& operator=(const SynchronizedKVCacheManager&) = delete;

  /// Runs fn(KVCacheManager&) under the lock and returns what it returns: the escape hatch for
  /// compound operations and for calls not forwarded below. fn must not call back into this
  /// wrapper (std::mutex is not recursive: that would deadlock) and must not let references or
  /// spans into the manager escape.
  template <typename Fn>
  decltype(auto) with_lock(Fn&& fn) {
    std::lock_guard lock(mutex_);
    return std::forward<Fn>(fn)(manager_);
  }
  /// Read-only with_lock: fn gets a const KVCacheManager&.
  template <typename Fn>
  decltype(auto) with_lock(Fn&& fn) const {
    std::lock_guard lock(mutex_);
    return std::forward<Fn>(fn)(std::as_const(manager_));
  }

  /// A deep copy of the manager taken atomically (tests, metrics dumps).
  [[nodiscard]] KVCacheManager snapshot() const {
    std::lock_guard lock(mutex_);
    return manager_;
  }

  // ---- mutators: see KVCacheManager for contracts, units and errors --------------------------
  /// @copydoc KVCacheManager::add_sequence(SeqId)
  void add_sequence(SeqId seq) {
    std::lock_guard lock(mutex_);
    manager_.add_sequence(seq);
  }
  /// @copydoc KVCacheManager::add_sequence(SeqId, std::span<const TokenId>, uint64_t)
  [[nodiscard]] std::optional<AddResult> add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                                      uint64_t extra_key = 0) {
    std::lock_guard lock(mutex_);
    return manager_.add_sequence(seq, prompt, extra_key);
  }
  /// @copydoc KVCacheManager::add_sequence(SeqId, std::span<const TokenId>, const AddOptions&)
  [[nodiscard]] std::optional<AddResult> add_sequence(SeqId seq, std::span<const TokenId> prompt,
                                                      const AddOptions& options) {
    std::lock_guard lock(mutex_);
    return manager_.add_sequence(seq, prompt, options);
  }
  /// @copydoc KVCacheManager::commit
  int32_t commit(SeqId seq, int64_t num_tokens) {
    std::lock_guard lock(mutex_);
    return manager_.commit(seq, num_tokens);
  }
  /// @copydoc KVCacheManager::truncate
  void truncate(SeqId seq, int64_t num_tokens) {
    std::lock_guard lock(mutex_);
    manager_.truncate(seq, num_tokens);
  }
  /// @copydoc KVCacheManager::free_sequence
  void free_sequence(SeqId seq) {
    std::lock_guard lock(mutex_);
    manager_.free_sequence(seq);
  }
  /// @copydoc KVCacheManager::fork
  void fork(SeqId parent, SeqId child) {
    std::lock_guard lock(mutex_);
    manager_.fork(parent, child);
  }
  /// @copydoc KVCacheManager::append_slots
  [[nodiscard]] std::optional<AppendResult> append_slots(SeqId seq, int64_t n) {
    std::lock_guard lock(mutex_);
    return manager_.append_slots(seq, n);
  }
  /// @copydoc KVCacheManager::append_tokens
  [[nodiscard]] std::optional<AppendResult> append_tokens(SeqId seq,
                                                          std::span<const TokenId> tokens) {
    std::lock_guard lock(mutex_);
    return manager_.append_tokens(seq, tokens);
  }
  /// @copydoc KVCacheManager::accumulate_attention
  void accumulate_attention(SeqId seq, std::span<const float> weights) {
    std::lock_guard lock(mutex_);
    manager_.accumulate_attention(seq, weights);
  }
  /// @copydoc KVCacheManager::swap_out
  [[nodiscard]] std::optional<SwapResult> swap_out(SeqId seq) {
    std::lock_guard lock(mutex_);
    return manager_.swap_out(seq);
  }
  /// @copydoc KVCacheManager::swap_in
  [[nodiscard]] std::optional<SwapResult> swap_in(SeqId seq, int64_t num_lookahead_slots = 0) {
    std::lock_guard lock(mutex_);
    return manager_.swap_in(seq, num_lookahead_slots);
  }
  /// @copydoc KVCacheManager::preempt
  PreemptedSequence preempt(SeqId seq) {
    std::lock_guard lock(mutex_);
    return manager_.preempt(seq);
  }
  /// @copydoc KVCacheManager::reset_prefix_cache
  int32_t reset_prefix_cache() {
    std::lock_guard lock(mutex_);
    return manager_.reset_prefix_cache();
  }
  /// @copydoc KVCacheManager::take_events
  std::vector<KVCacheEvent> take_events() {
    std::lock_guard lock(mutex_);
    return manager_.take_events();
  }

  // ---- queries: each answer is exact at the moment of the call; another thread may change the
  // state right after, so "query then act" belongs in with_lock() --------------------------------
  /// @copydoc KVCacheManager::can_add_sequence(std::span<const TokenId>, uint64_t) const
  [[nodiscard]] Admission can_add_sequence(std::span<const TokenId> prompt,
                                           uint64_t extra_key = 0) const {
    std::lock_guard lock(mutex_);
    return manager_.can_add_sequence(prompt, extra_key);
  }
  /// @copydoc KVCacheManager::can_add_sequence(std::span<const TokenId>, const AddOptions&) const
  [[nodiscard]] Admission can_add_sequence(std::span<const TokenId> prompt,
                                           const AddOptions& options) const {
    std::lock_guard lock(mutex_);
    return manager_.can_add_sequence(prompt, options);
  }
  /// @copydoc KVCacheManager::lookup_prefix
  [[nodiscard]] PrefixLookup lookup_prefix(std::span<const TokenId> prompt,
                                           uint64_t extra_key = 0) const {
    std::lock_guard lock(mutex_);
    return manager_.lookup_prefix(prompt, extra_key);
  }
  /// @copydoc KVCacheManager::num_committed_tokens
  [[nodiscard]] int64_t num_committed_tokens(SeqId seq) const {
    std::lock_guard lock(mutex_);
    return manager_.num_committed_tokens(seq);
  }
  /// @copydoc KVCacheManager::append_admission
  [[nodiscard]] Admission append_admission(SeqId seq, int64_t n,
                                           int64_t num_lookahead_slots = 0) const {
    std::lock_guard lock(mutex_);
    return manager_.append_admission(seq, n, num_lookahead_slots);
  }
  /// @copydoc KVCacheManager::swap_out_admission
  [[nodiscard]] Admission swap_out_admission(SeqId seq) const {
    std::lock_guard lock(mutex_);
    return manager_.swap_out_admission(seq);
  }
  /// @copydoc KVCacheManager::swap_in_admission
  [[nodiscard]] Admission swap_in_admission(SeqId seq, int64_t num_lookahead_slots = 0) const {
    std::lock_guard lock(mutex_);
    return manager_.swap_in_admission(seq, num_lookahead_slots);
  }
  /// @copydoc KVCacheManager::blocks_needed_to_append
  [[nodiscard]] int32_t blocks_needed_to_append(SeqId seq, int64_t n,
                                                int64_t num_lookahead_slots = 0) const {
    std::lock_guard lock(mutex_);
    return manager_.blocks_needed_to_append(seq, n, num_lookahead_slots);
  }
  /// @copydoc KVCacheManager::can_append
  [[nodiscard]] bool can_append(SeqId seq, int64_t n, int64_t num_lookahead_slots = 0) const {
    std::lock_guard lock(mutex_);
    return manager_.can_append(seq, n, num_lookahead_slots);
  }
  /// @copydoc KVCacheManager::can_swap_out
  [[nodiscard]] bool can_swap_out(SeqId seq) const {
    std::lock_guard lock(mutex_);
    return manager_.can_swap_out(seq);
  }
  /// @copydoc KVCacheManager::can_swap_in
  [[nodiscard]] bool can_swap_in(SeqId seq, int64_t num_lookahead_slots = 0) const {
    std::lock_guard lock(mutex_);
    return manager_.can_swap_in(seq, num_lookahead_slots);
  }
  /// @copydoc KVCacheManager::is_swapped
  [[nodiscard]] bool is_swapped(SeqId seq) const {
    std::lock_guard lock(mutex_);
    return manager_.is_swapped(seq);
  }
  /// KVCacheManager::batch_metadata(seqs, num_new_tokens) under the lock: the step's block
  /// tables (padded and CSR), slot mapping and query_start, by value. Shapes, units and errors:
  /// those of KVCacheManager::batch_metadata.
  [[nodiscard]] BatchMetadata batch_metadata(std::span<const SeqId> seqs,
                                             std::span<const int64_t> num_new_tokens) const {
    std::lock_guard lock(mutex_);
    return manager_.batch_metadata(seqs, num_new_tokens);
  }
  /// KVCacheManager::batch_metadata(seqs, num_new_tokens, out) under the lock: fills the
  /// caller-owned `out`, whose vectors keep their capacity; a throw leaves `out` unchanged.
  /// Shapes, units and errors: those of KVCacheManager::batch_metadata.
  void batch_metadata(std::span<const SeqId> seqs, std::span<const int64_t> num_new_tokens,
                      BatchMetadata& out) const {
    std::lock_guard lock(mutex_);
    manager_.batch_metadata(seqs, num_new_tokens, out);
  }
  /// @copydoc KVCacheManager::kept_tokens
  [[nodiscard]] KeptTokens kept_tokens(std::span<const SeqId> seqs) const {
    std::lock_guard lock(mutex_);
    return manager_.kept_tokens(seqs);
  }
  /// @copydoc KVCacheManager::num_tokens
  [[nodiscard]] int64_t num_tokens(SeqId seq) const {
    std::lock_guard lock(mutex_);
    return manager_.num_tokens(seq);
  }
  /// A copy of the block table (KVCacheManager::block_table returns a view that would dangle
  /// once the lock is released).
  [[nodiscard]] std::vector<BlockId> block_table(SeqId seq) const {
    std::lock_guard lock(mutex_);
    const std::span<const BlockId> table = manager_.block_table(seq);
    return {table.begin(), table.end()};
  }
  /// @copydoc KVCacheManager::has_sequence
  [[nodiscard]] bool has_sequence(SeqId seq) const {
    std::lock_guard lock(mutex_);
    return manager_.has_sequence(seq);
  }
  /// @copydoc KVCacheManager::sequences
  [[nodiscard]] std::vector<SeqId> sequences() const {
    std::lock_guard lock(mutex_);
    return manager_.sequences();
  }
  /// @copydoc KVCacheManager::num_sequences
  [[nodiscard]] int32_t num_sequences() const {
    std::lock_guard lock(mutex_);
    return manager_.num_sequences();
  }
  /// @copydoc KVCacheManager::num_free_blocks
  [[nodiscard]] int32_t num_free_blocks() const {
    std::lock_guard lock(mutex_);
    return manager_.num_free_blocks();
  }
  /// @copydoc KVCacheManager::num_total_blocks
  [[nodiscard]] int32_t num_total_blocks() const {
    std::lock_guard lock(mutex_);
    return manager_.num_total_blocks();
  }
  /// @copydoc KVCacheManager::watermark_blocks
  [[nodiscard]] int32_t watermark_blocks() const {
    std::lock_guard lock(mutex_);
    return manager_.watermark_blocks();
  }
  /// @copydoc KVCacheManager::min_blocks_held
  [[nodiscard]] int64_t min_blocks_held(int64_t num_tokens) const {
    std::lock_guard lock(mutex_);
    return manager_.min_blocks_held(num_tokens);
  }
  /// @copydoc KVCacheManager::usage
  [[nodiscard]] double usage() const {
    std::lock_guard lock(mutex_);
    return manager_.usage();
  }
  /// @copydoc KVCacheManager::stats
  [[nodiscard]] KVCacheStats stats() const {
    std::lock_guard lock(mutex_);
    return manager_.stats();
  }
  /// A copy of the configuration (copied under the lock like everything else, so the wrapper
  /// needs no reasoning about which members are immutable).
  [[nodiscard]] KVCacheManagerConfig config() const {
    std::lock_guard lock(mutex_);
    return manager_.config();
  }
  /// KVCacheManager::check_invariants under the lock. Errors: throws pagedkv::Error on the first
  /// violation.
  void check_invariants() const {
    std::lock_guard lock(mutex_);
    manager_.check_invariants();
  }

 private:
  mutable std::mutex mutex_;
  KVCacheManager manager_;
};

}  // namespace pagedkv
