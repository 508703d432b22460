#include "moekit/layer/presets.h"

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "moekit/core/error.h"
#include "moekit/io/json.h"

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
          ? fmt::format(", {} shared expert(s) I={}{}", num_shared_experts,
                        shared_intermediate_size, shared_expert_gate ? " gated" : "")
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
  {
    ModelPreset p;
    p.name = "qwen1.5-moe-a2.7b";  // Qwen2-MoE: a gated shared expert 4x an expert's width
    p.num_experts = 60;
    p.top_k = 4;
    p.hidden_size = 2048;
    p.intermediate_size = 1408;
    p.renormalize = false;
    p.num_shared_experts = 1;
    p.shared_intermediate_size = 5632;
    p.shared_expert_gate = true;
    p.num_layers = 24;
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
    p.name = "small-qwen2-moe";  // a gated shared expert twice an expert's width
    p.num_experts = 16;
    p.top_k = 4;
    p.hidden_size = 256;
    p.intermediate_size = 128;
    p.renormalize = false;
    p.num_shared_experts = 1;
    p.shared_intermediate_size = 256;
    p.shared_expert_gate = true;
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

// Bounds of config.json values. Dimensions stay within int32 (kernel grids and strides); the
// products of dimensions are checked separately.
constexpr int64_t kMaxExperts = 65536;
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxLayers = 100000;
constexpr int64_t kMaxSharedExperts = 1024;
constexpr double kMaxScale = 1e6;

// Typed reads from one config object (the root, or its text_config): every value checked for its
// type and range, errors naming the file, the key, the value and the requirement.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& j, std::string file, std::string prefix)
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  // The first of `keys` that is present and not null (its name in *used), or nullptr.
  const nlohmann::json* find(std::initializer_list<const char*> keys,
                             std::string* used = nullptr) const {
    for (const char* k : keys) {
      const auto it = j_.find(k);
      if (it != j_.end() && !it->is_null()) {
        if (used != nullptr) *used = k;
        return &*it;
      }
    }
    return nullptr;
  }
  std::string where(const std::string& key) const { return file_ + ": " + prefix_ + key; }

  std::optional<int64_t> opt_int(std::initializer_list<const char*> keys, int64_t min,
                                 int64_t max) const {
    std::string key;
    const nlohmann::json* v = find(keys, &key);
    if (v == nullptr) return std::nullopt;
    return io::json_integer(*v, where(key), min, max);
  }
  int64_t req_int(std::initializer_list<const char*> keys, int64_t min, int64_t max) const {
    if (auto v = opt_int(keys, min, max)) return *v;
    std::string names;
    for (const char* k : keys)
      names += std::string(names.empty() ? "" : " or ") + k;
    throw Error(fmt::format("moekit: {}: required key {}{} is missing", file_, prefix_, names));
  }
  std::optional<double> opt_number(const char* key, double min, double max) const {
    const nlohmann::json* v = find({key});
    if (v == nullptr) return std::nullopt;
    return io::json_number(*v, where(key), min, max);
  }
  std::optional<bool> opt_bool(const char* key) const {
    const nlohmann::json* v = find({key});
    if (v == nullptr) return std::nullopt;
    return io::json_bool(*v, where(key));
  }
  std::optional<std::string> opt_string(std::initializer_list<const char*> keys) const {
    std::string key;
    const nlohmann::json* v = find(keys, &key);
    if (v == nullptr) return std::nullopt;
    return io::json_string(*v, where(key));
  }
  std::optional<std::string> opt_choice(const char* key,
                                        std::initializer_list<std::string_view> valid) const {
    const nlohmann::json* v = find({key});
    if (v == nullptr) return std::nullopt;
    return io::json_choice(*v, where(key), valid);
  }

 private:
  const nlohmann::json& j_;
  std::string file_;
  std::string prefix_;
};

std::string activation_names() {
  std::string names = "gelu_pytorch_tanh, swiglu";
  for (Activation a : all_activations())
    names += fmt::format(", {}", activation_name(a));
  return names;
}

