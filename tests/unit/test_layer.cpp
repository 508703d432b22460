// MoELayer and the model presets: the real models' shapes, HuggingFace config.json parsing, layer
// forwards on the small presets against a float64 recomputation (routing recomputed here too),
// expert parallelism (two ranks' outputs sum to the single-rank output), and the forward's edges.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "moekit/config/activation.h"
#include "moekit/config/parallel_config.h"
#include "moekit/config/routing.h"
#include "moekit/core/error.h"
#include "moekit/core/tensor.h"
#include "moekit/core/tolerance.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/layer/presets.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::contains_all;
using testing::error_of;

using testing::first_bad_element;
using testing::has_nan;
using testing::random_tensor;
using testing::relative_l2_error;
// A fresh directory under the system temp dir, removed at the end of the scope.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("moekit_test_layer_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// ---- presets ----------------------------------------------------------------------------------

TEST(Presets, RealModelsHaveTheirRealShapes) {
  const ModelPreset& mixtral = find_preset("mixtral-8x7b");
  EXPECT_EQ(mixtral.num_experts, 8);
  EXPECT_EQ(mixtral.top_k, 2);
  EXPECT_EQ(mixtral.hidden_size, 4096);
  EXPECT_EQ(mixtral.intermediate_size, 14336);
  EXPECT_EQ(mixtral.activation, Activation::kSilu);
  EXPECT_EQ(mixtral.scoring, ScoringFunc::kSoftmax);
  EXPECT_TRUE(mixtral.renormalize);
  EXPECT_EQ(mixtral.num_shared_experts, 0);
  EXPECT_EQ(mixtral.routing_method(), RoutingMethodType::kRenormalizeNaive);

  const ModelPreset& qwen = find_preset("qwen3-30b-a3b");
  EXPECT_EQ(qwen.num_experts, 128);
  EXPECT_EQ(qwen.top_k, 8);
  EXPECT_EQ(qwen.hidden_size, 2048);
  EXPECT_EQ(qwen.intermediate_size, 768);
  EXPECT_EQ(qwen.activation, Activation::kSilu);

  const ModelPreset& ds = find_preset("deepseek-v3");
  EXPECT_EQ(ds.num_experts, 256);
  EXPECT_EQ(ds.top_k, 8);
  EXPECT_EQ(ds.hidden_size, 7168);
  EXPECT_EQ(ds.intermediate_size, 2048);
  EXPECT_EQ(ds.scoring, ScoringFunc::kSigmoid);
  EXPECT_EQ(ds.num_expert_group, 8);
  EXPECT_EQ(ds.topk_group, 4);
  EXPECT_EQ(ds.routed_scaling_factor, std::optional<float>(2.5f));
  EXPECT_TRUE(ds.has_e_score_correction_bias);
  EXPECT_EQ(ds.num_shared_experts, 1);
  EXPECT_EQ(ds.shared_intermediate_size, 2048);
  EXPECT_EQ(ds.routing_method(), RoutingMethodType::kDeepSeekV3);

  const ModelPreset& oss = find_preset("gpt-oss-120b");
  EXPECT_EQ(oss.num_experts, 128);
  EXPECT_EQ(oss.top_k, 4);
  EXPECT_EQ(oss.hidden_size, 2880);
  EXPECT_EQ(oss.intermediate_size, 2880);
  EXPECT_EQ(oss.activation, Activation::kSwigluOai);
  EXPECT_TRUE(oss.has_bias);
  EXPECT_EQ(oss.swiglu_limit, std::optional<float>(7.0f));
  EXPECT_EQ(oss.swiglu_alpha, std::optional<float>(1.702f));

  const ModelPreset& llama = find_preset("llama4-scout");
  EXPECT_TRUE(llama.llama4_top1);
  EXPECT_EQ(llama.top_k, 1);
  EXPECT_EQ(llama.routing_method(), RoutingMethodType::kLlama4);

  // Names are unique, every preset is self-consistent, and the summary names the model.
  std::set<std::string> names;
  for (const ModelPreset& p : model_presets()) {
    EXPECT_TRUE(names.insert(p.name).second) << "duplicate preset " << p.name;
    EXPECT_GE(p.top_k, 1) << p.name;
    EXPECT_LE(p.top_k, p.num_experts) << p.name;
    EXPECT_GT(p.hidden_size, 0) << p.name;
    EXPECT_GT(p.intermediate_size, 0) << p.name;
    EXPECT_EQ(p.summary().rfind(p.name, 0), 0u) << p.summary();
    if (p.num_expert_group > 0) {
      EXPECT_EQ(p.num_experts % p.num_expert_group, 0) << p.name;
    }
  }
  for (const char* small : {"tiny", "small", "small-deepseek", "small-gpt-oss"})
    EXPECT_EQ(names.count(small), 1u) << small;
}

