#include "moekit/io/fixtures.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <system_error>

#include <unistd.h>

#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/io/safetensors.h"
#include "moekit/quant/formats.h"
#include "moekit/quant/quantize.h"
#include "moekit/quantization/compressed_tensors.h"
#include "moekit/quantization/hf_fp8.h"
#include "moekit/quantization/hf_mxfp4.h"
#include "moekit/quantization/modelopt.h"

namespace moekit::io {
namespace {

using json = nlohmann::json;
using quant::QuantScheme;

struct ModelShape {
  std::string model_type;
  bool mixtral_names = false;
  int E = 8, k = 2;
  int64_t H = 192, I = 128;
  int layers = 2;
  int first_dense = 0;
  bool deepseek = false;
  bool qwen2 = false;    // a gated shared expert 2I wide (Qwen2-MoE's names)
  bool gpt_oss = false;  // fused experts, interleaved gate/up, biases, a router with a bias
  bool llama4 = false;   // fused experts, concatenated gate/up, top-1 sigmoid, a shared expert
};

ModelShape model_shape(const std::string& name) {
  ModelShape m;
  if (name == "tiny") {
    m.model_type = "qwen3_moe";
  } else if (name == "tiny-mixtral") {
    m.model_type = "mixtral";
    m.mixtral_names = true;
  } else if (name == "tiny-deepseek") {
    m.model_type = "deepseek_v3";
    m.E = 16;
    m.k = 4;
    m.layers = 3;
    m.first_dense = 1;
    m.deepseek = true;
  } else if (name == "tiny-qwen2-moe") {
    m.model_type = "qwen2_moe";
    m.qwen2 = true;
  } else if (name == "tiny-gpt-oss") {
    m.model_type = "gpt_oss";
    m.k = 4;
    m.gpt_oss = true;
  } else if (name == "tiny-llama4") {
    m.model_type = "llama4";
    m.k = 1;
    m.llama4 = true;
  } else {
    throw Error(fmt::format("unknown fixture model '{}'; known: {}", name,
                            fmt::join(fixture_models(), ", ")));
  }
  return m;
}

json config_json(const ModelShape& m, const std::string& scheme) {
  json c;
  c["model_type"] = m.model_type;
  c["architectures"] = json::array({m.model_type == "mixtral"     ? "MixtralForCausalLM"
                                    : m.model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                    : m.qwen2                     ? "Qwen2MoeForCausalLM"
                                    : m.gpt_oss                   ? "GptOssForCausalLM"
                                    : m.llama4                    ? "Llama4ForConditionalGeneration"
                                                                  : "DeepseekV3ForCausalLM"});
  c["hidden_size"] = m.H;
  c["num_hidden_layers"] = m.layers;
  c["num_experts_per_tok"] = m.k;
  c["hidden_act"] = "silu";
  c["torch_dtype"] = "bfloat16";
  c["_name_or_path"] = fmt::format("moekit-fixture-{}-{}", m.model_type, scheme);
  if (m.model_type == "mixtral") {
    c["num_local_experts"] = m.E;
    c["intermediate_size"] = m.I;
  } else if (m.gpt_oss) {
    c["num_local_experts"] = m.E;
    c["intermediate_size"] = m.I;
    c["swiglu_limit"] = 7.0;
  } else if (m.llama4) {
    // Llama4ForConditionalGeneration: the language model's config under text_config.
    json text = c;
    for (const char* key : {"architectures", "_name_or_path", "torch_dtype"})
      text.erase(key);
    text["model_type"] = "llama4_text";
    text["num_local_experts"] = m.E;
    text["intermediate_size"] = m.I;
    text["intermediate_size_mlp"] = 2 * m.I;
    text["interleave_moe_layer_step"] = 1;
    json top;
    for (const char* key : {"model_type", "architectures", "_name_or_path", "torch_dtype"})
      top[key] = c[key];
    top["text_config"] = text;
    return top;
  } else if (m.model_type == "qwen3_moe") {
    c["num_experts"] = m.E;
    c["moe_intermediate_size"] = m.I;
    c["intermediate_size"] = 3 * m.I;
    c["norm_topk_prob"] = true;
  } else if (m.qwen2) {
    c["num_experts"] = m.E;
    c["moe_intermediate_size"] = m.I;
    c["shared_expert_intermediate_size"] = 2 * m.I;
    c["intermediate_size"] = 4 * m.I;
    c["norm_topk_prob"] = false;
  } else {
    c["n_routed_experts"] = m.E;
    c["moe_intermediate_size"] = m.I;
    c["intermediate_size"] = 2 * m.I;
    c["n_group"] = 4;
    c["topk_group"] = 2;
    c["scoring_func"] = "sigmoid";
    c["topk_method"] = "noaux_tc";
    c["routed_scaling_factor"] = 2.5;
    c["n_shared_experts"] = 1;
    c["first_k_dense_replace"] = m.first_dense;
    c["norm_topk_prob"] = true;
  }
  return c;
}

json spec(const char* dtype, const char* qscheme, bool dynamic) {
  json s;
  s["dtype"] = dtype;
  s["qscheme"] = qscheme;
  s["is_dynamic"] = dynamic;
  s["symmetric"] = true;
  s["ch_axis"] = nullptr;
  s["group_size"] = nullptr;
  s["round_method"] = "half_even";
  s["scale_type"] = "float";
  return s;
}
json group_spec(const char* dtype, int64_t group, bool dynamic, bool e8m0) {
  json s = spec(dtype, "per_group", dynamic);
  s["group_size"] = group;
  s["ch_axis"] = -1;
  if (e8m0) s["scale_format"] = "e8m0";
  return s;
}

// The HuggingFace fp8 schemes: their config, and the Quark scheme of the same quantization.
std::optional<quantization::HfFp8Config> hf_fp8_of(const std::string& scheme) {
  quantization::HfFp8Config c;
  if (scheme == "hf_fp8_block128") {
    c.block = true;
  } else if (scheme == "hf_fp8_per_tensor") {
    c.static_activations = true;
  } else {
    return std::nullopt;
  }
  c.ignored = {"lm_head"};
  return c;
}

std::string quark_scheme_of(const std::string& scheme) {
  if (scheme == "hf_fp8_block128" || scheme == "ct_fp8_block128") return "fp8_block128";
  if (scheme == "hf_fp8_per_tensor" || scheme == "ct_fp8_static") return "fp8_per_tensor";
  if (scheme == "ct_fp8_dynamic") return "fp8_per_channel";
  if (scheme == "ct_int8_w8a8") return "int8_w8a8";
  if (scheme == "hf_mxfp4") return "mxfp4_w4a16";
  if (scheme == "mo_fp8") return "fp8_per_tensor";
  if (scheme == "mo_nvfp4" || scheme == "ct_nvfp4") return "nvfp4";
  if (scheme == "ct_nvfp4a16") return "nvfp4_w4a16";
  if (scheme == "ct_w4afp8") return "w4a8_fp8_g128";
  return scheme;
}

// The ModelOpt schemes (NVIDIA's FP8 and NVFP4 checkpoints): their config; their tensors are the
// Quark scheme's of quark_scheme_of, NVFP4's activation scale named input_scale.
std::optional<quantization::ModelOptConfig> modelopt_of(const std::string& scheme) {
  if (scheme != "mo_fp8" && scheme != "mo_nvfp4") return std::nullopt;
  quantization::ModelOptConfig c;
  c.quant_algo = scheme == "mo_fp8" ? "FP8" : "NVFP4";
  c.exclude_modules = {"lm_head", "model.layers.*.mlp.gate"};
  return c;
}

// The compressed-tensors schemes (llm-compressor's FP8, FP8_DYNAMIC, FP8_BLOCK, W8A8, NVFP4,
// NVFP4A16 and W4AFP8): their config; their tensors are the Quark scheme's of quark_scheme_of
// (NVFP4's renamed, the global scales as reciprocals: CompressedTensorsConfig::file_suffix;
// W4AFP8's weight_packed int32 words of offset codes, bf16 group scales, weight_shape).
std::optional<quantization::CompressedTensorsConfig> compressed_tensors_of(
    const std::string& scheme) {
  using Args = quantization::CompressedTensorsArgs;
  quantization::CompressedTensorsConfig c;
  c.format = "float-quantized";
  if (scheme == "ct_fp8_static") {
    c.weights = Args{"float", "tensor", false, 0, {}};
    c.input = Args{"float", "tensor", false, 0, {}};
  } else if (scheme == "ct_fp8_dynamic") {
    c.weights = Args{"float", "channel", false, 0, {}};
    c.input = Args{"float", "token", true, 0, {}};
  } else if (scheme == "ct_fp8_block128") {
    c.weights = Args{"float", "block", false, 0, {128, 128}};
    c.input = Args{"float", "group", true, 128, {}};
  } else if (scheme == "ct_int8_w8a8") {
    c.format = "int-quantized";
    c.weights = Args{"int", "channel", false, 0, {}};
    c.input = Args{"int", "token", true, 0, {}};
  } else if (scheme == "ct_nvfp4" || scheme == "ct_nvfp4a16") {  // NVFP4 / NVFP4A16
    c.format = "nvfp4-pack-quantized";
    c.weights = Args{"float", "tensor_group", false, 16, {}, 4};
    if (scheme == "ct_nvfp4") c.input = Args{"float", "tensor_group", true, 16, {}, 4};
  } else if (scheme == "ct_w4afp8") {  // W4AFP8
    c.format = "pack-quantized";
    c.weights = Args{"int", "group", false, 128, {}, 4};
    c.input = Args{"float", "token", true, 0, {}};
  } else {
    return std::nullopt;
  }
  c.ignore = {"lm_head", "re:.*mlp.gate$"};
  return c;
}

// gpt-oss's config: MXFP4 experts, everything else of the model left unquantized.
quantization::HfMxfp4Config hf_mxfp4_config() {
  quantization::HfMxfp4Config c;
  c.modules_to_not_convert = {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                              "model.embed_tokens", "lm_head"};
  return c;
}

// (weight, input) hints of a scheme.
std::pair<json, json> scheme_hints(const std::string& scheme) {
  if (scheme == "fp8_per_tensor") {
    return {spec("fp8_e4m3", "per_tensor", false), spec("fp8_e4m3", "per_tensor", false)};
  }
  if (scheme == "fp8_per_channel") {
    json w = spec("fp8_e4m3", "per_channel", false);
    w["ch_axis"] = 0;
    json a = spec("fp8_e4m3", "per_channel", true);
    a["ch_axis"] = 1;
    return {w, a};
  }
  if (scheme == "fp8_block128") {
    json w = spec("fp8_e4m3", "per_block", false);
    w["block_size"] = json::array({128, 128});
    return {w, group_spec("fp8_e4m3", 128, true, false)};
  }
  if (scheme == "w4a8_fp8") {
    json int4 = spec("int4", "per_channel", false);
    int4["ch_axis"] = 0;
    return {json::array({spec("fp8_e4m3", "per_tensor", false), int4}),
            spec("fp8_e4m3", "per_tensor", true)};
  }
  if (scheme == "w4a8_fp8_g128") {
    json a = spec("fp8_e4m3", "per_channel", true);  // per token
    a["ch_axis"] = 1;
    return {group_spec("int4", 128, false, false), a};
  }
  if (scheme == "nvfp4") {
    return {
        json::array({group_spec("fp4", 16, false, false), spec("fp8_e4m3", "per_tensor", false)}),
        json::array({group_spec("fp4", 16, true, false), spec("fp8_e4m3", "per_tensor", false)})};
  }
  if (scheme == "nvfp4_w4a16") {
    return {
        json::array({group_spec("fp4", 16, false, false), spec("fp8_e4m3", "per_tensor", false)}),
        nullptr};
  }
  if (scheme == "mxfp4_w4a16") return {group_spec("fp4", 32, false, true), nullptr};
  if (scheme == "mxfp4_a8") {
    return {group_spec("fp4", 32, false, true), spec("fp8_e4m3", "per_tensor", false)};
  }
  if (scheme == "mxfp4_a4") {
    return {group_spec("fp4", 32, false, true), group_spec("fp4", 32, true, true)};
  }
  if (scheme == "mxfp6_e3m2" || scheme == "mxfp6_e2m3") {
    const char* d = scheme == "mxfp6_e3m2" ? "fp6_e3m2" : "fp6_e2m3";
    return {group_spec(d, 32, false, true), group_spec(d, 32, true, true)};
  }
  if (scheme == "mxfp6_e3m2_a8" || scheme == "mxfp6_e2m3_a8") {
    const char* d = scheme == "mxfp6_e3m2_a8" ? "fp6_e3m2" : "fp6_e2m3";
    return {group_spec(d, 32, false, true), spec("fp8_e4m3", "per_tensor", false)};
  }
  if (scheme == "int8_w8a8") {
    json w = spec("int8", "per_channel", false);
    w["ch_axis"] = 0;
    return {w, spec("int8", "per_channel", true)};
  }
  if (scheme == "int8_per_tensor") {
    return {spec("int8", "per_tensor", false), spec("int8", "per_tensor", false)};
  }
  throw Error(fmt::format("unknown fixture scheme '{}'; known: {}", scheme,
                          fmt::join(fixture_schemes(), ", ")));
}

json quark_config(const std::string& scheme, bool deepseek) {
  auto [w, a] = scheme_hints(scheme);
  json layer;
  layer["weight"] = w;
  layer["input_tensors"] = a;
  layer["output_tensors"] = nullptr;
  layer["bias"] = nullptr;
  json q;
  q["quant_method"] = "quark";
  q["global_quant_config"] = layer;
  q["layer_quant_config"] = json::object();
  q["layer_type_quant_config"] = json::object();
  json exclude = json::array({"lm_head", "*.mlp.gate"});
  if (deepseek) {
    exclude.push_back("re:model\\.layers\\.\\d+\\.mlp\\.shared_experts\\..*");
    exclude.push_back("re:model\\.layers\\.0\\.mlp\\..*");
  }
  q["exclude"] = exclude;
  q["quant_mode"] = "eager_mode";
  q["export"] = json{{"kv_cache_group", json::array()}, {"pack_method", "reorder"}};
  return q;
}

// ---- tensors --------------------------------------------------------------------------------

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

class Emitter {
 public:
  void bytes(std::string name, std::string dtype, std::vector<int64_t> shape, const void* p,
             size_t n) {
    Entry e{std::move(name), std::move(dtype), std::move(shape), std::vector<std::byte>(n)};
    if (n > 0) std::memcpy(e.data.data(), p, n);
    entries.push_back(std::move(e));
  }
  void f32(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
    bytes(std::move(name), "F32", std::move(shape), v.data(), v.size() * sizeof(float));
  }
  void scalar(std::string name, float v) { f32(std::move(name), {}, std::vector<float>{v}); }
  void bf16(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      b[i] = float_to_bf16_bits(v[i]);
    bytes(std::move(name), "BF16", std::move(shape), b.data(), b.size() * 2);
  }
  std::vector<Entry> entries;
};

std::vector<float> uniform(std::mt19937_64& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v)
    x = u(rng);
  return v;
}

float amax(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

// int4 codes in groups of 128 along a row (uint4b8), their scales rounded to bf16 after
// quantizing: the w4a8_fp8_g128 and ct_w4afp8 (bf16 scales in the file) fixtures of a seed load
// bitwise alike.
quant::QuantizedTensor int4_groups(const std::vector<float>& w, int64_t rows, int64_t cols) {
  quant::QuantizedTensor q =
      quant::quantize(w, rows, cols, QuantScheme::int_weight_groups(QuantDType::kInt4, 128, true));
  for (float& s : q.scales)
    s = bf16_bits_to_float(float_to_bf16_bits(s));
  return q;
}

// One projection (rows, cols) under `scheme`, its tensors named `<p>.weight`, `<p>.weight_scale`..
// act_amax: the expected |input| bound of this projection (static activation scales).
void emit_projection(Emitter& out, const std::string& p, const std::vector<float>& w, int64_t rows,
                     int64_t cols, const std::string& scheme, float act_amax) {
  if (scheme == "ct_w4afp8") {
    // Eight offset codes per int32 word, rows padded to whole words; group scales in bf16 (the
    // model's dtype).
    const quant::QuantizedTensor q = int4_groups(w, rows, cols);
    const int64_t row_bytes = quant::code_row_bytes(QuantDType::kInt4, cols);
    const int64_t words = (cols + 7) / 8;
    std::vector<uint8_t> packed(static_cast<size_t>(rows * words * 4), 0x88);  // zero codes
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(packed.data() + r * words * 4, q.codes.data() + r * row_bytes,
                  static_cast<size_t>(row_bytes));
    out.bytes(p + ".weight_packed", "I32", {rows, words}, packed.data(), packed.size());
    out.bf16(p + ".weight_scale", {q.scale_rows, q.scale_cols}, q.scales);
    const int64_t shape[2] = {rows, cols};
    out.bytes(p + ".weight_shape", "I64", {2}, shape, sizeof(shape));
    return;
  }
  if (compressed_tensors_of(scheme) || modelopt_of(scheme)) {  // the Quark scheme's names
    emit_projection(out, p, w, rows, cols, quark_scheme_of(scheme), act_amax);
    return;
  }
  if (const std::optional<quantization::HfFp8Config> hf = hf_fp8_of(scheme)) {
    // The Quark scheme's tensors under the HuggingFace names.
    emit_projection(out, p, w, rows, cols, quark_scheme_of(scheme), act_amax);
    for (Entry& e : out.entries) {
      if (e.name == p + ".weight_scale") e.name = p + "." + hf->weight_scale_suffix();
    }
    return;
  }
  const std::span<const float> data(w);
  if (scheme == "bf16") {
    out.bf16(p + ".weight", {rows, cols}, w);
    return;
  }
  if (scheme.rfind("fp8_", 0) == 0) {
    const QuantScheme qs = scheme == "fp8_per_tensor"    ? QuantScheme::fp8_per_tensor()
                           : scheme == "fp8_per_channel" ? QuantScheme::fp8_per_channel()
                                                         : QuantScheme::fp8_block(128, 128);
    const quant::QuantizedTensor q = quant::quantize(data, rows, cols, qs);
    out.bytes(p + ".weight", "F8_E4M3", {rows, cols}, q.codes.data(), q.codes.size());
    if (scheme == "fp8_per_tensor") {
      out.scalar(p + ".weight_scale", q.scales[0]);
      out.scalar(p + ".input_scale", act_amax / 448.0f);
    } else if (scheme == "fp8_per_channel") {
      out.f32(p + ".weight_scale", {rows, 1}, q.scales);
    } else {
      out.f32(p + ".weight_scale", {q.scale_rows, q.scale_cols}, q.scales);
    }
    return;
  }
  if (scheme == "int8_w8a8") {
    const quant::QuantizedTensor q =
        quant::quantize(data, rows, cols, QuantScheme::int8_per_channel());
    out.bytes(p + ".weight", "I8", {rows, cols}, q.codes.data(), q.codes.size());
    out.f32(p + ".weight_scale", {rows, 1}, q.scales);
    return;
  }
  if (scheme == "int8_per_tensor") {
    const quant::QuantizedTensor q =
        quant::quantize(data, rows, cols, QuantScheme::int8_per_tensor());
    out.bytes(p + ".weight", "I8", {rows, cols}, q.codes.data(), q.codes.size());
    out.scalar(p + ".weight_scale", q.scales[0]);
    out.scalar(p + ".input_scale", act_amax / 127.0f);
    return;
  }
  if (scheme == "w4a8_fp8") {
    // Stage 1: fp8 per tensor. Stage 2: the fp8 values (in fp8 units) to int4 per channel.
    const float s2 = std::max(amax(w), quant::kAmaxFloor) / 448.0f;
    std::vector<float> fp8_units(w.size());
    for (size_t i = 0; i < w.size(); ++i)
      fp8_units[i] = quant::decode_e4m3(quant::encode_e4m3(w[i] / s2));
    const quant::QuantizedTensor q = quant::quantize(
        fp8_units, rows, cols, QuantScheme::int_weight_groups(QuantDType::kInt4, -1, true));
    std::vector<uint8_t> signed_codes = q.codes;  // uint4b8 -> two's complement nibbles
    for (uint8_t& b : signed_codes)
      b ^= 0x88;
    out.bytes(p + ".weight", "U8", {rows, (cols + 1) / 2}, signed_codes.data(),
              signed_codes.size());
    out.f32(p + ".weight_scale", {rows, 1}, q.scales);
    out.scalar(p + ".weight_scale_2", s2);
    return;
  }
  if (scheme == "w4a8_fp8_g128") {  // int4 groups of 128 along K, signed nibbles
    const quant::QuantizedTensor q = int4_groups(w, rows, cols);
    std::vector<uint8_t> signed_codes = q.codes;  // uint4b8 -> two's complement nibbles
    for (uint8_t& b : signed_codes)
      b ^= 0x88;
    out.bytes(p + ".weight", "U8", {rows, (cols + 1) / 2}, signed_codes.data(),
              signed_codes.size());
    out.f32(p + ".weight_scale", {q.scale_rows, q.scale_cols}, q.scales);
    return;
  }
  if (scheme.rfind("mxfp", 0) == 0) {
    const QuantDType el = scheme.rfind("mxfp4", 0) == 0        ? QuantDType::kFp4E2M1
                          : scheme.rfind("mxfp6_e3m2", 0) == 0 ? QuantDType::kFp6E3M2
                                                               : QuantDType::kFp6E2M3;
    const quant::QuantizedTensor q = quant::quantize(data, rows, cols, QuantScheme::mx(el));
    out.bytes(p + ".weight", "U8", {rows, quant::code_row_bytes(el, cols)}, q.codes.data(),
              q.codes.size());
    out.bytes(p + ".weight_scale", "U8", {q.scale_rows, q.scale_cols}, q.scale_codes.data(),
              q.scale_codes.size());
    if (scheme.ends_with("_a8")) out.scalar(p + ".input_scale", act_amax / 448.0f);
    return;
  }
  throw Error(fmt::format("unknown fixture scheme '{}'", scheme));
}

// NVFP4: the projections in `rows_of` quantized as one tensor (one global scale), emitted apart:
// Quark's tensors, or compressed-tensors' (`ct`: its names, the global scales g themselves where
// Quark stores 1 / g; Quark's input_scale_2 is 1 / g_a too, so that both load bitwise alike).
void emit_nvfp4(Emitter& out, const std::vector<std::string>& names,
                const std::vector<const std::vector<float>*>& parts, int64_t rows, int64_t cols,
                std::optional<float> act_amax,
                const std::optional<quantization::CompressedTensorsConfig>& ct) {
  auto suffix = [&](const char* quark_suffix) {
    return "." + (ct ? ct->file_suffix(quark_suffix) : std::string(quark_suffix));
  };
  auto global = [&](const char* quark_suffix, float g) {  // the file's value of 1 / g
    return ct && ct->reciprocal_in_file(quark_suffix) ? g : 1.0f / g;
  };
  std::vector<float> all;
  for (const auto* p : parts)
    all.insert(all.end(), p->begin(), p->end());
  const int64_t total = rows * static_cast<int64_t>(parts.size());
  const quant::QuantizedTensor q = quant::quantize(all, total, cols, QuantScheme::nvfp4());
  const int64_t rb = (cols + 1) / 2, sc = q.scale_cols;
  for (size_t i = 0; i < names.size(); ++i) {
    const int64_t r0 = static_cast<int64_t>(i) * rows;
    out.bytes(names[i] + suffix("weight"), "U8", {rows, rb}, q.codes.data() + r0 * rb,
              static_cast<size_t>(rows * rb));
    out.bytes(names[i] + suffix("weight_scale"), "F8_E4M3", {rows, sc},
              q.scale_codes.data() + r0 * sc, static_cast<size_t>(rows * sc));
    out.scalar(names[i] + suffix("weight_scale_2"), global("weight_scale_2", q.global_scale));
    if (act_amax) {
      out.scalar(names[i] + suffix("input_scale_2"),
                 global("input_scale_2", 448.0f * 6.0f / *act_amax));
    }
  }
}

// Fused experts (layer/checkpoint.h): one tensor per projection for every expert, gate_up's outputs
// interleaved (gpt-oss: 2j gate j, 2j + 1 up j) or concatenated (Llama 4: gate, then up),
// unquantized matrices stored transposed (x @ W), MXFP4 ones as _blocks (E, N, K / 32, 16) and
// e8m0 _scales (E, N, K / 32); gpt-oss's bf16 biases.
void emit_fused_experts(Emitter& out, const std::string& experts, const ModelShape& m, bool mxfp4,
                        std::mt19937_64& rng, float s1, float s2) {
  const int64_t E = m.E, H = m.H, I = m.I;
  std::vector<float> gate_up(static_cast<size_t>(E * 2 * I * H));  // (E, 2I, H)
  std::vector<float> down;                                         // (E, H, I)
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<float> wg = uniform(rng, I * H, s1), wu = uniform(rng, I * H, s1);
    for (int64_t j = 0; j < I; ++j) {
      const int64_t g = m.gpt_oss ? 2 * j : j, u = m.gpt_oss ? 2 * j + 1 : I + j;
      for (int64_t h = 0; h < H; ++h) {
        gate_up[static_cast<size_t>((e * 2 * I + g) * H + h)] = wg[j * H + h];
        gate_up[static_cast<size_t>((e * 2 * I + u) * H + h)] = wu[j * H + h];
      }
    }
    const std::vector<float> wd = uniform(rng, H * I, s2);
    down.insert(down.end(), wd.begin(), wd.end());
  }
  struct Proj {
    std::string name;
    const std::vector<float>& w;
    int64_t N, K;
  };
  for (const Proj& p : {Proj{experts + ".gate_up_proj", gate_up, 2 * I, H},
                        Proj{experts + ".down_proj", down, H, I}}) {
    if (mxfp4) {
      const quant::QuantizedTensor q =
          quant::quantize(p.w, E * p.N, p.K, QuantScheme::mx(QuantDType::kFp4E2M1));
      out.bytes(p.name + "_blocks", "U8", {E, p.N, p.K / 32, 16}, q.codes.data(), q.codes.size());
      out.bytes(p.name + "_scales", "U8", {E, p.N, p.K / 32}, q.scale_codes.data(),
                q.scale_codes.size());
    } else {
      std::vector<float> t(p.w.size());  // (E, K, N)
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t n = 0; n < p.N; ++n) {
          for (int64_t k = 0; k < p.K; ++k)
            t[static_cast<size_t>((e * p.K + k) * p.N + n)] =
                p.w[static_cast<size_t>((e * p.N + n) * p.K + k)];
        }
      }
      out.bf16(p.name, {E, p.K, p.N}, t);
    }
    if (m.gpt_oss) out.bf16(p.name + "_bias", {E, p.N}, uniform(rng, E * p.N, 0.1f));
  }
}

