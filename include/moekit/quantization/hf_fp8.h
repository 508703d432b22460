// HuggingFace "fp8" checkpoints: quantization_config {"quant_method": "fp8", ...} as DeepSeek-V3,
// DeepSeek-R1 and Qwen3-FP8 ship them (e4m3 weights in 128x128 blocks, scales in
// "<proj>.weight_scale_inv", activations quantized dynamically in 1x128 groups), and per-tensor
// fp8 checkpoints ("<proj>.weight_scale" per projection; with activation_scheme "static" also
// "<proj>.input_scale"). They load through the Quark MoE methods: the config becomes the
// equivalent Quark config, and the loader reads the weight scales under the file's name.
//
//   {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
//    "weight_block_size": [128, 128], "ignored_layers": ["lm_head"]}
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/quantization/quark/quark_config.h"

namespace moekit::quantization {

struct HfFp8Config {
  bool block = false;               // weight_block_size [128, 128]; else one scale per tensor
  bool static_activations = false;  // activation_scheme "static": per-tensor input_scale tensors
  // ignored_layers and modules_to_not_convert: module names (or patterns) left unquantized.
  std::vector<std::string> ignored;

  // The file's tensor suffix of a projection's weight scales.
  std::string weight_scale_suffix() const { return block ? "weight_scale_inv" : "weight_scale"; }
  // The config.json object (what a fixture writes).
  nlohmann::json to_json() const;
  // The Quark config of the same quantization (its layer and exclude rules: QuarkConfig).
  quark::QuarkConfig to_quark_config() const;
};

// Whether a quantization_config object is a HuggingFace fp8 one (quant_method "fp8").
bool is_hf_fp8_config(const nlohmann::json& quantization_config);

// Validates and reads one (`where` prefixes errors, e.g. "ckpt/config.json: quantization_config").
// Throws moekit::Error naming the key, the value and the requirement for: fmt other than e4m3
// (e5m2 weights are not served), an activation_scheme other than "dynamic" / "static", a
// weight_block_size other than [128, 128], static activations with block weights (block
// checkpoints quantize activations per 1x128 group at run time), ignored-layer lists that are not
// arrays of strings. Other keys are ignored (exporters add their own).
HfFp8Config parse_hf_fp8_config(const nlohmann::json& quantization_config, std::string_view where);

}  // namespace moekit::quantization