// An EP rank's random experts are a slice of the single-rank model of the same seed (so a DP + EP
// run can be checked against one process), and random_expert regenerates any one of them.
TEST(RandomWeights, EpRanksHoldSlicesOfTheSingleRankModel) {
  for (const char* name : {"small", "small-gpt-oss"}) {
    SCOPED_TRACE(name);
    const ModelPreset m = find_preset(name);
    MoELayerOptions one;
    const MoELayerWeights all = MoELayer::random_weights(m, one, 4);
    const int64_t E = m.num_experts / 2;
    for (int rank = 0; rank < 2; ++rank) {
      MoELayerOptions o;
      o.parallel = ParallelConfig::make(1, 2, rank, 0, true);
      const MoELayerWeights w = MoELayer::random_weights(m, o, 4);
      EXPECT_TRUE(testing::bitwise_equal(w.w13, all.w13.slice(0, rank * E, (rank + 1) * E)));
      EXPECT_TRUE(testing::bitwise_equal(w.w2, all.w2.slice(0, rank * E, (rank + 1) * E)));
      if (m.has_bias) {
        EXPECT_TRUE(
            testing::bitwise_equal(w.w13_bias, all.w13_bias.slice(0, rank * E, (rank + 1) * E)));
      }
    }
    const int64_t e = m.num_experts - 1;
    const ExpertWeights x = MoELayer::random_expert(m, one, 4, e);
    EXPECT_TRUE(testing::bitwise_equal(x.w13, all.w13.select(e).to_dtype(DType::kF32)));
    EXPECT_TRUE(testing::bitwise_equal(x.w2, all.w2.select(e).to_dtype(DType::kF32)));
    if (m.has_bias) {
      EXPECT_TRUE(testing::bitwise_equal(x.w2_bias, all.w2_bias.select(e).to_dtype(DType::kF32)));
    }
  }
}

// The stage marks a forward gives its observer (what `moekit bench` times) follow the order of the
// work: with the asynchronous no-EP finalize the shared experts run before the combine.
TEST(StageMarks, FollowTheOrderOfTheWork) {
  struct Recorder final : StageObserver {
    mutable std::vector<std::string> names;
    void stage_done(std::string_view stage, Stream) const override { names.emplace_back(stage); }
  } recorder;
  const ModelPreset model = find_preset("small-deepseek");
  MoELayerOptions separate;
  separate.shared_experts =
      SharedExpertsMode::kSeparate;  // their own pass, overlapping the combine
  MoELayer layer(model, MoELayer::random_weights(model, separate, 1), separate);
  const Tensor x = testing::random_tensor({5, model.hidden_size}, DType::kBF16, 2);
  const Tensor logits = testing::random_tensor({5, model.num_experts}, DType::kF32, 3);
  Tensor out = Tensor::empty({5, model.hidden_size}, DType::kBF16);
  layer.forward_into(out, x, logits, RunContext{Stream{}, nullptr, &recorder});
  auto at = [&](const char* name) {
    const auto it = std::find(recorder.names.begin(), recorder.names.end(), name);
    EXPECT_NE(it, recorder.names.end()) << name;
    return it - recorder.names.begin();
  };
  EXPECT_LT(at("router"), at("dispatch"));
  EXPECT_LT(at("dispatch"), at("experts"));
  EXPECT_LT(at("experts"), at("shared_experts"));
  EXPECT_LT(at("shared_experts"), at("finalize"));
  EXPECT_LT(at("finalize"), at("shared_add"));
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  const std::string msg = error_of([] { (void)find_preset("mixtral-8x22b-nope"); });
  EXPECT_TRUE(contains_all(msg, {"mixtral-8x22b-nope", "mixtral-8x7b", "qwen3-30b-a3b",
                                 "deepseek-v3", "gpt-oss-120b", "tiny"}));
}

// ---- HuggingFace config.json ------------------------------------------------------------------

