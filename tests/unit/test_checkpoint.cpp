// Checkpoints end to end: every fixture scheme written, loaded as one MoE layer and run against a
// float64 recomputation on the dequantized weights; naming variants (Qwen, Mixtral, DeepSeek with
// shared experts), sharded checkpoints, exclusions, and errors naming the tensor.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/io/fixtures.h"
#include "moekit/io/safetensors.h"
#include "moekit/layer/checkpoint.h"
#include "moekit/layer/reference.h"
#include "moekit/quantization/compressed_tensors.h"
#include "moekit/quantization/hf_fp8.h"
#include "moekit/quantization/hf_mxfp4.h"
#include "moekit/quantization/modelopt.h"
#include "moekit/quantization/quark/quark_moe.h"
#include "testing.h"

namespace moekit {
namespace {

// Errors here may come from the safetensors layer (std::runtime_error) as well as moekit::Error.
template <typename Fn>
std::string error_of(Fn&& fn) {
  return testing::error_of<std::exception>(std::forward<Fn>(fn));
}

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("moekit_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d;
}

fs::path fixture(const std::string& scheme, const std::string& model = "tiny", int shards = 1) {
  const fs::path d = temp_dir(scheme + "_" + model + "_" + std::to_string(shards));
  io::FixtureOptions o;
  o.scheme = scheme;
  o.model = model;
  o.num_shards = shards;
  o.seed = 3;
  io::write_fixture_checkpoint(d, o);
  return d;
}

void check_layer(MoELayer& layer, int64_t M = 33) {
  const int64_t H = layer.model().hidden_size;
  const Tensor x = testing::random_tensor({M, H}, DType::kBF16, 11);
  const Tensor logits = layer.router_logits(x);
  const RoutingResult routing = layer.router().select_experts(x, logits);
  const Tensor out = layer.forward(x, logits);
  ASSERT_EQ(out.shape(), (Shape{M, H}));
  ASSERT_FALSE(testing::has_nan(out));
  std::vector<int64_t> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m)
    rows[m] = m;
  const std::vector<double> ref = reference_forward(layer, x, routing, rows);
  const double err = testing::relative_l2_error(out, ref);
  const Tolerance& tol = testing::tolerance(layer.tolerance_name());
  EXPECT_LT(err, tol.rel_l2) << layer.tolerance_name();
  // The recomputation repeats the scheme's activation quantization: only roundings separate them.
  EXPECT_LT(err, testing::tolerance("bf16").rel_l2);
  EXPECT_GT(err, 0.0);
}

struct SchemeCase {
  std::string scheme, method, tolerance, experts, model = "tiny";
};

TEST(Checkpoint, EverySchemeEndToEnd) {
  const std::vector<SchemeCase> cases = {
      {"bf16", "", "bf16", ""},
      {"fp8_per_tensor", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"fp8_per_channel", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"fp8_block128", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"w4a8_fp8", "QuarkW4A8Fp8MoEMethod", "w4a8", "CpuW4A8Experts"},
      {"w4a8_fp8_g128", "QuarkW4A8Fp8MoEMethod", "w4a8", "CpuW4A8Experts"},
      {"nvfp4", "QuarkNvfp4MoEMethod", "nvfp4", "CpuNvfp4Experts"},
      {"nvfp4_w4a16", "QuarkNvfp4MoEMethod", "nvfp4", "CpuNvfp4Experts"},
      {"mxfp4_w4a16", "QuarkOCP_MX_MoEMethod", "mxfp4", "CpuMxfp4Experts"},
      {"mxfp4_a8", "QuarkOCP_MX_MoEMethod", "mxfp4", "CpuMxfp4Experts"},
      {"mxfp4_a4", "QuarkOCP_MX_MoEMethod", "mxfp4", "CpuMxfp4Experts"},
      {"mxfp6_e3m2", "QuarkOCP_MX_MoEMethod", "mxfp6", "CpuOcpMxExperts"},
      {"mxfp6_e2m3", "QuarkOCP_MX_MoEMethod", "mxfp6", "CpuOcpMxExperts"},
      {"mxfp6_e3m2_a8", "QuarkOCP_MX_MoEMethod", "mxfp6", "CpuOcpMxExperts"},
      {"mxfp6_e2m3_a8", "QuarkOCP_MX_MoEMethod", "mxfp6", "CpuOcpMxExperts"},
      {"int8_w8a8", "QuarkW8A8Int8MoEMethod", "int8_w8a8", "CpuInt8Experts"},
      {"int8_per_tensor", "QuarkW8A8Int8MoEMethod", "int8_w8a8", "CpuInt8Experts"},
      {"hf_fp8_block128", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"hf_fp8_per_tensor", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"hf_mxfp4", "QuarkOCP_MX_MoEMethod", "mxfp4", "CpuMxfp4Experts", "tiny-gpt-oss"},
      {"ct_fp8_static", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"ct_fp8_dynamic", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"ct_fp8_block128", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"ct_int8_w8a8", "QuarkW8A8Int8MoEMethod", "int8_w8a8", "CpuInt8Experts"},
      {"ct_nvfp4", "QuarkNvfp4MoEMethod", "nvfp4", "CpuNvfp4Experts"},
      {"ct_nvfp4a16", "QuarkNvfp4MoEMethod", "nvfp4", "CpuNvfp4Experts"},
      {"ct_w4afp8", "QuarkW4A8Fp8MoEMethod", "w4a8", "CpuW4A8Experts"},
      {"mo_fp8", "QuarkW8A8Fp8MoEMethod", "fp8_w8a8", "CpuFp8Experts"},
      {"mo_nvfp4", "QuarkNvfp4MoEMethod", "nvfp4", "CpuNvfp4Experts"},
  };
  ASSERT_EQ(cases.size(), io::fixture_schemes().size());
  for (const SchemeCase& c : cases) {
    SCOPED_TRACE(c.scheme);
    const fs::path dir = fixture(c.scheme, c.model);
    CheckpointInfo info;
    MoELayer layer = load_moe_layer(dir, 1, {}, &info);
    EXPECT_EQ(layer.is_quantized(), !c.method.empty());
    EXPECT_EQ(info.method, c.method.empty() ? "unquantized" : c.method);
    EXPECT_EQ(info.layer_index, 1);
    if (layer.is_quantized()) {
      EXPECT_EQ(layer.kernel().fused_experts().name(), c.experts);
    }
    EXPECT_EQ(layer.tolerance_name(), c.tolerance);
    check_layer(layer);
    fs::remove_all(dir);
  }
}

TEST(Checkpoint, NamingVariantsShardsAndSharedExperts) {
  {
    const fs::path dir = fixture("fp8_per_channel", "tiny-mixtral");
    MoELayer layer = load_moe_layer(dir, 0);
    EXPECT_EQ(layer.model().num_experts, 8);
    check_layer(layer, 17);
    fs::remove_all(dir);
  }
  for (const std::string scheme : {"nvfp4", "bf16"}) {
    SCOPED_TRACE(scheme);
    const fs::path dir = fixture(scheme, "tiny-deepseek", 3);
    EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
    MoELayer layer = load_moe_layer(dir, 2);
    EXPECT_TRUE(layer.has_shared_experts());
    EXPECT_TRUE(layer.weights().e_score_correction_bias.defined());
    EXPECT_EQ(layer.router().name(), "grouped_topk");
    check_layer(layer, 9);
    EXPECT_NE(error_of([&] { load_moe_layer(dir, 0); }).find("layer 0 is a dense layer"),
              std::string::npos);
    EXPECT_NE(error_of([&] { load_moe_layer(dir, 7); }).find("out of range"), std::string::npos);
    fs::remove_all(dir);
  }
}

// Qwen2-MoE: a shared expert twice an expert's width with its per-token sigmoid gate
// (mlp.shared_expert.*, mlp.shared_expert_gate.weight). Unquantized it folds into the routed
// experts as two chunks; quantized it runs as a separate pass (and says why).
TEST(Checkpoint, Qwen2MoeGatedSharedExpert) {
  for (const std::string scheme : {"bf16", "fp8_per_channel"}) {
    SCOPED_TRACE(scheme);
    const fs::path dir = fixture(scheme, "tiny-qwen2-moe");
    MoELayerOptions options;
    options.shared_experts =
        scheme == "bf16" ? SharedExpertsMode::kFolded : SharedExpertsMode::kAuto;
    MoELayer layer = load_moe_layer(dir, 1, options);
    EXPECT_TRUE(layer.model().shared_expert_gate);
    EXPECT_EQ(layer.model().shared_intermediate_size, 2 * layer.model().intermediate_size);
    EXPECT_FALSE(layer.model().renormalize);
    ASSERT_TRUE(layer.has_shared_experts());
    EXPECT_TRUE(layer.shared_reference().gate.defined());
    if (scheme == "bf16") {
      EXPECT_EQ(layer.shared_fold_reason(), "");
      EXPECT_EQ(layer.shared_chunks(), 2);
    } else {
      EXPECT_NE(layer.shared_fold_reason().find("quantized"), std::string::npos)
          << layer.shared_fold_reason();
      EXPECT_EQ(layer.shared_chunks(), 0);
    }
    check_layer(layer, 19);
    fs::remove_all(dir);
  }
}

// The acceptance case of "one layer, one plan": a quantized checkpoint runs through
// MoELayer::forward_into with the caller's workspace and an expert map (EP over two ranks inside
// one data-parallel group: each rank loads only its experts, the ranks' outputs sum to the whole).
TEST(Checkpoint, QuantizedLayerForwardIntoWithExpertMap) {
  const fs::path dir = fixture("fp8_block128");
  const MoELayer whole = load_moe_layer(dir, 1);
  const int64_t M = 21, H = whole.model().hidden_size;
  const Tensor x = testing::random_tensor({M, H}, DType::kBF16, 23);
  const Tensor logits = whole.router_logits(x);
  const RoutingResult routing = whole.router().select_experts(x, logits);
  std::vector<int64_t> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m)
    rows[m] = m;
  WorkspaceManager ws;  // one caller-owned workspace for both ranks' layers
  std::vector<double> sum(static_cast<size_t>(M * H), 0.0);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(rank);
    MoELayerOptions o;
    o.parallel = ParallelConfig::make(/*tp=*/2, /*dp=*/1, /*dp_rank=*/0, /*tp_rank=*/rank,
                                      /*enable_ep=*/true);
    o.workspace = &ws;
    MoELayer layer = load_moe_layer(dir, 1, o);
    ASSERT_TRUE(layer.is_quantized());
    ASSERT_TRUE(layer.expert_map().defined());
    EXPECT_EQ(layer.moe_config().num_local_experts, whole.moe_config().num_local_experts / 2);
    EXPECT_EQ(layer.first_local_expert(), rank * layer.moe_config().num_local_experts);
    EXPECT_EQ(layer.kernel_weights().w13.size(0), layer.moe_config().num_local_experts);
    // This rank's experts are the whole layer's experts [first, first + E_local).
    const ExpertWeights mine = layer.expert_reference(0);
    const ExpertWeights same = whole.expert_reference(layer.first_local_expert());
    EXPECT_TRUE(testing::bitwise_equal(mine.w13, same.w13));
    EXPECT_TRUE(testing::bitwise_equal(mine.w2, same.w2));
    Tensor out = testing::poisoned({M, H}, DType::kBF16);
    layer.forward_into(out, x, logits, RunContext{{}, &ws});
    ASSERT_FALSE(testing::has_nan(out));
    const std::vector<double> ref = reference_forward(layer, x, routing, rows);
    EXPECT_LT(testing::relative_l2_error(out, ref), testing::tolerance("fp8_w8a8").rel_l2);
    const std::vector<float> o_rank = out.to_float_vector();
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] += o_rank[i];
  }
  const std::vector<double> ref_whole = reference_forward(whole, x, routing, rows);
  EXPECT_LT(testing::relative_l2_error(sum, ref_whole), testing::tolerance("fp8_w8a8").rel_l2);
  fs::remove_all(dir);
}

