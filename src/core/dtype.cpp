#include "pagedkv/dtype.hpp"

#include "core/check.hpp"
#include "core/enum_names.hpp"

namespace pagedkv {

namespace {
// The first entry of a value is its name; the others are accepted aliases.
constexpr detail::EnumName<DType> kDTypeNames[] = {
    {DType::kF32, "fp32"},
    {DType::kF32, "f32"},
    {DType::kF32, "float32"},
    {DType::kF16, "fp16"},
    {DType::kF16, "f16"},
    {DType::kF16, "float16"},
    {DType::kF16, "half"},
    {DType::kBF16, "bf16"},
    {DType::kBF16, "bfloat16"},
    {DType::kFP8E4M3, "fp8_e4m3"},
    {DType::kFP8E4M3, "fp8"},
    {DType::kFP8E4M3, "e4m3"},
    {DType::kFP8E4M3, "float8_e4m3fn"},
    {DType::kFP8E5M2, "fp8_e5m2"},
    {DType::kFP8E5M2, "e5m2"},
    {DType::kFP8E5M2, "float8_e5m2"},
    {DType::kInt8, "int8"},
    {DType::kInt8, "i8"},
};
}  // namespace

std::string_view dtype_name(DType dtype) {
  const std::string_view name = detail::enum_name<DType>(kDTypeNames, dtype);
  PAGEDKV_CHECK(!name.empty(), "unknown DType value {}", static_cast<int>(dtype));
  return name;
}

DType parse_dtype(std::string_view name) {
  const auto dtype = detail::parse_enum<DType>(kDTypeNames, name);
  PAGEDKV_CHECK(dtype.has_value(), "unknown dtype '{}' (accepted: {})", name,
                detail::enum_names_list<DType>(kDTypeNames));
  return *dtype;
}

}  // namespace pagedkv