TEST(HfConfig, MixtralLike) {
  TempDir dir;
  const auto path = dir.write("mixtral/config.json", R"({
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 4096,
    "intermediate_size": 14336, "hidden_act": "silu", "num_hidden_layers": 32,
    "torch_dtype": "bfloat16"})");
  const ModelPreset p = preset_from_hf_config(path);
  EXPECT_EQ(p.num_experts, 8);
  EXPECT_EQ(p.top_k, 2);
  EXPECT_EQ(p.hidden_size, 4096);
  EXPECT_EQ(p.intermediate_size, 14336);
  EXPECT_EQ(p.activation, Activation::kSilu);
  EXPECT_EQ(p.scoring, ScoringFunc::kSoftmax);
  EXPECT_TRUE(p.renormalize);
  EXPECT_EQ(p.num_layers, 32);
  EXPECT_EQ(p.dtype, DType::kBF16);
  EXPECT_EQ(p.num_shared_experts, 0);
  EXPECT_FALSE(p.llama4_top1);
  // A directory holding config.json works too.
  EXPECT_EQ(preset_from_hf_config(path.parent_path()).intermediate_size, 14336);
}

TEST(HfConfig, Qwen3MoeLikeUsesTheMoeIntermediateSize) {
  TempDir dir;
  const auto path = dir.write("config.json", R"({
    "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8,
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "norm_topk_prob": true, "hidden_act": "silu", "num_hidden_layers": 48})");
  const ModelPreset p = preset_from_hf_config(path);
  EXPECT_EQ(p.num_experts, 128);
  EXPECT_EQ(p.top_k, 8);
  EXPECT_EQ(p.hidden_size, 2048);
  EXPECT_EQ(p.intermediate_size, 768);
  EXPECT_TRUE(p.renormalize);
  const ModelPreset& q = find_preset("qwen3-30b-a3b");
  EXPECT_EQ(p.routing_method(), q.routing_method());
}

TEST(HfConfig, DeepSeekV3LikeMatchesThePreset) {
  TempDir dir;
  const auto path = dir.write("config.json", R"({
    "model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "norm_topk_prob": true, "n_shared_experts": 1,
    "first_k_dense_replace": 3, "num_hidden_layers": 61, "hidden_act": "silu"})");
  const ModelPreset p = preset_from_hf_config(path);
  const ModelPreset& ds = find_preset("deepseek-v3");
  EXPECT_EQ(p.num_experts, ds.num_experts);
  EXPECT_EQ(p.top_k, ds.top_k);
  EXPECT_EQ(p.hidden_size, ds.hidden_size);
  EXPECT_EQ(p.intermediate_size, ds.intermediate_size);
  EXPECT_EQ(p.scoring, ScoringFunc::kSigmoid);
  EXPECT_EQ(p.num_expert_group, 8);
  EXPECT_EQ(p.topk_group, 4);
  EXPECT_EQ(p.routed_scaling_factor, std::optional<float>(2.5f));
  EXPECT_TRUE(p.has_e_score_correction_bias);
  EXPECT_EQ(p.num_shared_experts, 1);
  EXPECT_EQ(p.shared_intermediate_size, 2048);
  EXPECT_EQ(p.first_moe_layer, 3);
  EXPECT_EQ(p.num_layers, 61);
  EXPECT_EQ(p.routing_method(), RoutingMethodType::kDeepSeekV3);
  // Without topk_method noaux_tc there is no correction bias.
  const auto plain = dir.write("plain/config.json", R"({
    "model_type": "deepseek_v2", "n_routed_experts": 64, "num_experts_per_tok": 6,
    "hidden_size": 2048, "moe_intermediate_size": 1408, "topk_method": "greedy"})");
  EXPECT_FALSE(preset_from_hf_config(plain).has_e_score_correction_bias);
}

TEST(HfConfig, GptOssLike) {
  TempDir dir;
  const auto path = dir.write("config.json", R"({
    "model_type": "gpt_oss", "num_local_experts": 128, "experts_per_token": 4,
    "hidden_size": 2880, "intermediate_size": 2880, "swiglu_limit": 7.0,
    "num_hidden_layers": 36})");
  const ModelPreset p = preset_from_hf_config(path);
  EXPECT_EQ(p.num_experts, 128);
  EXPECT_EQ(p.top_k, 4);
  EXPECT_EQ(p.hidden_size, 2880);
  EXPECT_EQ(p.intermediate_size, 2880);
  EXPECT_EQ(p.activation, Activation::kSwigluOai);
  EXPECT_TRUE(p.has_bias);
  EXPECT_EQ(p.swiglu_limit, std::optional<float>(7.0f));
  EXPECT_EQ(p.swiglu_alpha, std::optional<float>(1.702f));
  EXPECT_EQ(p.swiglu_beta, std::optional<float>(1.0f));
}

