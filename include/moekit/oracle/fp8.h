// The oracle of fp8 (e4m3) weight MoE layers: W8A8 per tensor, per token x per channel and
// 128-block (DeepSeek), and fp8 W8A16.
//
// Backends mirror the original's Fp8MoeBackend. Default priority: aiter, flashinfer_trtllm,
// flashinfer_cutlass, deep_gemm, vllm_cutlass (only with allow_vllm_cutlass), triton, marlin,
// batched_deep_gemm, batched_vllm_cutlass, batched_triton, xpu, cpu. On a CUDA sm_90 device with
// 128-block weights, flashinfer_cutlass moves first under expert parallelism and triton first
// otherwise. Only "cpu" has a kernel in this build (CpuFp8Experts, the CPU emulation of the W8A8
// kernels); every other backend is rejected with kNoKernelRegisteredReason until its kernel
// registers in registry().
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

enum class Fp8MoeBackend {
  kFlashinferTrtllm,    // "flashinfer_trtllm"
  kFlashinferCutlass,   // "flashinfer_cutlass"
  kDeepGemm,            // "deep_gemm"
  kBatchedDeepGemm,     // "batched_deep_gemm"
  kMarlin,              // "marlin" (weight-only: fp8_w8a16)
  kTriton,              // "triton"
  kBatchedTriton,       // "batched_triton"
  kAiter,               // "aiter" (ROCm)
  kVllmCutlass,         // "vllm_cutlass"
  kBatchedVllmCutlass,  // "batched_vllm_cutlass"
  kXpu,                 // "xpu"
  kCpu,                 // "cpu": CpuFp8Experts
};

class Fp8MoEKernelOracle : public MoEKernelOracle<Fp8MoeBackend> {
 public:
  using Backend = Fp8MoeBackend;
  using MoEKernelOracle::make_quant_config;

  // allow_vllm_cutlass: consider vllm_cutlass in the priority list (the caller's opt-in).
  explicit Fp8MoEKernelOracle(MoEConfig moe_config,
                              std::optional<QuantKey> weight_key = std::nullopt,
                              std::optional<QuantKey> activation_key = std::nullopt,
                              bool allow_vllm_cutlass = false)
      : MoEKernelOracle(std::move(moe_config), std::move(weight_key), std::move(activation_key)),
        allow_vllm_cutlass_(allow_vllm_cutlass) {}

  // Defaults: kCpu -> {CpuFp8Experts}; every other backend -> {}.
  static KernelRegistry<Fp8MoeBackend>& registry();

  std::string name() const override { return "FP8"; }
  std::string type_name() const override { return "Fp8MoEKernelOracle"; }
  std::vector<Backend> backend_values() const override;
  std::string backend_name(Backend backend) const override;
  std::vector<std::pair<std::string, Backend>> backend_aliases() const override;
  std::vector<Backend> priority_backends(const MoEConfig& moe_config) const override;
  std::optional<Backend> batched_variant(Backend backend) const override;
  KernelRegistry<Backend>& kernel_registry() const override { return registry(); }

  // The QuantConfig `backend` runs with: marlin takes fp8 weights with unquantized activations
  // (fp8_w8a16_moe_quant_config, activation scales dropped); every other backend, the CPU
  // emulation included, fp8_w8a8_moe_quant_config.
  QuantConfig make_quant_config(Backend backend, const MoEWeightShape& shape,
                                Fp8W8A8Params params) const;

 private:
  bool allow_vllm_cutlass_;
};

}  // namespace moekit
