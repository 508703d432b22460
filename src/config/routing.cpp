#include "moekit/config/routing.h"

#include <array>
#include <utility>

namespace moekit {
namespace {
constexpr std::array<std::pair<RoutingMethodType, std::string_view>, 13> kNames = {{
    {RoutingMethodType::kDefault, "default"},
    {RoutingMethodType::kRenormalize, "renormalize"},
    {RoutingMethodType::kDeepSeekV3, "deepseek_v3"},
    {RoutingMethodType::kLlama4, "llama4"},
    {RoutingMethodType::kRenormalizeNaive, "renormalize_naive"},
    {RoutingMethodType::kTopK, "topk"},
    {RoutingMethodType::kSigmoidRenorm, "sigmoid_renorm"},
    {RoutingMethodType::kMiniMax2, "minimax2"},
    {RoutingMethodType::kSigmoid, "sigmoid"},
    {RoutingMethodType::kUnspecified, "unspecified"},
    {RoutingMethodType::kDeepseekV4, "deepseek_v4"},
    {RoutingMethodType::kCustom, "custom"},
    {RoutingMethodType::kSimulated, "simulated"},
}};
}  // namespace

std::string_view routing_method_name(RoutingMethodType method) {
  for (const auto& [m, name] : kNames) {
    if (m == method) return name;
  }
  return "?";
}

std::optional<RoutingMethodType> parse_routing_method(std::string_view name) {
  for (const auto& [m, n] : kNames) {
    if (n == name) return m;
  }
  return std::nullopt;
}

std::string_view scoring_func_name(ScoringFunc func) {
  return func == ScoringFunc::kSoftmax ? "softmax" : "sigmoid";
}

RoutingMethodType routing_method_type_for(ScoringFunc scoring, int top_k, bool renormalize,
                                          int num_expert_group, bool has_e_score_bias,
                                          std::optional<float> routed_scaling_factor) {
  (void)top_k;
  if (has_e_score_bias && scoring == ScoringFunc::kSigmoid && renormalize) {
    if (num_expert_group > 0) return RoutingMethodType::kDeepSeekV3;
    if (!routed_scaling_factor || *routed_scaling_factor == 1.0f)
      return RoutingMethodType::kMiniMax2;
  }
  if (scoring == ScoringFunc::kSigmoid) {
    return renormalize ? RoutingMethodType::kSigmoidRenorm : RoutingMethodType::kSigmoid;
  }
  if (scoring == ScoringFunc::kSoftmax) {
    return renormalize ? RoutingMethodType::kRenormalizeNaive : RoutingMethodType::kDefault;
  }
  return RoutingMethodType::kUnspecified;
}

}  // namespace moekit
