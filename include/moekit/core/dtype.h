// Element types of moekit tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moekit {

// NOTE: packed sub-byte formats (fp4 e2m1, fp6) are stored as bytes: a tensor of kFp4E2M1x2 holds
// two 4-bit values per element (low nibble first); fp6 data is kept as kUInt8 bytes, four values in
// three bytes. Their logical shapes live in the quantization descriptors, not in the tensor.
enum class DType : uint8_t {
  kBF16,
  kF16,
  kF32,
  kF64,
  kFp8E4M3,  // fp8 e4m3fn (max 448, no inf)
  kFp8E5M2,  // fp8 e5m2
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool,
  kFp4E2M1x2,  // two fp4 e2m1 values per byte, low nibble first
  kUE8M0,      // OCP MX shared scale: 2^(code - 127)
  kUE4M3,      // unsigned e4m3: the NVFP4 block scale
};

// Bytes per stored element.
size_t element_size(DType dtype);
// Short name: "bf16", "f16", "f32", "fp8_e4m3", ...
std::string_view dtype_name(DType dtype);
// Parses a short name ("bf16", "bfloat16", "fp16", "half", "float32", "fp8_e4m3", ...).
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType dtype);

}  // namespace moekit
