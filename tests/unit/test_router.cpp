// Routers: closed-form cases, an independent float64 reference on random logits, NaN/Inf rows,
// awkward sizes and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moekit/core/device.h"
#include "moekit/core/error.h"
#include "moekit/core/tensor.h"
#include "moekit/router/router.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::error_of;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// Tolerances: ids as sets (exact), weights relative to the float64 reference.
constexpr double kWeightRelTol = 1e-6;

RouterConfig softmax_config(int E, int k, bool renormalize) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.scoring = ScoringFunc::kSoftmax;
  c.renormalize = renormalize;
  return c;
}

RouterConfig sigmoid_config(int E, int k, bool renormalize) {
  RouterConfig c = softmax_config(E, k, renormalize);
  c.scoring = ScoringFunc::kSigmoid;
  return c;
}

RouterConfig grouped_config(int E, int k, int groups, int topk_group, ScoringFunc scoring,
                            bool renormalize) {
  RouterConfig c = softmax_config(E, k, renormalize);
  c.scoring = scoring;
  c.use_grouped_topk = true;
  c.num_expert_group = groups;
  c.topk_group = topk_group;
  return c;
}

RouterConfig llama4_config(int E) {
  RouterConfig c = softmax_config(E, 1, false);
  c.llama4_top1 = true;
  return c;
}

Tensor bias_tensor(const std::vector<float>& values) {
  return Tensor::from_floats(values, {static_cast<int64_t>(values.size())}, DType::kF32);
}

Tensor logits_tensor(const std::vector<float>& values, int64_t M, int64_t E,
                     DType dtype = DType::kF32) {
  return Tensor::from_floats(values, {M, E}, dtype);
}

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v)
    x = d(rng);
  return v;
}

// Routes with make_router into poisoned caller-owned outputs.
RoutingResult route(const RouterConfig& c, const Tensor& logits) {
  auto router = make_router(c);
  const int64_t M = logits.size(0);
  RoutingResult r;
  r.topk_weights = Tensor::empty({M, c.top_k}, DType::kF32);
  r.topk_ids = Tensor::empty({M, c.top_k}, DType::kInt32);
  r.topk_weights.fill_bytes(0xFF);
  r.topk_ids.fill_bytes(0xFF);
  Tensor hidden = Tensor::empty({M, 16}, DType::kBF16);
  router->select_experts_into(hidden, logits, r.topk_weights, r.topk_ids);
  return r;
}

// ---- the independent float64 reference ---------------------------------------------------------

struct RefRow {
  std::vector<int> ids;         // in decreasing key order
  std::vector<double> weights;  // per chosen id
  std::vector<double> keys;     // selection key of every expert
  std::vector<bool> candidate;  // expert inside a kept group
};

// Finite logits only. Written from the algorithm's description, not from the library's code.
std::vector<RefRow> reference(const RouterConfig& c, const std::vector<float>& logits, int64_t M) {
  const int E = c.num_experts, k = c.top_k;
  std::vector<double> bias(E, 0.0);
  if (c.has_bias()) {
    auto b = c.e_score_correction_bias.to_float_vector();
    for (int e = 0; e < E; ++e)
      bias[e] = b[e];
  }
  const double scale = c.routed_scaling_factor.value_or(1.0f);
  std::vector<RefRow> out(M);
  for (int64_t m = 0; m < M; ++m) {
    std::vector<double> x(logits.begin() + m * E, logits.begin() + (m + 1) * E);
    std::vector<double> score(E);
    if (c.llama4_top1 || c.scoring == ScoringFunc::kSigmoid) {
      for (int e = 0; e < E; ++e)
        score[e] = 1.0 / (1.0 + std::exp(-x[e]));
    } else {
      const double mx = *std::max_element(x.begin(), x.end());
      double sum = 0;
      for (int e = 0; e < E; ++e)
        sum += std::exp(x[e] - mx);
      for (int e = 0; e < E; ++e)
        score[e] = std::exp(x[e] - mx) / sum;
    }
    RefRow& row = out[m];
    row.keys.resize(E);
    for (int e = 0; e < E; ++e)
      row.keys[e] = c.llama4_top1 ? x[e] : score[e] + bias[e];
    row.candidate.assign(E, true);
    const int G = c.num_expert_group;
    if (c.use_grouped_topk && G > 1 && G < E) {
      const int size = E / G;
      std::vector<double> gscore(G);
      for (int g = 0; g < G; ++g) {
        std::vector<double> member(row.keys.begin() + g * size, row.keys.begin() + (g + 1) * size);
        std::sort(member.rbegin(), member.rend());
        gscore[g] = c.has_bias() ? member[0] + member[1] : member[0];
      }
      std::vector<int> order(G);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return gscore[a] > gscore[b]; });
      row.candidate.assign(E, false);
      for (int i = 0; i < c.topk_group; ++i) {
        for (int j = 0; j < size; ++j)
          row.candidate[order[i] * size + j] = true;
      }
    }
    std::vector<int> ids;
    for (int e = 0; e < E; ++e) {
      if (row.candidate[e]) ids.push_back(e);
    }
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int a, int b) { return row.keys[a] > row.keys[b]; });
    ids.resize(k);
    row.ids = ids;
    double sum = 0;
    for (int id : ids) {
      row.weights.push_back(score[id]);
      sum += score[id];
    }
    for (double& w : row.weights) {
      if (c.renormalize && !c.llama4_top1) w /= sum;
      w *= scale;
    }
  }
  return out;
}

