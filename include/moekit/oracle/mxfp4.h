// The oracle of OCP MX MoE layers: mxfp4 weights (W4A16 gpt-oss, W4A8 with static fp8
// activations, mxfp8 activations, W4A4) and, through its emulation backend, mxfp6 weights.
//
// Backends mirror the original's Mxfp4MoeBackend (plus its EMULATION member). Default priority:
// flashinfer_trtllm_mxfp4_bf16, ck, triton, flashinfer_cutlass_mxfp4_bf16, triton_unfused, marlin,
// batched_marlin, xpu, emulation. The mxfp8-activation variants (flashinfer_trtllm_mxfp4_mxfp8,
// flashinfer_cutlass_mxfp4_mxfp8; aliases flashinfer_trtllm_afp8 / flashinfer_cutlass_afp8) are
// used only when forced. "emulation" runs CpuMxfp4Experts (activations quantized in prepare), then
// CpuOcpMxExperts (activations quantize-dequantized inside; mxfp6 and mixed OCP MX pairs).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

enum class Mxfp4MoeBackend {
  kFlashinferTrtllmMxfp4Mxfp8,   // "flashinfer_trtllm_mxfp4_mxfp8"
  kFlashinferTrtllmMxfp4Bf16,    // "flashinfer_trtllm_mxfp4_bf16"
  kFlashinferCutlassMxfp4Mxfp8,  // "flashinfer_cutlass_mxfp4_mxfp8"
  kFlashinferCutlassMxfp4Bf16,   // "flashinfer_cutlass_mxfp4_bf16"
  kBatchedMarlin,                // "batched_marlin"
  kMarlin,                       // "marlin"
  kCk,                           // "ck" (ROCm AITER)
  kTriton,                       // "triton" (OAI triton_kernels)
  kTritonUnfused,                // "triton_unfused"
  kXpu,                          // "xpu"
  kEmulation,                    // "emulation": CpuMxfp4Experts, CpuOcpMxExperts
};

class Mxfp4MoEKernelOracle : public MoEKernelOracle<Mxfp4MoeBackend> {
 public:
  using Backend = Mxfp4MoeBackend;
  using MoEKernelOracle::make_quant_config;
  using MoEKernelOracle::MoEKernelOracle;

  // Defaults: kEmulation -> {CpuMxfp4Experts, CpuOcpMxExperts}; the others -> {}.
  static KernelRegistry<Mxfp4MoeBackend>& registry();

  std::string name() const override { return "MXFP4"; }
  std::string type_name() const override { return "Mxfp4MoEKernelOracle"; }
  std::vector<Backend> backend_values() const override;
  std::string backend_name(Backend backend) const override;
  std::vector<std::pair<std::string, Backend>> backend_aliases() const override;
  std::vector<Backend> priority_backends(const MoEConfig& moe_config) const override;
  std::optional<Backend> batched_variant(Backend backend) const override;
  KernelRegistry<Backend>& kernel_registry() const override { return registry(); }

  // ocp_mx_moe_quant_config(activation_dtype, weight_dtype); kFp8 activations need static scales
  // (mxfp4_w4a8), as the original's OCP MX method requires.
  QuantConfig make_quant_config(const MoEWeightShape& shape, OcpMxDType activation_dtype,
                                OcpMxDType weight_dtype, const MxParams& params) const;
};

}  // namespace moekit