TEST(HfConfig, Llama4LikeReadsTheTextConfig) {
  TempDir dir;
  const auto path = dir.write("config.json", R"({
    "model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
    "vision_config": {"hidden_size": 1408},
    "text_config": {"model_type": "llama4_text", "num_local_experts": 16,
                    "num_experts_per_tok": 1, "hidden_size": 5120, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "num_hidden_layers": 48,
                    "torch_dtype": "bfloat16"}})");
  const ModelPreset p = preset_from_hf_config(path);
  EXPECT_EQ(p.num_experts, 16);
  EXPECT_EQ(p.top_k, 1);
  EXPECT_EQ(p.hidden_size, 5120) << "the vision tower's hidden_size must not win";
  EXPECT_EQ(p.intermediate_size, 8192);
  EXPECT_TRUE(p.llama4_top1);
  EXPECT_EQ(p.scoring, ScoringFunc::kSigmoid);
  EXPECT_EQ(p.num_shared_experts, 1);
  EXPECT_EQ(p.routing_method(), RoutingMethodType::kLlama4);
}

TEST(HfConfig, MissingKeyInvalidJsonAndMissingFile) {
  TempDir dir;
  const auto no_hidden = dir.write("a.json", R"({"model_type": "mixtral",
    "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 14336})");
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(no_hidden); }),
                           {"hidden_size", "a.json"}));
  const auto no_experts = dir.write("b.json", R"({"model_type": "mixtral",
    "num_experts_per_tok": 2, "hidden_size": 64, "intermediate_size": 96})");
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(no_experts); }),
                           {"num_local_experts", "num_experts", "n_routed_experts"}));
  const auto no_topk = dir.write("c.json", R"({"num_local_experts": 8, "hidden_size": 64,
    "intermediate_size": 96})");
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(no_topk); }),
                           {"num_experts_per_tok"}));
  const auto broken = dir.write("d.json", "{ \"num_local_experts\": 8, ");
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(broken); }),
                           {"d.json", "not valid JSON"}));
  const auto wrong_type = dir.write("e.json", R"({"num_local_experts": "eight",
    "num_experts_per_tok": 2, "hidden_size": 64, "intermediate_size": 96})");
  EXPECT_TRUE(
      contains_all(error_of([&] { (void)preset_from_hf_config(wrong_type); }), {"e.json", "type"}));
  const auto too_many = dir.write("f.json", R"({"num_local_experts": 4,
    "num_experts_per_tok": 5, "hidden_size": 64, "intermediate_size": 96})");
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(too_many); }),
                           {"num_experts_per_tok=5"}));
  EXPECT_TRUE(contains_all(error_of([&] { (void)preset_from_hf_config(dir.path() / "nope.json"); }),
                           {"nope.json"}));
}

// ---- layer forward vs float64 -----------------------------------------------------------------

