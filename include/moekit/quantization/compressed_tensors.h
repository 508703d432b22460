// compressed-tensors checkpoints: quantization_config {"quant_method": "compressed-tensors", ...}
// as llm-compressor writes them (the FP8, FP8_DYNAMIC, FP8_BLOCK, W8A8 int8, NVFP4, NVFP4A16 and
// W4AFP8 schemes). Their 8-bit experts hold the Quark methods' tensors under the same names
// (<proj>.weight, <proj>.weight_scale: one per tensor, (N, 1) per channel or (N / 128, K / 128) per
// block, <proj>.input_scale for static activations), so they load through the Quark MoE methods:
// the config becomes the equivalent Quark config.
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

// One tensor's quantizer (compressed-tensors' QuantizationArgs), as served: 8-bit, NVFP4 or int4
// weights, symmetric.
struct CompressedTensorsArgs {
  std::string type;        // "float" (e4m3, or e2m1 at 4 bits) or "int" (int8)
  std::string strategy;    // weights: tensor, channel, block, group (int4: 128 of K);
                           // activations: tensor, token, group;
                           // NVFP4: tensor_group (groups of 16 under a per-tensor global scale)
  bool dynamic = false;    // NVFP4 activations: "local" in the file
  int64_t group_size = 0;  // strategy group (activations of block weights, int4 weights): 128;
                           // tensor_group: 16
  std::vector<int64_t> block_structure;  // strategy block: [128, 128]
  int num_bits = 8;                      // 8, or 4 for NVFP4 and int4
};

struct CompressedTensorsConfig {
  // "float-quantized", "int-quantized" or "naive-quantized"; "nvfp4-pack-quantized" for NVFP4,
  // "pack-quantized" for int4
  std::string format;
  CompressedTensorsArgs weights;
  std::optional<CompressedTensorsArgs> input;  // input_activations
  // Module names left unquantized: exact names or "re:" regular expressions matched at the start
  // of a name (Quark's exclude entries match the same way).
  std::vector<std::string> ignore;

  // NVFP4 weights (llm-compressor's NVFP4 / NVFP4A16 schemes). Their tensors carry other names
  // than the Quark method's (<proj>.weight_packed: e2m1 pairs, low nibble first, as Quark's
  // weight; .weight_scale: e4m3 per 16; .weight_global_scale and .input_global_scale: the
  // reciprocals of Quark's weight_scale_2 and input_scale_2, the scales that quantize rather
  // than dequantize).
  bool nvfp4() const { return weights.strategy == "tensor_group"; }
  // int4 weights in groups of 128 (llm-compressor's W4AFP8, format pack-quantized): <proj>.
  // weight_packed holds int32 words of eight offset-binary codes (code + 8; code j of a row at
  // bits 4 (j % 8) of word j / 8), .weight_scale (N, K / 128) in the model's float dtype,
  // .weight_shape [N, K]. The loader reads the words as Quark's signed-nibble bytes
  // (int4_words_in_file).
  bool int4_packed() const { return weights.num_bits == 4 && weights.type == "int"; }
  bool int4_words_in_file(const std::string& quark_suffix) const {
    return int4_packed() && quark_suffix == "weight";
  }
  // The file's suffix of a Quark parameter suffix (the suffix itself where the names agree), and
  // whether that file tensor holds the reciprocal of the Quark parameter.
  std::string file_suffix(const std::string& quark_suffix) const;
  bool reciprocal_in_file(const std::string& quark_suffix) const;

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
// (static or dynamic) or per token (dynamic), float 1x128 groups (dynamic) with block weights;
// NVFP4 weights (nvfp4-pack-quantized) with dynamic ("local") NVFP4 activations or none; int4
// symmetric weights in groups of 128 (pack-quantized) with fp8 activations per token (dynamic)
// or per tensor (static).
// Throws moekit::Error naming the key, the value and the requirement for anything else (int4
// weight-only (W4A16) or other group sizes, activation-ordered groups, MXFP4 groups, 8-bit
// weight-only schemes, asymmetric quantizers, several config groups, a sparsity_config other
// than dense, a transform_config: rotated weights, ...).
// Other keys are ignored (llm-compressor adds its own: quantization_status, kv_cache_scheme, ...).
CompressedTensorsConfig parse_compressed_tensors_config(const nlohmann::json& quantization_config,
                                                        std::string_view where);

}  // namespace moekit::quantization
