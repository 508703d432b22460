// The oracle of int4 / int8 weight-only (GPTQ / AWQ style) MoE layers. The seed's backends
// (flashinfer_trtllm, marlin, batched_marlin, humming, xpu) are declared without a moekit kernel;
// on a CUDA device the priority is flashinfer_trtllm, marlin, batched_marlin, humming, emulation,
// on the CPU just cpu. "cpu" and "emulation" (CpuWna16Experts) register beside their class.
#pragma once

#include <string>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

class IntWna16MoEKernelOracle : public MoEKernelOracle {
 public:
  using MoEKernelOracle::make_quant_config;

  explicit IntWna16MoEKernelOracle(MoEConfig moe_config,
                                   std::optional<QuantKey> weight_key = std::nullopt,
                                   std::optional<QuantKey> activation_key = std::nullopt,
                                   const BackendRegistry& registry = BackendRegistry::global())
      : MoEKernelOracle(QuantOracleKind::kIntWna16, std::move(moe_config), std::move(weight_key),
                        std::move(activation_key), registry) {}

  std::string name() const override { return "WNA16"; }
  std::string type_name() const override { return "IntWna16MoEKernelOracle"; }

  // int_wna16_moe_quant_config (group size and zero points as given).
  static QuantConfig make_quant_config(const MoEWeightShape& shape, const IntWna16Params& params);
};

}  // namespace moekit