bool is_checkpoint_file(const std::filesystem::path& p) {
  const std::string n = p.filename().string();
  return p.extension() == ".safetensors" || n == CheckpointDir::kIndexName || n == "config.json";
}

// Writes the shards (+ index when sharded) and config.json into the empty directory `dir`.
// Tensors are spread evenly: shard s holds entries [s * n / shards, (s + 1) * n / shards), so no
// shard is empty when shards <= n.
void write_files(const std::filesystem::path& dir, const std::vector<Entry>& entries, int shards,
                 const json& config) {
  const size_t n = entries.size();
  const auto ns = static_cast<size_t>(shards);
  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < ns; ++s) {
    const std::string file = shards == 1
                                 ? std::string("model.safetensors")
                                 : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards);
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (size_t i = s * n / ns; i < (s + 1) * n / ns; ++i) {
      const Entry& e = entries[i];
      total += e.data.size();
      weight_map[e.name] = file;
      w.add(e.name, e.dtype, e.shape, e.data);
    }
    w.write(dir / file);
  }
  auto write_text = [&](const std::string& name, const std::string& text) {
    std::ofstream f(dir / name);
    f << text;
    f.close();
    MOEKIT_CHECK(f.good(), "cannot write {}", (dir / name).string());
  };
  if (shards > 1) {
    json index;
    index["metadata"] = json{{"total_size", total}};
    index["weight_map"] = weight_map;
    write_text(std::string(CheckpointDir::kIndexName), index.dump(2));
  }
  write_text("config.json", config.dump(2) + "\n");
}

