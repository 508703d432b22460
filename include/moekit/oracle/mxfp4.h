// The oracle of OCP MX MoE layers: mxfp4 weights (W4A16 gpt-oss, W4A8 with static fp8
// activations, mxfp8 activations, W4A4) and, through its emulation backend, mxfp6 weights.
//
// The seed's backends are declared without a moekit kernel, in the original's priority:
// flashinfer_trtllm_mxfp4_bf16, ck, triton, flashinfer_cutlass_mxfp4_bf16, triton_unfused, marlin,
// batched_marlin, xpu; the mxfp8-activation variants (flashinfer_trtllm_mxfp4_mxfp8,
// flashinfer_cutlass_mxfp4_mxfp8; aliases flashinfer_trtllm_afp8 / flashinfer_cutlass_afp8) only
// when forced. Each declares the size alignment its kernels need (traits.hidden_align /
// intermediate_align, read by the Quark OCP MX method's maybe_roundup_sizes). "emulation" (alias
// "cpu") registers beside its classes: CpuMxfp4Experts, then CpuOcpMxExperts.
#pragma once

#include <string>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

class Mxfp4MoEKernelOracle : public MoEKernelOracle {
 public:
  using MoEKernelOracle::make_quant_config;

  explicit Mxfp4MoEKernelOracle(MoEConfig moe_config,
                                std::optional<QuantKey> weight_key = std::nullopt,
                                std::optional<QuantKey> activation_key = std::nullopt,
                                const BackendRegistry& registry = BackendRegistry::global())
      : MoEKernelOracle(QuantOracleKind::kMxfp4, std::move(moe_config), std::move(weight_key),
                        std::move(activation_key), registry) {}

  std::string name() const override { return "MXFP4"; }
  std::string type_name() const override { return "Mxfp4MoEKernelOracle"; }

  // ocp_mx_moe_quant_config(activation_dtype, weight_dtype); kFp8 activations need static scales
  // (mxfp4_w4a8), as the original's OCP MX method requires.
  static QuantConfig make_quant_config(const MoEWeightShape& shape, OcpMxDType activation_dtype,
                                       OcpMxDType weight_dtype, const MxParams& params);
};

}  // namespace moekit