// Random quantized layers of a model shape (what `moekit bench --quant` builds): every scheme's
// layer (the fixture schemes) runs through the same MoELayer and matches its
// float64 recomputation, with outputs of a sane magnitude (the random codes and scales are scaled
// like real weights).
TEST(Checkpoint, RandomQuantizedLayersOfEveryScheme) {
  const ModelPreset& model = find_preset("small");
  const int64_t M = 13, H = model.hidden_size;
  const Tensor x = testing::random_tensor({M, H}, DType::kBF16, 31);
  const Tensor logits = testing::random_tensor({M, model.num_experts}, DType::kF32, 32, -3, 3);
  std::vector<int64_t> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m)
    rows[m] = m;
  for (const std::string& scheme : io::fixture_schemes()) {
    SCOPED_TRACE(scheme);
    MoELayer layer = random_quantized_layer(model, scheme, {}, 7);
    EXPECT_EQ(layer.is_quantized(), scheme != "bf16");
    const Tensor out = layer.forward(x, logits);
    ASSERT_FALSE(testing::has_nan(out));
    double sq = 0;
    for (float v : out.to_float_vector())
      sq += static_cast<double>(v) * v;
    const double rms = std::sqrt(sq / static_cast<double>(out.numel()));
    EXPECT_GT(rms, 1e-3);  // not degenerate (random codes give rms ~0.01-0.05 here)
    EXPECT_LT(rms, 100.0);
    const RoutingResult routing = layer.router().select_experts(x, logits);
    const std::vector<double> ref = reference_forward(layer, x, routing, rows);
    EXPECT_LT(testing::relative_l2_error(out, ref), testing::tolerance("bf16").rel_l2);
  }
  EXPECT_TRUE(
      testing::contains_all(error_of([&] { (void)random_quantized_layer(model, "fp7", {}, 1); }),
                            {"unknown fixture scheme 'fp7'", "fp8_block128"}));
}

// Rewrites model.safetensors through `edit(name, dtype, shape, bytes) -> keep?`.
template <typename Edit>
void rewrite(const fs::path& dir, Edit edit) {
  std::vector<std::tuple<std::string, std::string, std::vector<int64_t>, std::vector<std::byte>>>
      all;
  {
    const io::SafetensorsFile f = io::SafetensorsFile::open(dir / "model.safetensors");
    for (const std::string& n : f.names()) {
      const io::TensorInfo& i = f.info(n);
      all.emplace_back(n, i.dtype, i.shape, std::vector<std::byte>(i.bytes.begin(), i.bytes.end()));
    }
  }
  io::SafetensorsWriter w;
  for (auto& [n, d, s, b] : all) {
    if (edit(n, d, s, b)) w.add(n, d, s, b);
  }
  w.write(dir / "model.safetensors");
}

// Qwen2-MoE's shared-expert gate is part of the model: a checkpoint without it is refused, naming
// the tensor.
TEST(Checkpoint, MissingSharedExpertGateNamesTheTensor) {
  const fs::path dir = fixture("bf16", "tiny-qwen2-moe");
  const std::string gate = "model.layers.1.mlp.shared_expert_gate.weight";
  rewrite(dir, [&](const std::string& n, auto&, auto&, auto&) { return n != gate; });
  EXPECT_NE(error_of([&] { load_moe_layer(dir, 1); }).find(gate), std::string::npos)
      << error_of([&] { load_moe_layer(dir, 1); });
  fs::remove_all(dir);
}

TEST(Checkpoint, MissingOrMisshapenTensorsNameTheTensor) {
  const fs::path dir = fixture("mxfp4_a4");
  const std::string missing = "model.layers.1.mlp.experts.5.up_proj.weight_scale";
  rewrite(dir, [&](const std::string& n, auto&, auto&, auto&) { return n != missing; });
  EXPECT_NE(error_of([&] { load_moe_layer(dir, 1); }).find(missing), std::string::npos)
      << error_of([&] { load_moe_layer(dir, 1); });
  EXPECT_NO_THROW(load_moe_layer(dir, 0));  // the other layer is intact

  const std::string bad = "model.layers.0.mlp.experts.2.down_proj.weight";
  rewrite(dir, [&](const std::string& n, std::string&, std::vector<int64_t>& s,
                   std::vector<std::byte>& b) {
    if (n == bad) {
      s = {s[0] / 2, s[1]};
      b.resize(b.size() / 2);
    }
    return true;
  });
  const std::string e = error_of([&] { load_moe_layer(dir, 0); });
  EXPECT_NE(e.find(bad), std::string::npos) << e;
  EXPECT_NE(e.find("has shape [96, 64]"), std::string::npos) << e;

  const std::string wrong_dtype = "model.layers.0.mlp.experts.1.gate_proj.weight";
  rewrite(dir, [&](const std::string& n, std::string& d, auto&, auto&) {
    if (n == wrong_dtype) d = "I8";
    return true;
  });
  const std::string e2 = error_of([&] { load_moe_layer(dir, 0); });
  EXPECT_NE(e2.find(wrong_dtype), std::string::npos) << e2;
  EXPECT_NE(e2.find("dtype int8"), std::string::npos) << e2;
  fs::remove_all(dir);
}

