// Routing methods, as the seed's RoutingMethodType (values match FlashInfer's runner).
#pragma once

#include <optional>
#include <string_view>

namespace moekit {

enum class RoutingMethodType : int {
  kDefault = 0,           // softmax -> top-k
  kRenormalize = 1,       // top-k -> softmax
  kDeepSeekV3 = 2,        // sigmoid + bias -> grouped top-k -> renormalize -> scale
  kLlama4 = 3,            // top-1 -> sigmoid, weight applied on the input
  kRenormalizeNaive = 4,  // softmax -> top-k -> renormalize
  kTopK = 5,              // top-k only
  kSigmoidRenorm = 6,     // sigmoid -> top-k -> renormalize
  kMiniMax2 = 7,          // sigmoid + bias -> top-k -> scaled-sum normalize
  kSigmoid = 8,           // sigmoid -> top-k
  kUnspecified = 9,
  kDeepseekV4 = 100,
  kCustom = 101,
  kSimulated = 102,
};

enum class ScoringFunc { kSoftmax, kSigmoid };

std::string_view routing_method_name(RoutingMethodType method);
std::optional<RoutingMethodType> parse_routing_method(std::string_view name);
std::string_view scoring_func_name(ScoringFunc func);

// The seed's get_routing_method_type.
RoutingMethodType routing_method_type_for(ScoringFunc scoring, int top_k, bool renormalize,
                                          int num_expert_group, bool has_e_score_bias,
                                          std::optional<float> routed_scaling_factor);

}  // namespace moekit
