// Quantization of the MoE layer input (a1) by a prepare/finalize, before dispatch.
#pragma once

#include "moekit/config/quant_config.h"
#include "moekit/core/tensor.h"
#include "moekit/modular/types.h"

namespace moekit {

// The quantized activations and their scales, as PrepareResult carries them (a1q, a1q_scale).
struct QuantizedInput {
  Tensor data;   // (M, K) quantized values, or the input itself when desc.dtype is kNone
  Tensor scale;  // scales per desc.shape (static scales come from desc.scale); undefined for kNone
};

// Quantizes a (M, K) activation tensor as `desc` describes (the a1 descriptor of a QuantConfig).
// QuantDType::kNone returns the input unchanged. Other formats throw UnsupportedError until the
// quantization ops land.
QuantizedInput quantize_moe_input(const Tensor& a, const QuantDesc& desc, RunContext ctx);

}  // namespace moekit
