#pragma once
// `pagedkv generate`'s prefix-caching and tier flags (docs/tiers.md) and their report: how many
// prompt tokens the paged run did not prefill, and what each tier held, loaded and failed.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/generate.hpp"

namespace pagedkv::cli {

/// The flags, as parsed.
struct TierFlags {
  bool prefix_caching = false;
  int64_t host_mib = 0;
  std::string disk_path;
  int64_t disk_mib = 0;
  std::string redis;
  int32_t redis_timeout_ms = 50;
  std::string write_policy = "write-through";
  std::string events_path;
  std::string events_stream;
  std::string warm_pass = "none";
};

/// Adds --prefix-caching, --tier-host-mib, --tier-disk, --tier-disk-mib, --tier-redis,
/// --tier-redis-timeout-ms, --tier-write, --kv-events, --kv-events-stream and --warm-pass to
/// `sub`.
void add_tier_flags(CLI::App& sub, TierFlags& flags);

/// The paged run's options from the flags; `weights_hash` identifies the model
/// (LlamaWeights::content_hash), so instances of different models share nothing.
[[nodiscard]] model::TieringOptions tiering_options(const TierFlags& flags, uint64_t weights_hash);

/// --warm-pass as parsed (validated by the flag's check).
[[nodiscard]] model::WarmPass warm_pass(const TierFlags& flags);

/// The text report of a paged run with prefix caching or tiers (nothing otherwise).
void print_tiering(const TierFlags& flags, const model::RunStats& stats);

/// The same as JSON: {"warm_pass", "prompt_tokens", "prompt_tokens_cached", "onboarded_tokens",
/// "refused_records", "stores_dropped", "event_batches", "tiers": [{"name", "loaded_blocks",
/// "entries", "used_bytes", "budget_bytes", "puts", "gets", "hits", "failures", "evictions",
/// "bytes_written", "bytes_read"}]}.
[[nodiscard]] nlohmann::ordered_json tiering_json(const TierFlags& flags,
                                                  const model::RunStats& stats);

}  // namespace pagedkv::cli
