// The oracle of unquantized (bf16/f16/f32 weights and activations) MoE layers.
//
// Priority: on a CUDA device sm90_grouped, sm90_batched, cpu, cpu_batched, cpu_monolithic (the CPU
// reference classes reject a CUDA device through their capability record, so the table says why);
// on the CPU cpu, cpu_batched, cpu_monolithic. cpu_monolithic comes last so that it serves only
// when forced (see priority_backends). User-facing names: "sm90_grouped", "sm90_batched", "cpu",
// "cpu_batched", "cpu_monolithic", and the aliases "cuda" (sm90_grouped), "reference" and
// "cpu_reference" (cpu).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "moekit/oracle/oracle.h"

namespace moekit {

enum class UnquantizedMoeBackend {
  kSm90Grouped,    // "sm90_grouped": Hopper grouped GEMM, standard format
  kSm90Batched,    // "sm90_batched": Hopper masked GEMM, batched format
  kCpu,            // "cpu": the CPU reference, standard format
  kCpuBatched,     // "cpu_batched": the CPU reference, batched format
  kCpuMonolithic,  // "cpu_monolithic": the CPU reference routing inside (router logits in)
};

class UnquantizedMoEKernelOracle : public MoEKernelOracle<UnquantizedMoeBackend> {
 public:
  using Backend = UnquantizedMoeBackend;

  // The unquantized oracle ignores quant keys; they are accepted for a uniform interface.
  explicit UnquantizedMoEKernelOracle(MoEConfig moe_config,
                                      std::optional<QuantKey> weight_key = std::nullopt,
                                      std::optional<QuantKey> activation_key = std::nullopt)
      : MoEKernelOracle(std::move(moe_config), std::move(weight_key), std::move(activation_key)) {}

  // The backend -> experts classes table of this oracle. Defaults:
  //   kCpu -> {CpuReferenceExperts}, kCpuBatched -> {CpuBatchedReferenceExperts},
  //   kCpuMonolithic -> {CpuReferenceMonolithicExperts},
  //   kSm90Grouped, kSm90Batched -> {} (the CUDA experts register there).
  static KernelRegistry<UnquantizedMoeBackend>& registry();

  std::string name() const override { return "Unquantized"; }
  std::string type_name() const override { return "UnquantizedMoEKernelOracle"; }
  std::vector<Backend> backend_values() const override;
  std::string backend_name(Backend backend) const override;
  std::vector<std::pair<std::string, Backend>> backend_aliases() const override;
  std::vector<Backend> priority_backends(const MoEConfig& moe_config) const override;
  std::optional<Backend> batched_variant(Backend backend) const override;
  KernelRegistry<Backend>& kernel_registry() const override { return registry(); }
  // sm90 backends with a fused gated activation take w13 (and its bias) in blocks-of-32 gate/up
  // order (see sm90_experts.h); every other backend keeps the standard layout.
  std::pair<Tensor, Tensor> convert_to_kernel_format(Backend backend, const MoEConfig& moe_config,
                                                     Tensor w13, Tensor w2) const override;
  Tensor convert_w13_bias_to_kernel_format(Backend backend, const MoEConfig& moe_config,
                                           Tensor w13_bias) const override;
};

}  // namespace moekit
