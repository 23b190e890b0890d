#pragma once
/// @file hardware_preset.hpp
/// Accelerator peaks for the replay's roofline step-time model (step_time.hpp) and the host
/// links that swap preemption copies K/V over. Datasheet figures only; what a real kernel
/// reaches of them is the model's efficiency factor, not part of the preset.

#include <span>
#include <string>
#include <string_view>

namespace pagedkv::sim {

/// One GPU. Units: bytes, bytes per second, FLOP per second.
struct HardwarePreset {
  std::string name;                  ///< CLI key, lowercase, e.g. "h200"
  std::string display;               ///< e.g. "NVIDIA H200 SXM 141GB"
  double memory_bytes = 0;           ///< HBM capacity, bytes (1 GB = 1e9 bytes)
  double bandwidth_bytes_per_s = 0;  ///< peak HBM bandwidth, bytes/s
  double bf16_flops_per_s = 0;       ///< peak dense BF16/FP16 tensor-core FLOP/s (no sparsity)
  double host_link_bytes_per_s = 0;  ///< effective host link (PCIe) bandwidth, bytes/s, one way
  std::string source;                ///< where the numbers come from
};

/// A100-40GB, A100-80GB, H100-SXM, H200, in that order.
[[nodiscard]] std::span<const HardwarePreset> hardware_presets();

/// The preset called `name` (case-insensitive; "_" and "-" interchangeable).
/// Errors: throws pagedkv::Error naming `name` and listing the known presets.
[[nodiscard]] const HardwarePreset& find_hardware(std::string_view name);

/// Comma-separated hardware preset names, for help texts and errors.
[[nodiscard]] std::string hardware_names();

/// Effective host-link bandwidth of a PCIe generation, x16, bytes/s one way: "pcie4" 25e9,
/// "pcie5" 50e9 (of the raw 31.5 / 63 GB/s: PCI-SIG base specifications 4.0 and 5.0, 16 GT/s and
/// 32 GT/s per lane with 128b/130b encoding; ~80% of raw is what pinned cudaMemcpy reaches).
/// Errors: throws pagedkv::Error naming `name` when it is neither.
[[nodiscard]] double host_link_bandwidth(std::string_view name);

}  // namespace pagedkv::sim
