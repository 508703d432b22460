// The oracle of W4A8 MoE layers: int4 weights (per-channel or group-128 f32 scales) with fp8
// activations. Backends mirror the original's W4A8MoeBackend (cutlass), plus "cpu"
// (CpuW4A8Experts, the CPU emulation). Priority: cutlass, cpu. Default keys
// (kInt4W4A8StaticChannelSym, kFp8DynamicTokenSym).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/oracle/oracle.h"

namespace moekit {

enum class W4A8MoeBackend {
  kCutlass,  // "cutlass"
  kCpu,      // "cpu": CpuW4A8Experts
};

class W4A8MoEKernelOracle : public MoEKernelOracle<W4A8MoeBackend> {
 public:
  using Backend = W4A8MoeBackend;
  using MoEKernelOracle::make_quant_config;

  explicit W4A8MoEKernelOracle(
      MoEConfig moe_config,
      std::optional<QuantKey> weight_key = quant_keys::kInt4W4A8StaticChannelSym,
      std::optional<QuantKey> activation_key = quant_keys::kFp8DynamicTokenSym)
      : MoEKernelOracle(std::move(moe_config), std::move(weight_key), std::move(activation_key)) {}

  // Defaults: kCpu -> {CpuW4A8Experts}, kCutlass -> {}.
  static KernelRegistry<W4A8MoeBackend>& registry();

  std::string name() const override { return "W4A8"; }
  std::string type_name() const override { return "W4A8MoEKernelOracle"; }
  std::vector<Backend> backend_values() const override;
  std::string backend_name(Backend backend) const override;
  std::vector<Backend> priority_backends(const MoEConfig& moe_config) const override;
  KernelRegistry<Backend>& kernel_registry() const override { return registry(); }

  // int4_w4afp8_moe_quant_config.
  QuantConfig make_quant_config(const MoEWeightShape& shape, const W4A8Fp8Params& params) const;
};

}  // namespace moekit
