// QuantKey: a quantization scheme as a value (data type + scale descriptors), with the standard
// catalog as named constants.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moekit {

// The data type of quantized values. kNone means "not quantized".
enum class QuantDType { kNone, kFp8E4M3, kFp8E5M2, kInt8, kInt4, kFp4E2M1, kFp6E3M2, kFp6E2M3 };
std::string_view quant_dtype_name(QuantDType dtype);

// How a scale covers a tensor: (rows, cols) of the block one scale serves; -1 = the whole extent.
struct GroupShape {
  int64_t row = -1;
  int64_t col = -1;

  static constexpr GroupShape per_tensor() { return {-1, -1}; }
  static constexpr GroupShape per_token() { return {1, -1}; }
  static constexpr GroupShape per_channel() { return {-1, 1}; }
  bool is_per_tensor() const { return row == -1 && col == -1; }
  bool is_per_token() const { return row == 1 && col == -1; }
  bool is_per_channel() const { return row == -1 && col == 1; }
  bool operator==(const GroupShape&) const = default;
  std::string to_string() const;
};

enum class ScaleDType { kF32, kUE8M0, kUE4M3, kActivation /* bf16/f16 like the activations */ };
std::string_view scale_dtype_name(ScaleDType dtype);

struct ScaleDesc {
  ScaleDType dtype = ScaleDType::kF32;
  bool is_static = true;
  GroupShape group_shape;
  bool operator==(const ScaleDesc&) const = default;
};

struct QuantKey {
  QuantDType dtype = QuantDType::kNone;
  ScaleDesc scale;
  std::optional<ScaleDesc> scale2;  // e.g. the NVFP4 per-tensor global scale
  bool symmetric = true;

  bool operator==(const QuantKey&) const = default;
  // e.g. "QuantKey(fp8_e4m3,scale(f32,static,per_tensor),symmetric)"
  std::string to_string() const;
};

// "None" for an absent key, else key.to_string().
std::string quant_key_to_string(const std::optional<QuantKey>& key);

namespace quant_keys {
// fp8 e4m3
extern const QuantKey kFp8StaticTensorSym;
extern const QuantKey kFp8DynamicTensorSym;
extern const QuantKey kFp8StaticTokenSym;
extern const QuantKey kFp8DynamicTokenSym;
extern const QuantKey kFp8StaticChannelSym;
extern const QuantKey kFp8Dynamic128Sym;      // activations, (1, 128) groups
extern const QuantKey kFp8Static128BlockSym;  // weights, 128x128 blocks
extern const QuantKey kFp8Static128BlockE8M0Sym;
extern const QuantKey kFp8Dynamic64Sym;
// NVFP4: e2m1 data, ue4m3 group-16 scales, f32 global scale
extern const QuantKey kNvfp4Static;
extern const QuantKey kNvfp4Dynamic;
// OCP MX: group 32, ue8m0 scales
extern const QuantKey kMxfp4Static;
extern const QuantKey kMxfp4Dynamic;
extern const QuantKey kMxfp8Static;
extern const QuantKey kMxfp8Dynamic;
extern const QuantKey kMxfp6E3M2Static;
extern const QuantKey kMxfp6E3M2Dynamic;
extern const QuantKey kMxfp6E2M3Static;
extern const QuantKey kMxfp6E2M3Dynamic;
// int8
extern const QuantKey kInt8StaticTensorSym;
extern const QuantKey kInt8DynamicTensorSym;
extern const QuantKey kInt8DynamicTokenSym;
extern const QuantKey kInt8StaticChannelSym;
extern const QuantKey kInt8DynamicTokenAsym;
// weight-only int4 / int8 with activation-dtype group scales
extern const QuantKey kInt4Static;
extern const QuantKey kInt4StaticAsym;
extern const QuantKey kInt4Static32;
extern const QuantKey kInt4Static32Asym;
extern const QuantKey kInt8Static;
// W4A8: int4 weights with f32 per-channel or group scales
extern const QuantKey kInt4W4A8StaticChannelSym;
extern const QuantKey kInt4W4A8StaticGroup128Sym;
}  // namespace quant_keys

}  // namespace moekit
