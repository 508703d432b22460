// Loading one MoE layer from a HuggingFace-layout checkpoint directory: config.json (model shape
// and quantization_config) plus *.safetensors (optionally sharded with
// model.safetensors.index.json).
//
//   MoELayer layer = load_moe_layer("ckpt/", 1, options);  // any scheme, any device / EP rank
//   Tensor logits = layer.router_logits(x);             // x (M, H) @ gate.weight^T, f32
//   Tensor y = layer.forward(x, logits);                 // (M, H)
//
// Tensor names (N = layer index, E = expert index), tried in this order:
//   experts   model.layers.N.mlp.experts.E.{gate,up,down}_proj.<param>          (Qwen, DeepSeek)
//             model.layers.N.block_sparse_moe.experts.E.{w1,w3,w2}.<param>     (Mixtral)
//             model.layers.N.mlp.experts.{gate_up,down}_proj{_blocks,_scales,_bias}     (gpt-oss)
//               every expert in one tensor per projection; gate_up's 2I rows interleave gate
//               and up (2j: gate j, 2j + 1: up j); unquantized: gate_up_proj (E, H, 2I) and
//               down_proj (E, I, H), transposed (x @ W); MXFP4: _blocks (E, N, K/32, 16) and
//               e8m0 _scales (E, N, K/32); biases (E, N)
//   router    <moe prefix>.gate.weight (E, H); DeepSeek's <moe
//   prefix>.gate.e_score_correction_bias;
//             gpt-oss's <moe prefix>.router.{weight,bias} (the bias added to the logits)
//   shared    model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight (DeepSeek),
//             model.layers.N.mlp.shared_expert.{...} (Qwen2-MoE), unquantized
// <param> is "weight" plus, per quantization method, the suffix of each parameter the method
// declares (quark_moe.h): w13_weight_scale <- gate/up "weight_scale", w2_input_scale <- down
// "input_scale", w13_bias <- gate/up "bias", ... Per expert the gate rows come first, then the up
// rows (w13 = [gate; up]); per-tensor parameters hold one entry per shard ((E, 2): gate, up), and
// static input scales (E,) take the max of gate's and up's.
//
// Quantization: no quantization_config -> unquantized (the weights load in options.dtype);
// quant_method "quark" -> the Quark MoE method of the layer (quark_moe.h), unless the layer is
// excluded; "fp8" (quantization/hf_fp8.h) and "mxfp4" (gpt-oss, quantization/hf_mxfp4.h; with
// "dequantize": true the experts are decoded and run unquantized) -> their Quark equivalents; any
// other quant_method is an error naming it. Either way the result is a MoELayer:
// the method declares, loads and processes the parameters, and its plan, QuantConfig and codes
// build the layer (one selection). Under expert parallelism only this rank's experts are read.
//
// Every failure throws moekit::Error (or io::SafetensorsError from the reader) naming the file,
// the JSON key or the tensor: a missing expert tensor names the first missing name; a wrong shape
// or dtype names the tensor, what it holds and what the layer needs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "moekit/layer/moe_layer.h"
#include "moekit/quantization/quark/quark_config.h"
#include "moekit/router/router.h"

namespace moekit {

// What a load found besides the layer.
struct CheckpointInfo {
  std::filesystem::path dir;
  int layer_index = 0;
  // "unquantized", or the Quark method's class name (e.g. "QuarkW8A8Fp8MoEMethod").
  std::string method = "unquantized";
};

// Loads MoE layer `layer_index` of the checkpoint in `dir` as a MoELayer with `options` (dtype,
// device, parallel config / expert map, backend, workspace, max_num_tokens). Throws moekit::Error
// naming the file, key or tensor on any problem (see the file comment); UnsupportedError when no
// backend can serve the scheme on options.device.
MoELayer load_moe_layer(const std::filesystem::path& dir, int layer_index,
                        const MoELayerOptions& options = {}, CheckpointInfo* info = nullptr);

// A layer of `model`'s real shape with random weights quantized as `scheme` (a make-fixture scheme
// name: fp8_block128, fp8_per_tensor, nvfp4, mxfp4_w4a16, ...; "bf16" = unquantized), built
// through the same Quark method as a checkpoint of that scheme (quark::fill_random_parameters):
// for benchmarks (`moekit bench --quant`) and tests, without a checkpoint on disk.
MoELayer random_quantized_layer(const ModelPreset& model, const std::string& scheme,
                                const MoELayerOptions& options, uint64_t seed);

// The Quark config of a checkpoint (nullopt when config.json has no quantization_config); a
// HuggingFace fp8 config (quantization/hf_fp8.h) comes back as its Quark equivalent.
// Throws moekit::Error for unreadable / malformed config.json or a quant_method other than
// "quark", "fp8" and "mxfp4" (nullopt too for "mxfp4" with "dequantize": true).
std::optional<quark::QuarkConfig> read_quark_config(const std::filesystem::path& dir);

}  // namespace moekit
