// Fast CPU paged attention: Google Highway SIMD compiled for several instruction sets and
// dispatched at run time (foreach_target.h re-includes this file once per target, and with it
// the per-target *-inl.h headers), OpenMP over work items, log-sum-exp merge of key partitions.
// Contract: attention_fast.hpp. The pieces:
//   attention_work.{hpp,cpp}   constants, KernelArgs / RowSet, the plan of a call, the merge
//   attention_prefetch-inl.h   block-table gather of a tile, row prefetch, block stream
//   attention_tile-inl.h       scores, online softmax and P.V accumulation over one tile
//   attention_item-inl.h       one work item: spans and tiles, with what comes next prefetched
//
// Decode is memory-bound: every K/V byte is read once from memory and used by all query heads
// of its kv head; everything else (scores, softmax, accumulators) stays in L1.

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/dtype_dispatch.hpp"
#include "cpu/attention_fast.hpp"
#include "cpu/attention_work.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
// foreach_target.h must come first: it re-includes this file per target.
#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "cpu/attention_item-inl.h"

// Target-independent: the element type Highway loads for each storage dtype.
#ifndef PAGEDKV_CPU_ATTENTION_HWY_SHARED_
#define PAGEDKV_CPU_ATTENTION_HWY_SHARED_
namespace pagedkv::detail::fast {
template <DType kT>
struct HwyElement;
template <>
struct HwyElement<DType::kF32> {
  using type = float;
};
template <>
struct HwyElement<DType::kF16> {
  using type = hwy::float16_t;
};
template <>
struct HwyElement<DType::kBF16> {
  using type = hwy::bfloat16_t;
};
template <>
struct HwyElement<DType::kFP8E4M3> {
  using type = Fp8E4M3;
};
template <>
struct HwyElement<DType::kFP8E5M2> {
  using type = Fp8E5M2;
};
template <>
struct HwyElement<DType::kInt8> {
  using type = int8_t;
};
}  // namespace pagedkv::detail::fast
#endif  // PAGEDKV_CPU_ATTENTION_HWY_SHARED_

HWY_BEFORE_NAMESPACE();
namespace pagedkv::detail::fast {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
void AttendTyped(const KernelArgs& a, const RowSet& rs, int32_t part) {
  // The widest vector that divides head_dim (listed once here; see attention_fast.hpp); bf16
  // takes its even/odd widening (LoadPair) where head_dim is a multiple of two vectors.
  const hn::ScalableTag<float> df;
  const hn::CappedTag<float, 4> d4;
  const auto fits = [&](auto d, int32_t vectors) {
    return a.head_dim % (vectors * static_cast<int32_t>(hn::Lanes(d))) == 0;
  };
  if constexpr (std::is_same_v<T, hwy::bfloat16_t>) {
    if (fits(df, 2)) return AttendImpl<true, T>(df, a, rs, part);
    if (fits(df, 1)) return AttendImpl<false, T>(df, a, rs, part);
    if (fits(d4, 2)) return AttendImpl<true, T>(d4, a, rs, part);
  } else {
    if (fits(df, 1)) return AttendImpl<false, T>(df, a, rs, part);
    if (fits(d4, 1)) return AttendImpl<false, T>(d4, a, rs, part);
  }
  const hn::CappedTag<float, 1> d1;
  AttendImpl<false, T>(d1, a, rs, part);
}

void AttendPart(const KernelArgs& a, const RowSet& rs, int32_t part) {
  dispatch_dtype(a.cache.dtype, [&](auto tag) {
    AttendTyped<typename HwyElement<decltype(tag)::value>::type>(a, rs, part);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace pagedkv::detail::fast
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedkv::detail {
namespace fast {
HWY_EXPORT(AttendPart);
}  // namespace fast

int32_t fast_attention_max_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

const char* fast_attention_target() {
  const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(targets & -targets);  // lowest bit = best target
}

namespace {
/// Compiled-and-supported targets, captured before any test hook narrows them.
int64_t available_targets() {
  static const int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return targets;
}
}  // namespace

std::vector<std::string> fast_attention_targets() {
  std::vector<std::string> names;
  for (int64_t t = available_targets(); t != 0; t &= t - 1) {
    names.emplace_back(hwy::TargetName(t & -t));
  }
  return names;
}

bool force_fast_attention_target(std::string_view name) {
  int64_t chosen = 0;
  if (!name.empty()) {
    for (int64_t t = available_targets(); t != 0; t &= t - 1) {
      if (name == hwy::TargetName(t & -t)) chosen = t & -t;
    }
    if (chosen == 0) return false;
  }
  available_targets();                      // capture the full set before narrowing it
  hwy::SetSupportedTargetsForTest(chosen);  // 0 = back to what the CPU supports
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return true;
}

void fast_paged_prefill_attention(const AttentionParams& params, const KVLayerView& cache,
                                  const BlockTableView& tables,
                                  std::span<const int32_t> query_start, std::span<const float> q,
                                  std::span<float> out, const FastAttentionConfig& config) {
  fast::KernelArgs a = fast::make_kernel_args(params, cache, tables, q, out);
  const int32_t threads =
      config.num_threads > 0 ? config.num_threads : fast_attention_max_threads();
  const fast::WorkPlan plan = fast::plan_work(params, a, tables, query_start, config, threads);

  thread_local std::vector<float> partial;
  if (plan.partial_floats > 0) {
    if (partial.size() < static_cast<size_t>(plan.partial_floats)) {
      partial.resize(static_cast<size_t>(plan.partial_floats));
    }
    a.partial = partial.data();
  }

  const auto num_items = static_cast<int64_t>(plan.items.size());
  [[maybe_unused]] const bool parallel =
      threads > 1 && num_items > 1 && plan.total_work >= fast::kMinParallelWork;
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (parallel)
#endif
  for (int64_t w = 0; w < num_items; ++w) {
    const fast::WorkItem item = plan.items[w];
    HWY_DYNAMIC_DISPATCH(fast::AttendPart)(a, plan.sets[item.set], item.part);
  }

  if (plan.partial_floats > 0) fast::merge_partitions(a, plan, threads, parallel);
}

}  // namespace pagedkv::detail
#endif  // HWY_ONCE
