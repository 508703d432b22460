// Activation quantization of the MoE layer (see the header's table), on top of quant/quantize.h.
#include "moekit/quant/moe_input_quant.h"

#include <cmath>
#include <cstring>

#include "modular/cpu_rows.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "quant/cuda/moe_input_quant.h"

namespace moekit {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool is_nvfp4(const QuantDesc& desc) {
  return desc.dtype == QuantDType::kFp4E2M1 && desc.shape == GroupShape{1, 16};
}

[[noreturn]] void throw_unsupported(const QuantDesc& desc, std::string_view why) {
  throw UnsupportedError(
      fmt::format("MoE activation quantization to {} with scale shape {} is not "
                  "supported: {}",
                  quant_dtype_name(desc.dtype), desc.shape.to_string(), why));
}

// The one static per-tensor scale of desc (checked).
float static_scale(const QuantDesc& desc) {
  MOEKIT_CHECK(desc.scale.numel() == 1,
               "static activation scale {} must hold one value (per-tensor); reduce per-expert "
               "scales to their maximum first",
               desc.scale.describe());
  const float s = desc.scale.to_float_vector()[0];
  MOEKIT_CHECK(std::isfinite(s) && s > 0.0f, "static activation scale = {} must be finite and > 0",
               s);
  return s;
}

float nvfp4_global(const QuantDesc& desc) {
  MOEKIT_CHECK(desc.alpha_or_gscale.defined(),
               "NVFP4 activations need a global scale (alpha_or_gscale, (1,) f32)");
  MOEKIT_CHECK(desc.alpha_or_gscale.numel() == 1,
               "NVFP4 activation global scale {} must hold one value to quantize before dispatch; "
               "per-expert global scales need experts that quantize after the permutation",
               desc.alpha_or_gscale.describe());
  const float g = desc.alpha_or_gscale.to_float_vector()[0];
  MOEKIT_CHECK(std::isfinite(g) && g > 0.0f,
               "NVFP4 activation global scale = {} must be finite "
               "and > 0",
               g);
  return g;
}

quant::QuantizedTensor quantize_values(std::span<const float> values, int64_t rows, int64_t cols,
                                       const QuantDesc& desc, std::optional<float> nvfp4_gscale) {
  const quant::QuantScheme scheme = activation_quant_scheme(desc);
  if (is_nvfp4(desc)) {
    const float g = nvfp4_gscale ? *nvfp4_gscale : nvfp4_global(desc);
    MOEKIT_CHECK(std::isfinite(g) && g > 0.0f,
                 "NVFP4 activation global scale = {} must be finite and > 0", g);
    return quant::quantize_with_scales(values, rows, cols, scheme, std::span<const float>(&g, 1));
  }
  if (has_static_scale(desc)) {
    const float s = static_scale(desc);
    return quant::quantize_with_scales(values, rows, cols, scheme, std::span<const float>(&s, 1));
  }
  return quant::quantize(values, rows, cols, scheme);
}

DType code_dtype(QuantDType dtype) {
  switch (dtype) {
    case QuantDType::kFp8E4M3:
      return DType::kFp8E4M3;
    case QuantDType::kFp8E5M2:
      return DType::kFp8E5M2;
    case QuantDType::kInt8:
      return DType::kInt8;
    case QuantDType::kFp4E2M1:
      return DType::kFp4E2M1x2;
    default:
      return DType::kUInt8;
  }
}

DType scale_tensor_dtype(ScaleDType dtype) {
  switch (dtype) {
    case ScaleDType::kUE8M0:
      return DType::kUE8M0;
    case ScaleDType::kUE4M3:
      return DType::kUE4M3;
    default:
      return DType::kF32;
  }
}

std::vector<float> rows_as_floats(const Tensor& a) {
  const int64_t M = a.size(0), K = a.size(1);
  const Tensor src = a.is_contiguous() ? a : a.clone();
  std::vector<float> values(static_cast<size_t>(M * K));
  if (M * K > 0) detail::load_row(src.data(), src.dtype(), 0, M * K, values.data());
  return values;
}

}  // namespace

