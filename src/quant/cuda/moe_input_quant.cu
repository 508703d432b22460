#include "quant/cuda/moe_input_quant.h"

#include "core/cuda/cuda_check.cuh"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "quant/cuda/quantize_rows.h"

namespace moekit {

void quantize_on_device(const Tensor& a, const QuantDesc& desc, Tensor& data, Tensor& scale,
                        void* amax_word, ValidRows valid, Stream stream) {
  const std::string why = device_quant_unsupported(desc);
  if (!why.empty()) throw UnsupportedError("GPU activation quantization: " + why);
  expect_dim(a, "activations", 2);
  expect_contiguous(a, "activations");
  const int64_t rows = a.size(0), cols = a.size(1);
  const DeviceQuantShapes shapes = device_quant_shapes(rows, cols, desc);
  MOEKIT_CHECK(data.shape() == shapes.data && data.dtype() == shapes.data_dtype &&
                   data.device() == a.device() && data.is_contiguous(),
               "quantized activations {} must be contiguous {} of shape ({}, {}) on {}",
               data.describe(), dtype_name(shapes.data_dtype), rows, cols, a.device().to_string());
  cuda::QuantizeRowsArgs q;
  q.x = a.data();
  q.x_type = cuda::elem_type_of(a.dtype());
  q.rows = rows;
  q.cols = cols;
  q.x_ld = cols;
  q.num_rows = valid.num_rows;
  q.batch_counts = valid.batch_counts;
  q.batch_rows = valid.batch_rows;
  q.q = data.data();
  q.q_type = desc.dtype == QuantDType::kInt8 ? cuda::ElemType::kS8 : cuda::ElemType::kE4M3;
  q.q_ld = cols;
  q.amax_workspace = static_cast<unsigned int*>(amax_word);
  if (desc.shape.is_per_tensor() && desc.scale.defined()) {
    expect_tensor(desc.scale, "static activation scale", {1}, {DType::kF32}, a.device());
    q.kind = cuda::RowQuant::kTensorStatic;
    q.static_scale = desc.scale.data_as<const float>();
    // The scale the GEMM reads is the static one itself.
    if (!scale.defined() || scale.data() != desc.scale.data()) scale = desc.scale;
  } else {
    MOEKIT_CHECK(scale.defined() && scale.numel() == numel_of(shapes.scale) &&
                     scale.dtype() == DType::kF32 && scale.device() == a.device() &&
                     scale.is_contiguous(),
                 "activation scales {} must be {} contiguous f32 values on {}",
                 scale.defined() ? scale.describe() : std::string("(undefined)"),
                 numel_of(shapes.scale), a.device().to_string());
    q.scale = scale.data_as<float>();
    if (desc.shape.is_per_tensor()) {
      MOEKIT_CHECK(amax_word != nullptr, "a dynamic per-tensor scale needs an amax word");
      q.kind = cuda::RowQuant::kTensorDynamic;
    } else if (desc.shape.is_per_token()) {
      q.kind = cuda::RowQuant::kRow;
    } else {
      q.kind = cuda::RowQuant::kGroup;
      q.group = static_cast<int>(desc.shape.col);
      q.scale_ld = shapes.scale[1];
    }
  }
  if (const char* reason = cuda::quantize_rows_unsupported_reason(q)) {
    MOEKIT_CHECK(false, "GPU activation quantization: {}", reason);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_quantize_rows(q, to_cuda(stream)));
}

}  // namespace moekit
