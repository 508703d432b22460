// The oracle of unquantized (bf16/f16/f32 weights and activations) MoE layers.
//
// Its backends are registered beside their experts classes: sm90_grouped and sm90_batched
// (experts/sm90_experts.cpp; CUDA only), cpu and cpu_batched (experts/cpu_reference.cpp),
// cpu_monolithic (experts/cpu_monolithic.cpp, last, so that it serves only when forced). On a CUDA
// device the CPU classes stay in the priority list and reject the device, so the table says why.
#pragma once

#include <string>

#include "moekit/oracle/oracle.h"

namespace moekit {

class UnquantizedMoEKernelOracle : public MoEKernelOracle {
 public:
  // The unquantized oracle ignores quant keys; they are accepted for a uniform interface.
  explicit UnquantizedMoEKernelOracle(MoEConfig moe_config,
                                      std::optional<QuantKey> weight_key = std::nullopt,
                                      std::optional<QuantKey> activation_key = std::nullopt,
                                      const BackendRegistry& registry = BackendRegistry::global())
      : MoEKernelOracle(QuantOracleKind::kUnquantized, std::move(moe_config), std::move(weight_key),
                        std::move(activation_key), registry) {}

  std::string name() const override { return "Unquantized"; }
  std::string type_name() const override { return "UnquantizedMoEKernelOracle"; }
};

}  // namespace moekit