double silu_d(double x) {
  return x / (1.0 + std::exp(-x));
}
double sigmoid_d(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// act(g) for the presets' activations: silu (gate first half) or swigluoai (interleaved).
std::vector<double> act_ref(const ModelPreset& p, const std::vector<double>& g) {
  const size_t d = g.size() / 2;
  std::vector<double> a(d);
  for (size_t i = 0; i < d; ++i) {
    if (p.activation == Activation::kSwigluOai) {
      const double limit = p.swiglu_limit.value_or(7.0f);
      const double gate = std::min(g[2 * i], limit);
      const double up = std::clamp(g[2 * i + 1], -limit, limit);
      a[i] = (up + p.swiglu_beta.value_or(1.0f)) * gate *
             sigmoid_d(p.swiglu_alpha.value_or(1.702f) * gate);
    } else {
      a[i] = silu_d(g[i]) * g[d + i];
    }
  }
  return a;
}

std::vector<double> doubles(const Tensor& t) {
  const std::vector<float> f = t.to_float_vector();
  return {f.begin(), f.end()};
}

// y = W2[e] @ act(W13[e] @ x + b13[e]) + b2[e] on (E, N, H) / (E, H, I) float64 arrays.
std::vector<double> mlp(const ModelPreset& p, const std::vector<double>& w13,
                        const std::vector<double>& w2, const std::vector<double>& b13,
                        const std::vector<double>& b2, int64_t e, int64_t N, int64_t I,
                        const double* x) {
  const int64_t H = p.hidden_size;
  std::vector<double> g(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double acc = b13.empty() ? 0.0 : b13[static_cast<size_t>(e * N + n)];
    for (int64_t h = 0; h < H; ++h)
      acc += w13[static_cast<size_t>((e * N + n) * H + h)] * x[h];
    g[static_cast<size_t>(n)] = acc;
  }
  const std::vector<double> a = act_ref(p, g);
  std::vector<double> y(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) {
    double acc = b2.empty() ? 0.0 : b2[static_cast<size_t>(e * H + h)];
    for (int64_t i = 0; i < I; ++i)
      acc += w2[static_cast<size_t>((e * H + h) * I + i)] * a[static_cast<size_t>(i)];
    y[static_cast<size_t>(h)] = acc;
  }
  return y;
}

// The layer's output in float64: routed experts of this rank (global ids in [first, first +
// E_local), whose weights `w` holds as local experts 0..E_local-1) plus the shared experts, from
// the given routing.
std::vector<double> layer_reference(const ModelPreset& p, const MoELayerWeights& w, const Tensor& x,
                                    const Tensor& ids, const Tensor& weights, int first_local,
                                    int E_local, bool weight_on_input = false) {
  const int64_t H = p.hidden_size, I = p.intermediate_size, N = 2 * I;
  const int64_t M = x.size(0);
  const int k = static_cast<int>(ids.size(1));
  const std::vector<double> xs = doubles(x), w13 = doubles(w.w13), w2 = doubles(w.w2);
  const std::vector<double> b13 =
      w.w13_bias.defined() ? doubles(w.w13_bias) : std::vector<double>{};
  const std::vector<double> b2 = w.w2_bias.defined() ? doubles(w.w2_bias) : std::vector<double>{};
  const std::vector<int64_t> id = ids.to_int_vector();
  const std::vector<float> wt = weights.to_float_vector();
  std::vector<double> out(static_cast<size_t>(M * H), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int j = 0; j < k; ++j) {
      const int64_t e = id[static_cast<size_t>(m * k + j)] - first_local;
      if (e < 0 || e >= E_local) continue;
      const double wj = wt[static_cast<size_t>(m * k + j)];
      std::vector<double> xin(xs.begin() + m * H, xs.begin() + (m + 1) * H);
      if (weight_on_input) {
        for (double& v : xin)
          v *= wj;
      }
      const std::vector<double> y = mlp(p, w13, w2, b13, b2, e, N, I, xin.data());
      for (int64_t h = 0; h < H; ++h)
        out[static_cast<size_t>(m * H + h)] +=
            (weight_on_input ? 1.0 : wj) * y[static_cast<size_t>(h)];
    }
  }
  if (p.num_shared_experts > 0) {
    const int64_t Is = p.shared_intermediate_size * p.num_shared_experts;
    const std::vector<double> s13 = doubles(w.shared_w13), s2 = doubles(w.shared_w2);
    const std::vector<double> g =
        w.shared_gate.defined() ? doubles(w.shared_gate) : std::vector<double>{};
    for (int64_t m = 0; m < M; ++m) {
      const std::vector<double> y =
          mlp(p, s13, s2, {}, {}, 0, 2 * Is, Is, &xs[static_cast<size_t>(m * H)]);
      double gate = 1.0;  // Qwen2-MoE: sigmoid(x . shared_gate)
      if (!g.empty()) {
        double dot = 0.0;
        for (int64_t h = 0; h < H; ++h)
          dot += g[static_cast<size_t>(h)] * xs[static_cast<size_t>(m * H + h)];
        gate = 1.0 / (1.0 + std::exp(-dot));
      }
      for (int64_t h = 0; h < H; ++h)
        out[static_cast<size_t>(m * H + h)] += gate * y[static_cast<size_t>(h)];
    }
  }
  return out;
}

// Routing recomputed in float64 from the preset's description: (ids sorted per row, weights in
// the same order).
struct Routed {
  std::vector<std::vector<int>> ids;
  std::vector<std::vector<double>> weights;
};