// The product of (name, value) factors, or an Error naming the product when it overflows int64.
int64_t checked_product(const std::string& file,
                        std::initializer_list<std::pair<std::string_view, int64_t>> factors) {
  std::string names, values;
  for (const auto& [name, value] : factors) {
    names += fmt::format("{}{}", names.empty() ? "" : " * ", name);
    values += fmt::format("{}{}", values.empty() ? "" : " * ", value);
  }
  int64_t out = 1;
  for (const auto& [name, value] : factors) {
    out = io::checked_mul(out, value, fmt::format("{}: {} = {}", file, names, values));
  }
  return out;
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

namespace {

ModelPreset preset_from_json(const nlohmann::json& root, const std::string& fname) {
  if (!root.is_object()) {
    throw Error(
        fmt::format("moekit: {} must hold a JSON object, got {}", fname, io::describe_json(root)));
  }
  // Multimodal configs (Llama4) keep the language model under text_config.
  const auto text_config = root.find("text_config");
  const bool nested = text_config != root.end() && !text_config->is_null();
  if (nested && !text_config->is_object()) {
    throw Error(fmt::format("moekit: {}: text_config={} must be an object", fname,
                            io::describe_json(*text_config)));
  }
  const ConfigReader top(root, fname, "");
  const ConfigReader c = nested ? ConfigReader(*text_config, fname, "text_config.") : top;

  ModelPreset p;
  const std::string model_type =
      c.opt_string({"model_type"}).value_or(top.opt_string({"model_type"}).value_or("unknown"));
  p.name = top.opt_string({"_name_or_path"}).value_or(model_type);
  p.num_experts = static_cast<int>(
      c.req_int({"num_local_experts", "num_experts", "n_routed_experts"}, 1, kMaxExperts));
  p.top_k = static_cast<int>(
      c.req_int({"num_experts_per_tok", "experts_per_token", "moe_topk"}, 1, p.num_experts));
  p.hidden_size = c.req_int({"hidden_size"}, 1, kMaxDim);
  p.intermediate_size = c.req_int({"moe_intermediate_size", "intermediate_size"}, 1, kMaxDim);
  p.num_layers = static_cast<int>(c.opt_int({"num_hidden_layers"}, 0, kMaxLayers).value_or(0));
  p.first_moe_layer = static_cast<int>(
      c.opt_int({"first_k_dense_replace"}, 0, p.num_layers > 0 ? p.num_layers : kMaxLayers)
          .value_or(0));
  if (const nlohmann::json* act = c.find({"hidden_act"})) {
    const std::string name = io::json_string(*act, c.where("hidden_act"));
    const auto a = parse_activation(name);
    if (!a) {
      throw Error(fmt::format("moekit: {}={} is not a supported activation: use one of {}",
                              c.where("hidden_act"), io::describe_json(*act), activation_names()));
    }
    p.activation = *a;
  }
  const std::string scoring =
      c.opt_choice("scoring_func", {"softmax", "sigmoid"}).value_or("softmax");
  p.scoring = scoring == "sigmoid" ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  p.renormalize = c.opt_bool("norm_topk_prob").value_or(true);
  p.num_expert_group = static_cast<int>(c.opt_int({"n_group"}, 0, p.num_experts).value_or(0));
  p.topk_group = static_cast<int>(c.opt_int({"topk_group"}, 0, p.num_experts).value_or(0));
  if (p.num_expert_group > 0) {
    MOEKIT_CHECK(p.num_experts % p.num_expert_group == 0,
                 "{}: n_group={} must divide the number of experts {}", fname, p.num_expert_group,
                 p.num_experts);
    MOEKIT_CHECK(p.topk_group >= 1 && p.topk_group <= p.num_expert_group,
                 "{}: topk_group={} must be in [1, n_group={}]", fname, p.topk_group,
                 p.num_expert_group);
    const int reachable = p.topk_group * (p.num_experts / p.num_expert_group);
    MOEKIT_CHECK(p.top_k <= reachable,
                 "{}: num_experts_per_tok={} exceeds the {} experts of the topk_group={} groups "
                 "kept ({} experts per group)",
                 fname, p.top_k, reachable, p.topk_group, p.num_experts / p.num_expert_group);
  }
  if (auto f = c.opt_number("routed_scaling_factor", 0.0, kMaxScale)) {
    MOEKIT_CHECK(*f > 0.0, "{}={} must be > 0", c.where("routed_scaling_factor"), *f);
    if (static_cast<float>(*f) != 1.0f) p.routed_scaling_factor = static_cast<float>(*f);
  }
  p.has_e_score_correction_bias =
      c.opt_choice("topk_method", {"greedy", "group_limited_greedy", "noaux_tc"}).value_or("") ==
      "noaux_tc";
  p.num_shared_experts = static_cast<int>(
      c.opt_int({"n_shared_experts", "num_shared_experts"}, 0, kMaxSharedExperts).value_or(0));
  p.shared_intermediate_size =
      c.opt_int({"shared_expert_intermediate_size"}, 1, kMaxDim).value_or(p.intermediate_size);
  if (model_type == "qwen2_moe" && p.num_shared_experts == 0 &&
      c.find({"shared_expert_intermediate_size"}) != nullptr) {
    p.num_shared_experts = 1;
  }
  // Qwen2-MoE scales its shared expert by a per-token sigmoid gate (mlp.shared_expert_gate).
  p.shared_expert_gate = model_type == "qwen2_moe" && p.num_shared_experts > 0;
  if (model_type == "gpt_oss") {
    p.activation = Activation::kSwigluOai;
    p.has_bias = true;
    const auto limit = c.opt_number("swiglu_limit", 0.0, kMaxScale).value_or(7.0);
    MOEKIT_CHECK(limit > 0.0, "{}={} must be > 0", c.where("swiglu_limit"), limit);
    p.swiglu_limit = static_cast<float>(limit);
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
  std::string dtype_key = "torch_dtype";
  const nlohmann::json* dtype = c.find({"torch_dtype", "dtype"}, &dtype_key);
  const ConfigReader& dtype_owner = dtype != nullptr ? c : top;
  if (dtype == nullptr) dtype = top.find({"torch_dtype"});
  if (dtype != nullptr) {
    const std::string where = dtype_owner.where(dtype_key);
    const std::string name = io::json_string(*dtype, where);
    const auto d = parse_dtype(name);
    if (!d || (*d != DType::kBF16 && *d != DType::kF16 && *d != DType::kF32)) {
      throw Error(
          fmt::format("moekit: {}={} is not a layer dtype: use one of bfloat16, float16, float32",
                      where, io::describe_json(*dtype)));
    }
    p.dtype = *d;
  }

  // Every weight of one layer must be addressable with 64-bit element and byte counts.
  const int64_t gate_up = is_gated(p.activation) ? 2 : 1;
  const auto bytes = static_cast<int64_t>(element_size(p.dtype));
  checked_product(fname, {{"num_experts", p.num_experts},
                          {"gate_up", gate_up},
                          {"intermediate_size", p.intermediate_size},
                          {"hidden_size", p.hidden_size},
                          {"bytes per element", bytes}});
  checked_product(fname, {{"num_experts", p.num_experts},
                          {"hidden_size", p.hidden_size},
                          {"intermediate_size", p.intermediate_size},
                          {"bytes per element", bytes}});
  if (p.num_shared_experts > 0) {
    checked_product(fname, {{"n_shared_experts", p.num_shared_experts},
                            {"gate_up", gate_up},
                            {"shared_expert_intermediate_size", p.shared_intermediate_size},
                            {"hidden_size", p.hidden_size},
                            {"bytes per element", bytes}});
  }
  return p;
}

}  // namespace

ModelPreset preset_from_hf_config(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) file /= "config.json";
  return preset_from_json(io::read_json_file(file), file.string());
}

ModelPreset preset_from_hf_config_text(std::string_view json_text, const std::string& where) {
  return preset_from_json(io::parse_json(json_text, where), where);
}

}  // namespace moekit