// Non-finite values never pass silently: weights (NaN / Inf floats, fp8 NaN codes) when the
// caller asks for the scan (the CLI does), scales always, and a bad input scale on one shard is
// not hidden by the max over the gate/up pair.
TEST(Checkpoint, NonFiniteWeightsAndScalesAreRefusedWithTheirName) {
  MoELayerOptions scan;
  scan.check_finite_weights = true;
  {
    const fs::path dir = fixture("bf16");
    const std::string name = "model.layers.1.mlp.experts.3.down_proj.weight";
    rewrite(dir, [&](const std::string& n, std::string& d, auto&, std::vector<std::byte>& b) {
      if (n == name) {
        EXPECT_EQ(d, "BF16");
        b[2 * 17] = std::byte{0xC0};  // element 17 -> bf16 0x7FC0: NaN
        b[2 * 17 + 1] = std::byte{0x7F};
      }
      return true;
    });
    EXPECT_NO_THROW(load_moe_layer(dir, 1));  // the library default does not scan
    const std::string e = error_of([&] { load_moe_layer(dir, 1, scan); });
    EXPECT_TRUE(testing::contains_all(
        e, {"model.layers.1.mlp.experts.*", "down weights", "nan", "must be finite"}))
        << e;
    const std::string gate = "model.layers.1.mlp.gate.weight";
    rewrite(dir, [&](const std::string& n, std::string& d, auto&, std::vector<std::byte>& b) {
      if (n == gate) {  // element 5 -> +inf
        if (d == "F32") {
          const float inf = INFINITY;
          std::memcpy(b.data() + 4 * 5, &inf, 4);
        } else {
          EXPECT_EQ(d, "BF16");
          b[2 * 5] = std::byte{0x80};
          b[2 * 5 + 1] = std::byte{0x7F};
        }
      }
      return true;
    });
    EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 1, scan); }),
                                      {gate, "inf", "element 5"}));
    fs::remove_all(dir);
  }
  {
    const fs::path dir = fixture("fp8_per_tensor");
    const std::string w = "model.layers.0.mlp.experts.1.gate_proj.weight";
    rewrite(dir, [&](const std::string& n, std::string&, auto&, std::vector<std::byte>& b) {
      if (n == w) b[7] = std::byte{0x7F};  // e4m3 NaN
      return true;
    });
    EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 0, scan); }),
                                      {"w13_weight", "0x7F", "must be finite"}));
    // A NaN or negative input scale on the up shard only: refused, not lost in max(gate, up).
    for (const float bad : {NAN, -0.5f}) {
      const std::string in = "model.layers.1.mlp.experts.2.up_proj.input_scale";
      rewrite(dir, [&](const std::string& n, std::string&, auto&, std::vector<std::byte>& b) {
        if (n == in) std::memcpy(b.data(), &bad, 4);
        return true;
      });
      EXPECT_TRUE(
          testing::contains_all(error_of([&] { load_moe_layer(dir, 1); }), {in, "finite and > 0"}))
          << bad;
    }
    fs::remove_all(dir);
  }
}

TEST(Checkpoint, ExcludedLayersLoadUnquantizedAndOtherMethodsAreRejected) {
  const fs::path dir = fixture("bf16");
  nlohmann::json cfg;
  std::ifstream(dir / "config.json") >> cfg;
  cfg["quantization_config"] =
      nlohmann::json::parse(io::fixture_quantization_config("fp8_per_tensor"));
  cfg["quantization_config"]["exclude"] = {"model.layers.1.mlp.experts"};
  std::ofstream(dir / "config.json") << cfg.dump();
  MoELayer excluded = load_moe_layer(dir, 1);
  EXPECT_FALSE(excluded.is_quantized());
  check_layer(excluded, 5);
  // Layer 0 is not excluded: the fp8 method looks for its tensors and names the first one missing.
  const std::string e = error_of([&] { load_moe_layer(dir, 0); });
  EXPECT_NE(e.find("'model.layers.0.mlp.experts.0.gate_proj.input_scale' not found"),
            std::string::npos)
      << e;

  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  std::ofstream(dir / "config.json") << cfg.dump();
  EXPECT_NE(error_of([&] { load_moe_layer(dir, 1); }).find("'gptq' is not supported"),
            std::string::npos);
  fs::remove_all(dir);
}

