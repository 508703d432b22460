// The oracle of fp8 (e4m3) weight MoE layers: W8A8 per tensor, per token x per channel and
// 128-block (DeepSeek), and fp8 W8A16.
//
// The seed's backends are declared here (src/oracle/fp8.cpp) without a moekit kernel, in the
// original's priority: aiter, flashinfer_trtllm, flashinfer_cutlass, deep_gemm, vllm_cutlass (only
// with allow_vllm_cutlass), triton, marlin (weight-only), batched_deep_gemm, batched_vllm_cutlass
// (only with allow_vllm_cutlass), batched_triton, xpu. On a CUDA sm_90 device with 128-block
// weights, flashinfer_cutlass moves ahead of the other declared backends under expert
// parallelism and triton otherwise. moekit's kernels register beside their experts classes
// ("cpu", alias "emulation": the CPU emulation CpuFp8Experts).
#pragma once

#include <string>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

// The fp8 W8A8 (weight, activation) key pairs moekit's fp8 experts serve, one list for every
// experts class of the scheme: 128x128 blocks (f32 or e8m0 scales) with dynamic 1x128
// activations, per-tensor weights with static / dynamic per-tensor or per-token activations,
// per-channel weights with per-token or per-tensor activations. (W8A16 adds its own pairs.)
std::vector<QuantScheme> fp8_w8a8_schemes();

class Fp8MoEKernelOracle : public MoEKernelOracle {
 public:
  using MoEKernelOracle::make_quant_config;

  // allow_vllm_cutlass: consider vllm_cutlass in the priority list (the caller's opt-in).
  explicit Fp8MoEKernelOracle(MoEConfig moe_config,
                              std::optional<QuantKey> weight_key = std::nullopt,
                              std::optional<QuantKey> activation_key = std::nullopt,
                              bool allow_vllm_cutlass = false,
                              const BackendRegistry& registry = BackendRegistry::global())
      : MoEKernelOracle(QuantOracleKind::kFp8, std::move(moe_config), std::move(weight_key),
                        std::move(activation_key), registry),
        allow_vllm_cutlass_(allow_vllm_cutlass) {}

  std::string name() const override { return "FP8"; }
  std::string type_name() const override { return "Fp8MoEKernelOracle"; }

  // The QuantConfig `backend` runs with: a weight-only backend (traits.weight_only, e.g. marlin)
  // takes fp8 weights with unquantized activations (fp8_w8a16_moe_quant_config, activation scales
  // dropped); every other backend fp8_w8a8_moe_quant_config.
  static QuantConfig make_quant_config(const ExpertsBackend& backend, const MoEWeightShape& shape,
                                       Fp8W8A8Params params);

 protected:
  std::optional<int> priority_for(const ExpertsBackend& backend,
                                  const MoEConfig& moe_config) const override;

 private:
  bool allow_vllm_cutlass_;
};

}  // namespace moekit