quant::QuantScheme activation_quant_scheme(const QuantDesc& desc) {
  const GroupShape& s = desc.shape;
  const bool row_group = s.row == 1 && s.col > 0;
  switch (desc.dtype) {
    case QuantDType::kNone:
      throw_unsupported(desc, "the descriptor is not quantized (kNone)");
    case QuantDType::kFp8E4M3:
    case QuantDType::kFp8E5M2: {
      quant::QuantScheme scheme;
      if (s.is_per_tensor()) {
        scheme = quant::QuantScheme::fp8_per_tensor();
      } else if (s.is_per_token()) {
        scheme = quant::QuantScheme::fp8_per_token();
      } else if (row_group && s.col == 32) {
        scheme = quant::QuantScheme::mx(desc.dtype);
      } else if (row_group) {
        scheme = quant::QuantScheme::fp8_per_token_group(s.col);
      } else {
        throw_unsupported(desc, "fp8 activations are per tensor, per token or in (1, g) groups");
      }
      scheme.dtype = desc.dtype;
      return scheme;
    }
    case QuantDType::kInt8:
      if (s.is_per_tensor()) return quant::QuantScheme::int8_per_tensor();
      if (s.is_per_token()) return quant::QuantScheme::int8_per_token();
      throw_unsupported(desc, "int8 activations are per tensor or per token");
    case QuantDType::kFp4E2M1:
      if (s == GroupShape{1, 32}) return quant::QuantScheme::mxfp4();
      if (s == GroupShape{1, 16}) return quant::QuantScheme::nvfp4();
      throw_unsupported(desc, "fp4 activations are MXFP4 (1, 32) or NVFP4 (1, 16)");
    case QuantDType::kFp6E3M2:
    case QuantDType::kFp6E2M3:
      if (s == GroupShape{1, 32}) return quant::QuantScheme::mx(desc.dtype);
      throw_unsupported(desc, "fp6 activations are MXFP6 with (1, 32) groups");
    case QuantDType::kInt4:
      throw_unsupported(desc, "int4 is a weight-only format");
  }
  throw_unsupported(desc, "unknown dtype");
}

bool has_static_scale(const QuantDesc& desc) {
  return desc.dtype != QuantDType::kNone && desc.scale.defined() &&
         (desc.dtype == QuantDType::kFp8E4M3 || desc.dtype == QuantDType::kFp8E5M2 ||
          desc.dtype == QuantDType::kInt8);
}

QuantizedInput quantize_moe_input(const Tensor& a, const QuantDesc& desc, RunContext ctx) {
  if (desc.dtype == QuantDType::kNone) return {a, Tensor{}};
  expect_defined(a, "a1");
  expect_dim(a, "a1", 2);
  expect_dtype(a, "a1", {DType::kBF16, DType::kF16, DType::kF32});
  if (!a.device().is_cpu()) {
    throw UnsupportedError(
        fmt::format("quantize_moe_input: quantizing the MoE input {} to {} runs on the CPU only",
                    a.describe(), quant_dtype_name(desc.dtype)));
  }
  if (has_static_scale(desc)) {
    MOEKIT_CHECK(desc.shape.is_per_tensor(),
                 "static activation scales are per tensor, but the descriptor's scale shape is {}",
                 desc.shape.to_string());
  }
  const int64_t M = a.size(0), K = a.size(1);
  const std::vector<float> values = rows_as_floats(a);
  const quant::QuantizedTensor q = quantize_values(values, M, K, desc, std::nullopt);

  QuantizedInput out;
  const int64_t row_bytes = quant::code_row_bytes(desc.dtype, K);
  out.data = Tensor::empty({M, row_bytes}, code_dtype(desc.dtype));
  if (!q.codes.empty()) std::memcpy(out.data.data(), q.codes.data(), q.codes.size());
  const quant::QuantScheme& scheme = q.scheme;
  Shape scale_shape;
  if (scheme.block.rows == -1 && scheme.block.cols == -1) {
    scale_shape = {1};
  } else {
    scale_shape = {q.scale_rows, q.scale_cols};
  }
  out.scale = Tensor::empty(scale_shape, scale_tensor_dtype(scheme.scale_dtype));
  if (scheme.scale_dtype == ScaleDType::kF32) {
    if (!q.scales.empty()) std::memcpy(out.scale.data(), q.scales.data(), q.scales.size() * 4);
  } else if (!q.scale_codes.empty()) {
    std::memcpy(out.scale.data(), q.scale_codes.data(), q.scale_codes.size());
  }
  return out;
}