// A HuggingFace fp8 checkpoint (quant_method "fp8", DeepSeek-V3's weight_scale_inv), a
// compressed-tensors one (NVFP4's renamed tensors and reciprocal global scales included) or a
// ModelOpt NVFP4 one is the same layer as the Quark checkpoint of the same weights: outputs
// bitwise equal.
TEST(Checkpoint, HuggingFaceFp8EqualsQuarkFp8) {
  for (const auto& [hf, quark_scheme] :
       {std::pair{"hf_fp8_block128", "fp8_block128"},
        std::pair{"hf_fp8_per_tensor", "fp8_per_tensor"},
        std::pair{"ct_fp8_static", "fp8_per_tensor"},
        std::pair{"ct_fp8_dynamic", "fp8_per_channel"},
        std::pair{"ct_fp8_block128", "fp8_block128"}, std::pair{"ct_int8_w8a8", "int8_w8a8"},
        std::pair{"ct_nvfp4", "nvfp4"}, std::pair{"ct_nvfp4a16", "nvfp4_w4a16"},
        std::pair{"mo_nvfp4", "nvfp4"}, std::pair{"ct_w4afp8", "w4a8_fp8_g128"}}) {
    for (const char* model : {"tiny", "tiny-deepseek"}) {
      SCOPED_TRACE(std::string(hf) + " " + model);
      const fs::path a = fixture(hf, model), b = fixture(quark_scheme, model);
      const int layer = std::string(model) == "tiny-deepseek" ? 1 : 0;
      MoELayer la = load_moe_layer(a, layer), lb = load_moe_layer(b, layer);
      const Tensor x = testing::random_tensor({19, la.model().hidden_size}, DType::kBF16, 4);
      const Tensor logits = la.router_logits(x);
      EXPECT_TRUE(testing::bitwise_equal(la.forward(x, logits), lb.forward(x, logits)));
      if (std::string(hf) == "hf_fp8_block128") {  // the file holds DeepSeek-V3's names
        const io::SafetensorsFile f = io::SafetensorsFile::open(a / "model.safetensors");
        const std::string p = fmt::format("model.layers.{}.mlp.experts.0.gate_proj.", layer);
        EXPECT_TRUE(f.contains(p + "weight_scale_inv"));
        EXPECT_FALSE(f.contains(p + "weight_scale"));
      }
      if (std::string(hf) == "ct_nvfp4") {  // compressed-tensors' names, its global scales g
        const io::SafetensorsFile f = io::SafetensorsFile::open(a / "model.safetensors");
        const io::SafetensorsFile q = io::SafetensorsFile::open(b / "model.safetensors");
        const std::string p = fmt::format("model.layers.{}.mlp.experts.0.down_proj.", layer);
        for (const char* name :
             {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"}) {
          EXPECT_TRUE(f.contains(p + name)) << name;
        }
        EXPECT_FALSE(f.contains(p + "weight"));
        EXPECT_FALSE(f.contains(p + "weight_scale_2"));
        auto scalar = [](const io::SafetensorsFile& file, const std::string& name) {
          float v = 0.0f;
          EXPECT_EQ(file.info(name).dtype, "F32") << name;
          std::memcpy(&v, file.info(name).bytes.data(), sizeof v);
          return v;
        };
        const float g = scalar(f, p + "weight_global_scale");
        EXPECT_EQ(scalar(q, p + "weight_scale_2"), 1.0f / g);
        EXPECT_GT(g, 1.0f);  // (448 * 6) / amax: the scale that quantizes
      }
      if (std::string(hf) == "ct_w4afp8") {  // int32 words of offset codes, bf16 group scales
        const io::SafetensorsFile f = io::SafetensorsFile::open(a / "model.safetensors");
        const io::SafetensorsFile q = io::SafetensorsFile::open(b / "model.safetensors");
        const std::string p = fmt::format("model.layers.{}.mlp.experts.0.down_proj.", layer);
        const io::TensorInfo& words = f.info(p + "weight_packed");
        const io::TensorInfo& nibbles = q.info(p + "weight");
        EXPECT_EQ(words.dtype, "I32");
        EXPECT_EQ(words.shape[1] * 8, la.model().intermediate_size);
        EXPECT_EQ(f.info(p + "weight_scale").dtype, "BF16");
        EXPECT_EQ(f.info(p + "weight_shape").dtype, "I64");
        EXPECT_FALSE(f.contains(p + "weight"));
        // Byte j of a row: codes 2j (low nibble) and 2j + 1, each + 8 where Quark's are signed.
        ASSERT_EQ(words.bytes.size(), nibbles.bytes.size());
        for (size_t i = 0; i < words.bytes.size(); ++i) {
          ASSERT_EQ(static_cast<uint8_t>(words.bytes[i]),
                    static_cast<uint8_t>(static_cast<uint8_t>(nibbles.bytes[i]) ^ 0x88))
              << i;
        }
      }
      fs::remove_all(a);
      fs::remove_all(b);
    }
  }
}

TEST(Checkpoint, HuggingFaceFp8ConfigsAreValidated) {
  using quantization::parse_hf_fp8_config;
  const nlohmann::json good = {{"quant_method", "fp8"},
                               {"fmt", "e4m3"},
                               {"activation_scheme", "dynamic"},
                               {"weight_block_size", {128, 128}}};
  const quantization::HfFp8Config c = parse_hf_fp8_config(good, "q");
  EXPECT_TRUE(c.block);
  EXPECT_FALSE(c.static_activations);
  EXPECT_EQ(c.weight_scale_suffix(), "weight_scale_inv");
  auto bad = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json j = good;
    if (value.is_null()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return error_of([&] { parse_hf_fp8_config(j, "ckpt/config.json: quantization_config"); });
  };
  EXPECT_TRUE(testing::contains_all(bad("fmt", "e5m2"), {"fmt=\"e5m2\"", "e4m3"}));
  EXPECT_TRUE(testing::contains_all(bad("fmt", "int4"), {"fmt", "int4", "e4m3"}));
  EXPECT_TRUE(testing::contains_all(bad("activation_scheme", nullptr),
                                    {"ckpt/config.json", "activation_scheme", "dynamic"}));
  EXPECT_TRUE(
      testing::contains_all(bad("activation_scheme", "per_token"), {"per_token", "static"}));
  EXPECT_TRUE(testing::contains_all(bad("activation_scheme", "static"),
                                    {"static", "weight_block_size", "1x128"}));
  EXPECT_TRUE(testing::contains_all(bad("weight_block_size", {64, 64}), {"[64, 64]", "128x128"}));
  EXPECT_TRUE(testing::contains_all(bad("weight_block_size", {128}), {"[128, 128]"}));
  EXPECT_TRUE(testing::contains_all(bad("weight_block_size", {128.5, 128}), {"128.5"}));
  EXPECT_TRUE(testing::contains_all(bad("ignored_layers", "lm_head"), {"ignored_layers", "array"}));
  EXPECT_TRUE(testing::contains_all(bad("ignored_layers", {1}), {"ignored_layers[0]"}));
  // Per-tensor, dynamic or static activations: the Quark equivalent parses.
  nlohmann::json tensor = good;
  tensor.erase("weight_block_size");
  for (const char* scheme : {"dynamic", "static"}) {
    tensor["activation_scheme"] = scheme;
    const quantization::HfFp8Config t = parse_hf_fp8_config(tensor, "q");
    EXPECT_FALSE(t.block);
    EXPECT_EQ(t.weight_scale_suffix(), "weight_scale");
    const quark::QuarkConfig qc = t.to_quark_config();
    ASSERT_EQ(qc.global_quant_config.input_tensors.size(), 1u);
  }
}

// compressed-tensors configs: the served 8-bit pairs become their Quark specs; everything else is
// refused naming the key and the value.
TEST(Checkpoint, CompressedTensorsConfigsAreValidated) {
  using quantization::parse_compressed_tensors_config;
  const nlohmann::json arg = {{"num_bits", 8},       {"type", "float"},   {"strategy", "channel"},
                              {"dynamic", false},    {"symmetric", true}, {"group_size", nullptr},
                              {"observer", "minmax"}};
  nlohmann::json good = {
      {"quant_method", "compressed-tensors"},
      {"format", "float-quantized"},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}},
          {"weights", arg},
          {"input_activations",
           {{"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}}}}}}},
      {"ignore", {"lm_head", "re:.*mlp.gate$"}}};
  const quantization::CompressedTensorsConfig c = parse_compressed_tensors_config(good, "q");
  EXPECT_EQ(c.weights.strategy, "channel");
  EXPECT_EQ(c.input->strategy, "token");
  const quark::QuarkConfig qc = c.to_quark_config();
  EXPECT_TRUE(qc.is_excluded("model.layers.3.mlp.gate"));
  EXPECT_FALSE(qc.is_excluded("model.layers.3.mlp.experts"));
  ASSERT_EQ(qc.global_quant_config.weight.size(), 1u);
  EXPECT_EQ(qc.global_quant_config.weight[0].qscheme, "per_channel");
  auto bad = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return error_of([&] { parse_compressed_tensors_config(j, "ckpt/config.json: q"); });
  };
  auto group = [](nlohmann::json& j) -> nlohmann::json& { return j["config_groups"]["group_0"]; };
  EXPECT_TRUE(testing::contains_all(
      bad([](auto& j) { j["format"] = "pack-quantized"; }),
      {"format=\"pack-quantized\"", "8-bit channel weights", "int4 ones as pack-quantized"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["num_bits"] = 4; }),
                                    {"group_0.weights", "num_bits 4", "NVFP4", "tensor_group"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["num_bits"] = 6; }),
                                    {"group_0.weights.num_bits=6", "8-bit", "NVFP4"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["symmetric"] = false; }),
                                    {"symmetric=false"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["input_activations"] = nullptr; }),
                                    {"input_activations is null", "W8A16"}));
  EXPECT_TRUE(testing::contains_all(
      bad([&](auto& j) { group(j)["input_activations"]["strategy"] = "tensor"; }),
      {"float weights per channel with float activations per tensor", "not served"}));
  EXPECT_TRUE(
      testing::contains_all(bad([&](auto& j) { group(j)["input_activations"]["dynamic"] = false; }),
                            {"strategy=\"token\" must be dynamic"}));
  EXPECT_TRUE(testing::contains_all(
      bad([&](auto& j) { group(j)["targets"] = {"re:.*self_attn.*"}; }), {"targets", "Linear"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { j["config_groups"]["group_1"] = group(j); }),
                                    {"one config group"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) {
                                      group(j)["weights"]["strategy"] = "block";
                                      group(j)["weights"]["block_structure"] = {64, 64};
                                    }),
                                    {"block_structure=[64,64]", "128x128"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["type"] = "int4"; }),
                                    {"weights.type", "int4"}));
  // Keys that change what the tensors mean are refused, not ignored.
  EXPECT_TRUE(testing::contains_all(bad([](auto& j) {
                                      j["sparsity_config"] = {{"format", "sparse-24-bitmask"}};
                                    }),
                                    {"sparsity_config", "sparse-24-bitmask", "not served"}));
  EXPECT_NO_THROW(parse_compressed_tensors_config(
      [&] {
        nlohmann::json j = good;
        j["sparsity_config"] = {{"format", "dense"}};
        j["kv_cache_scheme"] = nullptr;
        return j;
      }(),
      "q"));
  EXPECT_TRUE(
      testing::contains_all(bad([](auto& j) {
                              j["transform_config"] = {{"config_groups", nlohmann::json::object()}};
                            }),
                            {"transform_config", "rotated"}));
}

