// QuantConfig factories: validate the scale tensors of each scheme and fill the descriptors.
#include "moekit/config/quant_factories.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::string shapes_to_string(const std::vector<Shape>& shapes) {
  std::string out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (i > 0) out += " or ";
    out += shape_to_string(shapes[i]);
  }
  return out;
}

// `t` must be defined, have one of `allowed` shapes and one of `dtypes`.
void expect_tensor(const Tensor& t, std::string_view scheme, std::string_view name,
                   const std::vector<Shape>& allowed, std::initializer_list<DType> dtypes) {
  MOEKIT_CHECK(t.defined(), "{}: {} is required ({})", scheme, name, shapes_to_string(allowed));
  const bool shape_ok = std::find(allowed.begin(), allowed.end(), t.shape()) != allowed.end();
  MOEKIT_CHECK(shape_ok, "{}: {} has shape {} but must be {}", scheme, name,
               shape_to_string(t.shape()), shapes_to_string(allowed));
  const bool dtype_ok = std::find(dtypes.begin(), dtypes.end(), t.dtype()) != dtypes.end();
  if (!dtype_ok) {
    std::string names;
    for (DType d : dtypes)
      names += (names.empty() ? "" : ", ") + std::string(dtype_name(d));
    MOEKIT_CHECK(dtype_ok, "{}: {} has dtype {} but must be one of {}", scheme, name,
                 dtype_name(t.dtype()), names);
  }
}

void expect_unset(const Tensor& t, std::string_view scheme, std::string_view name,
                  std::string_view why) {
  MOEKIT_CHECK(!t.defined(), "{}: {} {} must not be set: {}", scheme, name, t.describe(), why);
}

constexpr std::initializer_list<DType> kFloatDTypes = {DType::kF32, DType::kBF16, DType::kF16};

// A (1,) f32 CPU tensor holding the maximum of a static activation scale given as (1,) or (E,).
Tensor reduce_static_scale(const Tensor& scale, std::string_view scheme, std::string_view name,
                           int64_t E) {
  expect_tensor(scale, scheme, name, {{1}, {E}}, {DType::kF32});
  const std::vector<float> values = scale.to_float_vector();
  float m = 0.0f;
  for (size_t i = 0; i < values.size(); ++i) {
    MOEKIT_CHECK(std::isfinite(values[i]) && values[i] > 0.0f,
                 "{}: {}[{}] = {} must be finite and > 0", scheme, name, i, values[i]);
    m = std::max(m, values[i]);
  }
  return Tensor::from_floats(std::span<const float>(&m, 1), {1}, DType::kF32);
}

// Checks positive finite values of an f32 tensor (global scales and alphas).
void expect_positive(const Tensor& t, std::string_view scheme, std::string_view name) {
  const std::vector<float> values = t.to_float_vector();
  for (size_t i = 0; i < values.size(); ++i) {
    MOEKIT_CHECK(std::isfinite(values[i]) && values[i] > 0.0f,
                 "{}: {}[{}] = {} must be finite and > 0", scheme, name, i, values[i]);
  }
}

void apply_common(QuantConfig& c, const MoEWeightShape& shape, const ExpertBiases& bias,
                  const SwigluParams& swiglu, std::string_view scheme) {
  const int64_t E = shape.num_experts;
  if (bias.w1_bias.defined()) {
    expect_tensor(bias.w1_bias, scheme, "w1_bias", {{E, shape.n1()}}, kFloatDTypes);
    c.w1.bias = bias.w1_bias;
  }
  if (bias.w2_bias.defined()) {
    expect_tensor(bias.w2_bias, scheme, "w2_bias", {{E, shape.hidden}}, kFloatDTypes);
    c.w2.bias = bias.w2_bias;
  }
  c.gemm1_alpha = swiglu.alpha;
  c.gemm1_beta = swiglu.beta;
  c.gemm1_clamp_limit = swiglu.limit;
  if (swiglu.limit) {
    MOEKIT_CHECK(std::isfinite(*swiglu.limit) && *swiglu.limit > 0.0f,
                 "{}: swiglu limit = {} must be finite and > 0", scheme, *swiglu.limit);
  }
}

