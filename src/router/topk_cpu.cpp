// The CPU reference router: every routing family of include/moekit/router/router.h, one row at a
// time. Per row it does:
//   1. load the E logits as f32 and score them (softmax / sigmoid, or the raw logit for Llama4);
//   2. build the selection keys: score (+ bias), NaN logit -> -inf;
//   3. (grouped) score each group, keep the topk_group best, restrict the candidates to them;
//   4. pick the k best candidates (key descending, id ascending);
//   5. weights = unbiased scores of the chosen experts, renormalized, then scaled.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <tuple>
#include <vector>

#include "moekit/core/checks.h"
#include "moekit/router/router.h"

namespace moekit {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

enum class Mode { kSoftmax, kSigmoid, kLlama4 };

struct RowPlan {
  Mode mode = Mode::kSoftmax;
  int E = 0;
  int k = 0;
  const float* bias = nullptr;  // (E,) or nullptr
  int groups = 0;               // > 1 when the grouped selection runs
  int topk_group = 0;
  bool renormalize = false;
  float scale = 1.0f;
};

// Per-thread scratch, sized once per call.
struct Scratch {
  std::vector<float> logits, scores, keys, group_scores;
  std::vector<int> candidates, groups;
  explicit Scratch(const RowPlan& p)
      : logits(p.E), scores(p.E), keys(p.E), group_scores(p.groups), groups(p.groups) {
    candidates.reserve(p.E);
  }
};

float sigmoid(float x) {
  if (std::isnan(x)) return 0.0f;
  const double d = x;
  return static_cast<float>(d >= 0 ? 1.0 / (1.0 + std::exp(-d))
                                   : std::exp(d) / (1.0 + std::exp(d)));
}

// NOTE: see the numerics block of router.h for the NaN / +-inf rules implemented here.
void softmax_row(const std::vector<float>& x, std::vector<float>& out) {
  const int E = static_cast<int>(x.size());
  float m = kNegInf;
  int valid = 0, pos_inf = 0;
  for (float v : x) {
    if (std::isnan(v)) continue;
    ++valid;
    if (v == std::numeric_limits<float>::infinity()) ++pos_inf;
    m = std::max(m, v);
  }
  if (valid == 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return;
  }
  if (pos_inf > 0 || m == kNegInf) {
    // Every mass goes to the +inf experts, or (all -inf) is spread over the non-NaN experts.
    const float share = 1.0f / static_cast<float>(pos_inf > 0 ? pos_inf : valid);
    for (int e = 0; e < E; ++e) {
      const bool gets =
          pos_inf > 0 ? x[e] == std::numeric_limits<float>::infinity() : !std::isnan(x[e]);
      out[e] = gets ? share : 0.0f;
    }
    return;
  }
  double sum = 0.0;
  std::vector<double> ex(E);  // small E: the allocation is negligible next to exp()
  for (int e = 0; e < E; ++e) {
    ex[e] = std::isnan(x[e]) ? 0.0 : std::exp(static_cast<double>(x[e]) - static_cast<double>(m));
    sum += ex[e];
  }
  for (int e = 0; e < E; ++e)
    out[e] = static_cast<float>(ex[e] / sum);
}

// Key descending, id ascending: a strict total order since keys are never NaN.
struct Better {
  const std::vector<float>& key;
  bool operator()(int a, int b) const { return key[a] > key[b] || (key[a] == key[b] && a < b); }
};

void route_row(const RowPlan& p, Scratch& s, float* w_out, int32_t* id_out) {
  const int E = p.E;
  // 1. scores
  switch (p.mode) {
    case Mode::kSoftmax:
      softmax_row(s.logits, s.scores);
      break;
    case Mode::kSigmoid:
    case Mode::kLlama4:
      for (int e = 0; e < E; ++e)
        s.scores[e] = sigmoid(s.logits[e]);
      break;
  }
  // 2. selection keys
  for (int e = 0; e < E; ++e) {
    if (std::isnan(s.logits[e])) {
      s.keys[e] = kNegInf;
    } else if (p.mode == Mode::kLlama4) {
      s.keys[e] = s.logits[e];
    } else {
      s.keys[e] = p.bias ? s.scores[e] + p.bias[e] : s.scores[e];
    }
  }
  // 3. groups
  s.candidates.clear();
  if (p.groups > 1) {
    const int size = E / p.groups;
    for (int g = 0; g < p.groups; ++g) {
      const float* k = s.keys.data() + static_cast<ptrdiff_t>(g) * size;
      float best = kNegInf, second = kNegInf;
      for (int i = 0; i < size; ++i) {
        if (k[i] > best) {
          second = best;
          best = k[i];
        } else if (k[i] > second) {
          second = k[i];
        }
      }
      s.group_scores[g] = p.bias ? best + second : best;  // -inf + finite stays -inf, never NaN
    }
    std::iota(s.groups.begin(), s.groups.end(), 0);
    std::partial_sort(s.groups.begin(), s.groups.begin() + p.topk_group, s.groups.end(),
                      Better{s.group_scores});
    std::sort(s.groups.begin(), s.groups.begin() + p.topk_group);
    for (int gi = 0; gi < p.topk_group; ++gi) {
      for (int i = 0; i < size; ++i)
        s.candidates.push_back(s.groups[gi] * size + i);
    }
  } else {
    for (int e = 0; e < E; ++e)
      s.candidates.push_back(e);
  }
  // 4. top-k
  std::partial_sort(s.candidates.begin(), s.candidates.begin() + p.k, s.candidates.end(),
                    Better{s.keys});
  // 5. weights
  double sum = 0.0;
  for (int j = 0; j < p.k; ++j) {
    const int e = s.candidates[j];
    id_out[j] = e;
    w_out[j] = s.scores[e];  // NaN logits scored 0 above
    sum += w_out[j];
  }
  if (p.renormalize && sum > 0.0) {
    for (int j = 0; j < p.k; ++j)
      w_out[j] = static_cast<float>(w_out[j] / sum);
  }
  if (p.scale != 1.0f) {
    for (int j = 0; j < p.k; ++j)
      w_out[j] *= p.scale;
  }
}

}  // namespace

