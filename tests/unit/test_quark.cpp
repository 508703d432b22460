// Quark: config parsing and matching, every branch and error of the MoE method selection, the
// parameters each method declares, and process_weights_after_loading's checks and conversions.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "moekit/quant/formats.h"
#include "moekit/quantization/quark/quark_config.h"
#include "moekit/quantization/quark/quark_moe.h"
#include "testing.h"

namespace moekit::quark {
namespace {

// Errors here may come from the safetensors layer (std::runtime_error) as well as moekit::Error.
template <typename Fn>
std::string error_of(Fn&& fn) {
  return testing::error_of<std::exception>(std::forward<Fn>(fn));
}

namespace qk = quant_keys;

const char* kFp8T = R"({"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": false})";
const char* kFp8TDyn = R"({"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": true})";
const char* kFp8C = R"({"dtype": "fp8_e4m3", "qscheme": "per_channel", "is_dynamic": false})";
const char* kFp8CDyn = R"({"dtype": "fp8_e4m3", "qscheme": "per_channel", "is_dynamic": true})";
const char* kFp4Mx = R"({"dtype": "fp4", "qscheme": "per_group", "group_size": 32,
                         "scale_format": "e8m0", "is_dynamic": false})";
const char* kFp4MxDyn = R"({"dtype": "fp4", "qscheme": "per_group", "group_size": 32,
                            "scale_format": "e8m0", "is_dynamic": true})";
const char* kE3m2Mx = R"({"dtype": "fp6_e3m2", "qscheme": "per_group", "group_size": 32,
                          "scale_format": "e8m0", "is_dynamic": false})";
const char* kE3m2MxDyn = R"({"dtype": "fp6_e3m2", "qscheme": "per_group", "group_size": 32,
                             "scale_format": "e8m0", "is_dynamic": true})";
const char* kE2m3Mx = R"({"dtype": "fp6_e2m3", "qscheme": "per_group", "group_size": 32,
                          "scale_format": "e8m0", "is_dynamic": false})";
const char* kE2m3MxDyn = R"({"dtype": "fp6_e2m3", "qscheme": "per_group", "group_size": 32,
                             "scale_format": "e8m0", "is_dynamic": true})";
const char* kInt8C = R"({"dtype": "int8", "qscheme": "per_channel", "is_dynamic": false,
                         "symmetric": true})";
const char* kInt8T = R"({"dtype": "int8", "qscheme": "per_tensor", "is_dynamic": false})";
const char* kInt8CDyn = R"({"dtype": "int8", "qscheme": "per_channel", "is_dynamic": true})";
const char* kNvW = R"([{"dtype": "fp4", "qscheme": "per_group", "group_size": 16,
                        "is_dynamic": false},
                       {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": false}])";
const char* kNvA = R"([{"dtype": "fp4", "qscheme": "per_group", "group_size": 16,
                        "is_dynamic": true},
                       {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": false}])";
const char* kW4A8W = R"([{"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": false},
                         {"dtype": "int4", "qscheme": "per_channel", "ch_axis": 0,
                          "symmetric": true, "is_dynamic": false}])";
const char* kInt4G128 = R"({"dtype": "int4", "qscheme": "per_group", "group_size": 128,
                            "ch_axis": 1, "symmetric": true, "is_dynamic": false})";

std::string layer_json(const std::string& w, const std::string& a, const std::string& extra = "") {
  return "{\"weight\": " + w + ", \"input_tensors\": " + a + extra + "}";
}

QuarkConfig config(const std::string& w, const std::string& a, const std::string& tail = "") {
  return QuarkConfig::parse(
      "{\"quant_method\": \"quark\", \"global_quant_config\": " + layer_json(w, a) + tail + "}");
}

QuarkMoETarget target(const std::string& w, const std::string& a) {
  return get_moe_method_target(config(w, a), "model.layers.1.mlp.experts");
}

MoEConfig make_moe(int E = 4, int64_t H = 64, int64_t I = 32, bool bias = false) {
  MoEConfig moe;
  moe.num_experts = moe.num_local_experts = moe.num_logical_experts = E;
  moe.experts_per_token = 2;
  moe.hidden_dim = moe.hidden_dim_unpadded = H;
  moe.intermediate_size = moe.intermediate_size_per_partition_unpadded = I;
  moe.in_dtype = DType::kBF16;
  moe.device = DeviceInfo{};
  moe.has_bias = bias;
  return moe;
}

std::unique_ptr<QuarkMoEMethod> method(const std::string& w, const std::string& a,
                                       MoEConfig moe = make_moe()) {
  const QuarkConfig c = config(w, a);
  return get_moe_method(c, moe, get_moe_method_target(c, "model.layers.1.mlp.experts"));
}

#define EXPECT_ERROR_HAS(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

// ---- matching -----------------------------------------------------------------------------

TEST(QuarkMatch, Fp8W8A8Branches) {
  auto t = target(kFp8T, kFp8T);
  EXPECT_EQ(t.scheme, QuarkMoEScheme::kW8A8Fp8);
  EXPECT_EQ(t.weight_key, qk::kFp8StaticTensorSym);
  EXPECT_EQ(t.activation_key, qk::kFp8StaticTensorSym);
  t = target(kFp8T, kFp8TDyn);
  EXPECT_EQ(t.activation_key, qk::kFp8DynamicTensorSym);
  t = target(kFp8C, kFp8CDyn);
  EXPECT_EQ(t.weight_key, qk::kFp8StaticChannelSym);
  EXPECT_EQ(t.activation_key, qk::kFp8DynamicTokenSym);
  const std::string block = R"({"dtype": "fp8_e4m3", "qscheme": "per_block",
                                "block_size": [128, 128], "is_dynamic": false})";
  const std::string group = R"({"dtype": "fp8_e4m3", "qscheme": "per_group", "group_size": 128,
                                "is_dynamic": true})";
  t = target(block, group);
  EXPECT_EQ(t.weight_key, qk::kFp8Static128BlockSym);
  EXPECT_EQ(t.activation_key, qk::kFp8Dynamic128Sym);
  const std::string e8m0 = R"({"dtype": "fp8_e4m3", "qscheme": "per_block", "block_size": [128,
                               128], "scale_type": "float8_e8m0fnu"})";
  EXPECT_EQ(target(e8m0, group).weight_key, qk::kFp8Static128BlockE8M0Sym);
  // Not fp8 W8A8: a 64x64 block, static per-channel activations, a dynamic weight.
  const std::string b64 = R"({"dtype": "fp8_e4m3", "qscheme": "per_block", "block_size": [64,64]})";
  EXPECT_ERROR_HAS(target(b64, group), "Unsupported FusedMoe scheme");
  EXPECT_ERROR_HAS(target(kFp8C, kFp8C), "Unsupported FusedMoe scheme");
  EXPECT_ERROR_HAS(target(kFp8TDyn, kFp8T), "Unsupported FusedMoe scheme");
  EXPECT_FALSE(is_fp8_w8a8(nullptr, nullptr).has_value());
}

