// The oracle of int8 W8A8 MoE layers: per-channel or per-tensor int8 weights with int8
// activations (default keys kInt8StaticChannelSym x kInt8DynamicTokenSym). The seed's "triton" is
// declared without a moekit kernel; moekit's kernels register beside their experts classes:
// "sm90_int8" (Sm90Int8Experts, Hopper s8 wgmma) and "cpu" (CpuInt8Experts).
#pragma once

#include <string>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

// The int8 W8A8 (weight, activation) key pairs moekit's int8 experts serve, one list for every
// experts class of the scheme: per-channel or per-tensor weights with dynamic per-token, static
// per-tensor or dynamic per-tensor activations.
std::vector<QuantScheme> int8_w8a8_schemes();

class Int8MoEKernelOracle : public MoEKernelOracle {
 public:
  using MoEKernelOracle::make_quant_config;

  explicit Int8MoEKernelOracle(
      MoEConfig moe_config, std::optional<QuantKey> weight_key = quant_keys::kInt8StaticChannelSym,
      std::optional<QuantKey> activation_key = quant_keys::kInt8DynamicTokenSym,
      const BackendRegistry& registry = BackendRegistry::global())
      : MoEKernelOracle(QuantOracleKind::kInt8, std::move(moe_config), std::move(weight_key),
                        std::move(activation_key), registry) {}

  std::string name() const override { return "INT8"; }
  std::string type_name() const override { return "Int8MoEKernelOracle"; }

  // int8_w8a8_moe_quant_config.
  static QuantConfig make_quant_config(const MoEWeightShape& shape, const Int8W8A8Params& params);
};

}  // namespace moekit
