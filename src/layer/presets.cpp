#include "moekit/layer/presets.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "moekit/core/error.h"

namespace moekit {

RoutingMethodType ModelPreset::routing_method() const {
  if (llama4_top1) return RoutingMethodType::kLlama4;
  return routing_method_type_for(scoring, top_k, renormalize, num_expert_group,
                                 has_e_score_correction_bias, routed_scaling_factor);
}

std::string ModelPreset::summary() const {
  std::string routing = fmt::format("{} top-{}", scoring_func_name(scoring), top_k);
  if (num_expert_group > 0) {
    routing += fmt::format(" grouped ({} groups, keep {})", num_expert_group, topk_group);
  }
  if (has_e_score_correction_bias) routing += " + bias";
  if (renormalize) routing += " renormalized";
  if (routed_scaling_factor) routing += fmt::format(" x{}", *routed_scaling_factor);
  if (llama4_top1) routing = "llama4 top-1 sigmoid, weight on input";
  std::string shared =
      num_shared_experts > 0
          ? fmt::format(", {} shared expert(s) I={}", num_shared_experts, shared_intermediate_size)
          : std::string();
  return fmt::format("{}: E={} top_k={} H={} I={} {}{}, routing {}{}, {}", name, num_experts, top_k,
                     hidden_size, intermediate_size, activation_name(activation),
                     has_bias ? " +bias" : "", routing, shared, dtype_name(dtype));
}

namespace {

std::vector<ModelPreset> make_presets() {
  std::vector<ModelPreset> out;
  {
    ModelPreset p;
    p.name = "mixtral-8x7b";
    p.num_experts = 8;
    p.top_k = 2;
    p.hidden_size = 4096;
    p.intermediate_size = 14336;
    p.num_layers = 32;
    out.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "qwen3-30b-a3b";
    p.num_experts = 128;
    p.top_k = 8;
    p.hidden_size = 2048;
    p.intermediate_size = 768;
    p.num_layers = 48;
    out.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "deepseek-v3";
    p.num_experts = 256;
    p.top_k = 8;
    p.hidden_size = 7168;
    p.intermediate_size = 2048;
    p.scoring = ScoringFunc::kSigmoid;
    p.num_expert_group = 8;
    p.topk_group = 4;
    p.routed_scaling_factor = 2.5f;
    p.has_e_score_correction_bias = true;
    p.num_shared_experts = 1;
    p.shared_intermediate_size = 2048;
    p.num_layers = 61;
    p.first_moe_layer = 3;
    out.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "gpt-oss-120b";
    p.num_experts = 128;
    p.top_k = 4;
    p.hidden_size = 2880;
    p.intermediate_size = 2880;
    p.activation = Activation::kSwigluOai;
    p.renormalize = true;  // softmax over the selected top-k logits == renormalized softmax top-k
    p.has_bias = true;
    p.swiglu_limit = 7.0f;
    p.swiglu_alpha = 1.702f;
    p.swiglu_beta = 1.0f;
    p.num_layers = 36;
    out.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "llama4-scout";
    p.num_experts = 16;
    p.top_k = 1;
    p.hidden_size = 5120;
    p.intermediate_size = 8192;
    p.scoring = ScoringFunc::kSigmoid;
    p.renormalize = false;
    p.llama4_top1 = true;
    p.num_shared_experts = 1;
    p.shared_intermediate_size = 8192;
    p.num_layers = 48;
    out.push_back(p);
  }
  // Small shapes for tests and quick runs.
  {
    ModelPreset p;
    p.name = "tiny";
    p.num_experts = 8;
    p.top_k = 2;
    p.hidden_size = 64;
    p.intermediate_size = 96;
    out.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "small";
    p.num_experts = 16;
    p.top_k = 4;
    p.hidden_size = 256;
    p.intermediate_size = 384;
    out.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "small-deepseek";
    p.num_experts = 32;
    p.top_k = 4;
    p.hidden_size = 256;
    p.intermediate_size = 128;
    p.scoring = ScoringFunc::kSigmoid;
    p.num_expert_group = 4;
    p.topk_group = 2;
    p.routed_scaling_factor = 2.5f;
    p.has_e_score_correction_bias = true;
    p.num_shared_experts = 1;
    p.shared_intermediate_size = 128;
    out.push_back(p);
  }
  {
    ModelPreset p;
    p.name = "small-gpt-oss";
    p.num_experts = 16;
    p.top_k = 4;
    p.hidden_size = 192;
    p.intermediate_size = 192;
    p.activation = Activation::kSwigluOai;
    p.has_bias = true;
    p.swiglu_limit = 7.0f;
    p.swiglu_alpha = 1.702f;
    p.swiglu_beta = 1.0f;
    out.push_back(p);
  }
  return out;
}

template <typename T>
std::optional<T> get_opt(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (j.contains(k) && !j[k].is_null()) return j[k].get<T>();
  }
  return std::nullopt;
}

template <typename T>
T get_req(const nlohmann::json& j, std::initializer_list<const char*> keys,
          const std::string& file) {
  if (auto v = get_opt<T>(j, keys)) return *v;
  std::string names;
  for (const char* k : keys)
    names += std::string(names.empty() ? "" : " or ") + k;
  throw Error(fmt::format("moekit: {}: required key {} is missing", file, names));
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = make_presets();
  return presets;
}

const ModelPreset& find_preset(const std::string& name) {
  for (const ModelPreset& p : model_presets()) {
    if (p.name == name) return p;
  }
  std::string names;
  for (const ModelPreset& p : model_presets())
    names += (names.empty() ? "" : ", ") + p.name;
  throw Error(fmt::format("moekit: unknown model preset '{}': known presets are {}", name, names));
}

ModelPreset preset_from_hf_config(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(file)) file /= "config.json";
  std::ifstream in(file);
  MOEKIT_CHECK(in.good(), "cannot open HuggingFace config {}", file.string());
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("moekit: {} is not valid JSON: {}", file.string(), e.what()));
  }
  MOEKIT_CHECK(root.is_object(), "{} must hold a JSON object", file.string());
  // Multimodal configs (Llama4) keep the language model under text_config.
  const nlohmann::json& j = root.contains("text_config") ? root["text_config"] : root;
  const std::string fname = file.string();
  ModelPreset p;
  try {
    const std::string model_type =
        get_opt<std::string>(j, {"model_type"})
            .value_or(get_opt<std::string>(root, {"model_type"}).value_or("unknown"));
    p.name = get_opt<std::string>(root, {"_name_or_path"}).value_or(model_type);
    p.num_experts =
        get_req<int>(j, {"num_local_experts", "num_experts", "n_routed_experts"}, fname);
    p.top_k = get_req<int>(j, {"num_experts_per_tok", "experts_per_token", "moe_topk"}, fname);
    p.hidden_size = get_req<int64_t>(j, {"hidden_size"}, fname);
    p.intermediate_size =
        get_req<int64_t>(j, {"moe_intermediate_size", "intermediate_size"}, fname);
    p.num_layers = get_opt<int>(j, {"num_hidden_layers"}).value_or(0);
    p.first_moe_layer = get_opt<int>(j, {"first_k_dense_replace"}).value_or(0);
    const std::string act = get_opt<std::string>(j, {"hidden_act"}).value_or("silu");
    if (auto a = parse_activation(act)) p.activation = *a;
    const std::string scoring = get_opt<std::string>(j, {"scoring_func"}).value_or("softmax");
    MOEKIT_CHECK(scoring == "softmax" || scoring == "sigmoid",
                 "{}: scoring_func '{}' is not supported (softmax or sigmoid)", fname, scoring);
    p.scoring = scoring == "sigmoid" ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
    p.renormalize = get_opt<bool>(j, {"norm_topk_prob"}).value_or(true);
    p.num_expert_group = get_opt<int>(j, {"n_group"}).value_or(0);
    p.topk_group = get_opt<int>(j, {"topk_group"}).value_or(0);
    if (auto f = get_opt<float>(j, {"routed_scaling_factor"}); f && *f != 1.0f) {
      p.routed_scaling_factor = f;
    }
    p.has_e_score_correction_bias =
        get_opt<std::string>(j, {"topk_method"}).value_or("") == "noaux_tc";
    p.num_shared_experts = get_opt<int>(j, {"n_shared_experts", "num_shared_experts"}).value_or(0);
    p.shared_intermediate_size =
        get_opt<int64_t>(j, {"shared_expert_intermediate_size"}).value_or(p.intermediate_size);
    if (model_type == "qwen2_moe" && p.num_shared_experts == 0 &&
        j.contains("shared_expert_intermediate_size")) {
      p.num_shared_experts = 1;
    }
    if (model_type == "gpt_oss") {
      p.activation = Activation::kSwigluOai;
      p.has_bias = true;
      p.swiglu_limit = get_opt<float>(j, {"swiglu_limit"}).value_or(7.0f);
      p.swiglu_alpha = 1.702f;
      p.swiglu_beta = 1.0f;
    }
    if (model_type == "llama4_text" || model_type == "llama4") {
      p.llama4_top1 = true;
      p.scoring = ScoringFunc::kSigmoid;
      p.renormalize = false;
      p.num_shared_experts = 1;
      p.shared_intermediate_size = p.intermediate_size;
    }
    const std::string dtype =
        get_opt<std::string>(j, {"torch_dtype", "dtype"})
            .value_or(get_opt<std::string>(root, {"torch_dtype"}).value_or("bfloat16"));
    if (auto d = parse_dtype(dtype)) p.dtype = *d;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("moekit: {}: a key has the wrong type: {}", fname, e.what()));
  }
  MOEKIT_CHECK(p.top_k >= 1 && p.top_k <= p.num_experts,
               "{}: num_experts_per_tok={} must be in [1, {}]", fname, p.top_k, p.num_experts);
  return p;
}

}  // namespace moekit