// Compares ids as sets and weights per id. Near-ties at the k-th place (within 1e-6 of the k-th
// key) may pick either expert: the check then only asks that the swapped experts tie.
void expect_matches_reference(const RouterConfig& c, const RoutingResult& r,
                              const std::vector<RefRow>& ref, const std::string& what) {
  const int k = c.top_k;
  const int64_t M = static_cast<int64_t>(ref.size());
  ASSERT_EQ(r.topk_ids.shape(), (Shape{M, k})) << what;
  ASSERT_EQ(r.topk_weights.shape(), (Shape{M, k})) << what;
  const auto ids = r.topk_ids.to_int_vector();
  const auto w = r.topk_weights.to_float_vector();
  for (int64_t m = 0; m < M; ++m) {
    const RefRow& row = ref[m];
    std::set<int> got(ids.begin() + m * k, ids.begin() + (m + 1) * k);
    ASSERT_EQ(static_cast<int>(got.size()), k) << what << " row " << m << ": ids not distinct";
    const double kth = row.keys[row.ids.back()];
    for (int j = 0; j < k; ++j) {
      const int id = static_cast<int>(ids[m * k + j]);
      ASSERT_GE(id, 0) << what;
      ASSERT_LT(id, c.num_experts) << what;
      auto it = std::find(row.ids.begin(), row.ids.end(), id);
      if (it == row.ids.end()) {
        EXPECT_TRUE(row.candidate[id] && std::abs(row.keys[id] - kth) <= 1e-6 * std::abs(kth))
            << what << " row " << m << ": id " << id << " (key " << row.keys[id]
            << ") is not in the reference top-k (k-th key " << kth << ")";
        continue;
      }
      const double ref_w = row.weights[it - row.ids.begin()];
      EXPECT_NEAR(w[m * k + j], ref_w, kWeightRelTol * std::abs(ref_w) + 1e-30)
          << what << " row " << m << " id " << id;
    }
    // Ids come in decreasing key order.
    for (int j = 1; j < k; ++j) {
      EXPECT_GE(row.keys[ids[m * k + j - 1]], row.keys[ids[m * k + j]]) << what << " row " << m;
    }
  }
}

std::vector<int64_t> ids_of(const RoutingResult& r) {
  return r.topk_ids.to_int_vector();
}
std::vector<float> weights_of(const RoutingResult& r) {
  return r.topk_weights.to_float_vector();
}

// ---- closed-form cases -------------------------------------------------------------------------

// Extra slots (MoELayer's folded shared experts): the routing unchanged, then count slots of ids
// first_id.. with weight 1; a first_id inside the routed experts is refused.
TEST(Router, ExtraSlotsFollowTheRouting) {
  RouterConfig c;
  c.num_experts = 12;
  c.top_k = 3;
  const auto router = make_router(c);
  const int64_t M = 5;
  const Tensor logits = testing::random_tensor({M, 12}, DType::kF32, 3, -2.0f, 2.0f);
  const RoutingResult plain = router->select_experts(Tensor{}, logits);
  Tensor w = Tensor::empty({M, 5}, DType::kF32), ids = Tensor::empty({M, 5}, DType::kInt32);
  router->select_experts_with_extra_into(Tensor{}, logits, w, ids, {12, 2});
  const auto pi = plain.topk_ids.to_int_vector(), xi = ids.to_int_vector();
  const auto pw = plain.topk_weights.to_float_vector(), xw = w.to_float_vector();
  for (int64_t m = 0; m < M; ++m) {
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(xi[m * 5 + j], pi[m * 3 + j]);
      EXPECT_EQ(xw[m * 5 + j], pw[m * 3 + j]);
    }
    EXPECT_EQ(xi[m * 5 + 3], 12);
    EXPECT_EQ(xi[m * 5 + 4], 13);
    EXPECT_EQ(xw[m * 5 + 3], 1.0f);
    EXPECT_EQ(xw[m * 5 + 4], 1.0f);
  }
  EXPECT_NE(testing::error_of([&] {
              router->select_experts_with_extra_into(Tensor{}, logits, w, ids, {11, 2});
            }).find("ids must follow the E=12 routed experts"),
            std::string::npos);
  Tensor narrow = Tensor::empty({M, 4}, DType::kInt32);
  EXPECT_NE(testing::error_of([&] {
              router->select_experts_with_extra_into(Tensor{}, logits, w, narrow, {12, 2});
            }).find("topk_ids with the extra slots"),
            std::string::npos);
}

