#include "moekit/config/quant_key.h"

#include <fmt/format.h>

namespace moekit {

std::string_view quant_dtype_name(QuantDType dtype) {
  switch (dtype) {
    case QuantDType::kNone:
      return "none";
    case QuantDType::kFp8E4M3:
      return "fp8_e4m3";
    case QuantDType::kFp8E5M2:
      return "fp8_e5m2";
    case QuantDType::kInt8:
      return "int8";
    case QuantDType::kInt4:
      return "int4";
    case QuantDType::kFp4E2M1:
      return "fp4_e2m1";
    case QuantDType::kFp6E3M2:
      return "fp6_e3m2";
    case QuantDType::kFp6E2M3:
      return "fp6_e2m3";
  }
  return "?";
}

std::string_view scale_dtype_name(ScaleDType dtype) {
  switch (dtype) {
    case ScaleDType::kF32:
      return "f32";
    case ScaleDType::kUE8M0:
      return "ue8m0";
    case ScaleDType::kUE4M3:
      return "ue4m3";
    case ScaleDType::kActivation:
      return "act_dtype";
  }
  return "?";
}

std::string GroupShape::to_string() const {
  if (is_per_tensor()) return "per_tensor";
  if (is_per_token()) return "per_token";
  if (is_per_channel()) return "per_channel";
  return fmt::format("group({},{})", row, col);
}

namespace {
std::string scale_to_string(const ScaleDesc& s) {
  return fmt::format("scale({},{},{})", scale_dtype_name(s.dtype),
                     s.is_static ? "static" : "dynamic", s.group_shape.to_string());
}
}  // namespace

std::string QuantKey::to_string() const {
  return fmt::format("QuantKey({},{}{},{})", quant_dtype_name(dtype), scale_to_string(scale),
                     scale2 ? fmt::format(",{}", scale_to_string(*scale2)) : std::string(),
                     symmetric ? "symmetric" : "asymmetric");
}

std::string quant_key_to_string(const std::optional<QuantKey>& key) {
  return key ? key->to_string() : std::string("None");
}

namespace quant_keys {
namespace {
constexpr GroupShape kTensor = GroupShape::per_tensor();
constexpr GroupShape kToken = GroupShape::per_token();
constexpr GroupShape kChannel = GroupShape::per_channel();

QuantKey key(QuantDType dtype, ScaleDType sdtype, bool is_static, GroupShape shape,
             bool symmetric = true) {
  return QuantKey{dtype, ScaleDesc{sdtype, is_static, shape}, std::nullopt, symmetric};
}
QuantKey key2(QuantDType dtype, ScaleDesc s1, ScaleDesc s2) {
  return QuantKey{dtype, s1, s2, true};
}
}  // namespace

using enum QuantDType;
using enum ScaleDType;

const QuantKey kFp8StaticTensorSym = key(kFp8E4M3, kF32, true, kTensor);
const QuantKey kFp8DynamicTensorSym = key(kFp8E4M3, kF32, false, kTensor);
const QuantKey kFp8StaticTokenSym = key(kFp8E4M3, kF32, true, kToken);
const QuantKey kFp8DynamicTokenSym = key(kFp8E4M3, kF32, false, kToken);
const QuantKey kFp8StaticChannelSym = key(kFp8E4M3, kF32, true, kChannel);
const QuantKey kFp8Dynamic128Sym = key(kFp8E4M3, kF32, false, {1, 128});
const QuantKey kFp8Static128BlockSym = key(kFp8E4M3, kF32, true, {128, 128});
const QuantKey kFp8Static128BlockE8M0Sym = key(kFp8E4M3, kUE8M0, true, {128, 128});
const QuantKey kFp8Dynamic64Sym = key(kFp8E4M3, kF32, false, {1, 64});
const QuantKey kNvfp4Static = key2(kFp4E2M1, {kUE4M3, true, {1, 16}}, {kF32, true, kTensor});
const QuantKey kNvfp4Dynamic = key2(kFp4E2M1, {kUE4M3, false, {1, 16}}, {kF32, true, kTensor});
const QuantKey kMxfp4Static = key(kFp4E2M1, kUE8M0, true, {1, 32});
const QuantKey kMxfp4Dynamic = key(kFp4E2M1, kUE8M0, false, {1, 32});
const QuantKey kMxfp8Static = key(kFp8E4M3, kUE8M0, true, {1, 32});
const QuantKey kMxfp8Dynamic = key(kFp8E4M3, kUE8M0, false, {1, 32});
const QuantKey kMxfp6E3M2Static = key(kFp6E3M2, kUE8M0, true, {1, 32});
const QuantKey kMxfp6E3M2Dynamic = key(kFp6E3M2, kUE8M0, false, {1, 32});
const QuantKey kMxfp6E2M3Static = key(kFp6E2M3, kUE8M0, true, {1, 32});
const QuantKey kMxfp6E2M3Dynamic = key(kFp6E2M3, kUE8M0, false, {1, 32});
const QuantKey kInt8StaticTensorSym = key(kInt8, kF32, true, kTensor);
const QuantKey kInt8DynamicTensorSym = key(kInt8, kF32, false, kTensor);
const QuantKey kInt8DynamicTokenSym = key(kInt8, kF32, false, kToken);
const QuantKey kInt8StaticChannelSym = key(kInt8, kF32, true, kChannel);
const QuantKey kInt8DynamicTokenAsym = key(kInt8, kF32, false, kToken, false);
const QuantKey kInt4Static = key(kInt4, kActivation, true, {1, -1});
const QuantKey kInt4StaticAsym = key(kInt4, kActivation, true, {1, -1}, false);
const QuantKey kInt4Static32 = key(kInt4, kActivation, true, {1, 32});
const QuantKey kInt4Static32Asym = key(kInt4, kActivation, true, {1, 32}, false);
const QuantKey kInt8Static = key(kInt8, kActivation, true, {1, -1});
const QuantKey kInt4W4A8StaticChannelSym = key(kInt4, kF32, true, kChannel);
const QuantKey kInt4W4A8StaticGroup128Sym = key(kInt4, kF32, true, {1, 128});

}  // namespace quant_keys
}  // namespace moekit