std::vector<float> dequantize_moe_input(const QuantizedInput& q, const QuantDesc& desc,
                                        int64_t cols) {
  expect_defined(q.data, "a1q");
  expect_dim(q.data, "a1q", 2);
  MOEKIT_CHECK(q.data.device().is_cpu(), "a1q {} must be on the CPU", q.data.describe());
  const int64_t rows = q.data.size(0);
  if (desc.dtype == QuantDType::kNone) {
    expect_shape(q.data, "a1q", {rows, cols});
    return rows_as_floats(q.data);
  }
  quant::QuantizedTensor t;
  t.scheme = activation_quant_scheme(desc);
  t.rows = rows;
  t.cols = cols;
  const int64_t row_bytes = quant::code_row_bytes(desc.dtype, cols);
  expect_shape(q.data, "a1q", {rows, row_bytes});
  expect_contiguous(q.data, "a1q");
  MOEKIT_CHECK(element_size(q.data.dtype()) == 1, "a1q dtype {} must be a one-byte code type",
               dtype_name(q.data.dtype()));
  t.codes.resize(static_cast<size_t>(rows * row_bytes));
  if (!t.codes.empty()) std::memcpy(t.codes.data(), q.data.data(), t.codes.size());

  const quant::BlockShape& b = t.scheme.block;
  t.scale_rows = b.rows == -1 ? 1 : ceil_div(rows, b.rows);
  t.scale_cols = b.cols == -1 ? 1 : ceil_div(cols, b.cols);
  const int64_t num_scales = t.scale_rows * t.scale_cols;
  expect_defined(q.scale, "a1q_scale");
  MOEKIT_CHECK(q.scale.numel() == num_scales,
               "a1q_scale {} must hold {} scales ({} x {}) for {} activations of shape ({}, {})",
               q.scale.describe(), num_scales, t.scale_rows, t.scale_cols, t.scheme.to_string(),
               rows, cols);
  if (t.scheme.scale_dtype == ScaleDType::kF32) {
    t.scales = q.scale.to_float_vector();
  } else {
    expect_dtype(q.scale, "a1q_scale",
                 {t.scheme.scale_dtype == ScaleDType::kUE8M0 ? DType::kUE8M0 : DType::kUE4M3,
                  DType::kUInt8});
    const Tensor s = q.scale.is_contiguous() ? q.scale : q.scale.clone();
    t.scale_codes.resize(static_cast<size_t>(num_scales));
    std::memcpy(t.scale_codes.data(), s.data(), t.scale_codes.size());
    if (t.scheme.scale_dtype == ScaleDType::kUE4M3) t.global_scale = nvfp4_global(desc);
  }
  return quant::dequantize(t);
}

void quant_dequant_rows(std::span<float> values, int64_t rows, int64_t cols, const QuantDesc& desc,
                        std::optional<float> nvfp4_global_scale) {
  if (desc.dtype == QuantDType::kNone || rows == 0) return;
  MOEKIT_CHECK(static_cast<int64_t>(values.size()) == rows * cols,
               "quant_dequant_rows: {} values, expected {} x {}", values.size(), rows, cols);
  const quant::QuantizedTensor q = quantize_values(values, rows, cols, desc, nvfp4_global_scale);
  quant::dequantize(q, values);
}

// ---- the GPU path's shapes (quant/cuda/moe_input_quant.h) -------------------------------------

std::string device_quant_unsupported(const QuantDesc& desc) {
  const bool fp8 = desc.dtype == QuantDType::kFp8E4M3;
  if (!fp8 && desc.dtype != QuantDType::kInt8) {
    return "activation dtype " + std::string(quant_dtype_name(desc.dtype)) +
           " (the GPU quantizes to fp8 e4m3 or int8)";
  }
  if (desc.shape.is_per_tensor()) return "";
  if (desc.scale.defined()) return "static scales other than per-tensor";
  if (desc.shape.is_per_token()) return "";
  if (fp8 && desc.shape.row == 1 && desc.shape.col > 0 && desc.shape.col != 32) return "";
  return "activation groups " + desc.shape.to_string();
}

DeviceQuantShapes device_quant_shapes(int64_t rows, int64_t cols, const QuantDesc& desc) {
  DeviceQuantShapes s;
  s.data = {rows, cols};
  s.data_dtype = desc.dtype == QuantDType::kInt8 ? DType::kInt8 : DType::kFp8E4M3;
  if (desc.shape.is_per_tensor()) {
    s.scale = {1};
  } else if (desc.shape.is_per_token()) {
    s.scale = {rows, 1};
  } else {
    s.scale = {rows, (cols + desc.shape.col - 1) / desc.shape.col};
  }
  return s;
}

}  // namespace moekit
