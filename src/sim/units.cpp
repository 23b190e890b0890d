#include "sim/units.hpp"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <utility>

#include "core/check.hpp"

namespace pagedkv::sim {

int64_t parse_bytes(std::string_view text) {
  const std::string shown(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  PAGEDKV_CHECK(i > 0,
                "invalid memory size '{}': expected a number with an optional unit "
                "(e.g. 40GiB, 80GB, 512MiB)",
                shown);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + i, value);
  PAGEDKV_CHECK(ec == std::errc() && end == text.data() + i, "invalid memory size '{}': bad number",
                shown);
  std::string unit;
  for (char c : text.substr(i)) {
    if (c != ' ') unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  static const std::array<std::pair<const char*, double>, 18> kUnits = {{
      {"", 1.0},
      {"b", 1.0},
      {"k", 0x1p10},
      {"ki", 0x1p10},
      {"kib", 0x1p10},
      {"m", 0x1p20},
      {"mi", 0x1p20},
      {"mib", 0x1p20},
      {"g", 0x1p30},
      {"gi", 0x1p30},
      {"gib", 0x1p30},
      {"t", 0x1p40},
      {"ti", 0x1p40},
      {"tib", 0x1p40},
      {"kb", 1e3},
      {"mb", 1e6},
      {"gb", 1e9},
      {"tb", 1e12},
  }};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      const double bytes = std::floor(value * scale);
      PAGEDKV_CHECK(bytes <= 0x1p62, "memory size '{}' is too large (limit 4 EiB)", shown);
      return static_cast<int64_t>(bytes);
    }
  }
  detail::fail(
      "invalid memory size '{}': unknown unit '{}' (use B, KiB, MiB, GiB, TiB, kB, MB, "
      "GB, TB)",
      shown, text.substr(i));
}

std::string format_bytes(double bytes) {
  static const std::array<const char*, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t k = 0;
  while (k + 1 < kNames.size() && std::fabs(bytes) >= 1024.0) {
    bytes /= 1024.0;
    ++k;
  }
  if (k == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.2f} {}", bytes, kNames[k]);
}

}  // namespace pagedkv::sim
