// Quark quantization configs: the "quantization_config" object of a checkpoint's config.json with
// quant_method "quark", parsed into typed data, plus the scheme predicates the MoE method
// selection uses (quark_moe.h).
//
//   "quantization_config": {
//     "quant_method": "quark",
//     "global_quant_config":     {"weight": SPEC, "input_tensors": SPEC, "output_tensors": null,
//                                 "bias": null},
//     "layer_quant_config":      {"model.layers.*.mlp.experts*": {...}},   // fnmatch patterns
//     "layer_type_quant_config": {"FusedMoE": {...}},                       // by layer type
//     "exclude":                 ["lm_head", "re:.*mlp.gate$", "*.shared_experts*"]
//   }
//   SPEC = null | {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": false, ...}
//        | [SPEC_DICT, SPEC_DICT]   (two quantizers of one tensor: NVFP4, fp8 W4A8)
//
// Matching (find_matched_config): layer_quant_config patterns in file order (fnmatch: * ? [..]),
// then layer_type_quant_config, then global_quant_config. For an MoE experts layer that no pattern
// names directly, a pattern naming the projections of its first expert ("<layer>.0.gate_proj",
// ".up_proj", ".down_proj", or the Mixtral "w1", "w3", "w2") decides, and all three projections
// must then resolve to the same config, else an error names them ("fused shards disagree").
//
// Every parse error throws moekit::Error naming the key path ("quantization_config.
// global_quant_config.weight[1].group_size"), the value and what was expected.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "moekit/config/quant_key.h"

namespace moekit::quark {

// One quantizer of one tensor (the seed's QuarkQTensorHint dict). Absent keys stay nullopt.
struct QuantSpec {
  std::string dtype;  // "fp8_e4m3", "fp8_e5m2", "int8", "uint8", "int4", "uint4", "fp4",
                      // "fp6_e3m2", "fp6_e2m3", ... (kept verbatim, compared case-sensitively)
  std::optional<std::string> qscheme;  // "per_tensor", "per_channel", "per_group", "per_block"
  std::optional<int64_t> group_size;   // per_group width (32 for OCP MX, 16 for NVFP4)
  std::optional<bool> is_dynamic;      // activations computed at run time
  std::optional<bool> symmetric;
  std::optional<std::string> scale_format;         // "e8m0" (OCP MX), "float", ...
  std::optional<std::string> scale_type;           // "float", "float8_e8m0fnu", ...
  std::optional<std::vector<int64_t>> block_size;  // per_block weights: [128, 128]
  std::optional<int64_t> ch_axis;

  bool dynamic() const { return is_dynamic.value_or(false); }
  bool operator==(const QuantSpec&) const = default;
  // e.g. "fp8_e4m3 per_tensor static"
  std::string to_string() const;
};

// A tensor's quantizers: empty = not quantized (JSON null or absent), one entry (a dict or a
// one-element list), or two entries (a two-element list).
using TensorHint = std::vector<QuantSpec>;

// The quantizers of one layer (one entry of global / layer / layer_type configs).
struct LayerQuantConfig {
  TensorHint weight;
  TensorHint input_tensors;
  TensorHint output_tensors;
  TensorHint bias;

  bool operator==(const LayerQuantConfig&) const = default;
};

struct QuarkConfig {
  LayerQuantConfig global_quant_config;
  // (name pattern, config) in file order.
  std::vector<std::pair<std::string, LayerQuantConfig>> layer_quant_config;
  // (layer type, config) in file order.
  std::vector<std::pair<std::string, LayerQuantConfig>> layer_type_quant_config;
  std::vector<std::string> exclude;

  // Parses the quantization_config object (`where` prefixes error paths). Throws moekit::Error
  // when quant_method is not "quark", a known key has the wrong type, or a SPEC lacks "dtype".
  static QuarkConfig from_json(const nlohmann::json& j,
                               std::string_view where = "quantization_config");
  // Same from JSON text; malformed JSON is an Error naming `where` and the parser's position.
  static QuarkConfig parse(std::string_view json_text,
                           std::string_view where = "quantization_config");

