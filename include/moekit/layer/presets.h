// Model presets: the MoE layer shapes of real models (and small test shapes), or the same read from
// a HuggingFace config.json.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config/activation.h"
#include "moekit/config/routing.h"
#include "moekit/core/dtype.h"

namespace moekit {

struct ModelPreset {
  std::string name;
  int num_experts = 0;  // routed experts E
  int top_k = 0;
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I per expert
  Activation activation = Activation::kSilu;
  // Routing.
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  bool renormalize = true;
  int num_expert_group = 0;  // DeepSeek-V3 grouped top-k
  int topk_group = 0;
  std::optional<float> routed_scaling_factor;
  bool has_e_score_correction_bias = false;
  bool llama4_top1 = false;  // top-1 sigmoid, router weight applied on the input
  // Shared experts: one dense MLP of width num_shared_experts * shared_intermediate_size.
  int num_shared_experts = 0;
  int64_t shared_intermediate_size = 0;
  // The shared experts' output is scaled per token by sigmoid(x . shared_gate) (Qwen2-MoE's
  // shared_expert_gate, a (1, H) linear layer).
  bool shared_expert_gate = false;
  bool has_bias = false;  // expert biases (gpt-oss)
  std::optional<float> swiglu_limit;
  std::optional<float> swiglu_alpha;
  std::optional<float> swiglu_beta;
  DType dtype = DType::kBF16;
  int num_layers = 0;       // informational
  int first_moe_layer = 0;  // layers before this one are dense (DeepSeek-V3: 3)

  RoutingMethodType routing_method() const;
  std::string summary()
      const;  // "deepseek-v3: E=256 top_k=8 H=7168 I=2048 silu, grouped sigmoid ..."
};

const std::vector<ModelPreset>& model_presets();
// Throws moekit::Error listing the known names when `name` is unknown.
const ModelPreset& find_preset(const std::string& name);
// Reads a HuggingFace config.json (a file, or a directory holding one). Understands the Mixtral,
// Qwen2/3-MoE, DeepSeek-V2/V3, gpt-oss and Llama4 keys. Every value is validated at this boundary:
// throws moekit::Error naming the file, the key, the value and the requirement for a missing key,
// a wrong JSON type, an integer that is fractional or out of range (num_experts in [1, 65536],
// sizes in [1, 2^31-1], top_k in [1, num_experts], ...), an unknown hidden_act / scoring_func /
// topk_method / torch_dtype (listing the valid ones), inconsistent grouped routing, a weight size
// whose element or byte count overflows int64 (naming the product), and for a path that is
// missing, a directory, not a regular file, too large or not valid JSON.
ModelPreset preset_from_hf_config(const std::filesystem::path& path);
// The same from the text of a config.json; `where` names it in messages.
ModelPreset preset_from_hf_config_text(std::string_view json_text,
                                       const std::string& where = "config.json");

}  // namespace moekit