TEST(Router, SoftmaxTopKKnownProbabilities) {
  // softmax(log(1), log(2), log(3), log(4)) = (0.1, 0.2, 0.3, 0.4).
  std::vector<float> x = {std::log(1.0f), std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  auto r = route(softmax_config(4, 2, false), logits_tensor(x, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{3, 2}));
  EXPECT_NEAR(weights_of(r)[0], 0.4f, 1e-6);
  EXPECT_NEAR(weights_of(r)[1], 0.3f, 1e-6);

  r = route(softmax_config(4, 2, true), logits_tensor(x, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{3, 2}));
  EXPECT_NEAR(weights_of(r)[0], 4.0 / 7.0, 1e-6);
  EXPECT_NEAR(weights_of(r)[1], 3.0 / 7.0, 1e-6);
}

TEST(Router, TiesGoToTheLowerExpertId) {
  // Equal logits: softmax is exactly 1/4 each.
  auto r = route(softmax_config(4, 2, false), logits_tensor({3, 3, 3, 3}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.25f, 0.25f}));
  r = route(softmax_config(4, 2, true), logits_tensor({3, 3, 3, 3}, 1, 4));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.5f, 0.5f}));
  // Ties below the best one.
  r = route(sigmoid_config(5, 3, false), logits_tensor({1, 2, 1, 2, 1}, 1, 5));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{1, 3, 0}));
}

TEST(Router, SigmoidTopK) {
  auto r = route(sigmoid_config(4, 2, false), logits_tensor({-2, 0, 2, 1}, 1, 4));
  const double s2 = 1 / (1 + std::exp(-2.0)), s1 = 1 / (1 + std::exp(-1.0));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{2, 3}));
  EXPECT_NEAR(weights_of(r)[0], s2, 1e-7);
  EXPECT_NEAR(weights_of(r)[1], s1, 1e-7);
  r = route(sigmoid_config(4, 2, true), logits_tensor({-2, 0, 2, 1}, 1, 4));
  EXPECT_NEAR(weights_of(r)[0], s2 / (s1 + s2), 1e-7);
  EXPECT_NEAR(weights_of(r)[1], s1 / (s1 + s2), 1e-7);
  // sigmoid(0) = 1/2 exactly.
  r = route(sigmoid_config(3, 1, false), logits_tensor({0, -1, -3}, 1, 3));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.5f}));
}

TEST(Router, BiasSelectsButDoesNotWeight) {
  // All scores 0.5; the bias alone decides the selection; weights stay 0.5.
  RouterConfig c = sigmoid_config(4, 2, false);
  c.e_score_correction_bias = bias_tensor({0.0f, 0.0f, 0.125f, 0.25f});
  EXPECT_EQ(make_router(c)->name(), "fused_topk_bias");
  auto r = route(c, logits_tensor({0, 0, 0, 0}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.5f, 0.5f}));
  // Renormalize first, then scale.
  c.renormalize = true;
  c.routed_scaling_factor = 2.5f;
  r = route(c, logits_tensor({0, 0, 0, 0}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{1.25f, 1.25f}));
  // A bias that outweighs the scores: expert 0 has the best score, but loses.
  c = sigmoid_config(3, 1, false);
  c.e_score_correction_bias = bias_tensor({-1.0f, 0.0f, 0.0f});
  r = route(c, logits_tensor({4, 0, 1}, 1, 3));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{2}));
  EXPECT_NEAR(weights_of(r)[0], 1 / (1 + std::exp(-1.0)), 1e-7);
}

TEST(Router, GroupedWithoutBiasUsesTheGroupMax) {
  // Groups of 2: maxima g0=5, g1=4.8, g2=4.9, g3=0. Keep g0 and g2 -> candidates {0, 1, 4, 5}.
  // Ungrouped top-3 would be {0, 4, 2}; grouped it is {0, 4, 1}.
  const std::vector<float> x = {5, 0, 4.8f, 4.8f, 4.9f, -1, 0, 0};
  RouterConfig c = grouped_config(8, 3, 4, 2, ScoringFunc::kSoftmax, false);
  EXPECT_EQ(make_router(c)->name(), "grouped_topk");
  auto r = route(c, logits_tensor(x, 1, 8));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0, 4, 1}));
  double sum = 0;
  for (float v : x)
    sum += std::exp(static_cast<double>(v));
  EXPECT_NEAR(weights_of(r)[0], std::exp(5.0) / sum, 1e-7);
  EXPECT_NEAR(weights_of(r)[1], std::exp(4.9) / sum, 1e-7);
  EXPECT_NEAR(weights_of(r)[2], std::exp(0.0) / sum, 1e-7);
  auto flat = route(softmax_config(8, 3, false), logits_tensor(x, 1, 8));
  EXPECT_EQ(ids_of(flat), (std::vector<int64_t>{0, 4, 2}));
}

