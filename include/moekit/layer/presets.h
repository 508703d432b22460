// Model presets: the MoE layer shapes of real models (and small test shapes), or the same read from
// a HuggingFace config.json.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
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
// Qwen2/3-MoE, DeepSeek-V2/V3, gpt-oss and Llama4 keys; throws naming the missing key otherwise.
ModelPreset preset_from_hf_config(const std::filesystem::path& path);

}  // namespace moekit
