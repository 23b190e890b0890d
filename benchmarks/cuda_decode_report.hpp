#pragma once
// The report of bench_cuda_decode (benchmarks/bench_cuda_decode.cu): the measured rows and the
// Markdown tables printed after the run (main table with the bandwidth and paged / contiguous
// goals; 8-bit / bf16; page sizes vs 128; tensor cores vs CUDA cores; CUDA-graph replay). Host
// C++ only; included by that one file.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace pagedkv::bench {

/// block_size of every row but the page-size series.
inline constexpr int32_t kDefaultBlockSize = 16;

/// One measured configuration (times: mean microseconds per call).
struct Row {
  std::string dtype;
  int group = 0;
  int batch = 0;
  int context = 0;
  int block_size = 0;
  bool tensor_cores = false;
  bool graph = false;
  int splits = 0;
  double paged_us = 0;
  double contiguous_us = 0;
  double kv_bytes = 0;
};

/// What the tables need besides the rows: measured once by main().
struct ReportContext {
  std::string device_name;
  double copy_bytes_per_s = 0;  // device-to-device copy, bytes read + written per second
  int64_t l2_bytes = 0;
};

/// The fifth table: the per-call time of the small-batch rows launched one by one and replayed
/// from a CUDA graph.
inline void print_graphs(const std::vector<Row>& rows) {
  std::map<std::tuple<std::string, int, int, int>, const Row*> eager;
  for (const Row& r : rows) {
    if (!r.graph && !r.tensor_cores && r.block_size == kDefaultBlockSize) {
      eager[{r.dtype, r.group, r.batch, r.context}] = &r;
    }
  }
  bool header = false;
  for (const Row& r : rows) {
    const auto it = eager.find({r.dtype, r.group, r.batch, r.context});
    if (!r.graph || it == eager.end()) continue;
    if (!header) {
      std::printf(
          "\nThe small-batch floor, per call (paged / contiguous us), launched one by one "
          "and replayed from a CUDA graph:\n\n");
      std::printf("| dtype | GQA | batch | context | launched | graph replay |\n");
      std::printf("|---|---|---|---|---|---|\n");
      header = true;
    }
    std::printf("| %s | %d | %d | %d | %.1f / %.1f | %.1f / %.1f |\n", r.dtype.c_str(), r.group,
                r.batch, r.context, it->second->paged_us, it->second->contiguous_us, r.paged_us,
                r.contiguous_us);
  }
}

/// The fourth table: tensor-core / CUDA-core paged time on every shape measured with both.
inline void print_tensor_cores(const std::vector<Row>& rows, const ReportContext& ctx) {
  std::map<std::tuple<std::string, int, int, int>, double> cuda_core_us;
  for (const Row& r : rows) {
    if (!r.tensor_cores && !r.graph && r.block_size == kDefaultBlockSize) {
      cuda_core_us[{r.dtype, r.group, r.batch, r.context}] = r.paged_us;
    }
  }
  bool header = false;
  double worst_pct = 1e9;
  for (const Row& r : rows) {
    const auto it = cuda_core_us.find({r.dtype, r.group, r.batch, r.context});
    if (!r.tensor_cores || it == cuda_core_us.end()) continue;
    if (!header) {
      std::printf("\nTensor cores (use_tensor_cores) vs the CUDA-core kernel, paged time:\n\n");
      std::printf(
          "| dtype | GQA | batch | context | tensor cores us | CUDA cores us | ratio | "
          "%% of copy |\n");
      std::printf("|---|---|---|---|---|---|---|---|\n");
      header = true;
    }
    const double pct = 100.0 * r.kv_bytes / (r.paged_us * 1e-6) / ctx.copy_bytes_per_s;
    if (r.batch >= 32 && r.context >= 4096) worst_pct = std::min(worst_pct, pct);
    std::printf("| %s | %d | %d | %d | %.1f | %.1f | %.3f | %.1f |\n", r.dtype.c_str(), r.group,
                r.batch, r.context, r.paged_us, it->second, r.paged_us / it->second, pct);
  }
  if (header && worst_pct < 1e9) {
    std::printf(
        "\nTensor cores, batch >= 32 and context >= 4k: worst %% of copy bandwidth %.1f "
        "(issue 22 goal >= 90: %s).\n",
        worst_pct, worst_pct >= 90 ? "met" : "NOT met");
  }
}

