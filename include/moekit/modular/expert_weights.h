// The routed experts' tensors as a kernel reads them, and the weight layouts that backends
// produce from the standard one (DESIGN.md §3) after loading.
#pragma once

#include <functional>
#include <string>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/core/tensor.h"

namespace moekit {

// E = local experts, N1 = 2I gated or I, H hidden, I intermediate; sub-byte codes are packed
// along the last dim. Scales of quantized weights live in the QuantConfig beside them.
struct ExpertWeights {
  Tensor w13;       // (E, N1, H) values or codes
  Tensor w2;        // (E, H, I) values or codes
  Tensor w13_bias;  // (E, N1), optional
  Tensor w2_bias;   // (E, H), optional
};

// How one backend wants the weights laid out, as a transformation of the standard layout.
//
// NOTE: to_kernel rewrites the tensors in place (the same storage: the layer keeps one copy of
// the weights) and may use at most one expert's worth of scratch memory; to_standard is its exact
// inverse, applied to host copies of single experts (the float64 checks read experts back).
struct WeightLayout {
  std::string name;  // e.g. "gate/up rows in blocks of 32"
  std::function<void(ExpertWeights& weights, const MoEConfig& moe, Stream stream)> to_kernel;
  std::function<void(ExpertWeights& one_expert_on_host, const MoEConfig& moe)> to_standard;
};

}  // namespace moekit