TEST(Router, GroupedWithBiasUsesTheTopTwoSum) {
  // Scores all 0.5; keys = 0.5 + bias. Group top-2 sums: g0 1.0, g1 1.2, g2 1.1, g3 1.0; the group
  // max would instead keep g0 (0.8) and g2 (0.7). Keep g1, g2 -> keys {0.6, 0.6, 0.7, 0.4}.
  RouterConfig c = grouped_config(8, 2, 4, 2, ScoringFunc::kSigmoid, true);
  c.e_score_correction_bias = bias_tensor({0.3f, -0.3f, 0.1f, 0.1f, 0.2f, -0.1f, 0.0f, 0.0f});
  c.routed_scaling_factor = 2.0f;
  EXPECT_EQ(c.routing_method_type(), RoutingMethodType::kDeepSeekV3);
  auto r = route(c, logits_tensor(std::vector<float>(8, 0.0f), 1, 8));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{1.0f, 1.0f}));  // (0.5 / 1.0) * 2
}

TEST(Router, Llama4TopOneSigmoidOnInput) {
  RouterConfig c = llama4_config(4);
  auto router = make_router(c);
  EXPECT_EQ(router->name(), "llama4_top1");
  EXPECT_TRUE(router->apply_router_weight_on_input());
  EXPECT_EQ(router->routing_method_type(), RoutingMethodType::kLlama4);
  auto r = route(c, logits_tensor({1, 3, 2, -1, kNaN, -5, 0, 3}, 2, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{1, 3}));  // row 1: the NaN logit never wins
  EXPECT_NEAR(weights_of(r)[0], 1 / (1 + std::exp(-3.0)), 1e-7);
  EXPECT_NEAR(weights_of(r)[1], 1 / (1 + std::exp(-3.0)), 1e-7);
  // Negative logits keep their (small) sigmoid weight: no renormalization to 1.
  r = route(c, logits_tensor({-2, -3, -4, -5}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0}));
  EXPECT_NEAR(weights_of(r)[0], 1 / (1 + std::exp(2.0)), 1e-7);
}

TEST(Router, FactoryPriorityAndRoutingMethods) {
  RouterConfig c = softmax_config(8, 2, true);
  auto router = make_router(c);
  EXPECT_EQ(router->name(), "fused_topk");
  EXPECT_FALSE(router->apply_router_weight_on_input());
  EXPECT_EQ(router->routing_method_type(), RoutingMethodType::kRenormalizeNaive);
  EXPECT_EQ(make_router(softmax_config(8, 2, false))->routing_method_type(),
            RoutingMethodType::kDefault);
  EXPECT_EQ(make_router(sigmoid_config(8, 2, true))->routing_method_type(),
            RoutingMethodType::kSigmoidRenorm);
  EXPECT_EQ(make_router(sigmoid_config(8, 2, false))->routing_method_type(),
            RoutingMethodType::kSigmoid);
  // Grouped wins over the bias.
  RouterConfig g = grouped_config(8, 2, 4, 2, ScoringFunc::kSigmoid, true);
  g.e_score_correction_bias = bias_tensor(std::vector<float>(8, 0.01f));
  EXPECT_EQ(make_router(g)->name(), "grouped_topk");
  EXPECT_TRUE(dynamic_cast<GroupedTopKRouter&>(*make_router(g)).grouping_active());
  // One group or one expert per group: grouped router, ungrouped selection.
  for (int groups : {0, 1, 8}) {
    RouterConfig f = grouped_config(8, 2, groups, groups == 0 ? 0 : 1, ScoringFunc::kSoftmax, true);
    auto fr = make_router(f);
    EXPECT_EQ(fr->name(), "grouped_topk");
    EXPECT_FALSE(dynamic_cast<GroupedTopKRouter&>(*fr).grouping_active()) << groups;
    // ... which routes exactly like the plain router.
    std::mt19937 rng(groups);
    Tensor logits = logits_tensor(random_floats(33 * 8, rng, -3.0f, 3.0f), 33, 8);
    auto a = route(f, logits);
    auto b = route(softmax_config(8, 2, true), logits);
    EXPECT_EQ(ids_of(a), ids_of(b)) << groups;
    EXPECT_EQ(weights_of(a), weights_of(b)) << groups;
  }
  EXPECT_NE(c.to_string().find("E=8"), std::string::npos);
}