void check_shape(const MoEWeightShape& s, std::string_view scheme) {
  MOEKIT_CHECK(s.num_experts > 0 && s.hidden > 0 && s.intermediate > 0,
               "{}: the layer shape E={}, H={}, I={} must be positive", scheme, s.num_experts,
               s.hidden, s.intermediate);
}

// fp8 weight descriptors for the three granularities.
void fill_fp8_weights(QuantConfig& c, const MoEWeightShape& shape, const Fp8W8A8Params& p,
                      std::string_view scheme) {
  const int64_t E = shape.num_experts, N1 = shape.n1(), H = shape.hidden, I = shape.intermediate;
  c.w1.dtype = c.w2.dtype = QuantDType::kFp8E4M3;
  if (p.block_shape) {
    const auto [bn, bk] = *p.block_shape;
    MOEKIT_CHECK(bn > 0 && bk > 0, "{}: block_shape = [{}, {}] must be positive", scheme, bn, bk);
    MOEKIT_CHECK(!p.per_act_token_quant && !p.per_out_ch_quant,
                 "{}: block_shape [{}, {}] excludes per_act_token_quant and per_out_ch_quant",
                 scheme, bn, bk);
    c.w1.shape = c.w2.shape = GroupShape{bn, bk};
    expect_tensor(p.w1_scale, scheme, "w1_scale", {{E, ceil_div(N1, bn), ceil_div(H, bk)}},
                  {DType::kF32, DType::kUE8M0});
    expect_tensor(p.w2_scale, scheme, "w2_scale", {{E, ceil_div(H, bn), ceil_div(I, bk)}},
                  {p.w1_scale.dtype()});
  } else if (p.per_out_ch_quant) {
    c.w1.shape = c.w2.shape = GroupShape::per_channel();
    expect_tensor(p.w1_scale, scheme, "w1_scale", {{E, N1}, {E, N1, 1}}, {DType::kF32});
    expect_tensor(p.w2_scale, scheme, "w2_scale", {{E, H}, {E, H, 1}}, {DType::kF32});
  } else {
    c.w1.shape = c.w2.shape = GroupShape::per_tensor();
    expect_tensor(p.w1_scale, scheme, "w1_scale", {{E}, {E, 1}, {E, 1, 1}}, {DType::kF32});
    expect_tensor(p.w2_scale, scheme, "w2_scale", {{E}, {E, 1}, {E, 1, 1}}, {DType::kF32});
  }
  if (p.w1_scale.dtype() == DType::kF32) {
    expect_positive(p.w1_scale, scheme, "w1_scale");
    expect_positive(p.w2_scale, scheme, "w2_scale");
  }
  c.w1.scale = p.w1_scale;
  c.w2.scale = p.w2_scale;
}

// Activation descriptor of a static (scale given) or dynamic per-tensor / per-token fp8 or int8.
QuantDesc act_desc(QuantDType dtype, GroupShape shape, Tensor scale) {
  QuantDesc d;
  d.dtype = dtype;
  d.shape = shape;
  d.scale = std::move(scale);
  return d;
}

QuantDType ocp_element(OcpMxDType d) {
  switch (d) {
    case OcpMxDType::kNone:
      return QuantDType::kNone;
    case OcpMxDType::kFp8:
    case OcpMxDType::kMxfp8:
      return QuantDType::kFp8E4M3;
    case OcpMxDType::kMxfp4:
      return QuantDType::kFp4E2M1;
    case OcpMxDType::kMxfp6E3M2:
      return QuantDType::kFp6E3M2;
    case OcpMxDType::kMxfp6E2M3:
      return QuantDType::kFp6E2M3;
  }
  return QuantDType::kNone;
}

}  // namespace

MoEWeightShape MoEWeightShape::from(const MoEConfig& moe) {
  return MoEWeightShape{moe.num_local_experts, moe.hidden_dim,
                        moe.intermediate_size_per_partition(), moe.is_act_and_mul()};
}

std::string_view ocp_mx_dtype_name(OcpMxDType dtype) {
  switch (dtype) {
    case OcpMxDType::kNone:
      return "none";
    case OcpMxDType::kFp8:
      return "fp8";
    case OcpMxDType::kMxfp4:
      return "mxfp4";
    case OcpMxDType::kMxfp6E3M2:
      return "mxfp6_e3m2";
    case OcpMxDType::kMxfp6E2M3:
      return "mxfp6_e2m3";
    case OcpMxDType::kMxfp8:
      return "mxfp8";
  }
  return "?";
}

