// HuggingFace "mxfp4" checkpoints: quantization_config {"quant_method": "mxfp4", ...} as gpt-oss
// ships them. The experts of a layer are stored fused (layer/checkpoint.h: gpt-oss's layout):
// "<experts>.gate_up_proj_blocks" (E, 2I, H/32, 16) e2m1 codes, two per byte, the even element in
// the low nibble; "<experts>.gate_up_proj_scales" (E, 2I, H/32) e8m0 codes (2^(code - 127) per
// 32 elements of a row); "<experts>.gate_up_proj_bias" (E, 2I); the same for down_proj with H and
// I swapped. Activations stay in the layer dtype (W4A16). The config loads through the Quark OCP
// MX method (Quark's w_mxfp4 scheme: the same codes, scales and packing).
//
//   {"quant_method": "mxfp4",
//    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
//                               "model.embed_tokens", "lm_head"]}
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/quantization/quark/quark_config.h"

namespace moekit::quantization {

struct HfMxfp4Config {
  // Module names left unquantized, as HuggingFace matches them: a regular expression that matches
  // at the start of a module name ("model.layers.*.mlp.router" keeps every router unquantized).
  std::vector<std::string> modules_to_not_convert;
  // "dequantize": true asks for the experts in the layer dtype: the codes are decoded at load
  // (exactly: every MXFP4 value is a bf16 value) and the layer runs unquantized.
  bool dequantize = false;

  // The config.json object (what a fixture writes).
  nlohmann::json to_json() const;
  // The Quark config of the same quantization: MXFP4 weights (per_group 32, e8m0 scales), no
  // activation quantizer; modules_to_not_convert become "re:" exclude entries.
  quark::QuarkConfig to_quark_config() const;
};

// Whether a quantization_config object is a HuggingFace MXFP4 one (quant_method "mxfp4").
bool is_hf_mxfp4_config(const nlohmann::json& quantization_config);

// Validates and reads one (`where` prefixes errors, e.g. "ckpt/config.json: quantization_config").
// Throws moekit::Error naming the key, the value and the requirement for a modules_to_not_convert
// that is not an array of strings and a dequantize that is not a boolean. Other keys are ignored
// (exporters add their own).
HfMxfp4Config parse_hf_mxfp4_config(const nlohmann::json& quantization_config,
                                    std::string_view where);

}  // namespace moekit::quantization