// llm-compressor's W4AFP8 config (int4 groups of 128, pack-quantized): its Quark equivalent, the
// file's names and encoding, and the refusals.
TEST(Checkpoint, CompressedTensorsW4Afp8ConfigsAreValidated) {
  using quantization::parse_compressed_tensors_config;
  const nlohmann::json int4 = {{"num_bits", 4},      {"type", "int"},    {"strategy", "group"},
                               {"group_size", 128},  {"dynamic", false}, {"symmetric", true},
                               {"actorder", nullptr}};
  const nlohmann::json token = {
      {"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}};
  const nlohmann::json good = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"config_groups",
       {{"group_0", {{"targets", {"Linear"}}, {"weights", int4}, {"input_activations", token}}}}},
      {"ignore", {"lm_head"}}};
  const quantization::CompressedTensorsConfig c = parse_compressed_tensors_config(good, "q");
  EXPECT_TRUE(c.int4_packed());
  EXPECT_FALSE(c.nvfp4());
  EXPECT_EQ(c.file_suffix("weight"), "weight_packed");
  EXPECT_EQ(c.file_suffix("weight_scale"), "weight_scale");
  EXPECT_TRUE(c.int4_words_in_file("weight"));
  EXPECT_FALSE(c.int4_words_in_file("weight_scale"));
  EXPECT_FALSE(c.reciprocal_in_file("weight_scale"));
  const quark::QuarkConfig qc = c.to_quark_config();
  ASSERT_EQ(qc.global_quant_config.weight.size(), 1u);
  EXPECT_EQ(qc.global_quant_config.weight[0].dtype, "int4");
  EXPECT_EQ(qc.global_quant_config.weight[0].qscheme, "per_group");
  EXPECT_EQ(qc.global_quant_config.weight[0].group_size, 128);
  const quark::QuarkMoETarget t = quark::get_moe_method_target(qc, "model.layers.1.mlp.experts");
  EXPECT_EQ(t.weight_key, quant_keys::kInt4W4A8StaticGroup128Sym);
  EXPECT_EQ(t.activation_key, quant_keys::kFp8DynamicTokenSym);
  EXPECT_EQ(parse_compressed_tensors_config(c.to_json(), "q").to_json(), c.to_json());
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return j;
  };
  auto bad = [&](const std::function<void(nlohmann::json&)>& edit) {
    return error_of([&] { parse_compressed_tensors_config(edited(edit), "ckpt/config.json: q"); });
  };
  auto group = [](nlohmann::json& j) -> nlohmann::json& { return j["config_groups"]["group_0"]; };
  // Static per-tensor fp8 activations, and actorder "weight" (the groups stay contiguous).
  const auto static_tensor =
      parse_compressed_tensors_config(edited([&](auto& j) {
                                        group(j)["input_activations"]["strategy"] = "tensor";
                                        group(j)["input_activations"]["dynamic"] = false;
                                        group(j)["weights"]["actorder"] = "weight";
                                      }),
                                      "q");
  EXPECT_EQ(
      quark::get_moe_method_target(static_tensor.to_quark_config(), "model.layers.1.mlp.experts")
          .activation_key,
      quant_keys::kFp8StaticTensorSym);
  EXPECT_TRUE(testing::contains_all(bad([](auto& j) { j["format"] = "int-quantized"; }),
                                    {"format=\"int-quantized\"", "int4 ones as pack-quantized"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["group_size"] = 64; }),
                                    {"weights.group_size=64", "groups of 128"}));
  EXPECT_TRUE(
      testing::contains_all(bad([&](auto& j) { group(j)["weights"]["actorder"] = "group"; }),
                            {"actorder=\"group\"", "g_idx"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["symmetric"] = false; }),
                                    {"symmetric=false"}));
  EXPECT_TRUE(
      testing::contains_all(bad([&](auto& j) { group(j)["weights"]["strategy"] = "channel"; }),
                            {"num_bits 4", "\"int\"", "\"channel\"", "int4 weights"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["input_activations"] = nullptr; }),
                                    {"input_activations is null", "W4A16"}));
  EXPECT_TRUE(testing::contains_all(
      bad([&](auto& j) { group(j)["input_activations"]["type"] = "int"; }),
      {"int weights per group with int activations per token", "int4 groups of 128"}));
  EXPECT_TRUE(testing::contains_all(
      bad([&](auto& j) { group(j)["input_activations"]["strategy"] = "tensor"; }),
      {"activations per tensor (dynamic)", "not served"}));
  // 8-bit weight groups are not a served scheme.
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) {
                                      j["format"] = "float-quantized";
                                      group(j)["weights"]["num_bits"] = 8;
                                      group(j)["weights"]["type"] = "float";
                                    }),
                                    {"strategy=\"group\" with 8-bit float weights"}));
}

// llm-compressor's NVFP4 (W4A4) and NVFP4A16 configs: their Quark equivalent, the file names,
// and the refusals.
TEST(Checkpoint, CompressedTensorsNvfp4ConfigsAreValidated) {
  using quantization::parse_compressed_tensors_config;
  const nlohmann::json fp4 = {{"num_bits", 4},    {"type", "float"},  {"strategy", "tensor_group"},
                              {"group_size", 16}, {"dynamic", false}, {"symmetric", true}};
  nlohmann::json act = fp4;
  act["dynamic"] = "local";
  const nlohmann::json good = {
      {"quant_method", "compressed-tensors"},
      {"format", "nvfp4-pack-quantized"},
      {"config_groups",
       {{"group_0", {{"targets", {"Linear"}}, {"weights", fp4}, {"input_activations", act}}}}},
      {"ignore", {"lm_head"}}};
  const quantization::CompressedTensorsConfig c = parse_compressed_tensors_config(good, "q");
  EXPECT_TRUE(c.nvfp4());
  ASSERT_TRUE(c.input.has_value());
  EXPECT_TRUE(c.input->dynamic);
  EXPECT_EQ(c.file_suffix("weight"), "weight_packed");
  EXPECT_EQ(c.file_suffix("weight_scale"), "weight_scale");
  EXPECT_EQ(c.file_suffix("weight_scale_2"), "weight_global_scale");
  EXPECT_EQ(c.file_suffix("input_scale_2"), "input_global_scale");
  EXPECT_TRUE(c.reciprocal_in_file("weight_scale_2"));
  EXPECT_FALSE(c.reciprocal_in_file("weight_scale"));
  // The Quark config ModelOpt's NVFP4 gives (same method, same numerics).
  const quark::QuarkConfig qc = c.to_quark_config();
  ASSERT_EQ(qc.global_quant_config.weight.size(), 2u);
  EXPECT_EQ(qc.global_quant_config.weight[0].group_size, 16);
  EXPECT_EQ(qc.global_quant_config.weight[1].qscheme, "per_tensor");
  ASSERT_EQ(qc.global_quant_config.input_tensors.size(), 2u);
  EXPECT_TRUE(qc.global_quant_config.input_tensors[0].dynamic());
  // Round trip through to_json (what a fixture writes).
  EXPECT_EQ(parse_compressed_tensors_config(c.to_json(), "q").to_json(), c.to_json());
  // NVFP4A16: no input_activations.
  nlohmann::json a16 = good;
  a16["config_groups"]["group_0"]["input_activations"] = nullptr;
  EXPECT_FALSE(parse_compressed_tensors_config(a16, "q").input.has_value());
  // 8-bit configs keep their names.
  EXPECT_EQ(quantization::CompressedTensorsConfig{}.file_suffix("weight"), "weight");
  auto bad = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return error_of([&] { parse_compressed_tensors_config(j, "ckpt/config.json: q"); });
  };
  auto group = [](nlohmann::json& j) -> nlohmann::json& { return j["config_groups"]["group_0"]; };
  EXPECT_TRUE(testing::contains_all(bad([](auto& j) { j["format"] = "float-quantized"; }),
                                    {"format=\"float-quantized\"", "nvfp4-pack-quantized"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["group_size"] = 32; }),
                                    {"weights", "groups of 16", "32"}));
  EXPECT_TRUE(testing::contains_all(bad([&](auto& j) { group(j)["weights"]["type"] = "int"; }),
                                    {"num_bits 4", "\"int\"", "NVFP4"}));
  EXPECT_TRUE(
      testing::contains_all(bad([&](auto& j) { group(j)["input_activations"]["dynamic"] = false; }),
                            {"input_activations", "dynamically"}));
  EXPECT_TRUE(testing::contains_all(
      bad([&](auto& j) { group(j)["input_activations"]["dynamic"] = "global"; }),
      {"input_activations.dynamic", "global", "local"}));
  EXPECT_TRUE(testing::contains_all(
      bad([&](auto& j) {
        group(j)["input_activations"] = {
            {"num_bits", 8}, {"type", "float"}, {"strategy", "token"}, {"dynamic", true}};
      }),
      {"float weights per tensor_group with float activations per token", "not served"}));
}

