#include "cli/replay_sharing.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

#include "pagedkv/error.hpp"
#include "sim/sharing.hpp"

namespace pagedkv::cli {

namespace {

/// The vLLM paper's memory savings (Kwon et al., SOSP 2023, sec. 6.3, Fig. 15, Alpaca prompts,
/// OPT-13B): parallel sampling 6.1-9.8%, beam search 37.6-55.2%.
const char* paper_range(sim::SharingMode mode) {
  return mode == sim::SharingMode::kParallelSampling ? "6.1-9.8%" : "37.6-55.2%";
}

}  // namespace

void run_sharing(const sim::Trace& trace, const std::vector<int32_t>& samples,
                 const std::vector<int32_t>& beams, int32_t block_size, uint64_t seed, bool json) {
  std::vector<sim::SharingConfig> configs;
  for (int32_t n : samples) {
    configs.push_back({.mode = sim::SharingMode::kParallelSampling, .width = n});
  }
  for (int32_t w : beams) configs.push_back({.mode = sim::SharingMode::kBeamSearch, .width = w});
  for (sim::SharingConfig& c : configs) {
    if (c.width < 1 || c.width > 64) {
      throw Error(fmt::format(
          "{} must be in [1, 64], got {}",
          c.mode == sim::SharingMode::kBeamSearch ? "--beam-width" : "--parallel-samples",
          c.width));
    }
    c.block_size = block_size;
    c.seed = seed;
  }
  nlohmann::json out = nlohmann::json::array();
  if (!json) {
    fmt::print("sharing workloads, block size {} ({} requests in the trace)\n", block_size,
               trace.requests.size());
    fmt::print("{:<12} {:>9} {:>12} {:>10} {:>12} {:>11} {:>8}\n", "workload", "requests",
               "decode steps", "saving", "paper", "capacity x", "wall s");
  }
  for (const sim::SharingConfig& c : configs) {
    const sim::SharingResult r = sim::simulate_sharing(trace, c);
    if (json) {
      out.push_back({{"workload", r.workload},
                     {"block_size", block_size},
                     {"requests", r.requests},
                     {"decode_steps", r.decode_steps},
                     {"shared_block_steps", r.shared_block_steps},
                     {"independent_block_steps", r.independent_block_steps},
                     {"saving", r.saving},
                     {"capacity_gain", r.capacity_gain},
                     {"wall_seconds", r.wall_seconds}});
      continue;
    }
    fmt::print("{:<12} {:>9} {:>12} {:>9.1f}% {:>12} {:>11.3f} {:>8.2f}\n", r.workload, r.requests,
               r.decode_steps, 100.0 * r.saving, paper_range(c.mode), r.capacity_gain,
               r.wall_seconds);
  }
  if (json) fmt::print("{}\n", nlohmann::json{{"sharing", out}}.dump(2));
}

void apply_sharing(const std::string& text, sim::ReplayConfig& config) {
  const bool beam = text.starts_with("beam-");
  const bool parallel = text.starts_with("parallel-");
  const std::string digits = text.substr(beam ? 5 : parallel ? 9 : 0);
  const bool number = (beam || parallel) && !digits.empty() && digits.size() <= 2 &&
                      digits.find_first_not_of("0123456789") == std::string::npos;
  const int width = number ? std::stoi(digits) : 0;
  if (width < 1 || width > 64) {
    throw Error(fmt::format(
        "--sharing '{}': expected parallel-N or beam-N with N in [1, 64] (e.g. beam-4)", text));
  }
  config.group_width = width;
  config.group_mode = beam ? sim::SharingMode::kBeamSearch : sim::SharingMode::kParallelSampling;
}

}  // namespace pagedkv::cli
