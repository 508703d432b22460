// NVIDIA ModelOpt checkpoints: quantization_config {"quant_method": "modelopt", "quant_algo":
// "FP8" | "NVFP4", ...} (or the same keys under "quantization", as hf_quant_config.json holds
// them), as NVIDIA publishes FP8 and FP4 MoE checkpoints. Their experts hold the Quark methods'
// tensors: FP8 per tensor with static per-tensor activations (<proj>.weight, .weight_scale,
// .input_scale); NVFP4 (<proj>.weight packed e2m1, .weight_scale ue4m3 per 16, .weight_scale_2
// global, .input_scale: the activations' global scale, Quark's input_scale_2). They load through
// the Quark MoE methods: the config becomes the equivalent Quark config.
//
//   {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
//    "kv_cache_quant_algo": null, "exclude_modules": ["lm_head", "model.layers.*.mlp.gate"]}
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/quantization/quark/quark_config.h"

namespace moekit::quantization {

struct ModelOptConfig {
  std::string quant_algo;                    // "FP8" or "NVFP4"
  std::vector<std::string> exclude_modules;  // exact names or fnmatch patterns ("*", "?")

  // The file suffix of a Quark parameter suffix where ModelOpt names it differently (NVFP4's
  // "input_scale_2" is ModelOpt's "input_scale"); else the suffix itself.
  std::string file_suffix(const std::string& quark_suffix) const;
  // The config.json object (what a fixture writes).
  nlohmann::json to_json() const;
  // The Quark config of the same quantization (its global config and exclude list).
  quark::QuarkConfig to_quark_config() const;
};

// Whether a quantization_config object is a ModelOpt one (quant_method "modelopt").
bool is_modelopt_config(const nlohmann::json& quantization_config);

// Validates and reads one (`where` prefixes errors). Throws moekit::Error naming the key, the value
// and the requirement for a quant_algo other than FP8 and NVFP4 (FP8_PER_CHANNEL_PER_TOKEN,
// W4A8_AWQ, MXFP8, MIXED_PRECISION, ... are not served), an NVFP4 group_size other than 16, and
// exclude lists that are not arrays of strings. kv_cache_quant_algo and other keys are ignored
// (the KV cache is not this layer's).
ModelOptConfig parse_modelopt_config(const nlohmann::json& quantization_config,
                                     std::string_view where);

}  // namespace moekit::quantization
