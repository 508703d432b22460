// The oracle of W4A8 MoE layers: int4 weights (per channel or group 128) with fp8 activations
// (default keys kInt4W4A8StaticChannelSym x kFp8DynamicTokenSym). The seed's "cutlass" is
// declared without a moekit kernel; "cpu" (CpuW4A8Experts) registers beside its class.
#pragma once

#include <string>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

class W4A8MoEKernelOracle : public MoEKernelOracle {
 public:
  using MoEKernelOracle::make_quant_config;

  explicit W4A8MoEKernelOracle(
      MoEConfig moe_config,
      std::optional<QuantKey> weight_key = quant_keys::kInt4W4A8StaticChannelSym,
      std::optional<QuantKey> activation_key = quant_keys::kFp8DynamicTokenSym,
      const BackendRegistry& registry = BackendRegistry::global())
      : MoEKernelOracle(QuantOracleKind::kW4A8, std::move(moe_config), std::move(weight_key),
                        std::move(activation_key), registry) {}

  std::string name() const override { return "W4A8"; }
  std::string type_name() const override { return "W4A8MoEKernelOracle"; }

  // int4_w4afp8_moe_quant_config.
  static QuantConfig make_quant_config(const MoEWeightShape& shape, const W4A8Fp8Params& params);
};

}  // namespace moekit
