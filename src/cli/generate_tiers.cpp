#include "cli/generate_tiers.hpp"

#include <fmt/format.h>

namespace pagedkv::cli {

void add_tier_flags(CLI::App& sub, TierFlags& f) {
  const char* group = "Prefix caching and tiers (paged mode, CPU; docs/tiers.md)";
  sub.add_flag("--prefix-caching", f.prefix_caching,
               "share published prompt blocks between sequences (implied by any tier)")
      ->group(group);
  sub.add_option("--tier-host-mib", f.host_mib, "host-memory tier budget, MiB (0 = none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->group(group);
  sub.add_option("--tier-disk", f.disk_path,
                 "local-disk tier file (created, or reused from an earlier run)")
      ->group(group);
  sub.add_option("--tier-disk-mib", f.disk_mib, "disk tier budget, MiB (default 64 with a file)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->group(group);
  sub.add_option("--tier-redis", f.redis,
                 "HOST:PORT of a Redis server shared by engine instances (its maxmemory and "
                 "allkeys-lru policy are the tier's budget)")
      ->group(group);
  sub.add_option("--tier-redis-timeout-ms", f.redis_timeout_ms,
                 "per-command timeout of the Redis tier; a failure skips it for 1 s")
      ->capture_default_str()
      ->check(CLI::Range(1, 60000))
      ->group(group);
  sub.add_option("--tier-write", f.write_policy,
                 "when blocks are written down: write-through (at publish) or on-eviction")
      ->capture_default_str()
      ->check(CLI::IsMember({"write-through", "on-eviction"}))
      ->group(group);
  sub.add_option("--kv-events", f.events_path,
                 "publish KV events (vLLM's BlockStored / BlockRemoved) as JSON lines to FILE "
                 "(- = stdout)")
      ->group(group);
  sub.add_option("--kv-events-stream", f.events_stream,
                 "also XADD each event batch to this Redis stream (needs --tier-redis)")
      ->group(group);
  sub.add_option("--warm-pass", f.warm_pass,
                 "run the prompts once first, unmeasured: pool = the measured run hits the "
                 "pool; tiers = the pool's prefix cache is then dropped to the tiers, so it "
                 "hits there")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "pool", "tiers"}))
      ->group(group);
}

model::WarmPass warm_pass(const TierFlags& f) {
  return model::parse_warm_pass(f.warm_pass).value_or(model::WarmPass::kNone);
}

model::TieringOptions tiering_options(const TierFlags& f, uint64_t weights_hash) {
  model::TieringOptions t;
  t.host_bytes = f.host_mib << 20;
  t.disk_path = f.disk_path;
  t.disk_bytes = (f.disk_path.empty() ? 0 : (f.disk_mib > 0 ? f.disk_mib : 64)) << 20;
  t.redis = f.redis;
  t.redis_timeout_ms = f.redis_timeout_ms;
  t.policy =
      f.write_policy == "on-eviction" ? WritePolicy::kOnEviction : WritePolicy::kWriteThrough;
  t.events_path = f.events_path;
  t.events_stream = f.events_stream;
  t.model_id = fmt::format("llama:{:016x}", weights_hash);
  return t;
}

void print_tiering(const TierFlags& flags, const model::RunStats& st) {
  const model::TieringReport& r = st.tiering;
  if (!flags.prefix_caching && r.tiers.empty() && r.event_batches == 0) return;
  if (flags.warm_pass != "none") {
    fmt::print("warm pass ({}): the prompts ran once first, unmeasured\n", flags.warm_pass);
  }
  fmt::print(
      "prefix cache (paged): {} of {} prompt tokens not prefilled ({} hit in the pool, {} "
      "onboarded from the tiers)\n",
      st.prompt_tokens_cached, st.prompt_tokens, st.prompt_tokens_cached - r.onboarded_tokens,
      r.onboarded_tokens);
  if (!r.tiers.empty()) {
    fmt::print("{:<7}{:>8}{:>9}{:>12}{:>8}{:>8}{:>10}{:>11}\n", "tier", "loaded", "entries",
               "bytes", "puts", "hits", "failures", "evictions");
    for (size_t i = 0; i < r.tiers.size(); ++i) {
      const TierStats& t = r.tiers[i];
      fmt::print("{:<7}{:>8}{:>9}{:>12}{:>8}{:>8}{:>10}{:>11}\n", r.tier_names[i],
                 r.loaded_blocks[i], t.entries, t.used_bytes, t.puts, t.hits, t.failures,
                 t.evictions);
    }
    fmt::print(
        "(loaded: blocks onboarded from the tier in this run; entries and bytes: what it holds "
        "now, -1 when only the server knows; {} records refused on load, {} stores dropped)\n",
        r.refused_records, r.stores_dropped);
  }
  if (r.event_batches > 0) fmt::print("KV events: {} batches published\n", r.event_batches);
}

nlohmann::ordered_json tiering_json(const TierFlags& flags, const model::RunStats& st) {
  const model::TieringReport& r = st.tiering;
  nlohmann::ordered_json tiers = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.tiers.size(); ++i) {
    const TierStats& t = r.tiers[i];
    tiers.push_back({{"name", r.tier_names[i]},
                     {"loaded_blocks", r.loaded_blocks[i]},
                     {"entries", t.entries},
                     {"used_bytes", t.used_bytes},
                     {"budget_bytes", t.budget_bytes},
                     {"puts", t.puts},
                     {"gets", t.gets},
                     {"hits", t.hits},
                     {"failures", t.failures},
                     {"evictions", t.evictions},
                     {"bytes_written", t.bytes_written},
                     {"bytes_read", t.bytes_read}});
  }
  return {{"warm_pass", flags.warm_pass},
          {"prompt_tokens", st.prompt_tokens},
          {"prompt_tokens_cached", st.prompt_tokens_cached},
          {"onboarded_tokens", r.onboarded_tokens},
          {"refused_records", r.refused_records},
          {"stores_dropped", r.stores_dropped},
          {"event_batches", r.event_batches},
          {"tiers", tiers}};
}

}  // namespace pagedkv::cli
