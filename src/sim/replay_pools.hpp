#pragma once
/// @file replay_pools.hpp
/// Internal to the replay (replay.cpp): the scheduler's view of one request and the memory
/// strategies it runs on, one Pool per Strategy. See replay.hpp for what each strategy models.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "pagedkv/types.hpp"
#include "sim/replay.hpp"
#include "sim/trace.hpp"

namespace pagedkv::sim::replay_detail {

/// Outcome of an admission attempt.
enum class Admit { kOk, kLater, kNever };

/// Scheduler-side state of one waiting or running request. Only active requests exist.
/// Positions: `cached` are assigned to the request in the KV cache (the whole prefill target is
/// assigned at admission, as KVCacheManager::add_sequence does), `computed` of them have K/V
/// computed (prefill progress; prefix hits count as computed).
struct Active {
  size_t index = 0;  // trace index; also the manager's sequence id
  int64_t arrival_step = 0;
  int64_t prompt = 0;  // P
  int64_t output = 0;  // O
  int64_t target = 0;  // positions to prefill: P, or P + generated after a preemption
  int64_t cached = 0;
  int64_t computed = 0;
  int64_t generated = 0;  // output tokens so far
  int64_t reserved = 0;   // contiguous: positions reserved at admission
  bool admitted_once = false;
  int32_t members = 1;         // sequences holding `cached` positions each (a sharing group)
  bool swapped = false;        // swap preemption: its K/V wait in host memory
  double first_token_ms = -1;  // end of the step that delivered the first output token, ms
  double load_ms = 0;          // admission: time of the blocks just loaded from the tiers
  double ready_ms = 0;         // tier loads done: the request computes from the first step after it
};

/// A memory strategy: admission, decode growth and release of requests' KV positions. Tracks
/// live positions (assigned to a token) and reserved positions (held for some request), in
/// units of unit_bytes() bytes: one position of every layer, except for the hybrid pool (one
/// position of one layer).
class Pool {
 public:
  virtual ~Pool() = default;
  /// Admission of the waiting request `r`; `alone` when nothing runs. On kOk the request holds
  /// r.target positions (r.cached = r.target) of which r.computed came from the prefix cache.
  virtual Admit admit(Active& r, bool alone) = 0;
  /// One decode position for a running request, for every sequence of its group (the first
  /// decode of a group of config.group_width creates the group); false (nothing changed) when
  /// memory is short. Sets r.members.
  virtual bool append_one(Active& r) = 0;
  /// Releases a finished request.
  virtual void release(Active& r) = 0;
  /// Recompute preemption: releases a running request that will be prefilled again.
  virtual void preempt(Active& r) { release(r); }
  /// The step's forward pass has run: the first r.computed positions of the running request
  /// `r` hold K/V (paged: KVCacheManager::commit, which publishes their full blocks).
  virtual void commit(const Active& /*r*/) {}
  [[nodiscard]] virtual int64_t live() const = 0;
  [[nodiscard]] virtual int64_t reserved() const = 0;
  /// Bytes of one unit of live() and reserved().
  [[nodiscard]] virtual int64_t unit_bytes(const ReplayConfig& config) const {
    return config.kv_bytes_per_token;
  }
  /// Units the budget holds (the denominator of the reserved fraction of the time series).
  [[nodiscard]] virtual int64_t capacity_units(const ReplayResult& res) const {
    return res.capacity_tokens;
  }
  virtual void finish(ReplayResult& /*res*/) const {}
};

/// The pool of `strategy` under the budget of `config`; fills res.capacity_tokens and, for
/// paged strategies, res.block_size and res.num_blocks.
/// Errors: throws pagedkv::Error if the budget holds no block of a paged strategy.
[[nodiscard]] std::unique_ptr<Pool> make_pool(const Trace& trace, const ReplayConfig& config,
                                              const Strategy& strategy, ReplayResult& res);

/// The hybrid-<bs> pool (replay_hybrid.cpp); fills res as make_pool does, and res's
/// layers_per_group, kv_groups and padded_layers.
/// Errors: throws pagedkv::Error if config.model is unset or the budget holds no page.
[[nodiscard]] std::unique_ptr<Pool> make_hybrid_pool(const ReplayConfig& config,
                                                     const Strategy& strategy, ReplayResult& res);

/// synthesize_tokens (replay.hpp) into `out` (resized to end - begin; its capacity is kept).
void synthesize_into(const Trace& trace, size_t index, int64_t begin, int64_t end,
                     int32_t vocab_size, std::vector<TokenId>& out);

}  // namespace pagedkv::sim::replay_detail
