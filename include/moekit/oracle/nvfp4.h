// The oracle of NVFP4 MoE layers (fp4 e2m1 weights with ue4m3 group-16 scales and fp32 global
// scales; nvfp4 or bf16 activations).
//
// The seed's backends are declared without a moekit kernel, in the original's priority:
// flashinfer_trtllm, flashinfer_cutedsl, flashinfer_cutedsl_batched, flashinfer_cutlass,
// vllm_cutlass, marlin, humming; b12x and flashinfer_b12x only when forced. "sm90_nvfp4"
// (Sm90Nvfp4Experts, weight-only on Hopper) and "emulation" (CpuNvfp4Experts) register beside
// their classes.
#pragma once

#include <string>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

// NVFP4 scales as a checkpoint stores them (Quark / ModelOpt parameter names).
struct Nvfp4CheckpointScales {
  Tensor w13_weight_scale;    // (E, N1, ceil(H/16)) ue4m3
  Tensor w2_weight_scale;     // (E, H, ceil(I/16)) ue4m3
  Tensor w13_weight_scale_2;  // (E,) or (E, 2) f32 (w1's column is used for the fused w13)
  Tensor w2_weight_scale_2;   // (E,) f32
  // Activation global scales (amax / (448 * 6)): (1,), (E,) or (E, 2) f32; undefined =
  // weight-only (w4a16).
  Tensor w13_input_scale;
  Tensor w2_input_scale;
  ExpertBiases bias;
  SwigluParams swiglu;
};

class Nvfp4MoEKernelOracle : public MoEKernelOracle {
 public:
  using MoEKernelOracle::make_quant_config;

  explicit Nvfp4MoEKernelOracle(MoEConfig moe_config,
                                std::optional<QuantKey> weight_key = quant_keys::kNvfp4Static,
                                std::optional<QuantKey> activation_key = quant_keys::kNvfp4Dynamic,
                                const BackendRegistry& registry = BackendRegistry::global())
      : MoEKernelOracle(QuantOracleKind::kNvfp4, std::move(moe_config), std::move(weight_key),
                        std::move(activation_key), registry) {}

  std::string name() const override { return "NvFp4"; }
  std::string type_name() const override { return "Nvfp4MoEKernelOracle"; }

  // The QuantConfig of `backend` from checkpoint scales: g_alphas = input_scale *
  // weight_scale_2, a_gscale = 1 / input_scale. Backends that quantize after the permutation
  // (traits.per_expert_input_global_scale: emulation, vllm_cutlass) keep per-expert input scales;
  // the others quantize before dispatch with the maximum input scale. Without input scales, or
  // for a weight-only backend (traits.weight_only: sm90_nvfp4, marlin; their input scales are
  // not used): nvfp4_w4a16 with g_alphas = weight_scale_2.
  static QuantConfig make_quant_config(const ExpertsBackend& backend, const MoEWeightShape& shape,
                                       const Nvfp4CheckpointScales& scales);
};

}  // namespace moekit
