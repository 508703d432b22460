// Device entry of the activation quantization (quant/moe_input_quant.h's layouts, on a GPU):
// prepare quantizes a1 with it, the GPU experts a2. Only moekit types; defined in
// quant/cuda/moe_input_quant.cu and reached through core/cuda_seam.h.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/config/quant_config.h"
#include "moekit/core/tensor.h"

namespace moekit {

// "" when quantize_on_device serves desc, else why not. Served: fp8 e4m3 and int8 with a static
// or dynamic per-tensor scale, dynamic per-token scales, or (fp8) dynamic (1, g) groups of f32
// scales (g != 32: MXFP8's e8m0 groups are not served).
std::string device_quant_unsupported(const QuantDesc& desc);

// The codes and scales of `rows` x `cols` activations under desc (quant/moe_input_quant.h):
// data (rows, cols) kFp8E4M3 / kInt8; scale (1,) | (rows, 1) | (rows, ceil(cols / g)) f32.
struct DeviceQuantShapes {
  Shape data, scale;
  DType data_dtype = DType::kFp8E4M3;
};
DeviceQuantShapes device_quant_shapes(int64_t rows, int64_t cols, const QuantDesc& desc);

// Quantizes a (rows, cols) bf16 / f16 / f32 CUDA tensor into data / scale (shaped as above, on
// a's device) on `stream`. A static scale is read from desc.scale, which must be on a's device.
// amax_word (4 bytes of device memory) is needed by a dynamic per-tensor scale. `valid` says which
// rows exist (default: all): only those are quantized and cover a per-tensor amax, the others
// are left untouched — the first *num_rows, and / or in the batched format (E, T, cols) viewed as
// (E * T, cols) the first batch_counts[e] (clamped to [0, T]) of each expert's T = batch_rows.
struct ValidRows {
  const int32_t* num_rows = nullptr;      // device: the first *num_rows rows
  const int32_t* batch_counts = nullptr;  // device: the batched format's counts per block
  int64_t batch_rows = 0;                 // rows per block (dividing a's rows)
};
void quantize_on_device(const Tensor& a, const QuantDesc& desc, Tensor& data, Tensor& scale,
                        void* amax_word, ValidRows valid, Stream stream);

}  // namespace moekit
