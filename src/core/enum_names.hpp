#pragma once
// One table per enum gives both directions of its text form: the name printed for a value and
// the value parsed from a name (aliases allowed), so the two never disagree. Private; every
// public *_name / parse_* function is a one-line use of its enum's table.
//
// Worked example:
//   inline constexpr EnumName<DType> kDTypeNames[] = {
//       {DType::kF32, "fp32"}, {DType::kF32, "f32"}, {DType::kF16, "fp16"}};
//   enum_name(kDTypeNames, DType::kF16) -> "fp16" (the first entry of a value is its name)
//   parse_enum(kDTypeNames, "f32")      -> DType::kF32;  parse_enum(..., "x") -> nullopt
//   enum_names_list(kDTypeNames)        -> "fp32, f32, fp16"

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace pagedkv::detail {

template <typename E>
struct EnumName {
  E value;
  std::string_view name;
};

/// The first name the table lists for `value`; empty when the value is not in the table.
template <typename E>
constexpr std::string_view enum_name(std::span<const EnumName<E>> table, E value) {
  for (const auto& e : table) {
    if (e.value == value) return e.name;
  }
  return {};
}

/// The value named `name` (any of its aliases); empty for a name the table does not list.
template <typename E>
constexpr std::optional<E> parse_enum(std::span<const EnumName<E>> table, std::string_view name) {
  for (const auto& e : table) {
    if (e.name == name) return e.value;
  }
  return std::nullopt;
}

/// Every name of the table in order, ", "-separated: the accepted set for an error message.
template <typename E>
std::string enum_names_list(std::span<const EnumName<E>> table) {
  std::string out;
  for (const auto& e : table) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

}  // namespace pagedkv::detail