TEST(QuarkMatch, OcpMxBranches) {
  auto t = target(kFp4Mx, "null");
  EXPECT_EQ(t.scheme, QuarkMoEScheme::kOcpMx);
  EXPECT_EQ(t.weight_key, qk::kMxfp4Static);
  EXPECT_FALSE(t.activation_key.has_value());
  EXPECT_EQ(target(kFp4Mx, kFp4MxDyn).activation_key, qk::kMxfp4Dynamic);
  EXPECT_EQ(target(kE3m2Mx, kE3m2MxDyn).weight_key, qk::kMxfp6E3M2Static);
  EXPECT_EQ(target(kE2m3Mx, kE2m3MxDyn).activation_key, qk::kMxfp6E2M3Dynamic);
  EXPECT_EQ(target(kFp4Mx, kE3m2MxDyn).activation_key, qk::kMxfp6E3M2Dynamic);
  EXPECT_EQ(target(kFp4Mx, kFp8T).activation_key, qk::kFp8StaticTensorSym);
  EXPECT_EQ(target(kFp4Mx, kFp8TDyn).activation_key, qk::kFp8DynamicTensorSym);
  // Static fp8 activations only where allowed (the MoE path allows them).
  QuantSpec w;
  w.dtype = "fp4";
  w.qscheme = "per_group";
  w.group_size = 32;
  w.scale_format = "e8m0";
  QuantSpec a;
  a.dtype = "fp8_e4m3";
  a.qscheme = "per_tensor";
  a.is_dynamic = false;
  EXPECT_FALSE(is_w_ocp_mx_a_x(&w, &a, false).has_value());
  EXPECT_TRUE(is_w_ocp_mx_a_x(&w, &a, true).has_value());
  // Wrong group size / scale format / static MX activations: nothing matches.
  const std::string g16 = R"({"dtype": "fp4", "qscheme": "per_group", "group_size": 16,
                              "scale_format": "e8m0"})";
  EXPECT_ERROR_HAS(target(g16, "null"), "Unsupported FusedMoe scheme");
  const std::string nofmt = R"({"dtype": "fp4", "qscheme": "per_group", "group_size": 32})";
  EXPECT_ERROR_HAS(target(nofmt, "null"), "Unsupported FusedMoe scheme");
  EXPECT_ERROR_HAS(target(kFp4Mx, kFp4Mx), "Unsupported FusedMoe scheme");
}

TEST(QuarkMatch, Int8Branches) {
  auto t = target(kInt8C, kInt8CDyn);
  EXPECT_EQ(t.scheme, QuarkMoEScheme::kW8A8Int8);
  EXPECT_EQ(t.weight_key, qk::kInt8StaticChannelSym);
  EXPECT_EQ(t.activation_key, qk::kInt8DynamicTokenSym);
  t = target(kInt8T, kInt8T);
  EXPECT_EQ(t.weight_key, qk::kInt8StaticTensorSym);
  EXPECT_EQ(t.activation_key, qk::kInt8StaticTensorSym);
  const std::string dyn_t = R"({"dtype": "int8", "qscheme": "per_tensor", "is_dynamic": true})";
  EXPECT_EQ(target(kInt8C, dyn_t).activation_key, qk::kInt8DynamicTensorSym);
  // Asymmetric activations match, with an asymmetric key the method does not support.
  const std::string asym = R"({"dtype": "int8", "qscheme": "per_channel", "is_dynamic": true,
                               "symmetric": false})";
  t = target(kInt8C, asym);
  ASSERT_TRUE(t.activation_key.has_value());
  EXPECT_FALSE(t.activation_key->symmetric);
  EXPECT_ERROR_HAS(method(kInt8C, asym), "Unsupported activation quant key");
  // Asymmetric weights, static per-channel activations: unsupported.
  const std::string wasym = R"({"dtype": "int8", "qscheme": "per_channel", "symmetric": false})";
  EXPECT_ERROR_HAS(target(wasym, kInt8CDyn), "Unsupported FusedMoe scheme");
  const std::string static_c = R"({"dtype": "int8", "qscheme": "per_channel"})";
  EXPECT_ERROR_HAS(target(kInt8C, static_c), "Unsupported FusedMoe scheme");
}

