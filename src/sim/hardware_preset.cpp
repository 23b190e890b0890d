#include "sim/hardware_preset.hpp"

#include <array>
#include <cctype>

#include "core/check.hpp"

namespace pagedkv::sim {

namespace {

constexpr double kGB = 1e9;
constexpr double kTFLOPS = 1e12;
constexpr double kPcie4 = 25 * kGB;  // host_link_bandwidth("pcie4")
constexpr double kPcie5 = 50 * kGB;  // host_link_bandwidth("pcie5")

// Dense (not 2:4 sparse) BF16 tensor-core peaks and HBM bandwidth of the SXM parts.
const std::array<HardwarePreset, 4>& table() {
  static const std::array<HardwarePreset, 4> presets = {{
      {"a100-40gb", "NVIDIA A100 SXM 40GB", 40 * kGB, 1555 * kGB, 312 * kTFLOPS, kPcie4,
       "NVIDIA A100 Tensor Core GPU datasheet (2021): 40GB HBM2 1,555 GB/s, BF16 tensor core "
       "312 TFLOPS dense; PCIe Gen4 host link"},
      {"a100-80gb", "NVIDIA A100 SXM 80GB", 80 * kGB, 2039 * kGB, 312 * kTFLOPS, kPcie4,
       "NVIDIA A100 Tensor Core GPU datasheet (2021): 80GB HBM2e 2,039 GB/s, BF16 tensor core "
       "312 TFLOPS dense; PCIe Gen4 host link"},
      {"h100-sxm", "NVIDIA H100 SXM 80GB", 80 * kGB, 3350 * kGB, 989 * kTFLOPS, kPcie5,
       "NVIDIA H100 Tensor Core GPU datasheet (2023): H100 SXM 80GB HBM3 3.35 TB/s, BF16 tensor "
       "core 1,979 TFLOPS with sparsity (989 dense); PCIe Gen5 host link"},
      {"h200", "NVIDIA H200 SXM 141GB", 141 * kGB, 4800 * kGB, 989 * kTFLOPS, kPcie5,
       "NVIDIA H200 Tensor Core GPU datasheet (2024): 141GB HBM3e 4.8 TB/s, BF16 tensor core "
       "1,979 TFLOPS with sparsity (989 dense); PCIe Gen5 host link"},
  }};
  return presets;
}

std::string normalize(std::string_view name) {
  std::string out;
  for (char c : name) {
    out += c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

}  // namespace

std::span<const HardwarePreset> hardware_presets() { return table(); }

std::string hardware_names() {
  std::string names;
  for (const HardwarePreset& h : table()) {
    if (!names.empty()) names += ", ";
    names += h.name;
  }
  return names;
}

const HardwarePreset& find_hardware(std::string_view name) {
  const std::string key = normalize(name);
  for (const HardwarePreset& h : table()) {
    if (h.name == key) return h;
  }
  detail::fail("unknown hardware preset '{}' (known: {})", name, hardware_names());
}

double host_link_bandwidth(std::string_view name) {
  const std::string key = normalize(name);
  if (key == "pcie4") return kPcie4;
  if (key == "pcie5") return kPcie5;
  detail::fail("unknown host link '{}' (known: pcie4, pcie5)", name);
}

}  // namespace pagedkv::sim
