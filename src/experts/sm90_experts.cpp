// Capability records of the Hopper experts (compiled in every build; see sm90_experts.h).
#include "moekit/experts/sm90_experts.h"

#include <fmt/format.h>

#include "moekit/core/error.h"

namespace moekit {
namespace {

// Shapes the Hopper kernels take: the GEMMs need K and N multiples of 8, the align kernel at most
// 512 local experts, the router and unpermute at most 32 experts per token.
std::string sm90_shape_check(const MoEConfig& moe) {
  const int64_t I = moe.intermediate_size_per_partition();
  if (moe.hidden_dim % 8 != 0)
    return fmt::format("(hidden {} is not a multiple of 8)", moe.hidden_dim);
  if (I % 8 != 0) return fmt::format("(intermediate {} is not a multiple of 8)", I);
  if (moe.num_local_experts > 512) {
    return fmt::format("({} local experts > 512)", moe.num_local_experts);
  }
  if (moe.experts_per_token > 32) return fmt::format("(top_k {} > 32)", moe.experts_per_token);
  return {};
}

}  // namespace

// NOTE: switching this changes the weight layout the sm90 experts expect (the oracle converts at
// load time); off, GEMM1 writes (rows, 2I) and a separate activation pass follows.
constexpr bool kFusedActivationAvailable = true;

bool sm90_fuses_activation(const MoEConfig& moe) {
  return kFusedActivationAvailable && moe.is_act_and_mul() &&
         moe.intermediate_size_per_partition() % 32 == 0;
}

const ExpertsClass& Sm90GroupedExperts::klass() {
  static const ExpertsClass k(
      [] {
        ExpertsCapabilities c;
        c.name = "Sm90GroupedExperts";
        c.format = ActivationFormat::kStandard;
        c.device_types = {DeviceType::kCUDA};
        c.min_compute_capability = 90;
        c.max_compute_capability = 90;  // wgmma: sm_90a only
        c.activations.assign(all_activations().begin(), all_activations().end());
        c.quant_schemes = {QuantScheme{}};
        c.in_dtypes = {DType::kBF16, DType::kF16};
        return c;
      }(),
      [](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> max_tokens,
         std::optional<int> dispatchers) -> std::unique_ptr<Experts> {
        MOEKIT_CHECK(!max_tokens && !dispatchers,
                     "Sm90GroupedExperts: max_num_tokens and num_dispatchers should only be set "
                     "for the BatchedExperts activation format");
        return std::make_unique<Sm90GroupedExperts>(moe, quant);
      },
      sm90_shape_check);
  return k;
}

const ExpertsClass& Sm90BatchedExperts::klass() {
  static const ExpertsClass k(
      [] {
        ExpertsCapabilities c = Sm90GroupedExperts::klass().caps();
        c.name = "Sm90BatchedExperts";
        c.format = ActivationFormat::kBatchedExperts;
        return c;
      }(),
      [](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> max_tokens,
         std::optional<int> dispatchers) -> std::unique_ptr<Experts> {
        MOEKIT_CHECK(max_tokens && dispatchers,
                     "Sm90BatchedExperts: max_num_tokens and num_dispatchers must be set for the "
                     "BatchedExperts activation format");
        return std::make_unique<Sm90BatchedExperts>(moe, quant, *max_tokens, *dispatchers);
      },
      sm90_shape_check);
  return k;
}

Sm90BatchedExperts::Sm90BatchedExperts(const MoEConfig& moe, const QuantConfig& quant,
                                       int64_t max_num_tokens, int num_dispatchers)
    : ExpertsModular(klass(), moe, quant, max_num_tokens, num_dispatchers) {
#ifndef MOEKIT_WITH_CUDA
  throw Error("moekit: Sm90BatchedExperts needs CUDA; moekit was built without CUDA");
#endif
  MOEKIT_CHECK(!quant.is_quantized(), "Sm90BatchedExperts runs unquantized layers only, got {}",
               quant.describe());
}

Sm90GroupedExperts::Sm90GroupedExperts(const MoEConfig& moe, const QuantConfig& quant)
    : ExpertsModular(klass(), moe, quant, std::nullopt, std::nullopt) {
#ifndef MOEKIT_WITH_CUDA
  throw Error("moekit: Sm90GroupedExperts needs CUDA; moekit was built without CUDA");
#endif
  MOEKIT_CHECK(!quant.is_quantized(), "Sm90GroupedExperts runs unquantized layers only, got {}",
               quant.describe());
}

#ifndef MOEKIT_WITH_CUDA
WorkspaceShapes Sm90GroupedExperts::workspace_shapes(int64_t, int64_t, int64_t, int64_t, int64_t,
                                                     int64_t, const ExpertTokensMetadata*,
                                                     Activation) const {
  throw Error("moekit: Sm90GroupedExperts needs CUDA");
}
std::shared_ptr<const TopKWeightAndReduce> Sm90GroupedExperts::finalize_weight_and_reduce_impl()
    const {
  return std::make_shared<TopKWeightAndReduceNoOp>();
}
void Sm90GroupedExperts::apply(const ExpertsApplyArgs&, RunContext) {
  throw Error("moekit: Sm90GroupedExperts needs CUDA");
}
WorkspaceShapes Sm90BatchedExperts::workspace_shapes(int64_t, int64_t, int64_t, int64_t, int64_t,
                                                     int64_t, const ExpertTokensMetadata*,
                                                     Activation) const {
  throw Error("moekit: Sm90BatchedExperts needs CUDA");
}
std::shared_ptr<const TopKWeightAndReduce> Sm90BatchedExperts::finalize_weight_and_reduce_impl()
    const {
  return std::make_shared<TopKWeightAndReduceDelegate>();
}
void Sm90BatchedExperts::apply(const ExpertsApplyArgs&, RunContext) {
  throw Error("moekit: Sm90BatchedExperts needs CUDA");
}
Sm90SharedExperts::Sm90SharedExperts(Tensor, Tensor, Activation, ActivationParams, int64_t) {
  throw Error("moekit: Sm90SharedExperts needs CUDA; moekit was built without CUDA");
}
Tensor Sm90SharedExperts::forward(const Tensor&, RunContext) {
  throw Error("moekit: Sm90SharedExperts needs CUDA");
}
#endif

}  // namespace moekit