// ---- fp8 ----------------------------------------------------------------------------------------

QuantConfig fp8_w8a8_moe_quant_config(const MoEWeightShape& shape, const Fp8W8A8Params& p) {
  constexpr std::string_view kScheme = "fp8_w8a8_moe_quant_config";
  check_shape(shape, kScheme);
  QuantConfig c;
  fill_fp8_weights(c, shape, p, kScheme);
  const int64_t E = shape.num_experts;
  if (p.block_shape) {
    expect_unset(p.a1_scale, kScheme, "a1_scale",
                 "block-quantized fp8 uses dynamic (1, block_k) activation groups");
    expect_unset(p.a2_scale, kScheme, "a2_scale",
                 "block-quantized fp8 uses dynamic (1, block_k) activation groups");
    const GroupShape g{1, p.block_shape->second};
    c.a1 = act_desc(QuantDType::kFp8E4M3, g, {});
    c.a2 = act_desc(QuantDType::kFp8E4M3, g, {});
  } else if (p.per_act_token_quant) {
    expect_unset(p.a1_scale, kScheme, "a1_scale", "per-token activation scales are dynamic");
    expect_unset(p.a2_scale, kScheme, "a2_scale", "per-token activation scales are dynamic");
    c.a1 = act_desc(QuantDType::kFp8E4M3, GroupShape::per_token(), {});
    c.a2 = act_desc(QuantDType::kFp8E4M3, GroupShape::per_token(), {});
  } else {
    MOEKIT_CHECK(p.a1_scale.defined() == p.a2_scale.defined(),
                 "{}: static activation scales need both a1_scale and a2_scale (got a1_scale {}, "
                 "a2_scale {})",
                 kScheme, p.a1_scale.defined() ? "set" : "unset",
                 p.a2_scale.defined() ? "set" : "unset");
    Tensor a1 =
        p.a1_scale.defined() ? reduce_static_scale(p.a1_scale, kScheme, "a1_scale", E) : Tensor{};
    Tensor a2 =
        p.a2_scale.defined() ? reduce_static_scale(p.a2_scale, kScheme, "a2_scale", E) : Tensor{};
    c.a1 = act_desc(QuantDType::kFp8E4M3, GroupShape::per_tensor(), a1);
    c.a2 = act_desc(QuantDType::kFp8E4M3, GroupShape::per_tensor(), a2);
  }
  apply_common(c, shape, p.bias, p.swiglu, kScheme);
  return c;
}

QuantConfig fp8_w8a16_moe_quant_config(const MoEWeightShape& shape, const Fp8W8A8Params& p) {
  constexpr std::string_view kScheme = "fp8_w8a16_moe_quant_config";
  check_shape(shape, kScheme);
  expect_unset(p.a1_scale, kScheme, "a1_scale", "the activations are not quantized");
  expect_unset(p.a2_scale, kScheme, "a2_scale", "the activations are not quantized");
  MOEKIT_CHECK(!p.per_act_token_quant, "{}: per_act_token_quant needs quantized activations",
               kScheme);
  QuantConfig c;
  fill_fp8_weights(c, shape, p, kScheme);
  apply_common(c, shape, p.bias, p.swiglu, kScheme);
  return c;
}

// ---- int8 ---------------------------------------------------------------------------------------

