#pragma once
// `pagedkv replay --parallel-samples N,... --beam-width W,...`: the sharing workloads of
// sim/sharing.hpp on a loaded trace, printed as a table (or JSON). docs/memory.md explains it.

#include <cstdint>
#include <string>
#include <vector>

#include "sim/replay.hpp"
#include "sim/trace.hpp"

namespace pagedkv::cli {

/// Runs every parallel-sampling width in `samples` and beam width in `beams` on `trace` with
/// `block_size`, prints one row each (one JSON object with `json`).
/// Errors: throws pagedkv::Error naming a width < 1 or > 64.
void run_sharing(const sim::Trace& trace, const std::vector<int32_t>& samples,
                 const std::vector<int32_t>& beams, int32_t block_size, uint64_t seed, bool json);

/// `--sharing parallel-N|beam-N`: sets config.group_mode and group_width for the timed replay.
/// Errors: throws pagedkv::Error naming the text unless it is parallel-N or beam-N, N in
/// [1, 64].
void apply_sharing(const std::string& text, sim::ReplayConfig& config);

}  // namespace pagedkv::cli