void route_cpu(const RouterConfig& config, const Tensor& router_logits, const Tensor& topk_weights,
               const Tensor& topk_ids) {
  expect_device(router_logits, "router_logits", Device::cpu());
  expect_dtype(router_logits, "router_logits", {DType::kF32, DType::kBF16, DType::kF16});
  expect_shape(router_logits, "router_logits", {kAnyDim, config.num_experts});
  const int64_t M = router_logits.size(0);
  for (const auto& [t, name, dt] : {std::tuple{&topk_weights, "topk_weights", DType::kF32},
                                    std::tuple{&topk_ids, "topk_ids", DType::kInt32}}) {
    expect_device(*t, name, Device::cpu());
    expect_dtype(*t, name, {dt});
    expect_shape(*t, name, {M, config.top_k});
    expect_contiguous(*t, name);
  }

  RowPlan p;
  p.E = config.num_experts;
  p.k = config.top_k;
  if (config.llama4_top1) {
    p.mode = Mode::kLlama4;
  } else {
    p.mode = config.scoring == ScoringFunc::kSigmoid ? Mode::kSigmoid : Mode::kSoftmax;
    p.renormalize = config.renormalize;
    p.scale = config.routed_scaling_factor.value_or(1.0f);
    if (config.has_bias()) {
      expect_device(config.e_score_correction_bias, "e_score_correction_bias", Device::cpu());
      p.bias = config.e_score_correction_bias.data_as<const float>();
    }
    if (config.use_grouped_topk && config.num_expert_group > 1 &&
        config.num_expert_group < config.num_experts) {
      p.groups = config.num_expert_group;
      p.topk_group = config.topk_group;
    }
  }
  if (M == 0) return;

  const char* base = static_cast<const char*>(router_logits.data());
  const DType dt = router_logits.dtype();
  const int64_t rs = router_logits.stride(0), cs = router_logits.stride(1);
  float* w = topk_weights.data_as<float>();
  int32_t* ids = topk_ids.data_as<int32_t>();

#pragma omp parallel if (M * p.E >= (int64_t{1} << 15))
  {
    Scratch s(p);
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      for (int e = 0; e < p.E; ++e)
        s.logits[e] = load_float(base, dt, m * rs + e * cs);
      route_row(p, s, w + m * p.k, ids + m * p.k);
    }
  }
}

}  // namespace moekit