// Writes the checkpoint into a fresh sibling directory first, then swaps its files into `dir`
// (replacing the checkpoint files there). NOTE: any failure removes everything this call wrote,
// so a failed write never leaves a partial checkpoint (e.g. shards without config.json) behind.
void write_checkpoint(const std::filesystem::path& dir, const std::vector<Entry>& entries,
                      int shards, const json& config) {
  namespace fs = std::filesystem;
  fs::path target = dir.lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  const fs::path staging = target.parent_path() /
                           fmt::format(".{}.moekit-tmp-{}", target.filename().string(), ::getpid());
  std::vector<fs::path> placed;  // files already moved into `target`
  try {
    fs::remove_all(staging);
    fs::create_directories(staging);
    write_files(staging, entries, shards, config);
    fs::create_directories(target);
    std::vector<fs::path> old_files;
    for (const auto& f : fs::directory_iterator(target)) {
      if (!is_checkpoint_file(f.path())) continue;
      // Checked before anything is removed, so a failure keeps the old checkpoint whole.
      if (f.is_directory()) {
        throw Error(fmt::format("{} is a directory, not a checkpoint file that can be replaced",
                                f.path().string()));
      }
      old_files.push_back(f.path());
    }
    for (const fs::path& f : old_files)
      fs::remove(f);
    for (const auto& f : fs::directory_iterator(staging)) {
      const fs::path to = target / f.path().filename();
      fs::rename(f.path(), to);
      placed.push_back(to);
    }
    fs::remove_all(staging);
  } catch (const std::exception& e) {
    std::error_code ignored;
    for (const fs::path& p : placed)
      fs::remove(p, ignored);
    fs::remove_all(staging, ignored);
    throw Error(fmt::format("cannot write fixture checkpoint into {}: {}", dir.string(), e.what()));
  }
}

}  // namespace

