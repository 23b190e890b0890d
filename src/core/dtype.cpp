#include "pagedkv/dtype.hpp"

#include "core/check.hpp"

namespace pagedkv {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
  }
  detail::fail("unknown DType value {}", static_cast<int>(dtype));
}

DType parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32") return DType::kF32;
  if (name == "fp16" || name == "f16" || name == "float16" || name == "half") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  detail::fail(
      "unknown dtype '{}' (accepted: fp32, f32, float32, fp16, f16, float16, half, bf16, "
      "bfloat16)",
      name);
}

}  // namespace pagedkv