QuantConfig int8_w8a8_moe_quant_config(const MoEWeightShape& shape, const Int8W8A8Params& p) {
  constexpr std::string_view kScheme = "int8_w8a8_moe_quant_config";
  check_shape(shape, kScheme);
  const int64_t E = shape.num_experts, N1 = shape.n1(), H = shape.hidden;
  QuantConfig c;
  c.w1.dtype = c.w2.dtype = QuantDType::kInt8;
  if (p.per_out_ch_quant) {
    c.w1.shape = c.w2.shape = GroupShape::per_channel();
    expect_tensor(p.w1_scale, kScheme, "w1_scale", {{E, N1}, {E, N1, 1}}, {DType::kF32});
    expect_tensor(p.w2_scale, kScheme, "w2_scale", {{E, H}, {E, H, 1}}, {DType::kF32});
  } else {
    c.w1.shape = c.w2.shape = GroupShape::per_tensor();
    expect_tensor(p.w1_scale, kScheme, "w1_scale", {{E}, {E, 1}, {E, 1, 1}}, {DType::kF32});
    expect_tensor(p.w2_scale, kScheme, "w2_scale", {{E}, {E, 1}, {E, 1, 1}}, {DType::kF32});
  }
  expect_positive(p.w1_scale, kScheme, "w1_scale");
  expect_positive(p.w2_scale, kScheme, "w2_scale");
  c.w1.scale = p.w1_scale;
  c.w2.scale = p.w2_scale;
  if (p.per_act_token_quant) {
    expect_unset(p.a1_scale, kScheme, "a1_scale", "per-token activation scales are dynamic");
    expect_unset(p.a2_scale, kScheme, "a2_scale", "per-token activation scales are dynamic");
    c.a1 = act_desc(QuantDType::kInt8, GroupShape::per_token(), {});
    c.a2 = act_desc(QuantDType::kInt8, GroupShape::per_token(), {});
  } else {
    MOEKIT_CHECK(p.a1_scale.defined() == p.a2_scale.defined(),
                 "{}: static activation scales need both a1_scale and a2_scale", kScheme);
    c.a1 = act_desc(
        QuantDType::kInt8, GroupShape::per_tensor(),
        p.a1_scale.defined() ? reduce_static_scale(p.a1_scale, kScheme, "a1_scale", E) : Tensor{});
    c.a2 = act_desc(
        QuantDType::kInt8, GroupShape::per_tensor(),
        p.a2_scale.defined() ? reduce_static_scale(p.a2_scale, kScheme, "a2_scale", E) : Tensor{});
  }
  apply_common(c, shape, p.bias, p.swiglu, kScheme);
  return c;
}

// ---- int weight-only ----------------------------------------------------------------------------

QuantConfig int_wna16_moe_quant_config(const MoEWeightShape& shape, const IntWna16Params& p) {
  constexpr std::string_view kScheme = "int_wna16_moe_quant_config";
  check_shape(shape, kScheme);
  MOEKIT_CHECK(p.weight_bits == 4 || p.weight_bits == 8, "{}: weight_bits = {} must be 4 or 8",
               kScheme, p.weight_bits);
  MOEKIT_CHECK(p.group_size == -1 || p.group_size > 0,
               "{}: group_size = {} must be positive or -1 (per channel)", kScheme, p.group_size);
  const int64_t E = shape.num_experts, N1 = shape.n1(), H = shape.hidden, I = shape.intermediate;
  const int64_t g1 = p.group_size == -1 ? 1 : ceil_div(H, p.group_size);
  const int64_t g2 = p.group_size == -1 ? 1 : ceil_div(I, p.group_size);
  QuantConfig c;
  c.w1.dtype = c.w2.dtype = p.weight_bits == 4 ? QuantDType::kInt4 : QuantDType::kInt8;
  c.w1.shape = c.w2.shape =
      p.group_size == -1 ? GroupShape::per_channel() : GroupShape{1, p.group_size};
  expect_tensor(p.w1_scale, kScheme, "w1_scale", {{E, N1, g1}}, kFloatDTypes);
  expect_tensor(p.w2_scale, kScheme, "w2_scale", {{E, H, g2}}, {p.w1_scale.dtype()});
  expect_positive(p.w1_scale, kScheme, "w1_scale");
  expect_positive(p.w2_scale, kScheme, "w2_scale");
  c.w1.scale = p.w1_scale;
  c.w2.scale = p.w2_scale;
  MOEKIT_CHECK(p.w1_zp.defined() == p.w2_zp.defined(),
               "{}: zero points need both w1_zp and w2_zp (got w1_zp {}, w2_zp {})", kScheme,
               p.w1_zp.defined() ? "set" : "unset", p.w2_zp.defined() ? "set" : "unset");
  if (p.w1_zp.defined()) {
    expect_tensor(p.w1_zp, kScheme, "w1_zp", {{E, N1, g1}}, {DType::kUInt8});
    expect_tensor(p.w2_zp, kScheme, "w2_zp", {{E, H, g2}}, {DType::kUInt8});
    const int64_t zmax = p.weight_bits == 4 ? 15 : 255;
    for (const auto& [t, name] : {std::pair{&p.w1_zp, "w1_zp"}, std::pair{&p.w2_zp, "w2_zp"}}) {
      const std::vector<int64_t> zp = t->to_int_vector();
      for (size_t i = 0; i < zp.size(); ++i) {
        MOEKIT_CHECK(zp[i] <= zmax, "{}: {}[{}] = {} must be in [0, {}] for int{} weights", kScheme,
                     name, i, zp[i], zmax, p.weight_bits);
      }
    }
    c.w1.zp = p.w1_zp;
    c.w2.zp = p.w2_zp;
  }
  apply_common(c, shape, p.bias, p.swiglu, kScheme);
  return c;
}

