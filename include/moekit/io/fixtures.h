// Small HuggingFace-layout checkpoints for tests and demos, so nothing is ever downloaded:
// config.json (model shape + Quark quantization_config) and model.safetensors (or shards plus
// model.safetensors.index.json), weights drawn from seeded uniform floats and quantized with
// moekit::quant (quant/quantize.h). Tensor names and parameter suffixes are the ones
// layer/checkpoint.h loads (see quantization/quark/quark_moe.h for each scheme's parameters).
//
// Schemes (FixtureOptions::scheme):
//   bf16              unquantized
//   fp8_per_tensor    fp8 W8A8, per-tensor weights, static per-tensor activations
//   fp8_per_channel   fp8 W8A8, per-channel weights, dynamic per-token activations
//   fp8_block128      fp8 W8A8, 128x128 weight blocks, dynamic (1, 128) activation groups
//   w4a8_fp8          int4 per-channel over an fp8 per-tensor scale, dynamic per-token fp8 acts
//   w4a8_fp8_g128     int4 with an f32 scale per channel and 128 of K (int4 per_group 128: the
//                     Quark form of compressed-tensors' W4AFP8), dynamic per-token fp8 acts
//   nvfp4             NVFP4 weights and activations
//   mxfp4_w4a16       mxfp4 weights, bf16 activations
//   mxfp4_a8          mxfp4 weights, static fp8 per-tensor activations
//   mxfp4_a4          mxfp4 weights and activations
//   mxfp6_e3m2        mxfp6 e3m2 weights and activations
//   mxfp6_e2m3        mxfp6 e2m3 weights and activations
//   int8_w8a8         int8 per-channel weights, dynamic per-token int8 activations
//   hf_fp8_block128   fp8_block128 as a HuggingFace fp8 checkpoint (DeepSeek-V3 layout:
//                     quant_method "fp8", weight_block_size [128, 128], "weight_scale_inv")
//   hf_fp8_per_tensor fp8_per_tensor as a HuggingFace fp8 checkpoint (activation_scheme static)
//   ct_fp8_static     fp8_per_tensor as a compressed-tensors checkpoint (llm-compressor's FP8)
//   ct_fp8_dynamic    fp8_per_channel as compressed-tensors (FP8_DYNAMIC: channel / token)
//   ct_fp8_block128   fp8_block128 as compressed-tensors (FP8_BLOCK)
//   ct_int8_w8a8      int8_w8a8 as compressed-tensors (W8A8: channel / dynamic token, int)
//   ct_w4afp8         w4a8_fp8_g128 as compressed-tensors (W4AFP8, format pack-quantized:
//                     weight_packed int32 words of eight offset codes, bf16 weight_scale per
//                     128 of K, weight_shape)
//   mo_fp8            fp8_per_tensor as an NVIDIA ModelOpt checkpoint (quant_algo FP8)
//   mo_nvfp4          nvfp4 as ModelOpt (quant_algo NVFP4: the activations' global scale named
//                     input_scale)
//   hf_mxfp4          gpt-oss's HuggingFace MXFP4 checkpoint (quant_method "mxfp4": fused
//                     gate_up_proj_blocks / _scales, bf16 activations); model tiny-gpt-oss only
// Models (FixtureOptions::model), every layer an MoE layer unless noted:
//   tiny          qwen3_moe naming (mlp.experts.E.{gate,up,down}_proj), E=8, top_k=2, H=192,
//                 I=128, 2 layers
//   tiny-mixtral  mixtral naming (block_sparse_moe.experts.E.{w1,w3,w2}), same shape
//   tiny-deepseek deepseek_v3: E=16, top_k=4, grouped sigmoid routing with
//                 e_score_correction_bias, one unquantized shared expert (listed in the Quark
//                 exclude list), layer 0 dense (first_k_dense_replace=1), 3 layers
//   tiny-gpt-oss  gpt_oss: E=8, top_k=4, swigluoai, expert biases, the router under mlp.router
//                 with a bias, every expert in one tensor per projection (gate and up rows
//                 interleaved; bf16: mlp.experts.{gate_up,down}_proj transposed, hf_mxfp4:
//                 their _blocks / _scales); schemes bf16 and hf_mxfp4
//   tiny-llama4   llama4 (Llama4ForConditionalGeneration: language_model.model.layers.N.
//                 feed_forward, config under text_config): E=8, top-1 sigmoid routing on the
//                 input, one shared expert, experts fused (experts.gate_up_proj (E, H, 2I) with
//                 gate and up concatenated, experts.down_proj (E, I, H)); scheme bf16
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace moekit::io {

struct FixtureOptions {
  std::string scheme = "bf16";
  std::string model = "tiny";
  uint64_t seed = 0;
  int num_shards = 1;  // > 1: model-0000k-of-0000n.safetensors + model.safetensors.index.json;
                       // at most the number of tensors
};

// Every scheme and model name above, in the order listed.
const std::vector<std::string>& fixture_schemes();
const std::vector<std::string>& fixture_models();

// Whether `scheme` can be written for `model`: tiny-gpt-oss takes bf16 and hf_mxfp4, tiny-llama4
// bf16, the other models every scheme but hf_mxfp4. Throws moekit::Error for an unknown model.
bool fixture_scheme_fits(const std::string& scheme, const std::string& model);

// The Quark quantization_config JSON text of a scheme ("" for bf16; the hf_ schemes: their Quark
// equivalent; also fp8_tensor = fp8_per_tensor and fp8_channel_token = fp8_per_channel, the
// benchmarks' names). Throws moekit::Error listing the schemes for an unknown one.
std::string fixture_quantization_config(const std::string& scheme);

// Writes the checkpoint into `dir` (created if needed; existing checkpoint files — *.safetensors,
// the index and config.json — are replaced). The files are staged in a sibling directory and moved
// in at the end, so a failed write leaves nothing of this call behind. Throws moekit::Error for
// an unknown scheme / model, num_shards outside [1, number of tensors] (every shard holds at least
// one tensor), or a failed write.
void write_fixture_checkpoint(const std::filesystem::path& dir, const FixtureOptions& options);

}  // namespace moekit::io