TEST(QuarkMatch, Int4GroupsWithFp8Activations) {
  // Per-token fp8 (per_channel or per_token, dynamic) or static per-tensor fp8.
  auto t = target(kInt4G128, kFp8CDyn);
  EXPECT_EQ(t.scheme, QuarkMoEScheme::kW4A8Fp8);
  EXPECT_EQ(t.weight_key, qk::kInt4W4A8StaticGroup128Sym);
  EXPECT_EQ(t.activation_key, qk::kFp8DynamicTokenSym);
  const std::string per_token = R"({"dtype": "fp8_e4m3", "qscheme": "per_token",
                                    "is_dynamic": true})";
  EXPECT_EQ(target(kInt4G128, per_token).activation_key, qk::kFp8DynamicTokenSym);
  EXPECT_EQ(target(kInt4G128, kFp8T).activation_key, qk::kFp8StaticTensorSym);
  const std::string last_axis = R"({"dtype": "int4", "qscheme": "per_group", "group_size": 128,
                                    "ch_axis": -1})";
  EXPECT_EQ(target(last_axis, kFp8CDyn).weight_key, qk::kInt4W4A8StaticGroup128Sym);
  // Not the form: other group sizes, groups along N, asymmetric or dynamic weights, dynamic
  // per-tensor or no activation quantization.
  for (const char* w : {R"({"dtype": "int4", "qscheme": "per_group", "group_size": 64})",
                        R"({"dtype": "int4", "qscheme": "per_group", "group_size": 128,
                            "ch_axis": 0})",
                        R"({"dtype": "int4", "qscheme": "per_group", "group_size": 128,
                            "symmetric": false})",
                        R"({"dtype": "int4", "qscheme": "per_group", "group_size": 128,
                            "is_dynamic": true})"}) {
    EXPECT_ERROR_HAS(target(w, kFp8CDyn), "Unsupported FusedMoe scheme") << w;
  }
  EXPECT_ERROR_HAS(target(kInt4G128, kFp8TDyn), "Unsupported FusedMoe scheme");
  EXPECT_ERROR_HAS(target(kInt4G128, "null"), "Unsupported FusedMoe scheme");
}

TEST(QuarkMatch, TwoEntryLists) {
  auto t = target(kNvW, kNvA);
  EXPECT_EQ(t.scheme, QuarkMoEScheme::kNvfp4);
  EXPECT_EQ(t.weight_key, qk::kNvfp4Static);
  EXPECT_EQ(t.activation_key, qk::kNvfp4Dynamic);
  t = target(kW4A8W, kFp8TDyn);
  EXPECT_EQ(t.scheme, QuarkMoEScheme::kW4A8Fp8);
  EXPECT_EQ(t.weight_key, qk::kInt4W4A8StaticChannelSym);
  EXPECT_EQ(t.activation_key, qk::kFp8DynamicTokenSym);
  EXPECT_EQ(target(kW4A8W, kFp8T).activation_key, qk::kFp8StaticTensorSym);
  // A two-entry list that is neither: the seed's error, not a fall-through to the single path.
  EXPECT_ERROR_HAS(target(kNvW, kFp8T), "Unsupported FusedMoe scheme");
  const std::string nv32 = R"([{"dtype": "fp4", "qscheme": "per_group", "group_size": 32},
                               {"dtype": "fp8_e4m3", "qscheme": "per_tensor"}])";
  EXPECT_ERROR_HAS(target(nv32, kNvA), "Unsupported FusedMoe scheme");
  // One-element lists unwrap to the single-spec path.
  EXPECT_EQ(target(std::string("[") + kFp8T + "]", std::string("[") + kFp8T + "]").scheme,
            QuarkMoEScheme::kW8A8Fp8);
}

TEST(QuarkMatch, RejectsOutputAndBiasQuantizationAndUnquantizedWeights) {
  const QuarkConfig out = QuarkConfig::parse(
      std::string(R"({"quant_method": "quark", "global_quant_config": {"weight": )") + kFp8T +
      R"(, "input_tensors": )" + kFp8T + R"(, "output_tensors": )" + kFp8T + "}}");
  EXPECT_ERROR_HAS(get_moe_method_target(out, "model.layers.0.mlp.experts"),
                   "output_tensors and bias quantized are not supported");
  const QuarkConfig bias = QuarkConfig::parse(
      std::string(R"({"quant_method": "quark", "global_quant_config": {"weight": )") + kFp8T +
      R"(, "input_tensors": )" + kFp8T + R"(, "bias": )" + kFp8T + "}}");
  EXPECT_ERROR_HAS(get_moe_method_target(bias, "model.layers.0.mlp.experts"),
                   "output_tensors and bias");
  EXPECT_ERROR_HAS(target("null", kFp8T), "Unsupported FusedMoe scheme");
  QuarkMoETarget none;
  EXPECT_ERROR_HAS(get_moe_method(QuarkConfig{}, make_moe(), none), "Unsupported FusedMoe scheme");
}

