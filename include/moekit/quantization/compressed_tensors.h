// compressed-tensors checkpoints: quantization_config {"quant_method": "compressed-tensors", ...}
// as llm-compressor writes them (the FP8, FP8_DYNAMIC, FP8_BLOCK and W8A8 int8 schemes). Their
// 8-bit experts hold the Quark methods' tensors under the same names (<proj>.weight,
// <proj>.weight_scale: one per tensor, (N, 1) per channel or (N / 128, K / 128) per block,
// <proj>.input_scale for static activations), so they load through the Quark MoE methods: the
// config becomes the equivalent Quark config.
//
//   {"quant_method": "compressed-tensors", "format": "float-quantized",
//    "config_groups": {"group_0": {"targets": ["Linear"],
//        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": false,
//                    "symmetric": true},
//        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
//                              "dynamic": true, "symmetric": true}}},
//    "ignore": ["lm_head", "re:.*mlp.gate$"]}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/quantization/quark/quark_config.h"

namespace moekit::quantization {

// One tensor's quantizer (compressed-tensors' QuantizationArgs), as served: 8-bit, symmetric.
struct CompressedTensorsArgs {
  std::string type;      // "float" (e4m3) or "int" (int8)
  std::string strategy;  // weights: tensor, channel, block; activations: tensor, token, group
  bool dynamic = false;
  int64_t group_size = 0;                // strategy group (activations of block weights): 128
  std::vector<int64_t> block_structure;  // strategy block: [128, 128]
};

struct CompressedTensorsConfig {
  std::string format;  // "float-quantized", "int-quantized" or "naive-quantized"
  CompressedTensorsArgs weights;
  std::optional<CompressedTensorsArgs> input;  // input_activations
  // Module names left unquantized: exact names or "re:" regular expressions matched at the start
  // of a name (Quark's exclude entries match the same way).
  std::vector<std::string> ignore;

  // The config.json object (what a fixture writes): one config group targeting every Linear.
  nlohmann::json to_json() const;
  // The Quark config of the same quantization (its global config and exclude list).
  quark::QuarkConfig to_quark_config() const;
};

// Whether a quantization_config object is a compressed-tensors one.
bool is_compressed_tensors_config(const nlohmann::json& quantization_config);

// Validates and reads one (`where` prefixes errors, e.g. "ckpt/config.json: quantization_config").
// Served: one config group targeting "Linear"; 8-bit symmetric float weights per tensor, channel
// or 128x128 block, or int weights per tensor or channel; float or int activations per tensor
// (static or dynamic) or per token (dynamic), float 1x128 groups (dynamic) with block weights.
// Throws moekit::Error naming the key, the value and the requirement for anything else (packed
// 4-bit formats, NVFP4 / MXFP4 groups, weight-only schemes, asymmetric quantizers, several
// config groups, a sparsity_config other than dense, a transform_config: rotated weights, ...).
// Other keys are ignored (llm-compressor adds its own: quantization_status, kv_cache_scheme, ...).
CompressedTensorsConfig parse_compressed_tensors_config(const nlohmann::json& quantization_config,
                                                        std::string_view where);

}  // namespace moekit::quantization