TEST(Checkpoint, ModelOptConfigsAreValidated) {
  using quantization::parse_modelopt_config;
  const quantization::ModelOptConfig nested = parse_modelopt_config(
      {{"quant_method", "modelopt"},
       {"quantization",
        {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"lm_head"}}}}},
      "q");
  EXPECT_EQ(nested.quant_algo, "NVFP4");
  EXPECT_EQ(nested.file_suffix("input_scale_2"), "input_scale");
  EXPECT_EQ(nested.file_suffix("weight_scale_2"), "weight_scale_2");
  EXPECT_TRUE(nested.to_quark_config().is_excluded("lm_head"));
  auto bad = [](const nlohmann::json& j) {
    return error_of([&] { parse_modelopt_config(j, "q"); });
  };
  EXPECT_TRUE(testing::contains_all(bad({{"quant_method", "modelopt"}, {"quant_algo", "W4A8_AWQ"}}),
                                    {"q.quant_algo=\"W4A8_AWQ\"", "FP8", "NVFP4"}));
  EXPECT_TRUE(testing::contains_all(bad({{"quant_method", "modelopt"}}), {"quant_algo"}));
  EXPECT_TRUE(testing::contains_all(
      bad({{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 32}}),
      {"group_size=32", "16"}));
  EXPECT_TRUE(testing::contains_all(
      bad({{"quant_method", "modelopt"}, {"quant_algo", "FP8"}, {"exclude_modules", "lm_head"}}),
      {"exclude_modules"}));
}

TEST(Checkpoint, BenchmarkSchemeNamesAreAliases) {
  EXPECT_EQ(io::fixture_quantization_config("fp8_tensor"),
            io::fixture_quantization_config("fp8_per_tensor"));
  EXPECT_EQ(io::fixture_quantization_config("fp8_channel_token"),
            io::fixture_quantization_config("fp8_per_channel"));
  const ModelPreset& model = find_preset("tiny");
  MoELayer a = random_quantized_layer(model, "fp8_tensor", {}, 3);
  MoELayer b = random_quantized_layer(model, "fp8_per_tensor", {}, 3);
  const Tensor x = testing::random_tensor({7, model.hidden_size}, DType::kBF16, 2);
  const Tensor logits = testing::random_tensor({7, model.num_experts}, DType::kF32, 3);
  EXPECT_TRUE(testing::bitwise_equal(a.forward(x, logits), b.forward(x, logits)));
}

TEST(Checkpoint, FixtureRejectsUnknownNames) {
  io::FixtureOptions o;
  o.scheme = "fp3";
  EXPECT_THROW(io::write_fixture_checkpoint(temp_dir("bad"), o), Error);
  o.scheme = "bf16";
  o.model = "huge";
  EXPECT_THROW(io::write_fixture_checkpoint(temp_dir("bad"), o), Error);
  // gpt-oss's format and gpt-oss's fused layout go together.
  o.scheme = "hf_mxfp4";
  o.model = "tiny";
  EXPECT_TRUE(testing::contains_all(
      error_of([&] { io::write_fixture_checkpoint(temp_dir("bad"), o); }), {"tiny-gpt-oss"}));
  o.scheme = "fp8_block128";
  o.model = "tiny-gpt-oss";
  EXPECT_TRUE(
      testing::contains_all(error_of([&] { io::write_fixture_checkpoint(temp_dir("bad"), o); }),
                            {"tiny-gpt-oss", "fused", "hf_mxfp4", "fp8_block128"}));
  EXPECT_THROW(io::fixture_quantization_config("fp3"), Error);
  fs::remove_all(temp_dir("bad"));
}

// ---- tensor parallelism
// ---------------------------------------------------------------------------

// The layer of tensor-parallel rank `rank` of `tp` (no EP): its experts' slice of
// intermediate_size.
MoELayer tp_rank_layer(const fs::path& dir, int layer, int tp, int rank) {
  MoELayerOptions o;
  o.parallel = ParallelConfig::make(tp, /*dp=*/1, /*dp_rank=*/0, /*tp_rank=*/rank,
                                    /*enable_ep=*/false);
  return load_moe_layer(dir, layer, o);
}

// Each tensor-parallel rank loads its slice of every expert, shared experts included, out of a
// checkpoint that holds whole projections (gate / up rows, down columns, their scales and groups;
// down's bias on rank 0): the ranks' outputs sum to the whole layer (what the engine's all-reduce
// computes), in every scheme whose groups and blocks divide intermediate_size / tp_size, and
// gpt-oss's fused layout.
TEST(Checkpoint, TensorParallelRanksSumToTheWholeLayer) {
  struct Case {
    std::string scheme, model;
    int tp;
  };
  std::vector<Case> cases;
  for (const std::string& scheme : io::fixture_schemes()) {
    if (scheme.find("block128") != std::string::npos) continue;  // I / tp = 64 < 128: refused below
    if (scheme == "hf_mxfp4") continue;
    cases.push_back({scheme, "tiny", 2});
  }
  cases.push_back({"bf16", "tiny", 4});
  cases.push_back({"ct_w4afp8", "tiny", 4});  // a rank's 32 columns: 4 of the file's int32 words
  cases.push_back({"fp8_per_channel", "tiny-mixtral", 2});
  // Shared experts: each rank holds its slice of them too (DeepSeek's, Qwen2-MoE's gated one).
  cases.push_back({"bf16", "tiny-deepseek", 2});
  cases.push_back({"nvfp4", "tiny-deepseek", 2});
  cases.push_back({"bf16", "tiny-qwen2-moe", 2});
  cases.push_back({"fp8_per_channel", "tiny-qwen2-moe", 4});
  cases.push_back({"bf16", "tiny-llama4", 2});  // fused gate/up concatenated: two ranges a rank
  cases.push_back({"bf16", "tiny-gpt-oss", 2});
  cases.push_back({"hf_mxfp4", "tiny-gpt-oss", 2});
  cases.push_back({"hf_mxfp4", "tiny-gpt-oss", 4});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.scheme + " " + c.model + " tp " + std::to_string(c.tp));
    const fs::path dir = fixture(c.scheme, c.model);
    const MoELayer whole = load_moe_layer(dir, 1);
    const int64_t M = 13, H = whole.model().hidden_size;
    const Tensor x = testing::random_tensor({M, H}, DType::kBF16, 41);
    const Tensor logits = whole.router_logits(x);
    std::vector<double> sum(static_cast<size_t>(M * H), 0.0);
    for (int rank = 0; rank < c.tp; ++rank) {
      MoELayer part = tp_rank_layer(dir, 1, c.tp, rank);
      ASSERT_EQ(part.moe_config().intermediate_size_per_partition(),
                whole.moe_config().intermediate_size_per_partition() / c.tp);
      const Tensor out = part.forward(x, logits);
      ASSERT_FALSE(testing::has_nan(out));
      const std::vector<float> o = out.to_float_vector();
      for (size_t i = 0; i < sum.size(); ++i)
        sum[i] += o[i];
    }
    const RoutingResult routing = whole.router().select_experts(x, logits);
    std::vector<int64_t> rows(static_cast<size_t>(M));
    std::iota(rows.begin(), rows.end(), 0);
    const std::vector<double> ref = reference_forward(whole, x, routing, rows);
    // Dynamic activation scales differ between a rank's slice of the intermediate and the whole
    // row, so only the scheme's tolerance holds (a bias added twice, or a wrong slice, is far off).
    const double err = testing::relative_l2_error(sum, ref);
    EXPECT_LT(err, testing::tolerance(whole.tolerance_name()).rel_l2) << err;
    // gpt-oss's W4A16 quantizes no activation: bf16 roundings only (a second bias is ~0.1 off).
    if (c.model == "tiny-gpt-oss") {
      EXPECT_LT(err, testing::tolerance("bf16").rel_l2) << err;
    }
    fs::remove_all(dir);
  }
}

// Where intermediate_size / tp_size is not a whole number of the scheme's blocks, the rank's load
// is refused with the reason; a tensor whose dimensions are no multiple of the rank's is named.
TEST(Checkpoint, TensorParallelSlicesThatSplitABlockAreRefused) {
  const fs::path dir = fixture("fp8_block128");
  EXPECT_TRUE(testing::contains_all(error_of([&] { tp_rank_layer(dir, 1, 2, 1); }),
                                    {"intermediate_size_per_partition=64", "multiple of 128"}));
  fs::remove_all(dir);
  const fs::path bf16 = fixture("bf16");
  const std::string gate = "model.layers.1.mlp.experts.3.gate_proj.weight";
  rewrite(bf16, [&](const std::string& n, auto&, std::vector<int64_t>& s, auto& b) {
    if (n == gate) {  // 96 rows: not 2 x the rank's 64
      s = {96, s[1]};
      b.resize(b.size() / 4 * 3);
    }
    return true;
  });
  EXPECT_TRUE(
      testing::contains_all(error_of([&] { tp_rank_layer(bf16, 1, 2, 1); }),
                            {gate, "[96, 192]", "[64, 192]", "tensor-parallel rank 1 of 2"}));
  fs::remove_all(bf16);
}

// ---- gpt-oss's fused layout --------------------------------------------------------------------