Routed routing_reference(const ModelPreset& p, const Tensor& logits, const Tensor& bias) {
  const int64_t M = logits.size(0);
  const int E = p.num_experts, k = p.top_k;
  const std::vector<double> l = doubles(logits);
  const std::vector<double> b = bias.defined() ? doubles(bias) : std::vector<double>(E, 0.0);
  Routed r;
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> score(static_cast<size_t>(E));
    if (p.scoring == ScoringFunc::kSigmoid) {
      for (int e = 0; e < E; ++e)
        score[static_cast<size_t>(e)] = sigmoid_d(l[static_cast<size_t>(m * E + e)]);
    } else {
      double mx = -1e300, sum = 0;
      for (int e = 0; e < E; ++e)
        mx = std::max(mx, l[static_cast<size_t>(m * E + e)]);
      for (int e = 0; e < E; ++e)
        sum += score[static_cast<size_t>(e)] = std::exp(l[static_cast<size_t>(m * E + e)] - mx);
      for (double& s : score)
        s /= sum;
    }
    std::vector<double> sel(score);
    for (int e = 0; e < E; ++e)
      sel[static_cast<size_t>(e)] += b[static_cast<size_t>(e)];
    std::vector<bool> allowed(static_cast<size_t>(E), true);
    if (p.num_expert_group > 1) {
      const int G = p.num_expert_group, per = E / G;
      std::vector<std::pair<double, int>> groups;
      for (int g = 0; g < G; ++g) {
        std::vector<double> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
        std::sort(v.rbegin(), v.rend());
        groups.emplace_back(bias.defined() ? v[0] + v[1] : v[0], g);
      }
      std::sort(groups.begin(), groups.end(), [](auto& a, auto& c) {
        return a.first > c.first || (a.first == c.first && a.second < c.second);
      });
      std::fill(allowed.begin(), allowed.end(), false);
      for (int t = 0; t < p.topk_group; ++t)
        for (int e = 0; e < per; ++e)
          allowed[static_cast<size_t>(groups[static_cast<size_t>(t)].second * per + e)] = true;
    }
    std::vector<int> order;
    for (int e = 0; e < E; ++e)
      if (allowed[static_cast<size_t>(e)]) order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) {
      return sel[static_cast<size_t>(a)] > sel[static_cast<size_t>(c)];
    });
    order.resize(static_cast<size_t>(k));
    std::sort(order.begin(), order.end());
    std::vector<double> w;
    double sum = 0;
    for (int e : order) {
      w.push_back(score[static_cast<size_t>(e)]);
      sum += score[static_cast<size_t>(e)];
    }
    for (double& v : w) {
      if (p.renormalize) v /= sum;
      v *= p.routed_scaling_factor.value_or(1.0f);
    }
    r.ids.push_back(order);
    r.weights.push_back(w);
  }
  return r;
}

void expect_routing_matches(const Routed& want, const Tensor& ids, const Tensor& weights,
                            const std::string& what) {
  const int64_t M = ids.size(0);
  const int k = static_cast<int>(ids.size(1));
  const std::vector<int64_t> id = ids.to_int_vector();
  const std::vector<float> wt = weights.to_float_vector();
  for (int64_t m = 0; m < M; ++m) {
    std::vector<std::pair<int, double>> got;
    for (int j = 0; j < k; ++j)
      got.emplace_back(static_cast<int>(id[static_cast<size_t>(m * k + j)]),
                       wt[static_cast<size_t>(m * k + j)]);
    std::sort(got.begin(), got.end());
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(got[static_cast<size_t>(j)].first,
                want.ids[static_cast<size_t>(m)][static_cast<size_t>(j)])
          << what << ": token " << m << " expert set differs";
      EXPECT_NEAR(got[static_cast<size_t>(j)].second,
                  want.weights[static_cast<size_t>(m)][static_cast<size_t>(j)], 1e-5)
          << what << ": token " << m << " weight";
    }
  }
}

void expect_close(const Tensor& out, const std::vector<double>& ref, DType dtype,
                  const std::string& what) {
  const Tolerance& tol = tolerance_for(dtype);
  ASSERT_FALSE(has_nan(out)) << what;
  EXPECT_LE(relative_l2_error(out, ref), tol.rel_l2) << what;
  EXPECT_EQ(first_bad_element(out, ref, tol), -1) << what;
}

class LayerForward : public ::testing::TestWithParam<const char*> {};