// ---- the float64 reference on random logits ----------------------------------------------------

struct Case {
  std::string name;
  RouterConfig config;
};

std::vector<Case> random_cases(int E, std::mt19937& rng) {
  std::vector<Case> cases;
  for (bool renorm : {false, true}) {
    const std::string r = renorm ? "renorm" : "plain";
    cases.push_back({"softmax_k6_" + r, softmax_config(E, 6, renorm)});
    cases.push_back({"sigmoid_k6_" + r, sigmoid_config(E, 6, renorm)});
    RouterConfig b = sigmoid_config(E, 8, renorm);
    b.e_score_correction_bias = bias_tensor(random_floats(E, rng, -0.2f, 0.2f));
    b.routed_scaling_factor = 2.5f;
    cases.push_back({"bias_k8_scaled_" + r, b});
    RouterConfig bs = b;
    bs.scoring = ScoringFunc::kSoftmax;
    cases.push_back({"bias_softmax_" + r, bs});
    cases.push_back(
        {"grouped_nobias_" + r, grouped_config(E, 6, 8, 3, ScoringFunc::kSoftmax, renorm)});
    RouterConfig gs = grouped_config(E, 8, 8, 4, ScoringFunc::kSigmoid, renorm);
    gs.e_score_correction_bias = bias_tensor(random_floats(E, rng, -0.1f, 0.1f));
    gs.routed_scaling_factor = 2.5f;
    cases.push_back({"grouped_bias_dsv3_" + r, gs});
    RouterConfig gsm = gs;
    gsm.scoring = ScoringFunc::kSoftmax;
    gsm.routed_scaling_factor.reset();
    cases.push_back({"grouped_bias_softmax_" + r, gsm});
  }
  cases.push_back({"top_k_eq_E", softmax_config(E, E, true)});
  cases.push_back({"llama4", llama4_config(E)});
  return cases;
}

