#pragma once
/// @file units.hpp
/// Byte-size parsing and formatting for command-line options and reports.

#include <cstdint>
#include <string>
#include <string_view>

namespace pagedkv::sim {

/// Parses a memory size: a non-negative number (decimals allowed) with an optional unit.
/// Binary units KiB, MiB, GiB, TiB (also K, M, G, T) are powers of 1024; decimal units kB, MB,
/// GB, TB powers of 1000; B or no unit means bytes. Case-insensitive except that a bare "b" is
/// bytes. Examples: "40GiB" = 42,949,672,960; "1.5G" = 1,610,612,736; "80GB" = 80e9.
/// Units: returns bytes, rounded down to a whole byte.
/// Errors: throws pagedkv::Error naming the text if it is empty, negative, not a number, has an
/// unknown unit, or exceeds 2^62 bytes.
[[nodiscard]] int64_t parse_bytes(std::string_view text);

/// Human-readable size with a binary unit and 2 decimals: "512 B", "1.50 KiB", "40.00 GiB".
[[nodiscard]] std::string format_bytes(double bytes);

}  // namespace pagedkv::sim