QuantConfig int4_w4a16_moe_quant_config(const MoEWeightShape& shape, IntWna16Params p) {
  p.weight_bits = 4;
  return int_wna16_moe_quant_config(shape, p);
}

QuantConfig int8_w8a16_moe_quant_config(const MoEWeightShape& shape, IntWna16Params p) {
  p.weight_bits = 8;
  return int_wna16_moe_quant_config(shape, p);
}

QuantConfig gptq_marlin_moe_quant_config(const MoEWeightShape& shape, int weight_bits,
                                         int64_t group_size, IntWna16Params p) {
  p.weight_bits = weight_bits;
  p.group_size = group_size;
  return int_wna16_moe_quant_config(shape, p);
}

// ---- OCP MX -------------------------------------------------------------------------------------

QuantConfig ocp_mx_moe_quant_config(const MoEWeightShape& shape, OcpMxDType activation_dtype,
                                    OcpMxDType weight_dtype, const MxParams& p) {
  const std::string scheme =
      fmt::format("ocp_mx_moe_quant_config(w={}, a={})", ocp_mx_dtype_name(weight_dtype),
                  ocp_mx_dtype_name(activation_dtype));
  check_shape(shape, scheme);
  MOEKIT_CHECK(weight_dtype == OcpMxDType::kMxfp4 || weight_dtype == OcpMxDType::kMxfp6E3M2 ||
                   weight_dtype == OcpMxDType::kMxfp6E2M3,
               "{}: the weight dtype must be mxfp4, mxfp6_e3m2 or mxfp6_e2m3", scheme);
  const int64_t E = shape.num_experts, N1 = shape.n1(), H = shape.hidden, I = shape.intermediate;
  QuantConfig c;
  c.w1.dtype = c.w2.dtype = ocp_element(weight_dtype);
  c.w1.shape = c.w2.shape = GroupShape{1, 32};
  expect_tensor(p.w1_scale, scheme, "w1_scale", {{E, N1, ceil_div(H, 32)}},
                {DType::kUE8M0, DType::kUInt8});
  expect_tensor(p.w2_scale, scheme, "w2_scale", {{E, H, ceil_div(I, 32)}},
                {DType::kUE8M0, DType::kUInt8});
  c.w1.scale = p.w1_scale;
  c.w2.scale = p.w2_scale;
  if (activation_dtype == OcpMxDType::kFp8) {
    MOEKIT_CHECK(p.a1_scale.defined() == p.a2_scale.defined(),
                 "{}: static fp8 activation scales need both a1_scale and a2_scale", scheme);
    c.a1 = act_desc(
        QuantDType::kFp8E4M3, GroupShape::per_tensor(),
        p.a1_scale.defined() ? reduce_static_scale(p.a1_scale, scheme, "a1_scale", E) : Tensor{});
    c.a2 = act_desc(
        QuantDType::kFp8E4M3, GroupShape::per_tensor(),
        p.a2_scale.defined() ? reduce_static_scale(p.a2_scale, scheme, "a2_scale", E) : Tensor{});
  } else {
    expect_unset(p.a1_scale, scheme, "a1_scale",
                 "only fp8 activations of OCP MX schemes take static scales");
    expect_unset(p.a2_scale, scheme, "a2_scale",
                 "only fp8 activations of OCP MX schemes take static scales");
    if (activation_dtype != OcpMxDType::kNone) {
      c.a1 = act_desc(ocp_element(activation_dtype), GroupShape{1, 32}, {});
      c.a2 = c.a1;
    }
  }
  apply_common(c, shape, p.bias, p.swiglu, scheme);
  return c;
}