TEST(Router, MatchesFloat64ReferenceOnRandomLogits) {
  std::mt19937 rng(1234);
  const int E = 64;
  for (int64_t M : {1, 33, 600}) {  // 600 x 64 takes the threaded path
    for (const Case& cs : random_cases(E, rng)) {
      const auto x = random_floats(static_cast<size_t>(M * E), rng, -4.0f, 4.0f);
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        Tensor logits = logits_tensor(x, M, E, dt);
        const auto rounded = logits.to_float_vector();  // the reference sees the stored values
        const auto ref = reference(cs.config, rounded, M);
        const std::string what = cs.name + " M=" + std::to_string(M) + " " + logits.describe();
        expect_matches_reference(cs.config, route(cs.config, logits), ref, what);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST(Router, GroupedBiasChangesSelectionButNotWeights) {
  // Same logits with and without a bias: wherever an expert is chosen by both, its weight before
  // renormalization is the same unbiased score; and the bias changes some selections.
  std::mt19937 rng(7);
  const int E = 64, M = 64;
  const auto x = random_floats(M * E, rng, -3.0f, 3.0f);
  RouterConfig plain = grouped_config(E, 8, 8, 4, ScoringFunc::kSigmoid, false);
  RouterConfig biased = plain;
  biased.e_score_correction_bias = bias_tensor(random_floats(E, rng, -0.5f, 0.5f));
  auto a = route(plain, logits_tensor(x, M, E));
  auto b = route(biased, logits_tensor(x, M, E));
  const auto ia = ids_of(a), ib = ids_of(b);
  const auto wa = weights_of(a), wb = weights_of(b);
  int differing_rows = 0;
  for (int m = 0; m < M; ++m) {
    std::set<int64_t> sa(ia.begin() + m * 8, ia.begin() + (m + 1) * 8);
    std::set<int64_t> sb(ib.begin() + m * 8, ib.begin() + (m + 1) * 8);
    if (sa != sb) ++differing_rows;
    for (int j = 0; j < 8; ++j) {
      const int64_t id = ib[m * 8 + j];
      const double score = 1 / (1 + std::exp(-static_cast<double>(x[m * E + id])));
      EXPECT_NEAR(wb[m * 8 + j], score, 1e-6 * score) << "row " << m << " id " << id;
      for (int i = 0; i < 8; ++i) {
        if (ia[m * 8 + i] == id) {
          EXPECT_EQ(wa[m * 8 + i], wb[m * 8 + j]);
        }
      }
    }
  }
  EXPECT_GT(differing_rows, M / 4);
}

TEST(Router, StridedLogitsAndSelectExpertsAllocating) {
  std::mt19937 rng(99);
  const int E = 16, M = 33;
  const auto wide = random_floats(M * 2 * E, rng, -2.0f, 2.0f);
  Tensor parent = logits_tensor(wide, M, 2 * E);
  Tensor logits = parent.slice(1, E, 2 * E);  // row stride 2E
  ASSERT_FALSE(logits.is_contiguous());
  RouterConfig c = softmax_config(E, 4, true);
  auto router = make_router(c);
  RoutingResult r = router->select_experts(Tensor::empty({M, 8}, DType::kF32), logits);
  EXPECT_EQ(r.topk_ids.dtype(), DType::kInt32);
  EXPECT_EQ(r.topk_weights.dtype(), DType::kF32);
  const auto contiguous = logits.clone().to_float_vector();
  expect_matches_reference(c, r, reference(c, contiguous, M), "strided");
  // hidden_states may be omitted.
  RoutingResult r2 = router->select_experts(Tensor(), logits);
  EXPECT_EQ(ids_of(r2), ids_of(r));
  EXPECT_EQ(weights_of(r2), weights_of(r));
}

TEST(Router, EmptyBatch) {
  for (const RouterConfig& c : {softmax_config(8, 2, true), llama4_config(8),
                                grouped_config(8, 2, 4, 2, ScoringFunc::kSigmoid, true)}) {
    auto router = make_router(c);
    Tensor logits = Tensor::empty({0, 8}, DType::kBF16);
    RoutingResult r = router->select_experts(Tensor::empty({0, 32}, DType::kBF16), logits);
    EXPECT_EQ(r.topk_ids.shape(), (Shape{0, c.top_k}));
    EXPECT_EQ(r.topk_weights.shape(), (Shape{0, c.top_k}));
    EXPECT_EQ(r.topk_ids.dtype(), DType::kInt32);
    Tensor w = Tensor::empty({0, c.top_k}, DType::kF32),
           ids = Tensor::empty({0, c.top_k}, DType::kInt32);
    router->select_experts_into(Tensor(), logits, w, ids);
  }
}

// ---- NaN / Inf ---------------------------------------------------------------------------------

TEST(Router, InfAndNaNClosedForm) {
  // +inf takes all the softmax mass; NaN selects as -inf and weighs 0.
  auto r = route(softmax_config(4, 2, false), logits_tensor({0, kInf, 1, kNaN}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{1.0f, 0.0f}));
  // Two +inf share it.
  r = route(softmax_config(4, 2, true), logits_tensor({kInf, 3, kInf, kNaN}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.5f, 0.5f}));
  // All -inf: uniform over the experts.
  r = route(softmax_config(4, 2, false), logits_tensor({-kInf, -kInf, -kInf, -kInf}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.25f, 0.25f}));
  // All NaN: the lowest ids with weight 0, also with renormalize.
  for (bool renorm : {false, true}) {
    r = route(softmax_config(4, 2, renorm), logits_tensor({kNaN, kNaN, kNaN, kNaN}, 1, 4));
    EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(weights_of(r), (std::vector<float>{0.0f, 0.0f}));
    r = route(sigmoid_config(4, 2, renorm), logits_tensor({kNaN, kNaN, kNaN, kNaN}, 1, 4));
    EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(weights_of(r), (std::vector<float>{0.0f, 0.0f}));
  }
  // NaN among finite logits: ignored by the normalization.
  r = route(softmax_config(4, 2, false), logits_tensor({kNaN, 2, kNaN, 2}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.5f, 0.5f}));
  // Sigmoid of +-inf.
  r = route(sigmoid_config(4, 3, false), logits_tensor({-kInf, kInf, kNaN, 0}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{1, 3, 0}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{1.0f, 0.5f, 0.0f}));
}

// The rules the GPU router follows too (router.h): a -inf logit is not special for selection (it
// selects by score + bias, ahead of NaN), and -0 ties with +0.
TEST(Router, NegInfSelectsByScorePlusBiasAndSignedZerosTie) {
  RouterConfig c = sigmoid_config(4, 3, false);
  c.e_score_correction_bias = bias_tensor({0.25f, 0.875f, 0.125f, -0.625f});
  // Keys: 0 + 0.25, NaN -> -inf, 0 + 0.125, 0.5 - 0.625.
  auto r = route(c, logits_tensor({-kInf, kNaN, -kInf, 0.0f}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.0f, 0.0f, 0.5f}));
  // Softmax without bias: -inf scores 0 like an underflowed logit; ties go to the lower id.
  r = route(softmax_config(4, 3, false), logits_tensor({kNaN, -kInf, 0.0f, -kInf}, 1, 4));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{2, 1, 3}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{1.0f, 0.0f, 0.0f}));
  r = route(llama4_config(3), logits_tensor({-1.0f, -0.0f, 0.0f}, 1, 3));
  EXPECT_EQ(ids_of(r), (std::vector<int64_t>{1}));
  EXPECT_EQ(weights_of(r), (std::vector<float>{0.5f}));
}

