#include "moekit/config/moe_config.h"

#include <fmt/format.h>

#include "moekit/core/error.h"
#include "moekit/modular/types.h"

namespace moekit {

ActivationFormat MoEConfig::activation_format() const {
  return parallel.use_batched_activation_format() ? ActivationFormat::kBatchedExperts
                                                  : ActivationFormat::kStandard;
}

ActivationParams MoEConfig::activation_params() const {
  ActivationParams p;
  p.clamp_limit = swiglu_limit;
  if (swiglu_alpha) p.alpha = *swiglu_alpha;
  if (swiglu_beta) p.beta = *swiglu_beta;
  return p;
}

void MoEConfig::validate() const {
  MOEKIT_CHECK(num_experts >= 1, "num_experts={} must be >= 1", num_experts);
  MOEKIT_CHECK(experts_per_token >= 1, "top_k={} must be >= 1", experts_per_token);
  MOEKIT_CHECK(experts_per_token <= num_experts, "top_k={} > num_experts={}", experts_per_token,
               num_experts);
  MOEKIT_CHECK(hidden_dim >= 1, "hidden_dim={} must be >= 1", hidden_dim);
  MOEKIT_CHECK(intermediate_size >= 1, "intermediate_size={} must be >= 1", intermediate_size);
  MOEKIT_CHECK(intermediate_size % parallel.tp_size == 0,
               "intermediate_size={} must be divisible by tp_size={}", intermediate_size,
               parallel.tp_size);
  MOEKIT_CHECK(num_local_experts >= 1 && num_local_experts <= num_experts,
               "num_local_experts={} must be in [1, num_experts={}]", num_local_experts,
               num_experts);
  MOEKIT_CHECK(max_num_tokens >= 1, "max_num_tokens={} must be >= 1", max_num_tokens);
  MOEKIT_CHECK(in_dtype == DType::kBF16 || in_dtype == DType::kF16 || in_dtype == DType::kF32,
               "in_dtype={} must be bf16, f16 or f32", dtype_name(in_dtype));
}

std::string MoEConfig::to_string() const {
  return fmt::format(
      "MoEConfig(E={}, local={}, top_k={}, H={}, I={}, act={}, routing={}, dtype={}, device={}, "
      "{})",
      num_experts, num_local_experts, experts_per_token, hidden_dim, intermediate_size,
      activation_name(activation), routing_method_name(routing_method), dtype_name(in_dtype),
      device.to_string(), parallel.to_string());
}

}  // namespace moekit