QuantConfig mxfp4_w4a16_moe_quant_config(const MoEWeightShape& shape, const MxParams& p) {
  return ocp_mx_moe_quant_config(shape, OcpMxDType::kNone, OcpMxDType::kMxfp4, p);
}

QuantConfig mxfp4_w4a8_moe_quant_config(const MoEWeightShape& shape, const MxParams& p) {
  MOEKIT_CHECK(p.a1_scale.defined() && p.a2_scale.defined(),
               "mxfp4_w4a8_moe_quant_config: static fp8 activation scales a1_scale and a2_scale "
               "((1,) or (E,) f32) are required");
  return ocp_mx_moe_quant_config(shape, OcpMxDType::kFp8, OcpMxDType::kMxfp4, p);
}

QuantConfig mxfp4_mxfp8_moe_quant_config(const MoEWeightShape& shape, const MxParams& p) {
  return ocp_mx_moe_quant_config(shape, OcpMxDType::kMxfp8, OcpMxDType::kMxfp4, p);
}

QuantConfig mxfp4_moe_quant_config(const MoEWeightShape& shape, const MxParams& p) {
  return ocp_mx_moe_quant_config(shape, OcpMxDType::kMxfp4, OcpMxDType::kMxfp4, p);
}

// ---- NVFP4 --------------------------------------------------------------------------------------

namespace {
QuantConfig nvfp4_common(const MoEWeightShape& shape, const Nvfp4Params& p,
                         std::string_view scheme) {
  check_shape(shape, scheme);
  const int64_t E = shape.num_experts, N1 = shape.n1(), H = shape.hidden, I = shape.intermediate;
  QuantConfig c;
  c.w1.dtype = c.w2.dtype = QuantDType::kFp4E2M1;
  c.w1.shape = c.w2.shape = GroupShape{1, 16};
  expect_tensor(p.w1_scale, scheme, "w1_scale", {{E, N1, ceil_div(H, 16)}},
                {DType::kUE4M3, DType::kUInt8});
  expect_tensor(p.w2_scale, scheme, "w2_scale", {{E, H, ceil_div(I, 16)}},
                {DType::kUE4M3, DType::kUInt8});
  expect_tensor(p.g1_alphas, scheme, "g1_alphas", {{E}}, {DType::kF32});
  expect_tensor(p.g2_alphas, scheme, "g2_alphas", {{E}}, {DType::kF32});
  expect_positive(p.g1_alphas, scheme, "g1_alphas");
  expect_positive(p.g2_alphas, scheme, "g2_alphas");
  c.w1.scale = p.w1_scale;
  c.w2.scale = p.w2_scale;
  c.w1.alpha_or_gscale = p.g1_alphas;
  c.w2.alpha_or_gscale = p.g2_alphas;
  apply_common(c, shape, p.bias, p.swiglu, scheme);
  return c;
}
}  // namespace

QuantConfig nvfp4_moe_quant_config(const MoEWeightShape& shape, const Nvfp4Params& p) {
  constexpr std::string_view kScheme = "nvfp4_moe_quant_config";
  QuantConfig c = nvfp4_common(shape, p, kScheme);
  const int64_t E = shape.num_experts;
  expect_tensor(p.a1_gscale, kScheme, "a1_gscale", {{1}, {E}}, {DType::kF32});
  expect_tensor(p.a2_gscale, kScheme, "a2_gscale", {{1}, {E}}, {DType::kF32});
  expect_positive(p.a1_gscale, kScheme, "a1_gscale");
  expect_positive(p.a2_gscale, kScheme, "a2_gscale");
  for (QuantDesc* a : {&c.a1, &c.a2}) {
    a->dtype = QuantDType::kFp4E2M1;
    a->shape = GroupShape{1, 16};
  }
  c.a1.alpha_or_gscale = p.a1_gscale;
  c.a2.alpha_or_gscale = p.a2_gscale;
  return c;
}

