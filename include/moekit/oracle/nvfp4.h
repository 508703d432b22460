// The oracle of NVFP4 MoE layers (fp4 e2m1 weights with ue4m3 group-16 scales and fp32 global
// scales; nvfp4 or bf16 activations).
//
// Backends mirror the original's NvFp4MoeBackend. Default priority: flashinfer_trtllm,
// flashinfer_cutedsl, flashinfer_cutedsl_batched, flashinfer_cutlass, vllm_cutlass, marlin,
// humming, emulation; b12x and flashinfer_b12x only when forced. "emulation" runs
// CpuNvfp4Experts; the others are rejected with kNoKernelRegisteredReason until they register.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

enum class NvFp4MoeBackend {
  kB12x,                      // "b12x" (explicit request only)
  kFlashinferTrtllm,          // "flashinfer_trtllm"
  kFlashinferCutlass,         // "flashinfer_cutlass"
  kFlashinferCutedsl,         // "flashinfer_cutedsl"
  kFlashinferCutedslBatched,  // "flashinfer_cutedsl_batched"
  kFlashinferB12x,            // "flashinfer_b12x" (explicit request only)
  kVllmCutlass,               // "vllm_cutlass"
  kMarlin,                    // "marlin"
  kHumming,                   // "humming"
  kEmulation,                 // "emulation": CpuNvfp4Experts
};

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

class Nvfp4MoEKernelOracle : public MoEKernelOracle<NvFp4MoeBackend> {
 public:
  using Backend = NvFp4MoeBackend;
  using MoEKernelOracle::make_quant_config;

  explicit Nvfp4MoEKernelOracle(MoEConfig moe_config,
                                std::optional<QuantKey> weight_key = quant_keys::kNvfp4Static,
                                std::optional<QuantKey> activation_key = quant_keys::kNvfp4Dynamic)
      : MoEKernelOracle(std::move(moe_config), std::move(weight_key), std::move(activation_key)) {}

  // Defaults: kEmulation -> {CpuNvfp4Experts}; the others -> {}.
  static KernelRegistry<NvFp4MoeBackend>& registry();

  std::string name() const override { return "NvFp4"; }
  std::string type_name() const override { return "Nvfp4MoEKernelOracle"; }
  std::vector<Backend> backend_values() const override;
  std::string backend_name(Backend backend) const override;
  std::vector<Backend> priority_backends(const MoEConfig& moe_config) const override;
  std::optional<Backend> batched_variant(Backend backend) const override;
  KernelRegistry<Backend>& kernel_registry() const override { return registry(); }

  // The QuantConfig of `backend` from checkpoint scales: g_alphas = input_scale *
  // weight_scale_2, a_gscale = 1 / input_scale. Backends that quantize after the permutation
  // (emulation, vllm_cutlass) keep per-expert input scales; the others quantize before dispatch
  // with the maximum input scale. Without input scales: nvfp4_w4a16 with g_alphas =
  // weight_scale_2.
  QuantConfig make_quant_config(Backend backend, const MoEWeightShape& shape,
                                const Nvfp4CheckpointScales& scales) const;
};

}  // namespace moekit