// One fused tensor of a checkpoint file as floats: bf16 values, or MXFP4 _blocks / _scales
// decoded here with their own table (not moekit's), (E, N, K) row-major.
std::vector<double> gpt_oss_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorInfo& i = f.info(name);
  std::vector<double> out;
  if (i.dtype == "BF16") {
    const auto* b = reinterpret_cast<const uint16_t*>(i.bytes.data());
    for (int64_t k = 0; k < i.numel(); ++k)
      out.push_back(bf16_bits_to_float(b[k]));
    return out;
  }
  static const double kE2m1[16] = {0,    0.5,  1,  1.5,  2,  3,  4,  6,
                                   -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  const io::TensorInfo& sc = f.info(name.substr(0, name.size() - 7) + "_scales");
  const auto* codes = reinterpret_cast<const uint8_t*>(i.bytes.data());
  const auto* scales = reinterpret_cast<const uint8_t*>(sc.bytes.data());
  for (int64_t byte = 0; byte < static_cast<int64_t>(i.bytes.size()); ++byte) {
    const double scale = std::ldexp(1.0, static_cast<int>(scales[byte / 16]) - 127);
    out.push_back(kE2m1[codes[byte] & 0xF] * scale);  // the even element in the low nibble
    out.push_back(kE2m1[codes[byte] >> 4] * scale);
  }
  return out;
}

// The gpt-oss MoE block as HuggingFace computes it, in float64 on the file's tensors: logits = x
// W_r^T + b_r; the top-k logits (taken from `logits`, the layer's, so that near-ties cannot pick
// other experts) softmaxed; per expert gate_up = x W + b with gate and up interleaved, gate
// clamped above and up on both sides at 7, (up + 1) * gate * sigmoid(1.702 gate), then down.
std::vector<double> gpt_oss_reference(const fs::path& dir, int layer, const Tensor& x,
                                      const Tensor& logits, std::vector<double>* ref_logits) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(dir / "model.safetensors");
  const std::string p = fmt::format("model.layers.{}.mlp.", layer);
  const bool mx = f.contains(p + "experts.gate_up_proj_blocks");
  const std::vector<double> wr = gpt_oss_tensor(f, p + "router.weight");
  const std::vector<double> br = gpt_oss_tensor(f, p + "router.bias");
  const std::vector<double> gu =
      gpt_oss_tensor(f, p + "experts.gate_up_proj" + (mx ? "_blocks" : ""));
  const std::vector<double> gub = gpt_oss_tensor(f, p + "experts.gate_up_proj_bias");
  const std::vector<double> dn = gpt_oss_tensor(f, p + "experts.down_proj" + (mx ? "_blocks" : ""));
  const std::vector<double> dnb = gpt_oss_tensor(f, p + "experts.down_proj_bias");
  const int64_t M = x.size(0), H = x.size(1), E = static_cast<int64_t>(br.size());
  const int64_t I = static_cast<int64_t>(gub.size()) / E / 2, k = 4;
  // W(e, n, h) of gate_up and D(e, h, i) of down, either layout.
  auto W = [&](int64_t e, int64_t n, int64_t h) {
    return mx ? gu[((e * 2 * I + n) * H) + h] : gu[((e * H + h) * 2 * I) + n];
  };
  auto D = [&](int64_t e, int64_t h, int64_t i) {
    return mx ? dn[((e * H + h) * I) + i] : dn[((e * I + i) * H) + h];
  };
  const std::vector<float> xv = x.to_float_vector(), lv = logits.to_float_vector();
  std::vector<double> out(static_cast<size_t>(M * H), 0.0);
  ref_logits->assign(static_cast<size_t>(M * E), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t e = 0; e < E; ++e) {
      double s = br[e];
      for (int64_t h = 0; h < H; ++h)
        s += xv[m * H + h] * wr[e * H + h];
      (*ref_logits)[m * E + e] = s;
    }
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return lv[m * E + a] > lv[m * E + b]; });
    double denom = 0.0;
    for (int64_t j = 0; j < k; ++j)
      denom += std::exp(double(lv[m * E + order[j]]) - lv[m * E + order[0]]);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      const double weight = std::exp(double(lv[m * E + e]) - lv[m * E + order[0]]) / denom;
      std::vector<double> a(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = gub[e * 2 * I + 2 * i], u = gub[e * 2 * I + 2 * i + 1];
        for (int64_t h = 0; h < H; ++h) {
          g += xv[m * H + h] * W(e, 2 * i, h);
          u += xv[m * H + h] * W(e, 2 * i + 1, h);
        }
        g = std::min(g, 7.0);
        u = std::clamp(u, -7.0, 7.0);
        a[i] = (u + 1.0) * g / (1.0 + std::exp(-1.702 * g));
      }
      for (int64_t h = 0; h < H; ++h) {
        double y = dnb[e * H + h];
        for (int64_t i = 0; i < I; ++i)
          y += a[i] * D(e, h, i);
        out[m * H + h] += weight * y;
      }
    }
  }
  return out;
}

// gpt-oss checkpoints (fused experts, interleaved gate/up, biases, a router with a bias), bf16 and
// HuggingFace MXFP4, load into the layer that HuggingFace's formula computes on the file's
// tensors; under EP a rank reads its own experts out of the fused tensors.
TEST(Checkpoint, GptOssFusedLayoutIsHuggingFacesBlock) {
  for (const std::string scheme : {"bf16", "hf_mxfp4"}) {
    SCOPED_TRACE(scheme);
    const fs::path dir = fixture(scheme, "tiny-gpt-oss");
    CheckpointInfo info;
    MoELayer layer = load_moe_layer(dir, 1, {}, &info);
    EXPECT_EQ(layer.is_quantized(), scheme == "hf_mxfp4");
    EXPECT_EQ(info.method, scheme == "bf16" ? "unquantized" : "QuarkOCP_MX_MoEMethod");
    EXPECT_EQ(layer.model().activation, Activation::kSwigluOai);
    EXPECT_EQ(layer.model().top_k, 4);
    ASSERT_TRUE(layer.weights().router_bias.defined());
    const int64_t M = 23, H = layer.model().hidden_size, E = layer.model().num_experts;
    const Tensor x = testing::random_tensor({M, H}, DType::kBF16, 5);
    const Tensor logits = layer.router_logits(x);
    std::vector<double> ref_logits;
    const std::vector<double> ref = gpt_oss_reference(dir, 1, x, logits, &ref_logits);
    const std::vector<float> lv = logits.to_float_vector();
    for (int64_t i = 0; i < M * E; ++i)
      ASSERT_NEAR(lv[i], ref_logits[i], 1e-5 * (1.0 + std::fabs(ref_logits[i]))) << i;
    const Tensor out = layer.forward(x, logits);
    ASSERT_FALSE(testing::has_nan(out));
    const double err = testing::relative_l2_error(out, ref);
    EXPECT_LT(err, testing::tolerance("bf16").rel_l2) << err;
    EXPECT_GT(err, 0.0);
    check_layer(layer, 9);

    MoELayerOptions o;
    o.parallel = ParallelConfig::make(/*tp=*/2, /*dp=*/1, /*dp_rank=*/0, /*tp_rank=*/1,
                                      /*enable_ep=*/true);
    const MoELayer rank1 = load_moe_layer(dir, 1, o);
    ASSERT_EQ(rank1.first_local_expert(), E / 2);
    for (int64_t e = 0; e < E / 2; ++e) {
      const ExpertWeights mine = rank1.expert_reference(e);
      const ExpertWeights same = layer.expert_reference(E / 2 + e);
      EXPECT_TRUE(testing::bitwise_equal(mine.w13, same.w13)) << e;
      EXPECT_TRUE(testing::bitwise_equal(mine.w2, same.w2)) << e;
    }
    fs::remove_all(dir);
  }
}