QuantConfig nvfp4_w4a16_moe_quant_config(const MoEWeightShape& shape, const Nvfp4Params& p) {
  constexpr std::string_view kScheme = "nvfp4_w4a16_moe_quant_config";
  expect_unset(p.a1_gscale, kScheme, "a1_gscale", "the activations are not quantized");
  expect_unset(p.a2_gscale, kScheme, "a2_gscale", "the activations are not quantized");
  return nvfp4_common(shape, p, kScheme);
}

// ---- W4A8 ---------------------------------------------------------------------------------------

QuantConfig int4_w4afp8_moe_quant_config(const MoEWeightShape& shape, const W4A8Fp8Params& p) {
  constexpr std::string_view kScheme = "int4_w4afp8_moe_quant_config";
  check_shape(shape, kScheme);
  MOEKIT_CHECK(p.group_size == -1 || p.group_size == 128,
               "{}: group_size = {} must be -1 (per channel) or 128", kScheme, p.group_size);
  const int64_t E = shape.num_experts, N1 = shape.n1(), H = shape.hidden, I = shape.intermediate;
  QuantConfig c;
  c.w1.dtype = c.w2.dtype = QuantDType::kInt4;
  if (p.group_size == -1) {
    c.w1.shape = c.w2.shape = GroupShape::per_channel();
    expect_tensor(p.w1_scale, kScheme, "w1_scale", {{E, N1}, {E, N1, 1}}, {DType::kF32});
    expect_tensor(p.w2_scale, kScheme, "w2_scale", {{E, H}, {E, H, 1}}, {DType::kF32});
  } else {
    c.w1.shape = c.w2.shape = GroupShape{1, 128};
    expect_tensor(p.w1_scale, kScheme, "w1_scale", {{E, N1, ceil_div(H, 128)}}, {DType::kF32});
    expect_tensor(p.w2_scale, kScheme, "w2_scale", {{E, H, ceil_div(I, 128)}}, {DType::kF32});
  }
  expect_positive(p.w1_scale, kScheme, "w1_scale");
  expect_positive(p.w2_scale, kScheme, "w2_scale");
  c.w1.scale = p.w1_scale;
  c.w2.scale = p.w2_scale;
  MOEKIT_CHECK(p.a1_scale.defined() == p.a2_scale.defined(),
               "{}: static activation scales need both a1_scale and a2_scale", kScheme);
  if (p.a1_scale.defined()) {
    c.a1 = act_desc(QuantDType::kFp8E4M3, GroupShape::per_tensor(),
                    reduce_static_scale(p.a1_scale, kScheme, "a1_scale", E));
    c.a2 = act_desc(QuantDType::kFp8E4M3, GroupShape::per_tensor(),
                    reduce_static_scale(p.a2_scale, kScheme, "a2_scale", E));
  } else {
    c.a1 = act_desc(QuantDType::kFp8E4M3, GroupShape::per_token(), {});
    c.a2 = c.a1;
  }
  apply_common(c, shape, p.bias, p.swiglu, kScheme);
  return c;
}

// ---- keys ---------------------------------------------------------------------------------------

const QuantKey& int8_static_asym_key() {
  static const QuantKey key{QuantDType::kInt8,
                            ScaleDesc{ScaleDType::kActivation, true, GroupShape{1, -1}},
                            std::nullopt, false};
  return key;
}