TEST(Router, NaNAndInfRowsGiveValidIdsAndFiniteWeights) {
  std::mt19937 rng(42);
  const int E = 64, M = 97;
  auto x = random_floats(M * E, rng, -5.0f, 5.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int m = 0; m < M; ++m) {
    const int kind = m % 5;  // 0: sprinkled specials, 1: all NaN, 2: all -inf, 3: +inf, 4: mixed
    for (int e = 0; e < E; ++e) {
      float& v = x[m * E + e];
      if (kind == 1) v = kNaN;
      if (kind == 2) v = -kInf;
      if (kind == 3 && e % 7 == 3) v = kInf;
      if (kind == 0 || kind == 4) {
        const int p = pick(rng);
        if (p == 0) v = kNaN;
        if (p == 1) v = kInf;
        if (p == 2) v = -kInf;
        if (kind == 4 && p < 8) v = kNaN;
      }
    }
  }
  std::vector<RouterConfig> configs;
  for (bool renorm : {false, true}) {
    configs.push_back(softmax_config(E, 8, renorm));
    configs.push_back(sigmoid_config(E, 8, renorm));
    RouterConfig b = sigmoid_config(E, 8, renorm);
    b.e_score_correction_bias = bias_tensor(random_floats(E, rng, -0.1f, 0.1f));
    b.routed_scaling_factor = 2.5f;
    configs.push_back(b);
    RouterConfig g = grouped_config(E, 8, 8, 4, ScoringFunc::kSigmoid, renorm);
    g.e_score_correction_bias = b.e_score_correction_bias;
    configs.push_back(g);
    configs.push_back(grouped_config(E, 8, 8, 2, ScoringFunc::kSoftmax, renorm));
  }
  configs.push_back(softmax_config(E, E, true));
  configs.push_back(llama4_config(E));
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const RouterConfig& c : configs) {
      auto r = route(c, logits_tensor(x, M, E, dt));
      const auto ids = ids_of(r);
      const auto w = weights_of(r);
      const int k = c.top_k;
      for (int m = 0; m < M; ++m) {
        std::set<int64_t> seen;
        int nan_chosen = 0;
        for (int j = 0; j < k; ++j) {
          const int64_t id = ids[m * k + j];
          ASSERT_GE(id, 0) << c.to_string() << " row " << m;
          ASSERT_LT(id, E) << c.to_string() << " row " << m;
          EXPECT_TRUE(seen.insert(id).second) << c.to_string() << " row " << m << " id " << id;
          EXPECT_TRUE(std::isfinite(w[m * k + j])) << c.to_string() << " row " << m;
          EXPECT_GE(w[m * k + j], 0.0f) << c.to_string() << " row " << m;
          if (std::isnan(x[m * E + id])) {
            ++nan_chosen;
            EXPECT_EQ(w[m * k + j], 0.0f) << c.to_string() << " row " << m;
          }
        }
        // Ungrouped routers pick a NaN expert only when fewer than k others exist.
        if (!c.use_grouped_topk) {
          int non_nan = 0;
          for (int e = 0; e < E; ++e)
            non_nan += std::isnan(x[m * E + e]) ? 0 : 1;
          EXPECT_EQ(nan_chosen, std::max(0, k - non_nan)) << c.to_string() << " row " << m;
        }
      }
    }
  }
}

// ---- errors ------------------------------------------------------------------------------------

void expect_error_mentions(const std::string& message, std::initializer_list<const char*> parts) {
  for (const char* p : parts) {
    EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
  }
}

