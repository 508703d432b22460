#include "moekit/oracle/nvfp4.h"

#include <algorithm>
#include <vector>

#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "seed_backends.h"

namespace moekit {
namespace {

// Per-expert values of a (1,), (E,) or (E, C) f32 scale: column 0 (`first_column`) or the row max.
std::vector<float> per_expert(const Tensor& t, std::string_view name, int64_t E,
                              bool first_column) {
  MOEKIT_CHECK(t.defined(), "nvfp4 make_quant_config: {} is required", name);
  expect_dtype(t, name, {DType::kF32});
  const std::vector<float> v = t.to_float_vector();
  if (t.numel() == 1) return std::vector<float>(static_cast<size_t>(E), v[0]);
  MOEKIT_CHECK(t.size(0) == E && (t.dim() == 1 || t.dim() == 2),
               "nvfp4 make_quant_config: {} {} must be (1,), ({},) or ({}, C)", name, t.describe(),
               E, E);
  const int64_t cols = t.dim() == 2 ? t.size(1) : 1;
  std::vector<float> out(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    float m = v[static_cast<size_t>(e * cols)];
    if (!first_column) {
      for (int64_t c = 1; c < cols; ++c)
        m = std::max(m, v[static_cast<size_t>(e * cols + c)]);
    }
    out[static_cast<size_t>(e)] = m;
  }
  return out;
}

Tensor f32_tensor(const std::vector<float>& v) {
  return Tensor::from_floats(v, {static_cast<int64_t>(v.size())}, DType::kF32);
}

const SeedBackends kSeedNvfp4(QuantOracleKind::kNvfp4,
                              {
                                  {"flashinfer_trtllm"},
                                  {"flashinfer_cutedsl", {}, "flashinfer_cutedsl_batched"},
                                  {"flashinfer_cutedsl_batched"},
                                  {"flashinfer_cutlass"},
                                  {"vllm_cutlass", {}, "", {.per_expert_input_global_scale = true}},
                                  {"marlin", {}, "", {.weight_only = true}},
                                  {"humming"},
                                  {"b12x", {}, "", {}, {}, /*only_when_forced=*/true},
                                  {"flashinfer_b12x", {}, "", {}, {}, /*only_when_forced=*/true},
                              });

}  // namespace

QuantConfig Nvfp4MoEKernelOracle::make_quant_config(const ExpertsBackend& backend,
                                                    const MoEWeightShape& shape,
                                                    const Nvfp4CheckpointScales& s) {
  const int64_t E = shape.num_experts;
  const std::vector<float> ws13 = per_expert(s.w13_weight_scale_2, "w13_weight_scale_2", E, true);
  const std::vector<float> ws2 = per_expert(s.w2_weight_scale_2, "w2_weight_scale_2", E, true);
  Nvfp4Params p;
  p.w1_scale = s.w13_weight_scale;
  p.w2_scale = s.w2_weight_scale;
  p.bias = s.bias;
  p.swiglu = s.swiglu;
  MOEKIT_CHECK(s.w13_input_scale.defined() == s.w2_input_scale.defined(),
               "nvfp4 make_quant_config: w13_input_scale and w2_input_scale must both be set "
               "(W4A4) or both unset (W4A16)");
  // W4A16: a checkpoint without input scales, or a weight-only backend (Hopper's, marlin),
  // which leaves the activations in the model's dtype and does not use the input scales.
  if (!s.w13_input_scale.defined() || backend.traits.weight_only) {
    if (s.w13_input_scale.defined()) {
      log::info_once(fmt::format(
          "nvfp4 MoE backend '{}' is weight-only: the activations stay unquantized and the "
          "checkpoint's input scales are not used",
          backend.name));
    }
    p.g1_alphas = f32_tensor(ws13);
    p.g2_alphas = f32_tensor(ws2);
    return nvfp4_w4a16_moe_quant_config(shape, p);
  }
  std::vector<float> in13 = per_expert(s.w13_input_scale, "w13_input_scale", E, false);
  std::vector<float> in2 = per_expert(s.w2_input_scale, "w2_input_scale", E, false);
  const bool per_expert_gscale = backend.traits.per_expert_input_global_scale;
  if (!per_expert_gscale) {
    const float m13 = *std::max_element(in13.begin(), in13.end());
    const float m2 = *std::max_element(in2.begin(), in2.end());
    std::fill(in13.begin(), in13.end(), m13);
    std::fill(in2.begin(), in2.end(), m2);
  }
  std::vector<float> g1(static_cast<size_t>(E)), g2(static_cast<size_t>(E));
  for (size_t e = 0; e < g1.size(); ++e) {
    MOEKIT_CHECK(in13[e] > 0.0f && in2[e] > 0.0f,
                 "nvfp4 make_quant_config: input scales of expert {} must be > 0 (got {}, {})", e,
                 in13[e], in2[e]);
    g1[e] = in13[e] * ws13[e];
    g2[e] = in2[e] * ws2[e];
  }
  p.g1_alphas = f32_tensor(g1);
  p.g2_alphas = f32_tensor(g2);
  auto inverse = [&](const std::vector<float>& in) {
    std::vector<float> out;
    if (per_expert_gscale) {
      for (float v : in)
        out.push_back(1.0f / v);
    } else {
      out.push_back(1.0f / in[0]);
    }
    return f32_tensor(out);
  };
  p.a1_gscale = inverse(in13);
  p.a2_gscale = inverse(in2);
  return nvfp4_moe_quant_config(shape, p);
}

}  // namespace moekit
