// The oracle of int8 W8A8 MoE layers. Backends mirror the original's Int8MoeBackend (triton),
// plus "cpu" (CpuInt8Experts, the CPU emulation). Priority: triton, cpu. Default keys
// (kInt8StaticChannelSym, kInt8DynamicTokenSym).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

enum class Int8MoeBackend {
  kTriton,  // "triton"
  kCpu,     // "cpu": CpuInt8Experts
};

class Int8MoEKernelOracle : public MoEKernelOracle<Int8MoeBackend> {
 public:
  using Backend = Int8MoeBackend;
  using MoEKernelOracle::make_quant_config;

  explicit Int8MoEKernelOracle(
      MoEConfig moe_config, std::optional<QuantKey> weight_key = quant_keys::kInt8StaticChannelSym,
      std::optional<QuantKey> activation_key = quant_keys::kInt8DynamicTokenSym)
      : MoEKernelOracle(std::move(moe_config), std::move(weight_key), std::move(activation_key)) {}

  // Defaults: kCpu -> {CpuInt8Experts}, kTriton -> {}.
  static KernelRegistry<Int8MoeBackend>& registry();

  std::string name() const override { return "INT8"; }
  std::string type_name() const override { return "Int8MoEKernelOracle"; }
  std::vector<Backend> backend_values() const override;
  std::string backend_name(Backend backend) const override;
  std::vector<Backend> priority_backends(const MoEConfig& moe_config) const override;
  KernelRegistry<Backend>& kernel_registry() const override { return registry(); }

  // int8_w8a8_moe_quant_config.
  QuantConfig make_quant_config(const MoEWeightShape& shape, const Int8W8A8Params& params) const;
};

}  // namespace moekit
