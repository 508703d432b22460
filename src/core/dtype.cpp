#include "moekit/core/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <utility>

namespace moekit {

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kInt64:
      return 8;
    case DType::kF32:
    case DType::kInt32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kFp8E4M3:
    case DType::kFp8E5M2:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool:
    case DType::kFp4E2M1x2:
    case DType::kUE8M0:
    case DType::kUE4M3:
      return 1;
  }
  return 1;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kFp8E4M3:
      return "fp8_e4m3";
    case DType::kFp8E5M2:
      return "fp8_e5m2";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kFp4E2M1x2:
      return "fp4_e2m1x2";
    case DType::kUE8M0:
      return "ue8m0";
    case DType::kUE4M3:
      return "ue4m3";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::array<std::pair<std::string_view, DType>, 24> kAliases = {{
      {"bf16", DType::kBF16},        {"bfloat16", DType::kBF16},
      {"f16", DType::kF16},          {"fp16", DType::kF16},
      {"float16", DType::kF16},      {"half", DType::kF16},
      {"f32", DType::kF32},          {"fp32", DType::kF32},
      {"float32", DType::kF32},      {"float", DType::kF32},
      {"f64", DType::kF64},          {"float64", DType::kF64},
      {"fp8_e4m3", DType::kFp8E4M3}, {"float8_e4m3fn", DType::kFp8E4M3},
      {"fp8_e5m2", DType::kFp8E5M2}, {"float8_e5m2", DType::kFp8E5M2},
      {"int8", DType::kInt8},        {"uint8", DType::kUInt8},
      {"int32", DType::kInt32},      {"int64", DType::kInt64},
      {"bool", DType::kBool},        {"fp4_e2m1x2", DType::kFp4E2M1x2},
      {"ue8m0", DType::kUE8M0},      {"ue4m3", DType::kUE4M3},
  }};
  for (const auto& [alias, dtype] : kAliases) {
    if (alias == lower) return dtype;
  }
  return std::nullopt;
}

bool is_floating(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kF16:
    case DType::kF32:
    case DType::kF64:
    case DType::kFp8E4M3:
    case DType::kFp8E5M2:
      return true;
    default:
      return false;
  }
}

}  // namespace moekit
