#pragma once
// Private: the optimized CPU paged attention kernel (Highway SIMD with run-time dispatch, OpenMP
// threads, key partitions merged by log-sum-exp). The public functions of attention.cpp call it
// after their checks; the plain kernel (attention_plain.hpp) stays as its test oracle.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/cpu/attention.hpp"
#include "pagedkv/metadata/batch_metadata.hpp"
#include "pagedkv/storage/kv_layer_view.hpp"

namespace pagedkv::detail {

/// Knobs of the fast kernel. The defaults are what the public functions use; tests and
/// benchmarks set them to force a code path (one thread, many small partitions).
struct FastAttentionConfig {
  /// Threads to run on; 0 = omp_get_max_threads() (OMP_NUM_THREADS), 1 = the calling thread.
  int32_t num_threads = 0;
  /// Keys per context partition. 0 = automatic: a (sequence, kv head) whose context is longer
  /// than the batch's fair share per thread is split so every thread gets work (vLLM's
  /// PagedAttention v2 idea). > 0 forces that size (tests use small values to exercise the
  /// log-sum-exp merge on short contexts).
  int64_t partition_keys = 0;
  /// KV heads served by one decode work item (a divisor of num_kv_heads is used, at most
  /// num_kv_heads). 0 = automatic: all heads of a block in one sweep, up to 32 query rows.
  int32_t heads_per_item = 0;
};

/// Chunked paged prefill (decode is n_i = 1): same contract, preconditions and output as
/// detail::plain_paged_prefill_attention, computed differently:
/// - work items = (sequence, kv heads, query tile[, key partition]); the rows of an item are the
///   `group` query heads of its kv heads for its query tokens (at most 32 rows), so every K/V
///   byte read from memory serves all query heads of its kv head (GQA); decode items take
///   several kv heads (one sweep per block), prefill items several query tokens (each K/V tile
///   reused by up to 32 rows); the rows of one kv head go in blocks of up to 4 (register blocks
///   of 4 rows x 4 keys for the scores, 4 rows x 4 vectors for P.V with AVX-512), each K and V
///   vector loaded and widened once per block;
/// - keys are visited in tiles of 64 positions gathered through the block table (a tile may span
///   several blocks, so block_size does not limit the vector work); with several kv heads over
///   blocks longer than a tile, each head goes through all tiles of a block before the next
///   head, so every block is read in address order; one pass over K and V with online softmax;
///   fp16 and the 8-bit formats converted to fp32 in registers, bf16 split into its even and
///   odd elements by two bit operations (q and the accumulators kept in that order);
/// - what comes next (the head's next tile, the next head's tile, or the next span) is
///   prefetched into L2, every row, one tile ahead: K during the first row block's scores, V
///   during its accumulation (attention_prefetch-inl.h says why L2 and what was measured);
/// - a partitioned item keeps (running max, sum, unnormalized accumulator) per row and the
///   partitions are merged: o = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p, M = max m_p.
/// Results differ from the plain kernel only by float summation order (a few ulp).
/// SIMD width: the widest vector that divides head_dim among {native, 4 lanes, 1 lane}; every
/// head_dim works, multiples of 16 (AVX-512) or 8 (AVX2) take the full width.
/// Source: PagedAttention (Kwon et al., SOSP 2023) and its v2 partitioned reduction; online
/// softmax (Milakov & Gimelshein 2018); split-K merge as in FlashDecoding (Dao et al., 2023).
void fast_paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                                  const BlockTableView& tables,
                                  std::span<const int32_t> query_start, std::span<const float> q,
                                  std::span<float> out, const FastAttentionConfig& config = {});

/// Name of the instruction set the dispatcher picks on this machine ("AVX3", "AVX2", ...).
[[nodiscard]] const char* fast_attention_target();

/// Instruction sets compiled into the kernel that this machine supports, best first (Highway
/// target names: "AVX3", "AVX2", "SSE4", "EMU128", ...).
[[nodiscard]] std::vector<std::string> fast_attention_targets();

/// Test hook: dispatch only to target `name` (one of fast_attention_targets()), so one machine
/// runs every compiled code path; "" restores the best target. Returns false and changes nothing
/// for another name. Must not race with running kernels.
bool force_fast_attention_target(std::string_view name);

/// Threads the kernel uses with num_threads = 0 (omp_get_max_threads(), or 1 without OpenMP).
[[nodiscard]] int32_t fast_attention_max_threads();

}  // namespace pagedkv::detail
