#pragma once
/// @file sharing.hpp
/// Sharing workloads (vLLM paper, Kwon et al., SOSP 2023, sec. 4.4 and 6.3, Fig. 15): parallel
/// sampling (n outputs per prompt) and beam search (width W) on each trace request's prompt and
/// output lengths, run on the real KVCacheManager with copy-on-write forks (fork(), then an
/// append into a shared, partially filled block copies it). Reports the blocks the group holds
/// with sharing against the blocks n (or W) independent copies of the sequence would hold.
///
/// Model of one request with prompt P and output O, block size bs:
///  - the prompt is added once (one sequence; prefix caching off);
///  - decode step 1: the prompt sequence is forked into n (or W) sequences, each appends its
///    first token (the n samples, or the top W of the first distribution);
///  - parallel sampling, steps 2..O: every sample appends one token;
///  - beam search, steps 2..O: each of the W beams proposes W candidates (W x W in all) and W of
///    them survive, chosen uniformly at random without replacement from a seeded generator
///    (a stand-in for the top-W scores, which the simulator has no model to compute). A beam
///    with k surviving candidates is forked k - 1 times before the appends (its children share
///    its blocks, the paper's Fig. 9); a beam with none is freed, releasing the blocks only it
///    held. Each survivor then appends its token.
/// After step t every sequence holds P + t tokens: independent copies would hold
/// n * ceil((P + t) / bs) blocks; with sharing the group holds the distinct blocks its tables
/// name (the manager's used blocks, the group running alone).
///
/// The floor(P / bs) full prompt blocks are shared by every sequence at every step and never
/// written (an append only writes the last, partial block), so the simulation adds only the
/// P mod bs tail of the prompt to the manager and counts the full blocks arithmetically: the
/// same counts as adding the whole prompt (tests/sim/test_sharing.cpp checks both), in time
/// independent of P.
///
/// Memory saving = 1 - sum over requests and decode steps of the shared blocks / the same sum
/// for independent copies: the paper's "blocks saved by sharing / blocks without sharing",
/// time-weighted by decode steps.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sim/trace.hpp"

namespace pagedkv::sim {

/// Which sharing workload.
enum class SharingMode { kParallelSampling, kBeamSearch };

/// One sharing workload.
struct SharingConfig {
  SharingMode mode = SharingMode::kParallelSampling;
  int32_t width = 2;        ///< n samples or W beams, >= 1
  int32_t block_size = 16;  ///< tokens per block, >= 1
  uint64_t seed = 1;        ///< beam search: the survivor choice
};

/// Beam search survivor choice at one step: given W (beams) returns W parent indices in
/// [0, W), one per surviving candidate (a parent may appear several times or not at all).
using BeamChooser = std::function<std::vector<int32_t>(int32_t width)>;

/// The default chooser: W of the W x W candidates drawn without replacement (partial
/// Fisher-Yates over candidate ids, candidate k of parent k / W) from splitmix64 seeded with
/// `seed`, so runs are identical on every platform.
[[nodiscard]] BeamChooser seeded_beam_chooser(uint64_t seed, int32_t width);

/// Blocks held at each decode step t = 1..output of one request: `shared[t - 1]` by the group,
/// `independent[t - 1]` by width independent copies.
struct GroupSteps {
  std::vector<int64_t> shared;
  std::vector<int64_t> independent;
};

/// Runs one request's group on a fresh KVCacheManager. `full_prompt`: add the whole prompt
/// (the reference) instead of only its tail (the fast path the trace run takes).
/// `choose` is used by beam search only (may be empty for parallel sampling).
/// Errors: throws pagedkv::Error if prompt < 1, output < 0, width < 1, block_size < 1, beam
/// search has no chooser, or the chooser returns a wrong count or an index out of range (names
/// the value).
[[nodiscard]] GroupSteps simulate_group(int64_t prompt, int64_t output, const SharingConfig& config,
                                        const BeamChooser& choose, bool full_prompt = false);

/// Totals over a trace.
struct SharingResult {
  std::string workload;                ///< "parallel-4", "beam-6"
  int64_t requests = 0;                ///< requests simulated (output >= 1)
  int64_t decode_steps = 0;            ///< sum of output lengths
  double shared_block_steps = 0;       ///< sum over requests and steps of the group's blocks
  double independent_block_steps = 0;  ///< the same for independent copies
  double saving = 0;                   ///< 1 - shared / independent, in [0, 1)
  /// independent / shared: how many more groups the same KV budget holds with sharing, the
  /// upper bound of the throughput gain when memory limits the batch.
  double capacity_gain = 1;
  double wall_seconds = 0;
};

/// simulate_group for every request of `trace` with output >= 1 (the first `limit`, 0 = all).
/// Errors: as simulate_group.
[[nodiscard]] SharingResult simulate_sharing(const Trace& trace, const SharingConfig& config,
                                             int64_t limit = 0);

}  // namespace pagedkv::sim