const std::vector<std::string>& fixture_schemes() {
  static const std::vector<std::string> kSchemes = {
      "bf16",          "fp8_per_tensor",  "fp8_per_channel", "fp8_block128",      "w4a8_fp8",
      "w4a8_fp8_g128", "nvfp4",           "nvfp4_w4a16",     "mxfp4_w4a16",       "mxfp4_a8",
      "mxfp4_a4",      "mxfp6_e3m2",      "mxfp6_e2m3",      "mxfp6_e3m2_a8",     "mxfp6_e2m3_a8",
      "int8_w8a8",     "int8_per_tensor", "hf_fp8_block128", "hf_fp8_per_tensor", "hf_mxfp4",
      "ct_fp8_static", "ct_fp8_dynamic",  "ct_fp8_block128", "ct_int8_w8a8",      "ct_nvfp4",
      "ct_nvfp4a16",   "ct_w4afp8",       "mo_fp8",          "mo_nvfp4"};
  return kSchemes;
}

const std::vector<std::string>& fixture_models() {
  static const std::vector<std::string> kModels = {
      "tiny", "tiny-mixtral", "tiny-deepseek", "tiny-qwen2-moe", "tiny-gpt-oss", "tiny-llama4"};
  return kModels;
}

bool fixture_scheme_fits(const std::string& scheme, const std::string& model) {
  const ModelShape m = model_shape(model);
  return scheme == "bf16" || (!m.llama4 && m.gpt_oss == (scheme == "hf_mxfp4"));
}

