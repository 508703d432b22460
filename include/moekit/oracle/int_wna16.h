// The oracle of int4 / int8 weight-only (GPTQ / AWQ style) MoE layers. Backends mirror the
// original's WNA16MoEBackend. Priority: on the CPU, cpu; otherwise flashinfer_trtllm, marlin,
// batched_marlin, humming, emulation. "cpu" and "emulation" run CpuWna16Experts; the others are
// rejected with kNoKernelRegisteredReason until their kernels register.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

enum class WNA16MoEBackend {
  kMarlin,            // "marlin"
  kBatchedMarlin,     // "batched_marlin"
  kHumming,           // "humming"
  kCpu,               // "cpu": CpuWna16Experts
  kFlashinferTrtllm,  // "flashinfer_trtllm"
  kXpu,               // "xpu"
  kEmulation,         // "emulation": CpuWna16Experts
};

class IntWna16MoEKernelOracle : public MoEKernelOracle<WNA16MoEBackend> {
 public:
  using Backend = WNA16MoEBackend;
  using MoEKernelOracle::make_quant_config;
  using MoEKernelOracle::MoEKernelOracle;

  // Defaults: kCpu, kEmulation -> {CpuWna16Experts}; the others -> {}.
  static KernelRegistry<WNA16MoEBackend>& registry();

  std::string name() const override { return "WNA16"; }
  std::string type_name() const override { return "IntWna16MoEKernelOracle"; }
  std::vector<Backend> backend_values() const override;
  std::string backend_name(Backend backend) const override;
  std::vector<Backend> priority_backends(const MoEConfig& moe_config) const override;
  std::optional<Backend> batched_variant(Backend backend) const override;
  KernelRegistry<Backend>& kernel_registry() const override { return registry(); }

  // int_wna16_moe_quant_config (group size and zero points as given).
  QuantConfig make_quant_config(const MoEWeightShape& shape, const IntWna16Params& params) const;
};

}  // namespace moekit