// "dequantize": true decodes the MXFP4 experts at load (exactly, into bf16) and runs them
// unquantized: the same block within bf16 rounding.
TEST(Checkpoint, GptOssMxfp4DequantizeRunsUnquantized) {
  const fs::path dir = fixture("hf_mxfp4", "tiny-gpt-oss");
  nlohmann::json cfg;
  std::ifstream(dir / "config.json") >> cfg;
  cfg["quantization_config"]["dequantize"] = true;
  std::ofstream(dir / "config.json") << cfg.dump();
  EXPECT_FALSE(read_quark_config(dir).has_value());
  CheckpointInfo info;
  MoELayer layer = load_moe_layer(dir, 0, {}, &info);
  EXPECT_FALSE(layer.is_quantized());
  EXPECT_EQ(info.method, "unquantized");
  const Tensor x = testing::random_tensor({17, layer.model().hidden_size}, DType::kBF16, 8);
  const Tensor logits = layer.router_logits(x);
  std::vector<double> ref_logits;
  const std::vector<double> ref = gpt_oss_reference(dir, 0, x, logits, &ref_logits);
  EXPECT_LT(testing::relative_l2_error(layer.forward(x, logits), ref),
            testing::tolerance("bf16").rel_l2);
  cfg["quantization_config"]["dequantize"] = "yes";
  std::ofstream(dir / "config.json") << cfg.dump();
  EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 0); }),
                                    {"quantization_config.dequantize", "\"yes\""}));
  fs::remove_all(dir);
}

TEST(Checkpoint, GptOssLayoutErrorsNameTheTensorOrTheConfig) {
  const fs::path dir = fixture("hf_mxfp4", "tiny-gpt-oss");
  nlohmann::json cfg;
  std::ifstream(dir / "config.json") >> cfg;
  // MXFP4 codes without the config that reads them.
  cfg.erase("quantization_config");
  std::ofstream(dir / "config.json") << cfg.dump();
  EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 1); }),
                                    {"model.layers.1.mlp.experts.gate_up_proj_blocks", "mxfp4"}));
  // The fused layout with another quantization method.
  cfg["quantization_config"] =
      nlohmann::json::parse(io::fixture_quantization_config("fp8_per_channel"));
  std::ofstream(dir / "config.json") << cfg.dump();
  EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 1); }),
                                    {"every expert fused", "QuarkW8A8Fp8MoEMethod"}));
  // A missing or misshapen fused tensor is named.
  cfg["quantization_config"] = quantization::HfMxfp4Config{}.to_json();
  cfg["quantization_config"]["modules_to_not_convert"] = {1};
  std::ofstream(dir / "config.json") << cfg.dump();
  EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 1); }),
                                    {"modules_to_not_convert[0]"}));
  cfg["quantization_config"] = quantization::HfMxfp4Config{}.to_json();
  std::ofstream(dir / "config.json") << cfg.dump();
  rewrite(dir, [](const std::string& n, auto&, std::vector<int64_t>& shape, auto&) {
    if (n == "model.layers.1.mlp.experts.down_proj_scales") std::swap(shape[1], shape[2]);
    return n != "model.layers.0.mlp.experts.gate_up_proj_bias";
  });
  EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 0); }),
                                    {"'model.layers.0.mlp.experts.gate_up_proj_bias' not found"}));
  EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 1); }),
                                    {"model.layers.1.mlp.experts.down_proj_scales", "shape"}));
  fs::remove_all(dir);
}

// ---- Llama 4's fused layout
// ----------------------------------------------------------------------

// Llama 4's MoE block as HuggingFace computes it, in float64 on the file's tensors: the top-1
// expert (by the layer's `logits`) takes x * sigmoid(its logit); its gate_up = x W (gate and up
// concatenated), silu(gate) * up, then down; plus the shared expert on x.
std::vector<double> llama4_reference(const fs::path& dir, int layer, const Tensor& x,
                                     const Tensor& logits) {
  const io::SafetensorsFile f = io::SafetensorsFile::open(dir / "model.safetensors");
  const std::string p = fmt::format("language_model.model.layers.{}.feed_forward.", layer);
  const std::vector<double> gu = gpt_oss_tensor(f, p + "experts.gate_up_proj");  // (E, H, 2I)
  const std::vector<double> dn = gpt_oss_tensor(f, p + "experts.down_proj");     // (E, I, H)
  const std::vector<double> sg = gpt_oss_tensor(f, p + "shared_expert.gate_proj.weight");
  const std::vector<double> su = gpt_oss_tensor(f, p + "shared_expert.up_proj.weight");
  const std::vector<double> sd = gpt_oss_tensor(f, p + "shared_expert.down_proj.weight");
  const int64_t M = x.size(0), H = x.size(1), E = logits.size(1);
  const int64_t I = static_cast<int64_t>(sg.size()) / H;
  const std::vector<float> xv = x.to_float_vector(), lv = logits.to_float_vector();
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  std::vector<double> out(static_cast<size_t>(M * H), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const int64_t e =
        std::max_element(lv.begin() + m * E, lv.begin() + (m + 1) * E) - (lv.begin() + m * E);
    const double score = 1.0 / (1.0 + std::exp(-double(lv[m * E + e])));
    std::vector<double> a(static_cast<size_t>(I)), s(static_cast<size_t>(I));
    for (int64_t i = 0; i < I; ++i) {
      double g = 0, u = 0, g_s = 0, u_s = 0;
      for (int64_t h = 0; h < H; ++h) {
        const double xs = xv[m * H + h];
        g += xs * score * gu[(e * H + h) * 2 * I + i];
        u += xs * score * gu[(e * H + h) * 2 * I + I + i];
        g_s += xs * sg[i * H + h];
        u_s += xs * su[i * H + h];
      }
      a[i] = silu(g) * u;
      s[i] = silu(g_s) * u_s;
    }
    for (int64_t h = 0; h < H; ++h) {
      double y = 0;
      for (int64_t i = 0; i < I; ++i)
        y += a[i] * dn[(e * I + i) * H + h] + s[i] * sd[h * I + i];
      out[m * H + h] = y;
    }
  }
  return out;
}

// A Llama 4 checkpoint (Llama4ForConditionalGeneration's names under language_model, the config
// under text_config, experts fused with gate and up concatenated, a shared expert, top-1 sigmoid
// routing on the input) loads into the layer that HuggingFace's formula computes on the file.
TEST(Checkpoint, Llama4FusedLayoutIsHuggingFacesBlock) {
  const fs::path dir = fixture("bf16", "tiny-llama4");
  MoELayer layer = load_moe_layer(dir, 1);
  EXPECT_TRUE(layer.model().llama4_top1);
  EXPECT_TRUE(layer.has_shared_experts());
  const int64_t M = 19, H = layer.model().hidden_size;
  const Tensor x = testing::random_tensor({M, H}, DType::kBF16, 6);
  const Tensor logits = layer.router_logits(x);
  const Tensor out = layer.forward(x, logits);
  ASSERT_FALSE(testing::has_nan(out));
  const double err = testing::relative_l2_error(out, llama4_reference(dir, 1, x, logits));
  EXPECT_LT(err, testing::tolerance("bf16").rel_l2) << err;
  EXPECT_GT(err, 0.0);
  // Maverick's dense layers (an MLP in feed_forward) are named as such.
  const std::string l0 = "language_model.model.layers.0.feed_forward.";
  rewrite(dir, [&](std::string& n, auto&, auto&, auto&) {
    if (n == l0 + "shared_expert.gate_proj.weight") n = l0 + "gate_proj.weight";
    return n != l0 + "experts.gate_up_proj";
  });
  EXPECT_TRUE(testing::contains_all(error_of([&] { load_moe_layer(dir, 0); }),
                                    {"layer 0 is a dense layer", l0 + "gate_proj"}));
  fs::remove_all(dir);
}

// modules_to_not_convert match HuggingFace's way (a regular expression at the start of a module
// name): routers stay unquantized, the experts do not.
TEST(Checkpoint, HuggingFaceMxfp4ConfigMatchesModulesLikeHuggingFace) {
  const nlohmann::json j = {{"quant_method", "mxfp4"},
                            {"modules_to_not_convert", {"model.layers.*.mlp.router", "lm_head"}}};
  const quantization::HfMxfp4Config c = quantization::parse_hf_mxfp4_config(j, "q");
  EXPECT_FALSE(c.dequantize);
  const quark::QuarkConfig qc = c.to_quark_config();
  EXPECT_TRUE(qc.is_excluded("model.layers.3.mlp.router"));
  EXPECT_TRUE(qc.is_excluded("lm_head"));
  EXPECT_FALSE(qc.is_excluded("model.layers.3.mlp.experts"));
  EXPECT_TRUE(
      testing::contains_all(error_of([&] {
                              quantization::parse_hf_mxfp4_config({{"quant_method", "fp8"}}, "q");
                            }),
                            {"mxfp4"}));
  EXPECT_TRUE(testing::contains_all(
      error_of([&] {
        quantization::parse_hf_mxfp4_config(
            {{"quant_method", "mxfp4"}, {"modules_to_not_convert", "lm_head"}}, "q");
      }),
      {"q.modules_to_not_convert", "array of module names"}));
}

}  // namespace
}  // namespace moekit