TEST(QuarkMatch, LayerPatternsTypesExcludesAndShards) {
  const std::string tail =
      R"(, "layer_quant_config": {"model.layers.2.mlp.experts*": )" +
      layer_json(kInt8C, kInt8CDyn) + R"(}, "layer_type_quant_config": {"FusedMoE": )" +
      layer_json(kFp4Mx, "null") +
      R"(}, "exclude": ["lm_head", "re:model\\.layers\\.[3-4]\\..*", "*.layers.5.mlp.experts"])";
  const QuarkConfig c = config(kFp8T, kFp8T, tail);
  EXPECT_EQ(get_moe_method_target(c, "model.layers.2.mlp.experts").scheme,
            QuarkMoEScheme::kW8A8Int8);
  EXPECT_EQ(get_moe_method_target(c, "model.layers.1.mlp.experts").scheme,
            QuarkMoEScheme::kOcpMx);  // the layer type beats the global config
  EXPECT_EQ(get_moe_method_target(c, "model.layers.1.mlp.experts", "Linear").scheme,
            QuarkMoEScheme::kW8A8Fp8);
  EXPECT_TRUE(c.is_excluded("lm_head"));
  EXPECT_TRUE(c.is_excluded("model.layers.3.mlp.experts"));
  EXPECT_TRUE(c.is_excluded("model.layers.5.mlp.experts"));
  EXPECT_FALSE(c.is_excluded("model.layers.1.mlp.experts"));
  EXPECT_FALSE(c.is_excluded("xlm_head"));
  // Per-projection configs: the fused shards must agree.
  const QuarkConfig shards = config(kFp8T, kFp8T,
                                    R"(, "layer_quant_config": {"*.experts.*.down_proj": )" +
                                        layer_json(kInt8C, kInt8CDyn) + "}");
  EXPECT_ERROR_HAS(shards.find_matched_config("model.layers.0.mlp.experts"),
                   "model.layers.0.mlp.experts.0.down_proj");
  const QuarkConfig agree =
      config(kFp8T, kFp8T,
             R"(, "layer_quant_config": {"*.experts.*_proj": )" + layer_json(kFp4Mx, "null") +
                 R"(, "*.experts.*.w[123]": )" + layer_json(kFp4Mx, "null") + "}");
  EXPECT_EQ(get_moe_method_target(agree, "model.layers.0.mlp.experts").scheme,
            QuarkMoEScheme::kOcpMx);
  const QuarkConfig bad_re = config(kFp8T, kFp8T, R"(, "exclude": ["re:("])");
  EXPECT_ERROR_HAS(bad_re.is_excluded("x"), "not a valid regular expression");
  // A back-reference or bound of 19+ digits would overflow inside the regex compiler.
  const QuarkConfig long_number =
      config(kFp8T, kFp8T, R"(, "exclude": ["re:a\\4444444444444444444444"])");
  EXPECT_ERROR_HAS(long_number.is_excluded("x"), "more than 9 digits");
  const QuarkConfig layer_index = config(kFp8T, kFp8T, R"(, "exclude": ["re:x\\.123456789"])");
  EXPECT_TRUE(layer_index.is_excluded("x.123456789"));
}

TEST(QuarkMatch, Fnmatch) {
  EXPECT_TRUE(fnmatch("*", ""));
  EXPECT_TRUE(fnmatch("model.*.experts", "model.layers.3.mlp.experts"));
  EXPECT_FALSE(fnmatch("model.*.experts", "model.layers.3.mlp.experts.0"));
  EXPECT_TRUE(fnmatch("a?c", "abc"));
  EXPECT_FALSE(fnmatch("a?c", "ac"));
  EXPECT_TRUE(fnmatch("w[13]", "w3"));
  EXPECT_FALSE(fnmatch("w[13]", "w2"));
  EXPECT_TRUE(fnmatch("w[!13]", "w2"));
  EXPECT_TRUE(fnmatch("w[0-9]x", "w7x"));
  EXPECT_TRUE(fnmatch("*a*b*c", "xxaxxbxxc"));
  EXPECT_FALSE(fnmatch("*a*b*c", "xxaxxcxxb"));
  EXPECT_TRUE(fnmatch("[", "["));
}

// ---- method construction errors -------------------------------------------------------------

TEST(QuarkMethod, Fp8MixesTheSeedRejects) {
  const MoEConfig moe = make_moe();
  EXPECT_ERROR_HAS(QuarkW8A8Fp8MoEMethod(moe, qk::kFp8StaticTensorSym, qk::kFp8DynamicTokenSym),
                   "only per-tensor and per-channel scales");
  EXPECT_ERROR_HAS(QuarkW8A8Fp8MoEMethod(moe, qk::kFp8StaticChannelSym, qk::kFp8StaticTensorSym),
                   "channelwise, dynamic per token");
  EXPECT_ERROR_HAS(QuarkW8A8Fp8MoEMethod(moe, qk::kFp8StaticChannelSym, qk::kFp8DynamicTensorSym),
                   "only per-tensor and per-channel scales");
  EXPECT_ERROR_HAS(QuarkW8A8Fp8MoEMethod(moe, qk::kFp8Static128BlockSym, qk::kFp8DynamicTokenSym),
                   "(1, 128) groups");
  EXPECT_ERROR_HAS(QuarkW8A8Fp8MoEMethod(moe, qk::kMxfp4Static, qk::kFp8StaticTensorSym),
                   "Unsupported weight quant key");
  EXPECT_ERROR_HAS(QuarkW8A8Fp8MoEMethod(moe, qk::kFp8StaticTensorSym, std::nullopt),
                   "Unsupported activation quant key: None");
  EXPECT_ERROR_HAS(QuarkNvfp4MoEMethod(moe, qk::kMxfp4Dynamic), "Unsupported activation quant key");
  EXPECT_ERROR_HAS(
      QuarkW4A8Fp8MoEMethod(moe, qk::kInt4W4A8StaticChannelSym, qk::kFp8DynamicTensorSym),
      "Unsupported activation quant key");
  EXPECT_ERROR_HAS(QuarkW4A8Fp8MoEMethod(moe, qk::kFp8StaticTensorSym, qk::kFp8DynamicTokenSym),
                   "Unsupported weight quant key");
}

TEST(QuarkMethod, OcpMxSchemesAndErrors) {
  EXPECT_EQ(ocp_mx_scheme_from_quant_dtype(std::nullopt, "mxfp4"), "w_mxfp4");
  EXPECT_EQ(ocp_mx_scheme_from_quant_dtype("fp8", "mxfp6_e2m3"), "w_mxfp6_e2m3_a_fp8");
  EXPECT_EQ(ocp_mx_scheme_from_quant_dtype("mxfp6_e3m2", "mxfp4"), "w_mxfp4_a_mxfp6_e3m2");
  EXPECT_FALSE(ocp_mx_scheme_from_quant_dtype(std::nullopt, "mxfp6_e3m2").has_value());
  EXPECT_FALSE(ocp_mx_scheme_from_quant_dtype("mxfp4", "mxfp6_e3m2").has_value());
  const auto m = method(kFp4Mx, kE2m3MxDyn);
  auto* mx = dynamic_cast<QuarkOcpMxMoEMethod*>(m.get());
  ASSERT_NE(mx, nullptr);
  EXPECT_EQ(mx->ocp_mx_scheme(), "w_mxfp4_a_mxfp6_e2m3");
  EXPECT_EQ(mx->backend(), "emulation");
  EXPECT_TRUE(mx->supports_eplb());
  EXPECT_EQ(dynamic_cast<QuarkOcpMxMoEMethod&>(*method(kFp4Mx, kFp8T)).ocp_mx_scheme(),
            "w_mxfp4_a_fp8");
  EXPECT_ERROR_HAS(method(kE3m2Mx, "null"),
                   "Unsupported OCP MX dtype combination for MoE: "
                   "input_dtype=None, weight_dtype=mxfp6_e3m2");
  EXPECT_ERROR_HAS(method(kE3m2Mx, kFp4MxDyn), "input_dtype=mxfp4, weight_dtype=mxfp6_e3m2");
  EXPECT_ERROR_HAS(method(kFp4Mx, kFp8TDyn),
                   "dynamic input scales is currently not implemented for OCP MX scheme "
                   "w_mxfp4_a_fp8");
  EXPECT_ERROR_HAS(QuarkOcpMxMoEMethod(make_moe(), qk::kMxfp4Static, qk::kFp8DynamicTokenSym),
                   "Unsupported activation quant key");
  // mxfp6 weights with static fp8 activations: the original has no fused MoE quant config for
  // them; moekit's is MXFP4's with MXFP6 weights (the per-expert input scales' maximum).
  auto m6 = method(kE3m2Mx, kFp8T);
  ExpertParams p;
  m6->create_weights(p, 4, 64, 32, DType::kBF16);
  p.replace("w13_input_scale",
            Tensor::from_floats(std::vector<float>{0.5f, 2.0f, 1.0f, 0.25f}, {4}, DType::kF32));
  p.replace("w2_input_scale",
            Tensor::from_floats(std::vector<float>{1.0f, 1.0f, 3.0f, 1.0f}, {4}, DType::kF32));
  m6->process_weights_after_loading(p);
  const QuantConfig q = m6->get_fused_moe_quant_config(p);
  EXPECT_EQ(q.w1.dtype, QuantDType::kFp6E3M2);
  EXPECT_EQ(q.a1.dtype, QuantDType::kFp8E4M3);
  EXPECT_TRUE(q.a1.shape.is_per_tensor());
  EXPECT_EQ(q.a1.scale.to_float_vector(), std::vector<float>{2.0f});
  EXPECT_EQ(q.a2.scale.to_float_vector(), std::vector<float>{3.0f});
  EXPECT_EQ(quant_keys_of(q).second, qk::kFp8StaticTensorSym);
}

TEST(QuarkMethod, RoundupSizes) {
  const auto mx = method(kFp4Mx, kFp4MxDyn);
  EXPECT_EQ(mx->maybe_roundup_sizes(70, 40, DType::kBF16, ParallelConfig{}),
            (std::pair<int64_t, int64_t>{96, 64}));
  EXPECT_EQ(mx->maybe_roundup_sizes(64, 32, DType::kBF16, ParallelConfig{}),
            (std::pair<int64_t, int64_t>{64, 32}));
  const auto fp8 = method(kFp8T, kFp8T);
  EXPECT_EQ(fp8->maybe_roundup_sizes(70, 40, DType::kBF16, ParallelConfig{}),
            (std::pair<int64_t, int64_t>{70, 40}));
}

// ---- create_weights ---------------------------------------------------------------------------

struct Expect {
  std::string name;
  Shape shape;
  DType dtype;
};

void expect_params(const QuarkMoEMethod& m, const std::vector<Expect>& want, bool bias = false) {
  SCOPED_TRACE(m.name());
  ExpertParams p;
  m.create_weights(p, 4, 64, 32, DType::kBF16);
  std::vector<std::string> names;
  for (const Expect& e : want) {
    names.push_back(e.name);
    ASSERT_TRUE(p.has(e.name)) << e.name;
    EXPECT_EQ(p.spec(e.name).shape, e.shape) << e.name;
    EXPECT_EQ(p.spec(e.name).dtype, e.dtype) << e.name;
    EXPECT_EQ(p.get(e.name).shape(), e.shape) << e.name;
  }
  if (bias) {
    names.push_back("w13_bias");
    names.push_back("w2_bias");
    EXPECT_EQ(p.spec("w13_bias").shape, (Shape{4, 64}));
    EXPECT_EQ(p.spec("w2_bias").shape, (Shape{4, 64}));
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(p.names(), names);
}

TEST(QuarkCreateWeights, EverySchemeNamesShapesDtypes) {
  const DType f32 = DType::kF32, u8 = DType::kUInt8;
  expect_params(*method(kFp8T, kFp8T), {{"w13_weight", {4, 64, 64}, DType::kFp8E4M3},
                                        {"w2_weight", {4, 64, 32}, DType::kFp8E4M3},
                                        {"w13_weight_scale", {4, 2}, f32},
                                        {"w2_weight_scale", {4}, f32},
                                        {"w13_input_scale", {4}, f32},
                                        {"w2_input_scale", {4}, f32}});
  expect_params(*method(kFp8C, kFp8CDyn), {{"w13_weight", {4, 64, 64}, DType::kFp8E4M3},
                                           {"w2_weight", {4, 64, 32}, DType::kFp8E4M3},
                                           {"w13_weight_scale", {4, 64, 1}, f32},
                                           {"w2_weight_scale", {4, 64, 1}, f32}});
  expect_params(*method(kInt8T, kInt8T), {{"w13_weight", {4, 64, 64}, DType::kInt8},
                                          {"w2_weight", {4, 64, 32}, DType::kInt8},
                                          {"w13_weight_scale", {4, 2}, f32},
                                          {"w2_weight_scale", {4}, f32},
                                          {"w13_input_scale", {4}, f32},
                                          {"w2_input_scale", {4}, f32}});
  expect_params(*method(kW4A8W, kFp8TDyn), {{"w13_weight", {4, 64, 32}, u8},
                                            {"w2_weight", {4, 64, 16}, u8},
                                            {"w13_weight_scale", {4, 64, 1}, f32},
                                            {"w2_weight_scale", {4, 64, 1}, f32},
                                            {"w13_weight_scale_2", {4, 2}, f32},
                                            {"w2_weight_scale_2", {4}, f32}});
  // Groups of 128: ceil(K / 128) scales per row (H = 64, I = 32: one group each), no second
  // stage; static activations add the input scales.
  expect_params(*method(kInt4G128, kFp8T), {{"w13_weight", {4, 64, 32}, u8},
                                            {"w2_weight", {4, 64, 16}, u8},
                                            {"w13_weight_scale", {4, 64, 1}, f32},
                                            {"w2_weight_scale", {4, 64, 1}, f32},
                                            {"w13_input_scale", {4}, f32},
                                            {"w2_input_scale", {4}, f32}});
  {
    ExpertParams p;  // H = 320, I = 256: 3 (one partial) and 2 groups per row
    method(kInt4G128, kFp8CDyn, make_moe(4, 320, 256))
        ->create_weights(p, 4, 320, 256, DType::kBF16);
    EXPECT_EQ(p.names().size(), 4u);
    EXPECT_EQ(p.spec("w13_weight").shape, (Shape{4, 512, 160}));
    EXPECT_EQ(p.spec("w13_weight_scale").shape, (Shape{4, 512, 3}));
    EXPECT_EQ(p.spec("w2_weight_scale").shape, (Shape{4, 320, 2}));
  }
  expect_params(*method(kNvW, kNvA), {{"w13_weight", {4, 64, 32}, u8},
                                      {"w2_weight", {4, 64, 16}, u8},
                                      {"w13_weight_scale", {4, 64, 4}, DType::kFp8E4M3},
                                      {"w2_weight_scale", {4, 64, 2}, DType::kFp8E4M3},
                                      {"w13_weight_scale_2", {4, 2}, f32},
                                      {"w2_weight_scale_2", {4}, f32},
                                      {"w13_input_scale_2", {4, 2}, f32},
                                      {"w2_input_scale_2", {4}, f32}});
  expect_params(*method(kFp4Mx, kFp8T, make_moe(4, 64, 32, true)),
                {{"w13_weight", {4, 64, 32}, u8},
                 {"w2_weight", {4, 64, 16}, u8},
                 {"w13_weight_scale", {4, 64, 2}, u8},
                 {"w2_weight_scale", {4, 64, 1}, u8},
                 {"w13_input_scale", {4}, f32},
                 {"w2_input_scale", {4}, f32}},
                /*bias=*/true);
  expect_params(*method(kE3m2Mx, kE3m2MxDyn), {{"w13_weight", {4, 64, 48}, u8},
                                               {"w2_weight", {4, 64, 24}, u8},
                                               {"w13_weight_scale", {4, 64, 2}, u8},
                                               {"w2_weight_scale", {4, 64, 1}, u8}});
  // A non-gated activation has one w13 shard.
  MoEConfig nomul = make_moe();
  nomul.activation = Activation::kSiluNoMul;
  ExpertParams p;
  method(kFp8T, kFp8T, nomul)->create_weights(p, 4, 64, 32, DType::kBF16);
  EXPECT_EQ(p.spec("w13_weight").shape, (Shape{4, 32, 64}));
  EXPECT_EQ(p.spec("w13_weight_scale").shape, (Shape{4, 1}));
}

TEST(QuarkParams, LoadValidatesShapeAndDtype) {
  ExpertParams p;
  p.register_parameter("w13_weight_scale", {4, 8, 1}, DType::kF32, 1.0);
  EXPECT_ERROR_HAS(p.load("w13_weight_scale", Tensor::zeros({4, 9, 1}, DType::kF32), "ckpt.x"),
                   "ckpt.x: shape [4, 9, 1] does not match parameter w13_weight_scale");
  EXPECT_ERROR_HAS(p.load("w13_weight_scale", Tensor::zeros({4, 8, 1}, DType::kBF16)),
                   "dtype bf16 does not match");
  EXPECT_ERROR_HAS(p.load("nope", Tensor::zeros({1}, DType::kF32)), "no parameter 'nope'");
  const Tensor v = testing::random_tensor({4, 8}, DType::kF32, 3, 0.5f, 1.0f);
  p.load("w13_weight_scale", v);  // trailing 1 dropped: accepted
  EXPECT_EQ(p.get("w13_weight_scale").to_float_vector(), v.to_float_vector());
  EXPECT_ERROR_HAS(p.get("missing"), "has no parameter 'missing'");
}

// ---- process_weights_after_loading ------------------------------------------------------------

// A method with its parameters filled with valid random codes and scales.
struct Loaded {
  std::unique_ptr<QuarkMoEMethod> m;
  ExpertParams p;
};

Loaded make_loaded(const std::string& w, const std::string& a, uint64_t seed = 1) {
  Loaded l{method(w, a), {}};
  l.m->create_weights(l.p, 4, 64, 32, DType::kBF16);
  for (const std::string& n : l.p.names()) {
    const ParamSpec& s = l.p.spec(n);
    Tensor t = Tensor::empty(s.shape, s.dtype);
    auto* b = t.data_as<uint8_t>();
    std::mt19937_64 rng(seed++);
    if (s.dtype == DType::kF32) {
      t = testing::random_tensor(s.shape, DType::kF32, seed, 0.01f, 0.02f);
    } else {
      for (size_t i = 0; i < t.nbytes(); ++i) {
        uint8_t v = static_cast<uint8_t>(rng());
        if (n.find("scale") != std::string::npos)
          v = static_cast<uint8_t>(100 + v % 20);  // finite, >= 0
        if (s.dtype == DType::kFp8E4M3 && n.find("scale") == std::string::npos &&
            (v & 0x7F) == 0x7F)
          v = 0;  // no NaN fp8 weights
        b[i] = v;
      }
    }
    l.p.load(n, t);
  }
  return l;
}

TEST(QuarkProcess, BadScalesAreClearErrors) {
  {
    Loaded l = make_loaded(kFp8C, kFp8CDyn);
    Tensor s = l.p.get("w2_weight_scale").clone();
    s.data_as<float>()[2 * 64 + 5] = NAN;  // expert 2
    l.p.load("w2_weight_scale", s);
    EXPECT_ERROR_HAS(l.m->process_weights_after_loading(l.p), "w2_weight_scale: expert 2");
  }
  {
    Loaded l = make_loaded(kFp8T, kFp8T);
    Tensor s = l.p.get("w13_input_scale").clone();
    s.data_as<float>()[1] = 0.0f;
    l.p.load("w13_input_scale", s);
    EXPECT_ERROR_HAS(l.m->process_weights_after_loading(l.p),
                     "w13_input_scale: expert 1 holds scale 0");
  }
  {
    Loaded l = make_loaded(kW4A8W, kFp8TDyn);
    Tensor s = l.p.get("w13_weight_scale_2").clone();
    s.data_as<float>()[7] = -1.0f;
    l.p.load("w13_weight_scale_2", s);
    EXPECT_ERROR_HAS(l.m->process_weights_after_loading(l.p), "w13_weight_scale_2: expert 3");
  }
  {
    Loaded l = make_loaded(kFp4Mx, kFp4MxDyn);
    Tensor s = l.p.get("w13_weight_scale").clone();
    s.data_as<uint8_t>()[0] = 0xFF;
    l.p.load("w13_weight_scale", s);
    EXPECT_ERROR_HAS(l.m->process_weights_after_loading(l.p), "e8m0 code 0xff (NaN)");
  }
  {
    Loaded l = make_loaded(kNvW, kNvA);
    Tensor s = l.p.get("w2_weight_scale").clone();
    s.data_as<uint8_t>()[3 * 64 * 2] = 0xB8;  // negative, expert 3
    l.p.load("w2_weight_scale", s);
    EXPECT_ERROR_HAS(l.m->process_weights_after_loading(l.p), "w2_weight_scale: expert 3");
  }
  {
    Loaded l = make_loaded(kInt8C, kInt8CDyn);
    Tensor s = l.p.get("w13_weight_scale").clone();
    s.data_as<float>()[0] = INFINITY;
    l.p.load("w13_weight_scale", s);
    EXPECT_ERROR_HAS(l.m->process_weights_after_loading(l.p), "must be finite and > 0");
  }
}

TEST(QuarkProcess, Int4GroupsDequantizeOneScalePer128OfK) {
  // H = 320: w13 rows hold groups [0, 128), [128, 256) and a partial [256, 320).
  const MoEConfig moe = make_moe(2, 320, 256);
  const std::unique_ptr<QuarkMoEMethod> m = method(kInt4G128, kFp8CDyn, moe);
  ExpertParams p;
  m->create_weights(p, 2, 320, 256, DType::kBF16);
  std::mt19937_64 rng(5);
  for (const char* n : {"w13_weight", "w2_weight"}) {
    Tensor t = Tensor::empty(p.spec(n).shape, DType::kUInt8);
    for (size_t i = 0; i < t.nbytes(); ++i)
      t.data_as<uint8_t>()[i] = static_cast<uint8_t>(rng());
    p.load(n, t);
  }
  for (const char* n : {"w13_weight_scale", "w2_weight_scale"})
    p.load(n, testing::random_tensor(p.spec(n).shape, DType::kF32, 7, 0.01f, 0.02f));
  const Tensor codes = p.get("w13_weight").clone();
  const std::vector<float> scales = p.get("w13_weight_scale").to_float_vector();
  m->process_weights_after_loading(p);
  const Tensor w13 = m->dequantized_weights(p).first;
  ASSERT_EQ(w13.shape(), (Shape{2, 512, 320}));
  const std::vector<float> v = w13.to_float_vector();
  // Signed nibbles, low first, times the scale of (expert, row, k / 128).
  for (const auto& [e, r, k] : {std::array<int64_t, 3>{0, 0, 0},
                                {0, 3, 127},
                                {0, 3, 128},
                                {1, 511, 255},
                                {1, 200, 256},
                                {1, 7, 319}}) {
    const uint8_t byte = codes.data_as<uint8_t>()[(e * 512 + r) * 160 + k / 2];
    const int nibble = k % 2 == 0 ? byte & 0xF : byte >> 4;
    const int code = nibble >= 8 ? nibble - 16 : nibble;
    EXPECT_EQ(v[static_cast<size_t>((e * 512 + r) * 320 + k)],
              static_cast<float>(code) * scales[static_cast<size_t>((e * 512 + r) * 3 + k / 128)])
        << e << " " << r << " " << k;
  }
  const QuantConfig q = m->get_fused_moe_quant_config(p);
  EXPECT_EQ(q.w1.shape, (GroupShape{1, 128}));
  EXPECT_EQ(q.w1.scale.shape(), (Shape{2, 512, 3}));
  EXPECT_EQ(q.w2.scale.shape(), (Shape{2, 320, 2}));
  // Tensor parallelism: a rank's columns of down start on a group of the checkpoint (I = 192 over
  // 2 ranks would split the second group), unless the whole row is one group (I = 128).
  for (const auto& [I, ok] : {std::pair{192, false}, std::pair{256, true}, std::pair{128, true}}) {
    MoEConfig tp = make_moe(2, 320, I);
    tp.parallel = ParallelConfig::make(2, 1, 0, 1, false);
    ExpertParams q;
    const auto create = [&] {
      method(kInt4G128, kFp8CDyn, tp)->create_weights(q, 2, 320, I / 2, DType::kBF16);
    };
    if (ok) {
      EXPECT_NO_THROW(create()) << I;
    } else {
      EXPECT_ERROR_HAS(create(), "rank 1 of 2 would hold intermediate_size_per_partition=96");
    }
  }
  // A bad group scale names the parameter and the expert.
  ExpertParams bad;
  m->create_weights(bad, 2, 320, 256, DType::kBF16);
  Tensor s =
      testing::random_tensor(bad.spec("w2_weight_scale").shape, DType::kF32, 9, 0.01f, 0.02f);
  s.data_as<float>()[320 * 2 + 1] = 0.0f;  // expert 1
  bad.load("w2_weight_scale", s);
  bad.load("w13_weight_scale", testing::random_tensor(bad.spec("w13_weight_scale").shape,
                                                      DType::kF32, 3, 0.01f, 0.02f));
  EXPECT_ERROR_HAS(m->process_weights_after_loading(bad), "w2_weight_scale: expert 1");
}

TEST(QuarkProcess, Nvfp4WarnsWhenShardGlobalScalesDiffer) {
  std::vector<std::string> warnings;
  const int id = log::add_callback([&](log::Level level, const std::string& msg) {
    if (level == log::Level::kWarn) warnings.push_back(msg);
  });
  log::reset_once_cache();
  Loaded same = make_loaded(kNvW, kNvA);
  Tensor s = Tensor::from_floats(std::vector<float>{0.5f, 0.5f, 0.25f, 0.25f, 1, 1, 2, 2}, {4, 2},
                                 DType::kF32);
  same.p.load("w13_weight_scale_2", s);
  same.m->process_weights_after_loading(same.p);
  auto has_warning = [&] {
    return std::any_of(warnings.begin(), warnings.end(), [](const std::string& w) {
      return w.find("w1_weight_scale_2 must match w3_weight_scale_2") != std::string::npos;
    });
  };
  EXPECT_FALSE(has_warning());
  // The fused w13 keeps w1's global scale.
  EXPECT_EQ(same.p.get("w13_weight_scale_2").shape(), (Shape{4}));
  EXPECT_EQ(same.p.get("w13_weight_scale").dtype(), DType::kUE4M3);
  Loaded diff = make_loaded(kNvW, kNvA);
  diff.p.load("w13_weight_scale_2",
              Tensor::from_floats(std::vector<float>{0.5f, 0.5f, 0.25f, 0.3f, 1, 1, 2, 2}, {4, 2},
                                  DType::kF32));
  diff.m->process_weights_after_loading(diff.p);
  EXPECT_TRUE(has_warning());
  EXPECT_EQ(diff.p.get("w13_weight_scale_2").to_float_vector(),
            (std::vector<float>{0.5f, 0.25f, 1, 2}));
  log::remove_callback(id);
}

TEST(QuarkProcess, PerTensorShardScalesAreMergedAndRequantized) {
  for (const char* w : {kFp8T, kInt8T}) {
    SCOPED_TRACE(w);
    Loaded l = make_loaded(w, std::string(w) == kFp8T ? kFp8T : kInt8T);
    const Tensor scales = Tensor::from_floats(
        std::vector<float>{0.01f, 0.02f, 0.03f, 0.015f, 0.01f, 0.01f, 0.005f, 0.04f}, {4, 2},
        DType::kF32);
    l.p.load("w13_weight_scale", scales);
    // Dequantize before (per shard) and after (merged) processing: close, and the scale is the max.
    const Tensor before = l.p.get("w13_weight").clone();
    const bool fp8 = std::string(w) == kFp8T;
    l.m->process_weights_after_loading(l.p);
    EXPECT_EQ(l.p.get("w13_weight_scale").to_float_vector(),
              (std::vector<float>{0.02f, 0.03f, 0.01f, 0.04f}));
    const Tensor after = l.m->dequantized_weights(l.p).first;
    const std::vector<float> sv = scales.to_float_vector();
    const auto* b = before.data_as<uint8_t>();
    const std::vector<float> a = after.to_float_vector();
    double num = 0, den = 0;
    for (int64_t i = 0; i < before.numel(); ++i) {
      const int64_t e = i / (64 * 64), shard = (i / 64) % 64 / 32;
      const float q =
          fp8 ? quant::decode_e4m3(b[i]) : static_cast<float>(static_cast<int8_t>(b[i]));
      const double ref = q * sv[e * 2 + shard];
      num += (a[i] - ref) * (a[i] - ref);
      den += ref * ref;
    }
    EXPECT_LT(std::sqrt(num / den), fp8 ? 0.05 : 0.01);
    EXPECT_GT(std::sqrt(num / den), 0.0);  // the smaller-scale shard really was re-quantized
    // Exactly: each code of the smaller-scale shard is the code of its value at the merged scale.
    const auto* c = l.p.get("w13_weight").data_as<uint8_t>();
    int64_t mismatches = 0;
    for (int64_t i = 0; i < before.numel(); ++i) {
      const int64_t e = i / (64 * 64), shard = (i / 64) % 64 / 32;
      const float own = sv[e * 2 + shard], m = std::max(sv[e * 2], sv[e * 2 + 1]);
      const uint8_t want = own == m ? b[i]
                           : fp8    ? quant::encode_e4m3(quant::decode_e4m3(b[i]) * own / m)
                                    : static_cast<uint8_t>(quant::encode_int8(
                                          static_cast<float>(static_cast<int8_t>(b[i])) * own / m));
      mismatches += c[i] != want;
    }
    EXPECT_EQ(mismatches, 0);
  }
}

TEST(QuarkProcess, ApplyNeedsProcessedWeightsAndMonolithicNeedsAMonolithicKernel) {
  Loaded l = make_loaded(kFp4Mx, kFp4MxDyn);
  const Tensor x = testing::random_tensor({3, 64}, DType::kBF16, 4);
  Tensor ids, w;
  testing::random_routing(3, 2, 4, 5, &ids, &w);
  EXPECT_ERROR_HAS(l.m->apply(l.p, x, w, ids), "before process_weights_after_loading");
  l.m->process_weights_after_loading(l.p);
  EXPECT_FALSE(l.m->is_monolithic());
  const Tensor y = l.m->apply(l.p, x, w, ids).output;
  EXPECT_EQ(y.shape(), (Shape{3, 64}));
  EXPECT_FALSE(testing::has_nan(y));
  EXPECT_ERROR_HAS(l.m->apply_monolithic(l.p, x, Tensor::zeros({3, 4}, DType::kF32)),
                   "needs a monolithic kernel");
}

}  // namespace
}  // namespace moekit::quark