TEST(Router, BadConfigsAreClearErrors) {
  expect_error_mentions(error_of([] { make_router(softmax_config(8, 9, true)); }),
                        {"top_k=9", "num_experts=8"});
  expect_error_mentions(error_of([] { make_router(softmax_config(8, 0, true)); }), {"top_k=0"});
  expect_error_mentions(error_of([] { make_router(softmax_config(0, 1, true)); }),
                        {"num_experts=0"});
  expect_error_mentions(
      error_of([] { make_router(grouped_config(10, 2, 4, 2, ScoringFunc::kSoftmax, true)); }),
      {"num_experts=10", "num_expert_group=4"});
  expect_error_mentions(
      error_of([] { make_router(grouped_config(8, 2, 4, 5, ScoringFunc::kSoftmax, true)); }),
      {"topk_group=5", "num_expert_group=4"});
  expect_error_mentions(
      error_of([] { make_router(grouped_config(16, 5, 8, 2, ScoringFunc::kSoftmax, true)); }),
      {"top_k=5", "topk_group=2"});
  RouterConfig b = sigmoid_config(8, 2, true);
  b.e_score_correction_bias = bias_tensor(std::vector<float>(7, 0.0f));
  expect_error_mentions(error_of([&] { make_router(b); }), {"e_score_correction_bias", "[7]", "8"});
  b.e_score_correction_bias = Tensor::from_floats(std::vector<float>(8, 0.0f), {8}, DType::kBF16);
  expect_error_mentions(error_of([&] { make_router(b); }), {"e_score_correction_bias", "bf16"});
  b.e_score_correction_bias = bias_tensor({0, 0, 0, kNaN, 0, 0, 0, 0});
  expect_error_mentions(error_of([&] { make_router(b); }), {"e_score_correction_bias[3]"});
  RouterConfig s = softmax_config(8, 2, true);
  s.routed_scaling_factor = -1.0f;
  expect_error_mentions(error_of([&] { make_router(s); }), {"routed_scaling_factor=-1"});
  RouterConfig l = llama4_config(8);
  l.top_k = 2;
  expect_error_mentions(error_of([&] { make_router(l); }), {"llama4", "top_k=2"});
  // Concrete routers refuse configs that belong to another family.
  RouterConfig fb = sigmoid_config(8, 2, true);
  fb.e_score_correction_bias = bias_tensor(std::vector<float>(8, 0.0f));
  expect_error_mentions(error_of([&] { FusedTopKRouter r(fb); }), {"e_score_correction_bias"});
  expect_error_mentions(error_of([] { FusedTopKBiasRouter r(sigmoid_config(8, 2, true)); }),
                        {"e_score_correction_bias"});
  expect_error_mentions(error_of([] { Llama4Router r(softmax_config(8, 1, true)); }),
                        {"llama4_top1"});
  expect_error_mentions(error_of([] { GroupedTopKRouter r(softmax_config(8, 1, true)); }),
                        {"use_grouped_topk"});
}

TEST(Router, BadInputsAreClearErrors) {
  auto router = make_router(softmax_config(8, 2, true));
  const auto x = std::vector<float>(4 * 8, 0.5f);
  const auto x7 = std::vector<float>(4 * 7, 0.5f);
  expect_error_mentions(
      error_of([&] { router->select_experts(Tensor(), logits_tensor(x7, 4, 7)); }),
      {"router_logits", "[4, 7]", "8"});
  expect_error_mentions(
      error_of(
          [&] { router->select_experts(Tensor(), Tensor::from_floats(x, {32}, DType::kF32)); }),
      {"router_logits", "[32]"});
  expect_error_mentions(
      error_of([&] {
        router->select_experts(
            Tensor(), Tensor::from_ints(std::vector<int64_t>(32, 1), {4, 8}, DType::kInt32));
      }),
      {"router_logits", "int32"});
  expect_error_mentions(
      error_of([&] {
        router->select_experts(Tensor::empty({5, 16}, DType::kBF16), logits_tensor(x, 4, 8));
      }),
      {"hidden_states", "5", "4"});
  Tensor w = Tensor::empty({4, 3}, DType::kF32), ids = Tensor::empty({4, 2}, DType::kInt32);
  expect_error_mentions(
      error_of([&] { router->select_experts_into(Tensor(), logits_tensor(x, 4, 8), w, ids); }),
      {"topk_weights", "[4, 3]"});
  w = Tensor::empty({4, 2}, DType::kF32);
  Tensor ids64 = Tensor::empty({4, 2}, DType::kInt64);
  expect_error_mentions(
      error_of([&] { router->select_experts_into(Tensor(), logits_tensor(x, 4, 8), w, ids64); }),
      {"topk_ids", "int64"});
}

TEST(Router, CudaLogitsWithoutCudaBuildAreAClearError) {
  if (built_with_cuda()) GTEST_SKIP() << "this build has the CUDA router";
  std::vector<float> host(2 * 8, 0.5f);
  std::vector<float> w(2 * 2);
  std::vector<int32_t> ids(2 * 2);
  // Views tagged as CUDA over host memory: the router must refuse them before touching the data.
  Tensor logits = Tensor::from_blob(host.data(), {2, 8}, DType::kF32, Device::cuda(0));
  Tensor tw = Tensor::from_blob(w.data(), {2, 2}, DType::kF32, Device::cuda(0));
  Tensor ti = Tensor::from_blob(ids.data(), {2, 2}, DType::kInt32, Device::cuda(0));
  auto router = make_router(softmax_config(8, 2, true));
  expect_error_mentions(error_of([&] { router->select_experts_into(Tensor(), logits, tw, ti); }),
                        {"router_logits", "built without CUDA"});
}

}  // namespace
}  // namespace moekit