  // Whether `layer_name` (or, for an experts layer, the projections of its first expert) is in
  // `exclude`: entries match exactly, as fnmatch patterns when they hold * ? or [, or as regular
  // expressions (ECMAScript, matched from the start, in time polynomial in the name: no
  // back-references) when they start with "re:". Throws moekit::Error for an invalid expression.
  bool is_excluded(std::string_view layer_name) const;
  // The config of `layer_name` (rules in the file comment). layer_type: e.g. "FusedMoE".
  const LayerQuantConfig& find_matched_config(std::string_view layer_name,
                                              std::string_view layer_type = "FusedMoE") const;
};

// fnmatch-style matching of the whole name: * (any run), ? (one character), [abc] / [!abc].
bool fnmatch(std::string_view pattern, std::string_view name);

// The (weight, activation) keys a scheme predicate recognised. activation_key nullopt =
// weight-only.
struct QuantKeyMatch {
  std::optional<QuantKey> weight_key;
  std::optional<QuantKey> activation_key;
};

// The seed's scheme predicates over single specs (nullptr = not quantized) or hint lists; each
// returns the keys when the JSON matches (rules in vllm_inventory.md section (g)), else nullopt.
std::optional<QuantKeyMatch> is_fp8_w8a8(const QuantSpec* weight, const QuantSpec* input);
std::optional<QuantKeyMatch> is_w_ocp_mx_a_x(const QuantSpec* weight, const QuantSpec* input,
                                             bool allow_static_fp8);
std::optional<QuantKeyMatch> is_w8a8_int8(const QuantSpec* weight, const QuantSpec* input);
std::optional<QuantKeyMatch> is_fp8_w4a8(const TensorHint& weight, const TensorHint& input);
std::optional<QuantKeyMatch> is_nvfp4(const TensorHint& weight, const TensorHint& input);
// Beyond the seed's rules: int4 weights per_group 128 along K (symmetric, static; no fp8 stage)
// with fp8 activations, dynamic per token (per_channel / per_token) or static per tensor. The
// Quark form of compressed-tensors' W4AFP8 (quantization/compressed_tensors.h); vLLM serves it
// through its compressed-tensors W4A8 method, Quark's W4A8 method takes only per-channel int4.
std::optional<QuantKeyMatch> is_int4_group_w4a8(const QuantSpec* weight, const QuantSpec* input);

// The OCP MX element type names of a spec's dtype: "fp4" -> "mxfp4", "fp6_e3m2" -> "mxfp6_e3m2",
// "fp6_e2m3" -> "mxfp6_e2m3"; nullopt otherwise.
std::optional<std::string> ocp_mx_dtype_of(std::string_view spec_dtype);

// For configs of other formats translated into Quark's (HuggingFace fp8 / MXFP4,
// compressed-tensors): the JSON of a symmetric quantizer (a QuantSpec: dtype, qscheme, is_dynamic,
// round_method half_even; the caller adds ch_axis, group_size, block_size, scale_format), and
// the Quark config of one global layer config (weight, input_tensors: null for none) with an
// exclude list, parsed (errors name `where`).
nlohmann::json spec_json(std::string_view dtype, std::string_view qscheme, bool dynamic);
// NVFP4's pair of quantizers for a tensor (ModelOpt NVFP4, compressed-tensors
// nvfp4-pack-quantized): e2m1 codes in groups of 16 along the last axis (dynamic for activations)
// and the static fp8 per-tensor global scale.
nlohmann::json nvfp4_spec_json(bool dynamic);
// Whether a quantization_config object's quant_method is `method` (false for a non-object).
bool quant_method_is(const nlohmann::json& quantization_config, std::string_view method);
QuarkConfig global_config(const nlohmann::json& weight, const nlohmann::json& input,
                          const nlohmann::json& exclude, std::string_view where);

}  // namespace moekit::quark
