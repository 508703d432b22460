// Quantization of the MoE layer input (a1) by a prepare/finalize, before dispatch, and of the
// intermediate (a2) by the experts, as a QuantDesc describes it. Host-side (CPU) reference code
// built on moekit::quant (quant/quantize.h), so every result is bit-exact and deterministic.
//
// How a QuantDesc (an activation descriptor of a QuantConfig) maps to a scheme:
//
// | desc.dtype     | desc.shape         | scheme                      | scales                    |
// |----------------|--------------------|-----------------------------|---------------------------|
// | kNone          | any                | identity                    | none                      |
// | kFp8E4M3/E5M2  | per_tensor         | fp8, one f32 scale          | static: desc.scale (1,)   |
// |                |                    |                             | dynamic: amax / 448       |
// | kFp8E4M3/E5M2  | per_token          | fp8, one f32 scale per row  | dynamic                   |
// | kFp8E4M3/E5M2  | (1, 32)            | MXFP8: e8m0 per 32 along K  | dynamic                   |
// | kFp8E4M3/E5M2  | (1, g), g != 32    | fp8, f32 per (1, g) group   | dynamic (DeepSeek g=128)  |
// | kInt8          | per_tensor         | int8 symmetric              | static (1,) or dynamic    |
// | kInt8          | per_token          | int8 symmetric per row      | dynamic                   |
// | kFp4E2M1       | (1, 32)            | MXFP4: e8m0 per 32          | dynamic                   |
// | kFp4E2M1       | (1, 16)            | NVFP4: ue4m3 per 16 + global| dynamic block scales, the |
// |                |                    |                             | global scale g is given:  |
// |                |                    |                             | desc.alpha_or_gscale (1,) |
// | kFp6E3M2/E2M3  | (1, 32)            | MXFP6: e8m0 per 32          | dynamic                   |
//
// NOTE: the fp8 (1, 32) shape means MXFP8 (e8m0 scales), as in the original's configs; f32-scaled
// fp8 groups use any other group width. Static scales (desc.scale defined) exist for per-tensor
// fp8 / int8 only and must hold one value (QuantConfig factories reduce per-expert static scales
// to their maximum). NVFP4 follows x ~= q * sf / g (quant/quantize.h).
//
// Layout of QuantizedInput for an (M, K) input (codes of each row start on a byte boundary):
//   fp8:   data (M, K) kFp8E4M3 / kFp8E5M2;   scale (1,) f32 | (M, 1) f32 | (M, ceil(K/g)) f32
//   mxfp8: data (M, K) kFp8E4M3;              scale (M, ceil(K/32)) kUE8M0
//   int8:  data (M, K) kInt8 (two's compl.);  scale (1,) f32 | (M, 1) f32
//   mxfp4: data (M, ceil(K/2)) kFp4E2M1x2 (element 2j in the low nibble of byte j);
//          scale (M, ceil(K/32)) kUE8M0
//   nvfp4: data (M, ceil(K/2)) kFp4E2M1x2;    scale (M, ceil(K/16)) kUE4M3 (the global scale
//          stays in desc.alpha_or_gscale)
//   mxfp6: data (M, 3*ceil(K/4)) kUInt8 (four codes per three bytes, formats.h);
//          scale (M, ceil(K/32)) kUE8M0
// A static per-tensor scale is returned as a (1,) f32 copy of desc.scale.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "moekit/config/quant_config.h"
#include "moekit/core/tensor.h"
#include "moekit/modular/types.h"
#include "moekit/quant/quantize.h"

namespace moekit {

// The quantized activations and their scales, as PrepareResult carries them (a1q, a1q_scale).
struct QuantizedInput {
  Tensor data;   // layout above, or the input itself when desc.dtype is kNone
  Tensor scale;  // layout above; undefined for kNone
};

// The element scheme of an activation descriptor (table above). Throws UnsupportedError naming
// the dtype and shape for combinations that are not activation schemes (kNone included).
quant::QuantScheme activation_quant_scheme(const QuantDesc& desc);

// Whether desc carries a static (calibrated) per-tensor scale.
bool has_static_scale(const QuantDesc& desc);

// Quantizes a (M, K) bf16/f16/f32 CPU activation tensor as `desc` describes. QuantDType::kNone
// returns the input unchanged. Throws moekit::Error for bad scales (wrong count, not finite or
// not positive) and UnsupportedError for non-CPU tensors or unsupported descriptors.
QuantizedInput quantize_moe_input(const Tensor& a, const QuantDesc& desc, RunContext ctx);

// The inverse: the (rows, cols) fp32 values (row-major) that `q` encodes under `desc`
// (q.data / q.scale in the layout above; cols = K, the logical row length).
std::vector<float> dequantize_moe_input(const QuantizedInput& q, const QuantDesc& desc,
                                        int64_t cols);

// Quantize-dequantize (QDQ) in place: values [rows, cols] fp32 become exactly what
// dequantize_moe_input(quantize_moe_input(values)) gives. `nvfp4_global_scale` replaces
// desc.alpha_or_gscale for NVFP4 (per-expert global scales of experts that quantize after the
// permutation). kNone leaves the values unchanged.
void quant_dequant_rows(std::span<float> values, int64_t rows, int64_t cols, const QuantDesc& desc,
                        std::optional<float> nvfp4_global_scale = std::nullopt);

}  // namespace moekit