std::string fixture_quantization_config(const std::string& scheme) {
  if (scheme == "bf16") return "";
  // The names the fp8 benchmarks use for two of the schemes.
  const std::string name = scheme == "fp8_tensor"          ? "fp8_per_tensor"
                           : scheme == "fp8_channel_token" ? "fp8_per_channel"
                                                           : scheme;
  return quark_config(quark_scheme_of(name), false).dump(2);
}

void write_fixture_checkpoint(const std::filesystem::path& dir, const FixtureOptions& options) {
  const ModelShape m = model_shape(options.model);
  const std::string& scheme = options.scheme;
  const std::vector<std::string>& known = fixture_schemes();
  if (std::find(known.begin(), known.end(), scheme) == known.end()) {
    throw Error(
        fmt::format("unknown fixture scheme '{}'; known: {}", scheme, fmt::join(known, ", ")));
  }
  if (!fixture_scheme_fits(scheme, options.model)) {
    throw Error(m.gpt_oss || m.llama4
                    ? fmt::format("fixture model {} stores fused experts, which load unquantized "
                                  "(bf16){}, not as {}",
                                  options.model,
                                  m.gpt_oss ? " or as HuggingFace MXFP4 (hf_mxfp4)" : "", scheme)
                    : fmt::format("fixture model {}: scheme {} is gpt-oss's checkpoint "
                                  "format; use --model tiny-gpt-oss",
                                  options.model, scheme));
  }
  json cfg = config_json(m, scheme);
  if (const std::optional<quantization::HfFp8Config> hf = hf_fp8_of(scheme)) {
    cfg["quantization_config"] = hf->to_json();
  } else if (const auto ct = compressed_tensors_of(scheme)) {
    cfg["quantization_config"] = ct->to_json();
  } else if (const auto mo = modelopt_of(scheme)) {
    cfg["quantization_config"] = mo->to_json();
  } else if (scheme == "hf_mxfp4") {
    cfg["quantization_config"] = hf_mxfp4_config().to_json();
  } else if (scheme != "bf16") {
    cfg["quantization_config"] = quark_config(scheme, m.deepseek);
  }
  std::mt19937_64 rng(options.seed * 7919 + 17);
  Emitter out;
  const int64_t H = m.H, I = m.I;
  const float s1 = 2.0f / std::sqrt(static_cast<float>(H));
  const float s2 = 2.0f / std::sqrt(static_cast<float>(I));
  // Expected input bounds: x in [-1, 1]; the intermediate stays within ~4.
  const float a13 = 1.0f, a2 = 4.0f;
  for (int n = 0; n < m.layers; ++n) {
    if (n < m.first_dense) {
      const std::string p = fmt::format("model.layers.{}.mlp", n);
      const int64_t Id = 2 * I;
      out.bf16(p + ".gate_proj.weight", {Id, H}, uniform(rng, Id * H, s1));
      out.bf16(p + ".up_proj.weight", {Id, H}, uniform(rng, Id * H, s1));
      out.bf16(p + ".down_proj.weight", {H, Id}, uniform(rng, H * Id, s2));
      continue;
    }
    const std::string moe = m.llama4 ? fmt::format("language_model.model.layers.{}.feed_forward", n)
                                     : fmt::format("model.layers.{}.{}", n,
                                                   m.mixtral_names ? "block_sparse_moe" : "mlp");
    const bool fused = m.gpt_oss || m.llama4;
    const std::string router = moe + (fused ? ".router" : ".gate");
    out.bf16(router + ".weight", {m.E, H}, uniform(rng, m.E * H, 1.0f / std::sqrt(float(H))));
    if (m.gpt_oss) out.bf16(router + ".bias", {m.E}, uniform(rng, m.E, 0.5f));
    if (m.llama4) {
      const std::string sp = moe + ".shared_expert";
      out.bf16(sp + ".gate_proj.weight", {I, H}, uniform(rng, I * H, s1));
      out.bf16(sp + ".up_proj.weight", {I, H}, uniform(rng, I * H, s1));
      out.bf16(sp + ".down_proj.weight", {H, I}, uniform(rng, H * I, s2));
    }
    if (fused) {
      emit_fused_experts(out, moe + ".experts", m, scheme == "hf_mxfp4", rng, s1, s2);
      continue;
    }
    if (m.deepseek) {
      out.f32(moe + ".gate.e_score_correction_bias", {m.E}, uniform(rng, m.E, 0.05f));
      const std::string sp = moe + ".shared_experts";
      out.bf16(sp + ".gate_proj.weight", {I, H}, uniform(rng, I * H, s1));
      out.bf16(sp + ".up_proj.weight", {I, H}, uniform(rng, I * H, s1));
      out.bf16(sp + ".down_proj.weight", {H, I}, uniform(rng, H * I, s2));
    }
    if (m.qwen2) {
      const std::string sp = moe + ".shared_expert";
      const int64_t Is = 2 * I;
      out.bf16(sp + ".gate_proj.weight", {Is, H}, uniform(rng, Is * H, s1));
      out.bf16(sp + ".up_proj.weight", {Is, H}, uniform(rng, Is * H, s1));
      out.bf16(sp + ".down_proj.weight", {H, Is}, uniform(rng, H * Is, s2 / std::sqrt(2.0f)));
      out.bf16(moe + ".shared_expert_gate.weight", {1, H}, uniform(rng, H, s1));
    }
    const char* g = m.mixtral_names ? "w1" : "gate_proj";
    const char* u = m.mixtral_names ? "w3" : "up_proj";
    const char* d = m.mixtral_names ? "w2" : "down_proj";
    for (int e = 0; e < m.E; ++e) {
      const std::string p = fmt::format("{}.experts.{}.", moe, e);
      const std::vector<float> wg = uniform(rng, I * H, s1);
      const std::vector<float> wu = uniform(rng, I * H, s1);
      const std::vector<float> wd = uniform(rng, H * I, s2);
      // Static activation bounds differ a little per expert (exercises the max reduction).
      const float vary = 1.0f + 0.02f * static_cast<float>(e);
      if (quark_scheme_of(scheme) == "nvfp4" || quark_scheme_of(scheme) == "nvfp4_w4a16") {
        const bool w4a4 = quark_scheme_of(scheme) == "nvfp4";  // W4A16: no input scales
        const auto ct = compressed_tensors_of(scheme);
        emit_nvfp4(out, {p + g, p + u}, {&wg, &wu}, I, H,
                   w4a4 ? std::optional<float>(a13 * vary) : std::nullopt, ct);
        emit_nvfp4(out, {p + d}, {&wd}, H, I, w4a4 ? std::optional<float>(a2 * vary) : std::nullopt,
                   ct);
        continue;
      }
      emit_projection(out, p + g, wg, I, H, scheme, a13 * vary);
      emit_projection(out, p + u, wu, I, H, scheme, a13 * vary);
      emit_projection(out, p + d, wd, H, I, scheme, a2 * vary);
    }
  }
  const auto num_tensors = static_cast<int64_t>(out.entries.size());
  if (options.num_shards < 1 || options.num_shards > num_tensors) {
    throw Error(fmt::format(
        "fixture checkpoint: num_shards={} must be in [1, {}]: every shard file holds at least "
        "one of the {} tensors of the {} {} checkpoint",
        options.num_shards, num_tensors, num_tensors, options.model, scheme));
  }
  if (const auto mo = modelopt_of(scheme)) {  // ModelOpt's names of the Quark suffixes
    const std::string from = ".input_scale_2", to = "." + mo->file_suffix("input_scale_2");
    for (Entry& e : out.entries) {
      if (e.name.size() > from.size() && e.name.ends_with(from)) {
        e.name = e.name.substr(0, e.name.size() - from.size()) + to;
      }
    }
  }
  write_checkpoint(dir, out.entries, options.num_shards, cfg);
}

}  // namespace moekit::io