/// The second table: 8-bit / bf16 paged time for every shape measured in both.
inline void print_quantized_ratios(const std::vector<Row>& rows) {
  std::map<std::tuple<int, int, int>, double> bf16_us;
  for (const Row& r : rows) {
    if (r.dtype == "bf16" && r.block_size == kDefaultBlockSize && !r.tensor_cores && !r.graph) {
      bf16_us[{r.group, r.batch, r.context}] = r.paged_us;
    }
  }
  std::printf("\n8-bit K/V vs bf16, paged decode time (goal <= 0.55 at context >= 8k):\n\n");
  std::printf("| dtype | GQA | batch | context | paged us | bf16 us | 8-bit / bf16 |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  double worst = 0;
  for (const Row& r : rows) {
    const auto it = bf16_us.find({r.group, r.batch, r.context});
    const bool eight_bit = r.dtype != "bf16" && r.dtype != "fp16";
    if (!eight_bit || it == bf16_us.end() || r.context < 8192 || r.block_size != kDefaultBlockSize)
      continue;
    const double ratio = r.paged_us / it->second;
    worst = std::max(worst, ratio);
    std::printf("| %s | %d | %d | %d | %.1f | %.1f | %.3f |\n", r.dtype.c_str(), r.group, r.batch,
                r.context, r.paged_us, it->second, ratio);
  }
  if (worst > 0) {
    std::printf("\nWorst 8-bit / bf16: %.3f (goal <= 0.55: %s).\n", worst,
                worst <= 0.55 ? "met" : "NOT met");
  }
}

/// The third table: each page size's K/V rate relative to block_size 128 on the same shape.
inline void print_page_sizes(const std::vector<Row>& rows) {
  std::map<std::tuple<std::string, int, int, int>, double> us_128;
  for (const Row& r : rows) {
    if (r.block_size == 128 && !r.tensor_cores) {
      us_128[{r.dtype, r.group, r.batch, r.context}] = r.paged_us;
    }
  }
  if (us_128.empty()) return;
  std::printf(
      "\nPage sizes: paged K/V rate relative to block_size 128 (goals: >= 0.95 at "
      "block_size >= 16, >= 0.70 at block_size 1):\n\n");
  std::printf("| dtype | GQA | batch | context | block_size | paged us | vs block_size 128 |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  double worst_16 = 1e9;
  double worst_1 = 1e9;
  for (const Row& r : rows) {
    const auto it = us_128.find({r.dtype, r.group, r.batch, r.context});
    if (it == us_128.end() || r.tensor_cores) continue;
    const double rel = it->second / r.paged_us;  // rate relative to block_size 128
    if (r.block_size >= 16) worst_16 = std::min(worst_16, rel);
    if (r.block_size == 1) worst_1 = std::min(worst_1, rel);
    std::printf("| %s | %d | %d | %d | %d | %.1f | %.3f |\n", r.dtype.c_str(), r.group, r.batch,
                r.context, r.block_size, r.paged_us, rel);
  }
  std::printf(
      "\nWorst at block_size >= 16: %.3f (goal >= 0.95: %s); block_size 1: %.3f (goal >= "
      "0.70: %s).\n",
      worst_16, worst_16 >= 0.95 ? "met" : "NOT met", worst_1, worst_1 >= 0.70 ? "met" : "NOT met");
}

/// The Markdown section: the main table of every row with its goal line, then the 8-bit,
/// page-size, tensor-core and CUDA-graph tables.
inline void print_markdown(const std::map<std::string, Row>& measured, const ReportContext& ctx) {
  std::printf("\n### CUDA decode attention: %s\n\n", ctx.device_name.c_str());
  std::printf("Device-to-device copy bandwidth (read + write), same run: %.0f GB/s.\n",
              ctx.copy_bytes_per_s / 1e9);
  std::printf("8 kv heads, head_dim 128, scattered tables; q/out fp32.\n\n");
  std::printf(
      "| dtype | GQA | batch | context | block_size | kernel | splits | paged us | contiguous us | "
      "paged/contig | K/V GB/s | %% of copy |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  double worst_pct = 1e9;
  double worst_ratio = 0;
  std::vector<Row> rows;
  for (const auto& [name, row] : measured) rows.push_back(row);
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.dtype, a.group, a.batch, a.context, a.block_size, a.tensor_cores, a.graph) <
           std::tie(b.dtype, b.group, b.batch, b.context, b.block_size, b.tensor_cores, b.graph);
  });
  for (const Row& r : rows) {
    const double gbps = r.kv_bytes / (r.paged_us * 1e-6) / 1e9;
    const double pct = 100.0 * r.kv_bytes / (r.paged_us * 1e-6) / ctx.copy_bytes_per_s;
    const bool in_l2 = r.kv_bytes < 4.0 * static_cast<double>(ctx.l2_bytes);
    std::printf("| %s | %d | %d | %d | %d | %s | %d | %.1f | %.1f | %.3f | %.0f | %.1f%s |\n",
                r.dtype.c_str(), r.group, r.batch, r.context, r.block_size,
                r.graph          ? "cuda cores, graph"
                : r.tensor_cores ? "mma"
                                 : "cuda cores",
                r.splits, r.paged_us, r.contiguous_us, r.paged_us / r.contiguous_us, gbps, pct,
                in_l2 ? " (L2)" : "");
    // The bandwidth and paged/contiguous goals are issue 5's, for the 16-bit formats.
    const bool sixteen_bit = r.dtype == "fp16" || r.dtype == "bf16";
    if (sixteen_bit && r.batch >= 32 && r.context >= 4096 && r.block_size == kDefaultBlockSize &&
        !r.tensor_cores) {
      worst_pct = std::min(worst_pct, pct);
      worst_ratio = std::max(worst_ratio, r.paged_us / r.contiguous_us);
    }
  }
  if (worst_ratio > 0) {
    std::printf(
        "\nGoal (batch >= 32, context >= 4k): worst %% of copy bandwidth %.1f (goal >= 80: "
        "%s); worst paged/contiguous %.3f (goal <= 1.05: %s).\n",
        worst_pct, worst_pct >= 80 ? "met" : "NOT met", worst_ratio,
        worst_ratio <= 1.05 ? "met" : "NOT met");
  }
  print_quantized_ratios(rows);
  print_page_sizes(rows);
  print_tensor_cores(rows, ctx);
  print_graphs(rows);
}

}  // namespace pagedkv::bench