namespace {

std::optional<QuantKey> weight_key_of(const QuantConfig& c) {
  namespace k = quant_keys;
  const QuantDesc& w = c.w1;
  const GroupShape& s = w.shape;
  switch (w.dtype) {
    case QuantDType::kNone:
      return std::nullopt;
    case QuantDType::kFp8E4M3:
    case QuantDType::kFp8E5M2: {
      if (w.dtype == QuantDType::kFp8E4M3) {
        if (s.is_per_tensor()) return k::kFp8StaticTensorSym;
        if (s.is_per_channel()) return k::kFp8StaticChannelSym;
        if (s == GroupShape{128, 128}) {
          return w.scale.defined() && w.scale.dtype() == DType::kUE8M0
                     ? k::kFp8Static128BlockE8M0Sym
                     : k::kFp8Static128BlockSym;
        }
        if (s == GroupShape{1, 32}) return k::kMxfp8Static;
      }
      const ScaleDType sd = w.scale.defined() && w.scale.dtype() == DType::kUE8M0
                                ? ScaleDType::kUE8M0
                                : ScaleDType::kF32;
      return QuantKey{w.dtype, ScaleDesc{sd, true, s}, std::nullopt, true};
    }
    case QuantDType::kInt8:
      if (c.a1.dtype == QuantDType::kInt8) {
        if (s.is_per_tensor()) return k::kInt8StaticTensorSym;
        if (s.is_per_channel()) return k::kInt8StaticChannelSym;
        return QuantKey{QuantDType::kInt8, ScaleDesc{ScaleDType::kF32, true, s}, std::nullopt,
                        true};
      }
      return w.zp.defined() ? int8_static_asym_key() : k::kInt8Static;
    case QuantDType::kInt4:
      if (c.a1.dtype == QuantDType::kFp8E4M3) {
        if (s == GroupShape{1, 128}) return k::kInt4W4A8StaticGroup128Sym;
        if (s.is_per_channel()) return k::kInt4W4A8StaticChannelSym;
        return QuantKey{QuantDType::kInt4, ScaleDesc{ScaleDType::kF32, true, s}, std::nullopt,
                        true};
      }
      if (s == GroupShape{1, 32}) return w.zp.defined() ? k::kInt4Static32Asym : k::kInt4Static32;
      return w.zp.defined() ? k::kInt4StaticAsym : k::kInt4Static;
    case QuantDType::kFp4E2M1:
      if (s == GroupShape{1, 16}) return k::kNvfp4Static;
      if (s == GroupShape{1, 32}) return k::kMxfp4Static;
      return QuantKey{QuantDType::kFp4E2M1, ScaleDesc{ScaleDType::kUE8M0, true, s}, std::nullopt,
                      true};
    case QuantDType::kFp6E3M2:
      return k::kMxfp6E3M2Static;
    case QuantDType::kFp6E2M3:
      return k::kMxfp6E2M3Static;
  }
  return std::nullopt;
}

std::optional<QuantKey> activation_key_of(const QuantConfig& c) {
  namespace k = quant_keys;
  const QuantDesc& a = c.a1;
  const GroupShape& s = a.shape;
  const bool is_static = a.scale.defined();
  switch (a.dtype) {
    case QuantDType::kNone:
      return std::nullopt;
    case QuantDType::kFp8E4M3:
      if (s.is_per_tensor()) return is_static ? k::kFp8StaticTensorSym : k::kFp8DynamicTensorSym;
      if (s.is_per_token()) return is_static ? k::kFp8StaticTokenSym : k::kFp8DynamicTokenSym;
      if (s == GroupShape{1, 128}) return k::kFp8Dynamic128Sym;
      if (s == GroupShape{1, 64}) return k::kFp8Dynamic64Sym;
      if (s == GroupShape{1, 32}) return k::kMxfp8Dynamic;
      break;
    case QuantDType::kInt8:
      if (s.is_per_tensor()) return is_static ? k::kInt8StaticTensorSym : k::kInt8DynamicTensorSym;
      if (s.is_per_token()) return k::kInt8DynamicTokenSym;
      break;
    case QuantDType::kFp4E2M1:
      if (s == GroupShape{1, 16}) return k::kNvfp4Dynamic;
      if (s == GroupShape{1, 32}) return k::kMxfp4Dynamic;
      break;
    case QuantDType::kFp6E3M2:
      return k::kMxfp6E3M2Dynamic;
    case QuantDType::kFp6E2M3:
      return k::kMxfp6E2M3Dynamic;
    default:
      break;
  }
  const ScaleDType sd = a.dtype == QuantDType::kFp4E2M1 && s == GroupShape{1, 16}
                            ? ScaleDType::kUE4M3
                            : ScaleDType::kF32;
  return QuantKey{a.dtype, ScaleDesc{sd, is_static, s}, std::nullopt, true};
}

}  // namespace

std::pair<std::optional<QuantKey>, std::optional<QuantKey>> quant_keys_of(
    const QuantConfig& config) {
  return {weight_key_of(config), activation_key_of(config)};
}

}  // namespace moekit
