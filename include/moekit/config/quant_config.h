// FusedMoEQuantConfig: per-operand quantization descriptors (a1, a2 = GEMM1/GEMM2 activations,
// w1, w2 = GEMM1/GEMM2 weights) plus the gemm1 swiglu parameters. Unquantized layers use
// QuantConfig::unquantized(); quantized factories fill the same fields.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "moekit/config/quant_key.h"
#include "moekit/core/tensor.h"

namespace moekit {

struct QuantDesc {
  QuantDType dtype = QuantDType::kNone;  // kNone: this operand is not quantized
  GroupShape shape;                      // scale granularity
  Tensor scale;            // weights: (E, ...) per scheme; static activations: (1,) or (E,)
  Tensor alpha_or_gscale;  // NVFP4: (E,) g-alphas for weights, (1,) or (E,) global act scale
  Tensor zp;               // (E, N/g, K) zero points of asymmetric weight-only schemes
  Tensor bias;             // (E, N) expert bias of this GEMM (weights only)
};

struct QuantConfig {
  QuantDesc a1, a2, w1, w2;
  bool is_scale_swizzled = true;
  std::optional<float> gemm1_alpha;  // swiglu alpha (gpt-oss 1.702)
  std::optional<float> gemm1_beta;   // swiglu beta (gpt-oss 1.0)
  std::optional<float> gemm1_clamp_limit;
  int mx_alignment = 0;

  static QuantConfig unquantized();
  // Unquantized, with expert biases: w1_bias (E, N1), w2_bias (E, H).
  static QuantConfig biased(const Tensor& w1_bias, const Tensor& w2_bias);

  QuantDType quant_dtype() const { return a1.dtype; }
  QuantDType weight_quant_dtype() const { return w1.dtype; }
  bool is_quantized() const {
    return a1.dtype != QuantDType::kNone || w1.dtype != QuantDType::kNone;
  }
  bool per_act_token_quant() const { return a1.shape.is_per_token(); }
  bool per_out_ch_quant() const { return w1.shape.is_per_channel(); }
  // [block_n, block_k] for block-quantized weights (e.g. 128x128), empty otherwise.
  std::vector<int64_t> block_shape() const;
  bool is_per_tensor() const { return a1.shape.is_per_tensor(); }
  const Tensor& w1_bias() const { return w1.bias; }
  const Tensor& w2_bias() const { return w2.bias; }
  bool has_bias() const { return w1.bias.defined() || w2.bias.defined(); }
  // "unquantized", "fp8_w8a8", ...
  std::string describe() const;
};

}  // namespace moekit