TEST_P(LayerForward, MatchesFloat64Recomputation) {
  const ModelPreset& preset = find_preset(GetParam());
  MoELayerOptions options;
  options.max_num_tokens = 64;
  const MoELayerWeights w = MoELayer::random_weights(preset, options, 1234);
  MoELayer layer(preset, w, options);
  EXPECT_TRUE(layer.selection().ok()) << layer.selection().to_string();
  EXPECT_FALSE(layer.expert_map().defined()) << "no EP: no expert_map";
  EXPECT_EQ(layer.has_shared_experts(), preset.num_shared_experts > 0);
  // auto folds two or more chunks (small-qwen2-moe), not one (tests/unit/test_shared_fold.cpp).
  EXPECT_EQ(layer.shared_chunks(), std::string(GetParam()) == "small-qwen2-moe" ? 2 : 0)
      << layer.shared_fold_reason();

  for (int64_t M : {1, 13}) {
    const Tensor x =
        random_tensor({M, preset.hidden_size}, options.dtype, 50 + static_cast<uint64_t>(M));
    const Tensor logits = random_tensor({M, preset.num_experts}, DType::kF32,
                                        60 + static_cast<uint64_t>(M), -3.0f, 3.0f);
    const Tensor y = layer.forward(x, logits);
    ASSERT_EQ(y.shape(), (Shape{M, preset.hidden_size}));
    ASSERT_EQ(y.dtype(), options.dtype);
    // The routing, recomputed here from the preset's description.
    const RoutingResult routed = layer.router().select_experts(x, logits);
    expect_routing_matches(routing_reference(preset, logits, w.e_score_correction_bias),
                           routed.topk_ids, routed.topk_weights,
                           std::string(GetParam()) + " M=" + std::to_string(M));
    expect_close(
        y,
        layer_reference(preset, w, x, routed.topk_ids, routed.topk_weights, 0, preset.num_experts),
        options.dtype, std::string(GetParam()) + " M=" + std::to_string(M));
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, LayerForward,
                         ::testing::Values("tiny", "small-deepseek", "small-gpt-oss",
                                           "small-qwen2-moe"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(Layer, Llama4StyleRouterWeightGoesOnTheInput) {
  ModelPreset p = find_preset("tiny");
  p.name = "tiny-llama4";
  p.top_k = 1;
  p.llama4_top1 = true;
  p.scoring = ScoringFunc::kSigmoid;
  p.renormalize = false;
  MoELayerOptions options;
  options.dtype = DType::kF32;
  const MoELayerWeights w = MoELayer::random_weights(p, options, 77);
  MoELayer layer(p, w, options);
  EXPECT_TRUE(layer.router().apply_router_weight_on_input());
  const Tensor x = random_tensor({9, p.hidden_size}, options.dtype, 5);
  const Tensor logits = random_tensor({9, p.num_experts}, DType::kF32, 6, -3.0f, 3.0f);
  const Tensor y = layer.forward(x, logits);
  const RoutingResult r = layer.router().select_experts(x, logits);
  expect_close(y, layer_reference(p, w, x, r.topk_ids, r.topk_weights, 0, 8, true), options.dtype,
               "llama4-style");
}

// ---- expert parallelism -----------------------------------------------------------------------

TEST(Layer, TwoExpertParallelRanksSumToTheSingleRankOutput) {
  const ModelPreset& preset = find_preset("tiny");  // E = 8, no shared experts
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    MoELayerOptions single_opts;
    single_opts.dtype = dtype;
    const MoELayerWeights full = MoELayer::random_weights(preset, single_opts, 99);
    MoELayer single(preset, full, single_opts);

    const Tensor x = random_tensor({11, preset.hidden_size}, dtype, 7);
    const Tensor logits = random_tensor({11, preset.num_experts}, DType::kF32, 8, -2.0f, 2.0f);
    const Tensor y_single = single.forward(x, logits);

    std::vector<double> sum(static_cast<size_t>(y_single.numel()), 0.0);
    for (int rank = 0; rank < 2; ++rank) {
      MoELayerOptions opts = single_opts;
      opts.parallel = ParallelConfig::make(/*tp_size=*/2, /*dp_size=*/1, /*dp_rank=*/0,
                                           /*tp_rank=*/rank, /*enable_ep=*/true);
      ASSERT_TRUE(opts.parallel.use_ep);
      ASSERT_EQ(opts.parallel.ep_size, 2);
      ASSERT_EQ(opts.parallel.ep_rank, rank);
      MoELayerWeights part;
      part.w13 = full.w13.slice(0, 4 * rank, 4 * rank + 4).clone();
      part.w2 = full.w2.slice(0, 4 * rank, 4 * rank + 4).clone();
      MoELayer layer(preset, part, opts);
      EXPECT_EQ(layer.moe_config().num_local_experts, 4);
      EXPECT_EQ(layer.first_local_expert(), 4 * rank);
      ASSERT_TRUE(layer.expert_map().defined());
      std::vector<int64_t> want_map(8, -1);
      for (int e = 0; e < 4; ++e)
        want_map[static_cast<size_t>(4 * rank + e)] = e;
      EXPECT_EQ(layer.expert_map().to_int_vector(), want_map);

      const Tensor y = layer.forward(x, logits);
      ASSERT_FALSE(has_nan(y));
      // Each rank alone matches the float64 contributions of its own experts.
      const RoutingResult r = layer.router().select_experts(x, logits);
      expect_close(y, layer_reference(preset, part, x, r.topk_ids, r.topk_weights, 4 * rank, 4),
                   dtype, "rank " + std::to_string(rank));
      const std::vector<float> v = y.to_float_vector();
      for (size_t i = 0; i < v.size(); ++i)
        sum[i] += v[i];
    }
    const Tolerance& tol = tolerance_for(dtype);
    EXPECT_LE(relative_l2_error(y_single, sum), tol.rel_l2) << dtype_name(dtype);
    EXPECT_EQ(first_bad_element(y_single, sum, tol), -1) << dtype_name(dtype);
  }
}

// ---- forward edges ----------------------------------------------------------------------------

TEST(Layer, Int64TopkIdsAreAcceptedByForwardRouted) {
  const ModelPreset& preset = find_preset("tiny");
  MoELayer layer(preset, MoELayer::random_weights(preset, {}, 5));
  const Tensor x = random_tensor({6, preset.hidden_size}, DType::kBF16, 1);
  Tensor ids, weights;
  testing::random_routing(6, preset.top_k, preset.num_experts, 2, &ids, &weights);
  const Tensor y32 = layer.forward_routed(x, ids, weights);
  const Tensor ids64 = Tensor::from_ints(ids.to_int_vector(), ids.shape(), DType::kInt64);
  const Tensor y64 = layer.forward_routed(x, ids64, weights);
  ASSERT_EQ(y32.nbytes(), y64.nbytes());
  EXPECT_EQ(std::memcmp(y32.data(), y64.data(), y32.nbytes()), 0);
  // An int64 id that does not fit in int32 is rejected, not wrapped around.
  std::vector<int64_t> big = ids.to_int_vector();
  big[0] = (int64_t{1} << 32) + 1;  // would wrap to 1
  EXPECT_TRUE(contains_all(error_of([&] {
                             (void)layer.forward_routed(
                                 x, Tensor::from_ints(big, ids.shape(), DType::kInt64), weights);
                           }),
                           {"topk_ids"}));
}

TEST(Layer, ZeroTokens) {
  const ModelPreset& preset = find_preset("small-deepseek");  // with shared experts
  MoELayer layer(preset, MoELayer::random_weights(preset, {}, 6));
  const Tensor x = Tensor::empty({0, preset.hidden_size}, DType::kBF16);
  const Tensor logits = Tensor::empty({0, preset.num_experts}, DType::kF32);
  const Tensor y = layer.forward(x, logits);
  EXPECT_EQ(y.shape(), (Shape{0, preset.hidden_size}));
  EXPECT_EQ(y.dtype(), DType::kBF16);
}

TEST(Layer, MoreTokensThanMaxNumTokensIsAnError) {
  const ModelPreset& preset = find_preset("tiny");
  MoELayerOptions options;
  options.max_num_tokens = 16;
  MoELayer layer(preset, MoELayer::random_weights(preset, options, 7), options);
  const Tensor ok_x = random_tensor({16, preset.hidden_size}, DType::kBF16, 8);
  EXPECT_NO_THROW((void)layer.forward(ok_x, random_tensor({16, 8}, DType::kF32, 9)));
  const Tensor x = random_tensor({17, preset.hidden_size}, DType::kBF16, 10);
  const std::string msg = error_of([&] {
    (void)layer.forward(x, random_tensor({17, 8}, DType::kF32, 11));
  });
  EXPECT_TRUE(contains_all(msg, {"M=17", "max_num_tokens=16"}));
}

TEST(Layer, BadInputsAndWeightsAreNamed) {
  const ModelPreset& preset = find_preset("tiny");
  MoELayer layer(preset, MoELayer::random_weights(preset, {}, 12));
  const Tensor x = random_tensor({3, preset.hidden_size}, DType::kBF16, 13);
  EXPECT_TRUE(contains_all(error_of([&] {
                             (void)layer.forward(x, random_tensor({3, 7}, DType::kF32, 14));
                           }),
                           {"router_logits", "[3, 7]"}));
  EXPECT_TRUE(contains_all(
      error_of([&] {
        (void)layer.forward(x.to_dtype(DType::kF32), random_tensor({3, 8}, DType::kF32, 15));
      }),
      {"hidden_states", "f32", "bf16"}));
  MoELayerWeights w = MoELayer::random_weights(preset, {}, 16);
  w.w13 = w.w13.slice(0, 0, 7).clone();
  EXPECT_TRUE(contains_all(error_of([&] { MoELayer bad(preset, w); }), {"w13", "[7, 192, 64]"}));
  MoELayerOptions forced;
  forced.backend = "sm90_grouped";
  try {
    MoELayer gpu(preset, MoELayer::random_weights(preset, forced, 17), forced);
    ADD_FAILURE() << "a forced GPU backend on the CPU must be refused";
  } catch (const UnsupportedError& e) {
    EXPECT_TRUE(contains_all(e.what(), {"sm90_grouped"}));
  }
}

}  // namespace
}  // namespace moekit
