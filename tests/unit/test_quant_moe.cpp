// Quantized MoE on the CPU: every scheme through a whole FusedMoEKernel (oracle selection,
// PrepareFinalizeNoEP, CPU emulation experts) against a float64 recomputation on the dequantized
// weights and the quantize-dequantized activations / intermediate; the factories' validation; the
// quantized oracles' priorities and rejections.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "moekit/config/quant_factories.h"
#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/experts/cpu_emulation.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/oracle/for_scheme.h"
#include "moekit/oracle/fp8.h"
#include "moekit/oracle/int8.h"
#include "moekit/oracle/int_wna16.h"
#include "moekit/oracle/mxfp4.h"
#include "moekit/oracle/nvfp4.h"
#include "moekit/oracle/plan.h"
#include "moekit/oracle/w4a8.h"
#include "moekit/prepare_finalize/no_ep.h"
#include "moekit/quant/moe_input_quant.h"
#include "moekit/quant/quantize.h"
#include "testing.h"

namespace moekit {
namespace {

namespace qk = quant_keys;
using quant::QuantizedTensor;

// ---- building quantized layers --------------------------------------------------------------

MoEConfig make_moe(int E, int topk, int64_t H, int64_t I, Activation act = Activation::kSilu,
                   DType dtype = DType::kBF16) {
  MoEConfig moe;
  moe.num_experts = E;
  moe.num_local_experts = E;
  moe.num_logical_experts = E;
  moe.experts_per_token = topk;
  moe.hidden_dim = H;
  moe.intermediate_size = I;
  moe.activation = act;
  moe.in_dtype = dtype;
  moe.device = DeviceInfo{};
  return moe;
}

// Per-expert quantized weights: the code tensor the kernel reads (one code per byte, or packed),
// and the QuantizedTensors the reference dequantizes independently.
struct QWeights {
  Tensor codes;                    // (E, rows, cols) one code per byte
  Tensor packed;                   // (E, rows, row_bytes)
  std::vector<QuantizedTensor> q;  // per expert
};

QWeights quantize_weights(const std::vector<float>& w, int64_t E, int64_t rows, int64_t cols,
                          const quant::QuantScheme& scheme, DType code_dtype,
                          const std::function<void(QuantizedTensor&)>& adjust = {}) {
  QWeights out;
  const int64_t rb = quant::code_row_bytes(scheme.dtype, cols);
  out.codes = Tensor::empty({E, rows, cols}, code_dtype);
  out.packed = Tensor::empty({E, rows, rb}, code_dtype);
  for (int64_t e = 0; e < E; ++e) {
    QuantizedTensor q = quant::quantize(
        std::span<const float>(w.data() + e * rows * cols, static_cast<size_t>(rows * cols)), rows,
        cols, scheme);
    if (adjust) adjust(q);
    auto* c = out.codes.data_as<uint8_t>() + e * rows * cols;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k)
        c[r * cols + k] = q.code_at(r, k);
    std::memcpy(out.packed.data_as<uint8_t>() + e * rows * rb, q.codes.data(), q.codes.size());
    out.q.push_back(std::move(q));
  }
  return out;
}

// Stacks per-expert scales into (E, ...) tensors.
Tensor stack_f32(const QWeights& w, const Shape& per_expert) {
  std::vector<float> v;
  for (const auto& q : w.q)
    v.insert(v.end(), q.scales.begin(), q.scales.end());
  Shape s = {static_cast<int64_t>(w.q.size())};
  s.insert(s.end(), per_expert.begin(), per_expert.end());
  return Tensor::from_floats(v, s, DType::kF32);
}
Tensor stack_codes(const QWeights& w, DType dtype, bool zero_points = false) {
  const auto& first = w.q[0];
  Tensor t =
      Tensor::empty({static_cast<int64_t>(w.q.size()), first.scale_rows, first.scale_cols}, dtype);
  const size_t n = static_cast<size_t>(first.scale_rows * first.scale_cols);
  for (size_t e = 0; e < w.q.size(); ++e) {
    const auto& src = zero_points ? w.q[e].zero_points : w.q[e].scale_codes;
    std::memcpy(t.data_as<uint8_t>() + e * n, src.data(), n);
  }
  return t;
}

// A scheme case: the config, the weight codes the kernel gets, the tolerance and the class.
struct Case {
  std::string name;
  std::string tolerance;
  std::string experts;  // expected experts class
  MoEConfig moe;
  QuantConfig quant;
  Tensor w1, w2;  // what the kernel reads
  Tensor w1_packed, w2_packed;
  std::vector<QuantizedTensor> q1, q2;
};

struct Layer {
  int E = 6, topk = 2;
  int64_t H = 160, I = 96;
  std::vector<float> w1, w2;
  Tensor b1, b2;
};

Layer make_layer(uint64_t seed, bool gated = true) {
  Layer l;
  const int64_t N1 = gated ? 2 * l.I : l.I;
  l.w1 = testing::random_tensor({l.E, N1, l.H}, DType::kF32, seed, -0.2f, 0.2f).to_float_vector();
  l.w2 =
      testing::random_tensor({l.E, l.H, l.I}, DType::kF32, seed + 1, -0.2f, 0.2f).to_float_vector();
  return l;
}

// ---- the float64 recomputation --------------------------------------------------------------

std::vector<double> reference(const Case& c, const Tensor& x, const Tensor& ids,
                              const Tensor& weights) {
  const QuantConfig& q = c.quant;
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t topk = ids.size(1);
  const int64_t N = c.q1[0].rows, D = c.q2[0].cols;
  const DType act_dtype = x.dtype();
  std::vector<std::vector<float>> W1, W2;
  for (size_t e = 0; e < c.q1.size(); ++e) {
    W1.push_back(quant::dequantize(c.q1[e]));
    W2.push_back(quant::dequantize(c.q2[e]));
  }
  const std::vector<float> xf = x.to_float_vector();
  std::vector<float> A = xf;
  const bool per_expert_a1 = q.a1.alpha_or_gscale.defined() && q.a1.alpha_or_gscale.numel() > 1;
  if (!per_expert_a1) quant_dequant_rows(A, M, K, q.a1);
  const std::vector<int64_t> id = ids.to_int_vector();
  const std::vector<float> tw = weights.to_float_vector();
  const std::vector<float> b1 =
      q.w1_bias().defined() ? q.w1_bias().to_float_vector() : std::vector<float>{};
  const std::vector<float> b2 =
      q.w2_bias().defined() ? q.w2_bias().to_float_vector() : std::vector<float>{};
  ActivationParams params = c.moe.activation_params();
  if (q.gemm1_alpha) params.alpha = *q.gemm1_alpha;
  if (q.gemm1_beta) params.beta = *q.gemm1_beta;
  if (q.gemm1_clamp_limit) params.clamp_limit = q.gemm1_clamp_limit;
  std::vector<float> inter(static_cast<size_t>(M * topk * D));
  for (int64_t s = 0; s < M * topk; ++s) {
    const int64_t e = id[static_cast<size_t>(s)], m = s / topk;
    std::vector<float> h(A.begin() + m * K, A.begin() + (m + 1) * K);
    if (per_expert_a1) {
      h.assign(xf.begin() + m * K, xf.begin() + (m + 1) * K);
      quant_dequant_rows(h, 1, K, q.a1, q.a1.alpha_or_gscale.to_float_vector()[e]);
    }
    std::vector<float> g(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      double acc = b1.empty() ? 0.0 : b1[e * N + n];
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<double>(h[k]) * W1[e][n * K + k];
      g[n] = round_to_dtype(static_cast<float>(acc), act_dtype);
    }
    apply_activation_row(c.moe.activation, params, g.data(), inter.data() + s * D, D);
    for (int64_t d = 0; d < D; ++d)
      inter[s * D + d] = round_to_dtype(inter[s * D + d], act_dtype);
  }
  if (q.a2.alpha_or_gscale.defined() && q.a2.alpha_or_gscale.numel() > 1) {
    const std::vector<float> g = q.a2.alpha_or_gscale.to_float_vector();
    for (int64_t s = 0; s < M * topk; ++s)
      quant_dequant_rows(std::span<float>(inter.data() + s * D, D), 1, D, q.a2,
                         g[id[static_cast<size_t>(s)]]);
  } else {
    quant_dequant_rows(inter, M * topk, D, q.a2);
  }
  std::vector<double> out(static_cast<size_t>(M * K), 0.0);
  for (int64_t s = 0; s < M * topk; ++s) {
    const int64_t e = id[static_cast<size_t>(s)], m = s / topk;
    for (int64_t k = 0; k < K; ++k) {
      double acc = b2.empty() ? 0.0 : b2[e * K + k];
      for (int64_t d = 0; d < D; ++d)
        acc += static_cast<double>(inter[s * D + d]) * W2[e][k * D + d];
      out[m * K + k] += tw[static_cast<size_t>(s)] * acc;
    }
  }
  return out;
}

void run_case(const Case& c, int64_t M = 33, uint64_t seed = 7) {
  SCOPED_TRACE(c.name);
  const Tensor x = testing::random_tensor({M, c.moe.hidden_dim}, c.moe.in_dtype, seed);
  Tensor ids, weights;
  testing::random_routing(M, c.moe.experts_per_token, c.moe.num_experts, seed + 1, &ids, &weights);
  const auto kernel = make_kernel_for(c.moe, c.quant);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(kernel->prepare_finalize().name(), "PrepareFinalizeNoEP");
  EXPECT_EQ(kernel->fused_experts().name(), c.experts);
  ModularApplyArgs args;
  args.hidden_states = x;
  args.w1 = c.w1;
  args.w2 = c.w2;
  args.topk_ids = ids;
  args.topk_weights = weights;
  args.activation = c.moe.activation;
  args.output = Tensor::empty(x.shape(), x.dtype());
  args.output.fill_bytes(0xFF);
  const Tensor out = kernel->apply(args, RunContext{}).output;
  ASSERT_FALSE(testing::has_nan(out)) << "unwritten (poisoned) output elements";
  const std::vector<double> ref = reference(c, x, ids, weights);
  const Tolerance& tol = testing::tolerance(c.tolerance);
  const double err = testing::relative_l2_error(out, ref);
  EXPECT_LT(err, tol.rel_l2) << c.tolerance;
  EXPECT_EQ(testing::first_bad_element(out, ref, tol), -1);
  // The recomputation repeats every quantization step, so only bf16 roundings separate them.
  EXPECT_LT(err, testing::tolerance("bf16").rel_l2) << "emulation drifted from the recomputation";
}

// ---- scheme builders ------------------------------------------------------------------------

Case base_case(std::string name, std::string tol, std::string experts, const Layer& l,
               Activation act = Activation::kSilu) {
  Case c;
  c.name = std::move(name);
  c.tolerance = std::move(tol);
  c.experts = std::move(experts);
  c.moe = make_moe(l.E, l.topk, l.H, l.I, act);
  return c;
}

void set_weights(Case& c, const QWeights& w1, const QWeights& w2) {
  c.w1 = w1.codes;
  c.w2 = w2.codes;
  c.w1_packed = w1.packed;
  c.w2_packed = w2.packed;
  c.q1 = w1.q;
  c.q2 = w2.q;
}

enum class Fp8Kind { kTensorStatic, kTensorDynamic, kTokenChannel, kBlock, kW8A16 };

Case fp8_case(Fp8Kind kind) {
  const Layer l = make_layer(11);
  const int64_t N1 = 2 * l.I;
  Fp8W8A8Params p;
  quant::QuantScheme ws = quant::QuantScheme::fp8_per_tensor();
  Shape s1 = {}, s2 = {};
  if (kind == Fp8Kind::kTokenChannel) {
    ws = quant::QuantScheme::fp8_per_channel();
    p.per_out_ch_quant = true;
    p.per_act_token_quant = true;
    s1 = {N1};
    s2 = {l.H};
  } else if (kind == Fp8Kind::kBlock) {
    ws = quant::QuantScheme::fp8_block(128, 128);
    p.block_shape = std::pair<int64_t, int64_t>{128, 128};
    s1 = {2, 2};
    s2 = {2, 1};
  }
  const QWeights w1 = quantize_weights(l.w1, l.E, N1, l.H, ws, DType::kFp8E4M3);
  const QWeights w2 = quantize_weights(l.w2, l.E, l.H, l.I, ws, DType::kFp8E4M3);
  p.w1_scale = stack_f32(w1, s1);
  p.w2_scale = stack_f32(w2, s2);
  if (kind == Fp8Kind::kTensorStatic) {
    p.a1_scale = Tensor::from_floats(
        std::vector<float>{1.0f / 448, 1.2f / 448, 0.9f / 448, 1.0f / 448, 1.1f / 448, 1.0f / 448},
        {l.E}, DType::kF32);
    p.a2_scale = Tensor::from_floats(std::vector<float>{0.05f / 448}, {1}, DType::kF32);
  }
  Case c = base_case("fp8", "fp8_w8a8", "CpuFp8Experts", l);
  c.quant = kind == Fp8Kind::kW8A16 ? fp8_w8a16_moe_quant_config(MoEWeightShape::from(c.moe), p)
                                    : fp8_w8a8_moe_quant_config(MoEWeightShape::from(c.moe), p);
  set_weights(c, w1, w2);
  return c;
}

Case int8_case(bool per_token) {
  const Layer l = make_layer(21);
  const int64_t N1 = 2 * l.I;
  const QWeights w1 =
      quantize_weights(l.w1, l.E, N1, l.H, quant::QuantScheme::int8_per_channel(), DType::kInt8);
  const QWeights w2 =
      quantize_weights(l.w2, l.E, l.H, l.I, quant::QuantScheme::int8_per_channel(), DType::kInt8);
  Int8W8A8Params p;
  p.w1_scale = stack_f32(w1, {N1});
  p.w2_scale = stack_f32(w2, {l.H});
  p.per_act_token_quant = per_token;
  if (!per_token) {
    p.a1_scale = Tensor::from_floats(std::vector<float>{1.0f / 127}, {1}, DType::kF32);
    p.a2_scale = Tensor::from_floats(std::vector<float>{0.03f / 127}, {1}, DType::kF32);
  }
  Case c = base_case("int8", "int8_w8a8", "CpuInt8Experts", l);
  c.quant = Int8MoEKernelOracle::make_quant_config(MoEWeightShape::from(c.moe), p);
  set_weights(c, w1, w2);
  return c;
}

// Weight-only ints with bf16 group scales (scales rounded to bf16 in the reference too).
Case wna16_case(int bits, int64_t group, bool asym) {
  const Layer l = make_layer(31);
  const int64_t N1 = 2 * l.I;
  const QuantDType dt = bits == 4 ? QuantDType::kInt4 : QuantDType::kInt8;
  const auto scheme = quant::QuantScheme::int_weight_groups(dt, group, !asym);
  auto round_scales = [](QuantizedTensor& q) {
    for (float& s : q.scales)
      s = round_to_bf16(s);
  };
  const DType code_dtype = bits == 8 && !asym ? DType::kInt8 : DType::kUInt8;
  const QWeights w1 = quantize_weights(l.w1, l.E, N1, l.H, scheme, code_dtype, round_scales);
  const QWeights w2 = quantize_weights(l.w2, l.E, l.H, l.I, scheme, code_dtype, round_scales);
  IntWna16Params p;
  p.weight_bits = bits;
  p.group_size = group;
  p.w1_scale = stack_f32(w1, {w1.q[0].scale_rows, w1.q[0].scale_cols}).to_dtype(DType::kBF16);
  p.w2_scale = stack_f32(w2, {w2.q[0].scale_rows, w2.q[0].scale_cols}).to_dtype(DType::kBF16);
  if (asym) {
    p.w1_zp = stack_codes(w1, DType::kUInt8, true);
    p.w2_zp = stack_codes(w2, DType::kUInt8, true);
  }
  Case c = base_case("wna16", bits == 4 ? "int4_w4a16" : "int8_w8a8", "CpuWna16Experts", l);
  c.quant = IntWna16MoEKernelOracle::make_quant_config(MoEWeightShape::from(c.moe), p);
  set_weights(c, w1, w2);
  return c;
}

Case mx_case(OcpMxDType act, OcpMxDType weight, std::string experts, bool gpt_oss = false) {
  const Layer l = make_layer(41);
  const int64_t N1 = 2 * l.I;
  const QuantDType wd = weight == OcpMxDType::kMxfp4       ? QuantDType::kFp4E2M1
                        : weight == OcpMxDType::kMxfp6E3M2 ? QuantDType::kFp6E3M2
                                                           : QuantDType::kFp6E2M3;
  const auto scheme = quant::QuantScheme::mx(wd);
  const QWeights w1 = quantize_weights(l.w1, l.E, N1, l.H, scheme, DType::kUInt8);
  const QWeights w2 = quantize_weights(l.w2, l.E, l.H, l.I, scheme, DType::kUInt8);
  MxParams p;
  p.w1_scale = stack_codes(w1, DType::kUE8M0);
  p.w2_scale = stack_codes(w2, DType::kUE8M0);
  if (act == OcpMxDType::kFp8) {
    p.a1_scale = Tensor::from_floats(std::vector<float>{1.0f / 448}, {1}, DType::kF32);
    p.a2_scale = Tensor::from_floats(std::vector<float>{0.04f / 448}, {1}, DType::kF32);
  }
  Case c = base_case("mx", wd == QuantDType::kFp4E2M1 ? "mxfp4" : "mxfp6", std::move(experts), l,
                     gpt_oss ? Activation::kSwigluOai : Activation::kSilu);
  if (gpt_oss) {
    p.bias.w1_bias = testing::random_tensor({l.E, N1}, DType::kF32, 5, -0.1f, 0.1f);
    p.bias.w2_bias = testing::random_tensor({l.E, l.H}, DType::kF32, 6, -0.1f, 0.1f);
    p.swiglu = SwigluParams{1.702f, 1.0f, 7.0f};
  }
  c.quant = Mxfp4MoEKernelOracle::make_quant_config(MoEWeightShape::from(c.moe), act, weight, p);
  set_weights(c, w1, w2);
  return c;
}

// The QuantConfig is built for `backend` (its traits decide the global scales).
Case nvfp4_case(bool weight_only, const ExpertsBackend& backend) {
  const Layer l = make_layer(51);
  const int64_t N1 = 2 * l.I;
  const QWeights w1 =
      quantize_weights(l.w1, l.E, N1, l.H, quant::QuantScheme::nvfp4(), DType::kUInt8);
  const QWeights w2 =
      quantize_weights(l.w2, l.E, l.H, l.I, quant::QuantScheme::nvfp4(), DType::kUInt8);
  Nvfp4CheckpointScales s;
  s.w13_weight_scale = stack_codes(w1, DType::kUE4M3);
  s.w2_weight_scale = stack_codes(w2, DType::kUE4M3);
  std::vector<float> ws13, ws2, in13, in2;
  for (int e = 0; e < l.E; ++e) {
    ws13.push_back(1.0f / w1.q[e].global_scale);
    ws13.push_back(1.0f / w1.q[e].global_scale);
    ws2.push_back(1.0f / w2.q[e].global_scale);
    in13.push_back((1.0f + 0.1f * e) / 2688.0f);
    in2.push_back((0.05f + 0.01f * e) / 2688.0f);
  }
  s.w13_weight_scale_2 = Tensor::from_floats(ws13, {l.E, 2}, DType::kF32);
  s.w2_weight_scale_2 = Tensor::from_floats(ws2, {l.E}, DType::kF32);
  if (!weight_only) {
    s.w13_input_scale = Tensor::from_floats(in13, {l.E}, DType::kF32);
    s.w2_input_scale = Tensor::from_floats(in2, {l.E}, DType::kF32);
  }
  Case c = base_case("nvfp4", "nvfp4", "CpuNvfp4Experts", l);
  c.quant = Nvfp4MoEKernelOracle::make_quant_config(backend, MoEWeightShape::from(c.moe), s);
  set_weights(c, w1, w2);
  return c;
}

// The same for the registered NVFP4 backend named `backend`.
Case nvfp4_case(bool weight_only, const std::string& backend = "emulation") {
  const Layer dims;  // the sizes only
  return nvfp4_case(
      weight_only,
      Nvfp4MoEKernelOracle(make_moe(dims.E, dims.topk, dims.H, dims.I)).backend(backend));
}

Case w4a8_case(bool static_act, int64_t group) {
  const Layer l = make_layer(61);
  const int64_t N1 = 2 * l.I;
  const auto scheme = quant::QuantScheme::int_weight_groups(QuantDType::kInt4, group, true);
  const QWeights w1 = quantize_weights(l.w1, l.E, N1, l.H, scheme, DType::kUInt8);
  const QWeights w2 = quantize_weights(l.w2, l.E, l.H, l.I, scheme, DType::kUInt8);
  W4A8Fp8Params p;
  p.group_size = group;
  p.w1_scale = group == -1 ? stack_f32(w1, {N1}) : stack_f32(w1, {N1, 2});
  p.w2_scale = group == -1 ? stack_f32(w2, {l.H}) : stack_f32(w2, {l.H, 1});
  if (static_act) {
    p.a1_scale = Tensor::from_floats(std::vector<float>{1.0f / 448}, {1}, DType::kF32);
    p.a2_scale = Tensor::from_floats(std::vector<float>{0.05f / 448}, {1}, DType::kF32);
  }
  Case c = base_case("w4a8", "w4a8", "CpuW4A8Experts", l);
  c.quant = W4A8MoEKernelOracle::make_quant_config(MoEWeightShape::from(c.moe), p);
  set_weights(c, w1, w2);
  return c;
}

// ---- every scheme through the kernel --------------------------------------------------------

TEST(QuantMoE, Fp8PerTensorStatic) {
  const Case c = fp8_case(Fp8Kind::kTensorStatic);
  EXPECT_EQ(quant_keys_of(c.quant).first, qk::kFp8StaticTensorSym);
  EXPECT_EQ(quant_keys_of(c.quant).second, qk::kFp8StaticTensorSym);
  // (E,) static scales are reduced to their maximum.
  EXPECT_FLOAT_EQ(c.quant.a1.scale.to_float_vector()[0], 1.2f / 448);
  run_case(c);
}
TEST(QuantMoE, Fp8PerTensorDynamic) {
  const Case c = fp8_case(Fp8Kind::kTensorDynamic);
  EXPECT_EQ(quant_keys_of(c.quant).second, qk::kFp8DynamicTensorSym);
  run_case(c);
}
TEST(QuantMoE, Fp8PerTokenPerChannel) {
  const Case c = fp8_case(Fp8Kind::kTokenChannel);
  EXPECT_EQ(quant_keys_of(c.quant).first, qk::kFp8StaticChannelSym);
  EXPECT_EQ(quant_keys_of(c.quant).second, qk::kFp8DynamicTokenSym);
  run_case(c);
  run_case(c, 1, 99);
}
TEST(QuantMoE, Fp8Block128) {
  const Case c = fp8_case(Fp8Kind::kBlock);
  EXPECT_EQ(quant_keys_of(c.quant).first, qk::kFp8Static128BlockSym);
  EXPECT_EQ(quant_keys_of(c.quant).second, qk::kFp8Dynamic128Sym);
  EXPECT_EQ(c.quant.block_shape(), (std::vector<int64_t>{128, 128}));
  run_case(c);
}
TEST(QuantMoE, Fp8W8A16) {
  const Case c = fp8_case(Fp8Kind::kW8A16);
  EXPECT_FALSE(quant_keys_of(c.quant).second.has_value());
  run_case(c);
}
TEST(QuantMoE, Int8PerTokenAndStatic) {
  const Case a = int8_case(true);
  EXPECT_EQ(quant_keys_of(a.quant).second, qk::kInt8DynamicTokenSym);
  run_case(a);
  const Case b = int8_case(false);
  EXPECT_EQ(quant_keys_of(b.quant).second, qk::kInt8StaticTensorSym);
  run_case(b);
}
TEST(QuantMoE, IntWeightOnly) {
  const Case a = wna16_case(4, 32, false);
  EXPECT_EQ(quant_keys_of(a.quant).first, qk::kInt4Static32);
  run_case(a);
  const Case b = wna16_case(4, 64, true);
  EXPECT_EQ(quant_keys_of(b.quant).first, qk::kInt4StaticAsym);
  run_case(b);
  const Case d = wna16_case(8, -1, false);
  EXPECT_EQ(quant_keys_of(d.quant).first, qk::kInt8Static);
  run_case(d);
}
TEST(QuantMoE, Mxfp4W4A16GptOss) {
  const Case c = mx_case(OcpMxDType::kNone, OcpMxDType::kMxfp4, "CpuMxfp4Experts", true);
  EXPECT_EQ(c.quant.gemm1_clamp_limit, 7.0f);
  run_case(c);
}
TEST(QuantMoE, Mxfp4W4A8StaticFp8) {
  const Case c = mx_case(OcpMxDType::kFp8, OcpMxDType::kMxfp4, "CpuMxfp4Experts");
  EXPECT_EQ(quant_keys_of(c.quant).second, qk::kFp8StaticTensorSym);
  run_case(c);
}
TEST(QuantMoE, Mxfp4Mxfp8AndW4A4) {
  run_case(mx_case(OcpMxDType::kMxfp8, OcpMxDType::kMxfp4, "CpuMxfp4Experts"));
  const Case c = mx_case(OcpMxDType::kMxfp4, OcpMxDType::kMxfp4, "CpuMxfp4Experts");
  EXPECT_EQ(quant_keys_of(c.quant).second, qk::kMxfp4Dynamic);
  run_case(c);
}
TEST(QuantMoE, OcpMxMxfp6AndMixed) {
  run_case(mx_case(OcpMxDType::kMxfp6E3M2, OcpMxDType::kMxfp6E3M2, "CpuOcpMxExperts"));
  run_case(mx_case(OcpMxDType::kMxfp6E2M3, OcpMxDType::kMxfp6E2M3, "CpuOcpMxExperts"));
  run_case(mx_case(OcpMxDType::kMxfp6E3M2, OcpMxDType::kMxfp4, "CpuOcpMxExperts"));
}
TEST(QuantMoE, Nvfp4PerExpertAndSharedGlobalScales) {
  const Case c = nvfp4_case(false);
  EXPECT_EQ(c.quant.a1.alpha_or_gscale.numel(), 6);  // emulation quantizes per expert
  run_case(c);
  // A backend that quantizes before dispatch takes the maximum input scale.
  const Case d = nvfp4_case(false, "flashinfer_trtllm");
  EXPECT_EQ(d.quant.a1.alpha_or_gscale.numel(), 1);
  run_case(d);
  // vllm_cutlass quantizes after the permutation, like the emulation (its traits say so).
  const Case v = nvfp4_case(false, "vllm_cutlass");
  EXPECT_EQ(v.quant.a1.alpha_or_gscale.numel(), 6);
  EXPECT_EQ(v.quant.a1.alpha_or_gscale.to_float_vector(),
            c.quant.a1.alpha_or_gscale.to_float_vector());
  const Case w = nvfp4_case(true);
  EXPECT_FALSE(quant_keys_of(w.quant).second.has_value());
  run_case(w);
}
TEST(QuantMoE, W4A8) {
  run_case(w4a8_case(false, -1));
  const Case c = w4a8_case(true, 128);
  EXPECT_EQ(quant_keys_of(c.quant).first, qk::kInt4W4A8StaticGroup128Sym);
  run_case(c);
}

// Packed sub-byte weights give bitwise the same output as one code per byte.
TEST(QuantMoE, PackedAndUnpackedWeightsAgree) {
  for (const Case& c : {mx_case(OcpMxDType::kMxfp4, OcpMxDType::kMxfp4, "CpuMxfp4Experts"),
                        mx_case(OcpMxDType::kMxfp6E3M2, OcpMxDType::kMxfp6E3M2, "CpuOcpMxExperts"),
                        wna16_case(4, 32, true)}) {
    SCOPED_TRACE(c.name);
    const auto kernel = make_kernel_for(c.moe, c.quant);
    auto& experts = static_cast<ExpertsModular&>(kernel->fused_experts());
    const int64_t M = 5;
    const Tensor x = testing::random_tensor({M, c.moe.hidden_dim}, DType::kBF16, 3);
    Tensor ids, w;
    testing::random_routing(M, 2, 6, 4, &ids, &w);
    QuantizedInput qi = experts.expects_unquantized_inputs()
                            ? QuantizedInput{x, Tensor{}}
                            : quantize_moe_input(x, c.quant.a1, RunContext{});
    Tensor outs[2];
    for (int packed = 0; packed < 2; ++packed) {
      ExpertsApplyArgs a;
      a.output = Tensor::empty({M, 2, c.moe.hidden_dim}, DType::kBF16);
      a.output.fill_bytes(0xFF);
      a.hidden_states = qi.data;
      a.a1q_scale = qi.scale;
      a.w1 = packed ? c.w1_packed : c.w1;
      a.w2 = packed ? c.w2_packed : c.w2;
      a.topk_ids = ids;
      a.topk_weights = w;
      a.activation = c.moe.activation;
      a.global_num_experts = 6;
      experts.apply(a, RunContext{});
      outs[packed] = a.output;
    }
    ASSERT_FALSE(testing::has_nan(outs[0]));
    EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].nbytes()), 0);
  }
}

// ---- input quantization ---------------------------------------------------------------------

TEST(QuantMoE, InputQuantLayoutsRoundTrip) {
  const int64_t M = 7, K = 80;
  const Tensor x = testing::random_tensor({M, K}, DType::kBF16, 17, -3.f, 3.f);
  struct Row {
    QuantDesc desc;
    Shape data_shape, scale_shape;
    DType data_dtype, scale_dtype;
  };
  QuantDesc fp8_static{QuantDType::kFp8E4M3,
                       GroupShape::per_tensor(),
                       Tensor::from_floats(std::vector<float>{0.01f}, {1}, DType::kF32),
                       {},
                       {},
                       {}};
  QuantDesc nv{QuantDType::kFp4E2M1,
               GroupShape{1, 16},
               {},
               Tensor::from_floats(std::vector<float>{2688.0f / 3.0f}, {1}, DType::kF32),
               {},
               {}};
  const std::vector<Row> rows = {
      {fp8_static, {M, K}, {1}, DType::kFp8E4M3, DType::kF32},
      {{QuantDType::kFp8E4M3, GroupShape::per_tensor(), {}, {}, {}, {}},
       {M, K},
       {1},
       DType::kFp8E4M3,
       DType::kF32},
      {{QuantDType::kFp8E4M3, GroupShape::per_token(), {}, {}, {}, {}},
       {M, K},
       {M, 1},
       DType::kFp8E4M3,
       DType::kF32},
      {{QuantDType::kFp8E4M3, GroupShape{1, 64}, {}, {}, {}, {}},
       {M, K},
       {M, 2},
       DType::kFp8E4M3,
       DType::kF32},
      {{QuantDType::kFp8E4M3, GroupShape{1, 32}, {}, {}, {}, {}},
       {M, K},
       {M, 3},
       DType::kFp8E4M3,
       DType::kUE8M0},
      {{QuantDType::kInt8, GroupShape::per_token(), {}, {}, {}, {}},
       {M, K},
       {M, 1},
       DType::kInt8,
       DType::kF32},
      {{QuantDType::kFp4E2M1, GroupShape{1, 32}, {}, {}, {}, {}},
       {M, K / 2},
       {M, 3},
       DType::kFp4E2M1x2,
       DType::kUE8M0},
      {nv, {M, K / 2}, {M, 5}, DType::kFp4E2M1x2, DType::kUE4M3},
      {{QuantDType::kFp6E2M3, GroupShape{1, 32}, {}, {}, {}, {}},
       {M, 3 * K / 4},
       {M, 3},
       DType::kUInt8,
       DType::kUE8M0},
  };
  const std::vector<float> xf = x.to_float_vector();
  for (const Row& r : rows) {
    QuantConfig as_a1;
    as_a1.a1 = r.desc;
    SCOPED_TRACE(quant_key_to_string(quant_keys_of(as_a1).second));
    const QuantizedInput q = quantize_moe_input(x, r.desc, RunContext{});
    EXPECT_EQ(q.data.shape(), r.data_shape);
    EXPECT_EQ(q.data.dtype(), r.data_dtype);
    EXPECT_EQ(q.scale.shape(), r.scale_shape);
    EXPECT_EQ(q.scale.dtype(), r.scale_dtype);
    const std::vector<float> deq = dequantize_moe_input(q, r.desc, K);
    std::vector<float> qdq = xf;
    quant_dequant_rows(qdq, M, K, r.desc);
    EXPECT_EQ(deq, qdq);
    double num = 0, den = 0;
    for (size_t i = 0; i < xf.size(); ++i) {
      num += (deq[i] - xf[i]) * (deq[i] - xf[i]);
      den += xf[i] * xf[i];
    }
    EXPECT_LT(std::sqrt(num / den), 0.25);
    EXPECT_GT(num, 0.0);  // it did quantize
  }
  // kNone is the identity; per-expert NVFP4 global scales cannot quantize before dispatch.
  EXPECT_EQ(quantize_moe_input(x, QuantDesc{}, RunContext{}).data.data(), x.data());
  QuantDesc per_expert = nv;
  per_expert.alpha_or_gscale = Tensor::from_floats(std::vector<float>{1.f, 2.f}, {2}, DType::kF32);
  EXPECT_THROW(quantize_moe_input(x, per_expert, RunContext{}), Error);
  QuantDesc bad{QuantDType::kInt4, GroupShape::per_token(), {}, {}, {}, {}};
  EXPECT_THROW(quantize_moe_input(x, bad, RunContext{}), UnsupportedError);
}

// ---- factory validation ---------------------------------------------------------------------

template <typename Fn>
void expect_error_containing(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(QuantFactories, ValidationErrorsNameTensorAndRequirement) {
  const MoEWeightShape shape{4, 64, 32, true};
  const Tensor f32_e = Tensor::from_floats(std::vector<float>(4, 0.1f), {4}, DType::kF32);
  Fp8W8A8Params p;
  p.w1_scale = f32_e;
  p.w2_scale = Tensor::from_floats(std::vector<float>(3, 0.1f), {3}, DType::kF32);
  expect_error_containing([&] { fp8_w8a8_moe_quant_config(shape, p); },
                          "w2_scale has shape [3] but must be [4]");
  p.w2_scale = f32_e;
  p.block_shape = std::pair<int64_t, int64_t>{128, 128};
  p.per_act_token_quant = true;
  expect_error_containing([&] { fp8_w8a8_moe_quant_config(shape, p); },
                          "excludes per_act_token_quant");
  p = {};
  p.w1_scale = f32_e;
  p.w2_scale = f32_e;
  p.per_act_token_quant = true;
  p.a1_scale = Tensor::from_floats(std::vector<float>{0.1f}, {1}, DType::kF32);
  expect_error_containing([&] { fp8_w8a8_moe_quant_config(shape, p); }, "a1_scale");
  p.per_act_token_quant = false;
  expect_error_containing([&] { fp8_w8a8_moe_quant_config(shape, p); },
                          "both a1_scale and a2_scale");
  p.a2_scale = Tensor::from_floats(std::vector<float>{-1.0f}, {1}, DType::kF32);
  expect_error_containing([&] { fp8_w8a8_moe_quant_config(shape, p); }, "must be finite and > 0");

  IntWna16Params w;
  w.weight_bits = 3;
  expect_error_containing([&] { int_wna16_moe_quant_config(shape, w); }, "weight_bits = 3");
  w.weight_bits = 4;
  w.group_size = 32;
  w.w1_scale = Tensor::zeros({4, 64, 2}, DType::kBF16);
  w.w2_scale = Tensor::zeros({4, 64, 1}, DType::kBF16);
  expect_error_containing([&] { int_wna16_moe_quant_config(shape, w); }, "w1_scale[0] = 0");
  w.w1_scale.fill(0.5);
  w.w2_scale.fill(0.5);
  w.w1_zp = Tensor::zeros({4, 64, 2}, DType::kUInt8);
  expect_error_containing([&] { int_wna16_moe_quant_config(shape, w); }, "both w1_zp and w2_zp");
  w.w2_zp = Tensor::zeros({4, 64, 1}, DType::kUInt8);
  w.w2_zp.fill(16);
  expect_error_containing([&] { int_wna16_moe_quant_config(shape, w); }, "must be in [0, 15]");

  MxParams m;
  m.w1_scale = Tensor::zeros({4, 64, 2}, DType::kF32);
  m.w2_scale = Tensor::zeros({4, 64, 1}, DType::kUE8M0);
  expect_error_containing([&] { mxfp4_moe_quant_config(shape, m); },
                          "w1_scale has dtype f32 but must be one of ue8m0, uint8");
  m.w1_scale = Tensor::zeros({4, 64, 2}, DType::kUE8M0);
  expect_error_containing([&] { mxfp4_w4a8_moe_quant_config(shape, m); }, "are required");
  m.a1_scale = f32_e;
  expect_error_containing([&] { mxfp4_w4a16_moe_quant_config(shape, m); },
                          "only fp8 activations of OCP MX schemes take static scales");
  m.a1_scale = {};
  expect_error_containing(
      [&] { ocp_mx_moe_quant_config(shape, OcpMxDType::kMxfp4, OcpMxDType::kFp8, m); },
      "the weight dtype must be mxfp4, mxfp6_e3m2 or mxfp6_e2m3");

  Nvfp4Params n;
  n.w1_scale = Tensor::zeros({4, 64, 4}, DType::kUE4M3);
  n.w2_scale = Tensor::zeros({4, 64, 2}, DType::kUE4M3);
  n.g1_alphas = f32_e;
  n.g2_alphas = f32_e;
  expect_error_containing([&] { nvfp4_moe_quant_config(shape, n); }, "a1_gscale is required");
  n.a1_gscale = f32_e;
  expect_error_containing([&] { nvfp4_w4a16_moe_quant_config(shape, n); }, "a1_gscale");

  W4A8Fp8Params q;
  q.group_size = 64;
  expect_error_containing([&] { int4_w4afp8_moe_quant_config(shape, q); }, "group_size = 64");
  expect_error_containing(
      [&] {
        fp8_w8a8_moe_quant_config(MoEWeightShape{0, 64, 32, true}, Fp8W8A8Params{});
      },
      "must be positive");
}

// ---- oracles --------------------------------------------------------------------------------

using Names = std::vector<std::string>;

// A CUDA sm_`cc` device description (planning only: nothing runs on it).
DeviceInfo cuda_device(int cc) {
  return DeviceInfo{DeviceType::kCUDA, 0, cc};
}

// Two decision tables agree in every field (to_string() shows each candidate's verdict).
::testing::AssertionResult same_report(const OracleReport& a, const OracleReport& b) {
  if (a.to_string() == b.to_string() && a.error == b.error &&
      a.chosen_backend == b.chosen_backend && a.chosen_experts == b.chosen_experts &&
      a.forced_by == b.forced_by && a.candidates.size() == b.candidates.size()) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << a.to_string() << a.error << "\nvs\n"
                                       << b.to_string() << b.error;
}

TEST(QuantOracles, PriorityLists) {
  MoEConfig moe = make_moe(8, 2, 128, 64);
  using V = Names;
  EXPECT_EQ(Fp8MoEKernelOracle(moe).priority_backends(moe),
            (V{"aiter", "flashinfer_trtllm", "flashinfer_cutlass", "deep_gemm", "triton", "marlin",
               "batched_deep_gemm", "batched_triton", "xpu", "cpu"}));
  EXPECT_EQ(Fp8MoEKernelOracle(moe, {}, {}, true).priority_backends(moe)[4], "vllm_cutlass");
  MoEConfig hopper = moe;
  hopper.device = cuda_device(90);
  // On a Hopper GPU moekit's own kernels lead (standard, then batched format); the original's
  // list follows in its order.
  EXPECT_EQ(Fp8MoEKernelOracle(hopper, qk::kFp8Static128BlockSym).priority_backends(hopper)[0],
            "sm90_fp8");
  EXPECT_EQ(Fp8MoEKernelOracle(hopper, qk::kFp8Static128BlockSym).priority_backends(hopper)[1],
            "sm90_fp8_batched");
  EXPECT_EQ(Fp8MoEKernelOracle(hopper, qk::kFp8Static128BlockSym).priority_backends(hopper)[2],
            "triton");
  hopper.parallel.use_ep = true;
  EXPECT_EQ(Fp8MoEKernelOracle(hopper, qk::kFp8Static128BlockSym).priority_backends(hopper)[2],
            "flashinfer_cutlass");
  EXPECT_EQ(Int8MoEKernelOracle(moe).priority_backends(moe), (V{"triton", "cpu"}));
  EXPECT_EQ(W4A8MoEKernelOracle(moe).priority_backends(moe), (V{"cutlass", "cpu"}));
  EXPECT_EQ(IntWna16MoEKernelOracle(moe).priority_backends(moe), (V{"cpu"}));
  EXPECT_EQ(Mxfp4MoEKernelOracle(moe).priority_backends(moe),
            (V{"flashinfer_trtllm_mxfp4_bf16", "ck", "triton", "flashinfer_cutlass_mxfp4_bf16",
               "triton_unfused", "marlin", "batched_marlin", "xpu", "emulation"}));
  EXPECT_EQ(Nvfp4MoEKernelOracle(moe).priority_backends(moe),
            (V{"flashinfer_trtllm", "flashinfer_cutedsl", "flashinfer_cutedsl_batched",
               "flashinfer_cutlass", "vllm_cutlass", "marlin", "humming", "emulation"}));
}

// On Hopper moekit's weight-only NVFP4 kernel leads the list (after the megakernel deployment's
// sm90_ep_peer, which serves nothing else) and serves W4A4 checkpoints too:
// their QuantConfig keeps the activations unquantized (g_alphas = weight_scale_2, no input
// scales), as marlin's (which the seed runs weight-only) does; shapes it cannot take are refused
// with the reason.
TEST(QuantOracles, Nvfp4OnHopperIsWeightOnly) {
  const Layer dims;
  MoEConfig hopper = make_moe(dims.E, dims.topk, dims.H, dims.I);
  hopper.device = cuda_device(90);
  const Nvfp4MoEKernelOracle oracle(hopper);
  EXPECT_EQ(oracle.priority_backends(hopper)[0], "sm90_ep_peer");
  EXPECT_EQ(oracle.priority_backends(hopper)[1], "sm90_nvfp4");
  const auto sel = oracle.select_backend();
  EXPECT_EQ(sel.backend.name, "sm90_nvfp4");
  EXPECT_EQ(sel.experts, &Sm90Nvfp4Experts::klass());
  EXPECT_TRUE(sel.backend.traits.weight_only);
  EXPECT_TRUE(oracle.backend("marlin").traits.weight_only);
  for (const char* backend : {"sm90_nvfp4", "marlin"}) {
    SCOPED_TRACE(backend);
    const Case w = nvfp4_case(/*weight_only=*/false, oracle.backend(backend));
    EXPECT_EQ(w.quant.a1.dtype, QuantDType::kNone);
    EXPECT_FALSE(w.quant.a1.alpha_or_gscale.defined());
    EXPECT_FALSE(quant_keys_of(w.quant).second.has_value());
    // g_alphas are the weight global scales alone (no input scale folded in).
    const Case plain = nvfp4_case(/*weight_only=*/true);
    EXPECT_EQ(w.quant.w1.alpha_or_gscale.to_float_vector(),
              plain.quant.w1.alpha_or_gscale.to_float_vector());
  }
  // H = 48: not whole 32-element groups.
  MoEConfig odd = make_moe(dims.E, dims.topk, 48, dims.I);
  odd.device = cuda_device(90);
  const OracleReport r = Nvfp4MoEKernelOracle(odd).explain();
  bool seen = false;
  for (const auto& cand : r.candidates) {
    if (cand.backend != "sm90_nvfp4") continue;
    seen = true;
    EXPECT_FALSE(cand.supported);
    EXPECT_TRUE(
        testing::contains_all(cand.reason, {"NVFP4 rows need hidden 48", "multiples of 32"}))
        << cand.reason;
  }
  EXPECT_TRUE(seen);
  // The CPU keeps the emulation (sm90_nvfp4 is listed on CUDA devices only).
  EXPECT_EQ(Nvfp4MoEKernelOracle(make_moe(dims.E, dims.topk, dims.H, dims.I))
                .select_backend()
                .backend.name,
            "emulation");
}

// On Hopper MXFP6 weights with MXFP6 activations run moekit's W4A16 kernels on repacked rows
// (sm90_mxfp6), both elements; MXFP4 keeps sm90_mxfp4; sizes that are not multiples of 64 are
// refused with the reason; the CPU keeps the emulation.
TEST(QuantOracles, Mxfp6OnHopperRunsSm90Mxfp6) {
  const Layer dims;
  MoEConfig hopper = make_moe(dims.E, dims.topk, 128, 192);
  hopper.device = cuda_device(90);
  for (const auto& [wk, ak] : {std::pair{qk::kMxfp6E3M2Static, qk::kMxfp6E3M2Dynamic},
                               std::pair{qk::kMxfp6E2M3Static, qk::kMxfp6E2M3Dynamic}}) {
    const auto sel = Mxfp4MoEKernelOracle(hopper, wk, ak).select_backend();
    EXPECT_EQ(sel.backend.name, "sm90_mxfp6");
    EXPECT_EQ(sel.experts, &Sm90Mxfp6Experts::klass());
    EXPECT_EQ(sel.backend.traits.hidden_align, 64);
    EXPECT_EQ(sel.backend.traits.intermediate_align, 64);
    EXPECT_EQ(Mxfp4MoEKernelOracle(make_moe(dims.E, dims.topk, 128, 192), wk, ak)
                  .select_backend()
                  .backend.name,
              "emulation");
  }
  EXPECT_EQ(
      Mxfp4MoEKernelOracle(hopper, qk::kMxfp4Static, std::nullopt).select_backend().backend.name,
      "sm90_mxfp4");
  MoEConfig odd = make_moe(dims.E, dims.topk, 128, 96);
  odd.device = cuda_device(90);
  const OracleReport r =
      Mxfp4MoEKernelOracle(odd, qk::kMxfp6E3M2Static, qk::kMxfp6E3M2Dynamic).explain();
  bool seen = false;
  for (const auto& cand : r.candidates) {
    if (cand.backend != "sm90_mxfp6") continue;
    seen = true;
    EXPECT_FALSE(cand.supported);
    EXPECT_TRUE(testing::contains_all(
        cand.reason, {"MXFP6 rows need hidden 128 and intermediate 96 multiples of 64"}))
        << cand.reason;
  }
  EXPECT_TRUE(seen);
}

TEST(QuantOracles, Fp8PriorityPolicy) {
  MoEConfig moe = make_moe(8, 2, 128, 64);
  using V = Names;
  // allow_vllm_cutlass puts both vllm_cutlass backends in their original places.
  EXPECT_EQ(
      Fp8MoEKernelOracle(moe, {}, {}, /*allow_vllm_cutlass=*/true).priority_backends(moe),
      (V{"aiter", "flashinfer_trtllm", "flashinfer_cutlass", "deep_gemm", "vllm_cutlass", "triton",
         "marlin", "batched_deep_gemm", "batched_vllm_cutlass", "batched_triton", "xpu", "cpu"}));
  // Without it they stay registered (and forceable by name), just out of the priority list.
  Fp8MoEKernelOracle plain(moe);
  const V values = plain.backend_values();
  for (const char* name : {"vllm_cutlass", "batched_vllm_cutlass"}) {
    EXPECT_NE(std::find(values.begin(), values.end(), name), values.end()) << name;
  }
  MoEConfig forced = moe;
  forced.moe_backend = "vllm_cutlass";
  expect_error_containing(
      [&] { (void)Fp8MoEKernelOracle(forced).select_backend(); },
      "FP8 MoE backend 'vllm_cutlass' does not support the deployment configuration since no "
      "kernel is registered for this backend.\nThe backend was forced by config; there is no "
      "fallback.");

  // sm_90 with 128-block weights: triton (flashinfer_cutlass under expert parallelism) moves ahead
  // of the other declared backends; the rest keep their order, after moekit's sm90_fp8 and
  // sm90_fp8_batched.
  MoEConfig hopper = moe;
  hopper.device = cuda_device(90);
  for (const QuantKey& block : {qk::kFp8Static128BlockSym, qk::kFp8Static128BlockE8M0Sym}) {
    SCOPED_TRACE(block.to_string());
    EXPECT_EQ(Fp8MoEKernelOracle(hopper, block).priority_backends(hopper),
              (V{"sm90_fp8", "sm90_fp8_batched", "triton", "aiter", "flashinfer_trtllm",
                 "flashinfer_cutlass", "deep_gemm", "marlin", "batched_deep_gemm", "batched_triton",
                 "xpu", "cpu"}));
    MoEConfig ep = hopper;
    ep.parallel.use_ep = true;
    EXPECT_EQ(
        Fp8MoEKernelOracle(ep, block).priority_backends(ep),
        (V{"sm90_fp8", "sm90_fp8_batched", "flashinfer_cutlass", "aiter", "flashinfer_trtllm",
           "deep_gemm", "triton", "marlin", "batched_deep_gemm", "batched_triton", "xpu", "cpu"}));
    EXPECT_EQ(Fp8MoEKernelOracle(ep, block, {}, true).priority_backends(ep)[2],
              "flashinfer_cutlass");
  }
  // No move for other weights, another architecture, or the CPU (sm90_fp8 and its batched form
  // are listed on CUDA devices only).
  const V original = plain.priority_backends(moe);
  V cuda_original = original;
  cuda_original.insert(cuda_original.begin(), {"sm90_fp8", "sm90_fp8_batched"});
  EXPECT_EQ(Fp8MoEKernelOracle(hopper, qk::kFp8StaticTensorSym).priority_backends(hopper),
            cuda_original);
  MoEConfig blackwell = moe;
  blackwell.device = cuda_device(100);
  EXPECT_EQ(Fp8MoEKernelOracle(blackwell, qk::kFp8Static128BlockSym).priority_backends(blackwell),
            cuda_original);
  EXPECT_EQ(Fp8MoEKernelOracle(moe, qk::kFp8Static128BlockSym).priority_backends(moe), original);
  // The policy orders the oracle's own selection too: after sm90_fp8 (and its batched form,
  // rejected: the format), triton is tried first.
  const Case block_case = fp8_case(Fp8Kind::kBlock);
  MoEConfig block_hopper = block_case.moe;
  block_hopper.device = cuda_device(90);
  const OracleReport r =
      Fp8MoEKernelOracle(block_hopper, qk::kFp8Static128BlockSym, qk::kFp8Dynamic128Sym).explain();
  ASSERT_FALSE(r.candidates.empty());
  ASSERT_GE(r.candidates.size(), 3u);
  EXPECT_EQ(r.candidates[0].backend, "sm90_fp8");
  EXPECT_EQ(r.candidates[1].backend, "sm90_fp8_batched");
  EXPECT_EQ(r.candidates[2].backend, "triton");
}

TEST(QuantOracles, Wna16BackendsByDevice) {
  const Case c = wna16_case(4, 32, false);
  const auto [wk, ak] = quant_keys_of(c.quant);
  // cpu is the candidate on a CPU device, emulation (the same class) on a GPU one.
  const IntWna16MoEKernelOracle oracle(c.moe, wk, ak);
  EXPECT_EQ(oracle.priority_backends(c.moe), (Names{"cpu"}));
  MoEConfig gpu = c.moe;
  gpu.device = cuda_device(90);
  EXPECT_EQ(oracle.priority_backends(gpu),
            (Names{"flashinfer_trtllm", "marlin", "batched_marlin", "humming", "emulation"}));
  EXPECT_EQ(oracle.backend("cpu").candidate_on, (std::vector<DeviceType>{DeviceType::kCPU}));
  EXPECT_EQ(oracle.backend("emulation").candidate_on, (std::vector<DeviceType>{DeviceType::kCUDA}));
  // xpu only when forced; marlin's batched variant is batched_marlin.
  EXPECT_TRUE(oracle.backend("xpu").only_when_forced);
  EXPECT_EQ(oracle.batched_variant("marlin"), std::optional<std::string>("batched_marlin"));

  const auto selection = oracle.select_backend();
  EXPECT_EQ(selection.backend.name, "cpu");
  EXPECT_EQ(selection.experts, &CpuWna16Experts::klass());
  EXPECT_TRUE(selection.rejections.empty());
  // emulation is in the table (skipped on this device, but its class would serve).
  bool skipped_emulation = false;
  for (const auto& cand : selection.report.candidates) {
    if (cand.backend == "emulation") skipped_emulation = !cand.considered && cand.supported;
  }
  EXPECT_TRUE(skipped_emulation) << selection.report.to_string();
  // Forced by name, emulation serves the CPU deployment too (candidate_on only shapes the list).
  MoEConfig forced = c.moe;
  forced.moe_backend = "emulation";
  const auto forced_selection = IntWna16MoEKernelOracle(forced, wk, ak).select_backend();
  EXPECT_EQ(forced_selection.backend.name, "emulation");
  EXPECT_EQ(forced_selection.experts, &CpuWna16Experts::klass());
  EXPECT_EQ(forced_selection.forced_by, "config");
  // And the whole kernel goes through it.
  EXPECT_EQ(make_kernel_for(forced, c.quant)->fused_experts().name(), "CpuWna16Experts");
}

TEST(QuantOracles, OnlyWhenForcedBackends) {
  const Case nv = nvfp4_case(false);
  const auto [wk, ak] = quant_keys_of(nv.quant);
  const Nvfp4MoEKernelOracle oracle(nv.moe, wk, ak);
  const Names values = oracle.backend_values();
  const Names priority = oracle.priority_backends(nv.moe);
  for (const char* name : {"b12x", "flashinfer_b12x"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(oracle.backend(name).only_when_forced);
    EXPECT_NE(std::find(values.begin(), values.end(), name), values.end());
    EXPECT_EQ(std::find(priority.begin(), priority.end(), name), priority.end());
    // Forced, it is tried (no kernel here) and never falls back to the emulation.
    MoEConfig forced = nv.moe;
    forced.moe_backend = name;
    const std::string msg = testing::error_of<UnsupportedError>(
        [&] { (void)Nvfp4MoEKernelOracle(forced, wk, ak).select_backend(); });
    EXPECT_TRUE(testing::contains_all(
        msg, {"NvFp4 MoE backend '" + std::string(name) +
                  "' does not support the deployment configuration since no kernel is registered "
                  "for this backend.",
              "there is no fallback"}));
    EXPECT_EQ(msg.find("CpuNvfp4Experts"), std::string::npos) << msg;
  }
  // MXFP4: the mxfp8-activation variants, also by their aliases.
  const Mxfp4MoEKernelOracle mx(make_moe(8, 2, 128, 64));
  const Names mx_priority = mx.priority_backends(mx.moe_config());
  for (const char* name : {"flashinfer_trtllm_mxfp4_mxfp8", "flashinfer_cutlass_mxfp4_mxfp8"}) {
    EXPECT_TRUE(mx.backend(name).only_when_forced) << name;
    EXPECT_EQ(std::find(mx_priority.begin(), mx_priority.end(), name), mx_priority.end()) << name;
  }
  EXPECT_EQ(mx.map_backend("flashinfer_trtllm_afp8"), "flashinfer_trtllm_mxfp4_mxfp8");
  EXPECT_EQ(mx.map_backend("flashinfer_cutlass_afp8"), "flashinfer_cutlass_mxfp4_mxfp8");
  EXPECT_EQ(mx.map_backend("cpu"), "emulation");
  // Each declares the alignment its kernels need (read by the Quark OCP MX method).
  EXPECT_EQ(mx.backend("emulation").traits.hidden_align, 32);
  EXPECT_EQ(mx.backend("emulation").traits.intermediate_align, 32);
  EXPECT_EQ(mx.backend("flashinfer_trtllm_mxfp4_bf16").traits.hidden_align, 256);
  EXPECT_EQ(mx.backend("triton").traits.intermediate_align, 64);
}

TEST(QuantOracles, SelectionReportIsExplainAndThePlans) {
  for (const Case& c :
       {fp8_case(Fp8Kind::kBlock), int8_case(true), wna16_case(4, 32, true), w4a8_case(false, -1),
        nvfp4_case(false),
        mx_case(OcpMxDType::kMxfp6E3M2, OcpMxDType::kMxfp6E3M2, "CpuOcpMxExperts")}) {
    SCOPED_TRACE(c.name);
    const QuantOracleKind kind = oracle_kind_for(c.quant);
    const auto [wk, ak] = quant_keys_of(c.quant);
    const std::unique_ptr<MoEKernelOracle> oracle = make_oracle(kind, c.moe, wk, ak);
    const auto selection = oracle->select_backend();
    EXPECT_EQ(selection.experts->name(), c.experts);
    EXPECT_TRUE(same_report(selection.report, oracle->explain()));
    EXPECT_TRUE(same_report(selection.report, explain_for_scheme(c.moe, c.quant)));
    const MoEPlan plan = plan_moe(c.moe, c.quant, PlanOptions{.log = false});
    ASSERT_TRUE(plan.ok()) << plan.error();
    EXPECT_TRUE(same_report(selection.report, plan.experts_report));
    EXPECT_EQ(plan.backend->name, selection.backend.name);
    EXPECT_EQ(plan.experts, selection.experts);
  }
  // A forced backend that cannot serve: the error thrown is the table's.
  Case nv = nvfp4_case(false);
  nv.moe.moe_backend = "flashinfer_cutlass";
  const auto [wk, ak] = quant_keys_of(nv.quant);
  const Nvfp4MoEKernelOracle oracle(nv.moe, wk, ak);
  const std::string msg =
      testing::error_of<UnsupportedError>([&] { (void)oracle.select_backend(); });
  const OracleReport report = oracle.explain();
  EXPECT_EQ(report.error, msg);
  EXPECT_EQ(report.forced_by, "config");
  EXPECT_TRUE(same_report(report, explain_for_scheme(nv.moe, nv.quant)));
  const MoEPlan plan = plan_moe(nv.moe, nv.quant, PlanOptions{.log = false});
  EXPECT_FALSE(plan.ok());
  EXPECT_EQ(plan.error(), msg);
  expect_error_containing([&] { plan.check(); }, "there is no fallback");
}

TEST(QuantOracles, GpuBackendsRejectedUntilRegisteredAndEmulationChosen) {
  const Case c = nvfp4_case(false);
  const OracleReport r = explain_for_scheme(c.moe, c.quant);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.oracle_name, "NvFp4");
  EXPECT_EQ(r.chosen_backend, "emulation");
  EXPECT_EQ(r.chosen_experts, "CpuNvfp4Experts");
  ASSERT_FALSE(r.candidates.empty());
  EXPECT_EQ(r.candidates[0].backend, "flashinfer_trtllm");
  EXPECT_EQ(r.candidates[0].reason, kNoKernelRegisteredReason);
  const auto sel = Nvfp4MoEKernelOracle(c.moe).select_backend();
  EXPECT_EQ(sel.backend.name, "emulation");
  EXPECT_EQ(sel.experts, &CpuNvfp4Experts::klass());
  EXPECT_EQ(sel.rejections.size(), 7u);  // every GPU backend before emulation
  for (const auto& rej : sel.rejections)
    EXPECT_EQ(rej.reason, kNoKernelRegisteredReason);
  // Forcing a GPU backend never falls back.
  MoEConfig forced = c.moe;
  forced.moe_backend = "flashinfer_cutlass";
  expect_error_containing([&] { make_kernel_for(forced, c.quant); }, "there is no fallback");
  forced.moe_backend = "no_such_backend";
  expect_error_containing([&] { make_kernel_for(forced, c.quant); }, "Unknown NvFp4 MoE backend");
}

TEST(QuantOracles, ExplainPicksTheOracleOfEachScheme) {
  EXPECT_EQ(explain_for_scheme(fp8_case(Fp8Kind::kBlock).moe, fp8_case(Fp8Kind::kBlock).quant)
                .chosen_experts,
            "CpuFp8Experts");
  const Case mx6 = mx_case(OcpMxDType::kMxfp6E3M2, OcpMxDType::kMxfp6E3M2, "CpuOcpMxExperts");
  const OracleReport r = explain_for_scheme(mx6.moe, mx6.quant);
  EXPECT_EQ(r.oracle_name, "MXFP4");
  EXPECT_EQ(r.chosen_experts, "CpuOcpMxExperts");
  bool mxfp4_rejected = false;
  for (const auto& cand : r.candidates) {
    if (cand.experts_class == "CpuMxfp4Experts") {
      mxfp4_rejected = true;
      EXPECT_NE(cand.reason.find("kernel does not support quantization scheme"), std::string::npos);
      EXPECT_NE(cand.reason.find("fp6_e3m2"), std::string::npos) << cand.reason;
    }
  }
  EXPECT_TRUE(mxfp4_rejected);
  EXPECT_EQ(oracle_kind_for(int8_case(true).quant), QuantOracleKind::kInt8);
  EXPECT_EQ(oracle_kind_for(wna16_case(8, -1, false).quant), QuantOracleKind::kIntWna16);
  EXPECT_EQ(oracle_kind_for(w4a8_case(false, -1).quant), QuantOracleKind::kW4A8);
  EXPECT_EQ(oracle_kind_for(QuantConfig::unquantized()), QuantOracleKind::kUnquantized);
  QuantConfig act_only;
  act_only.a1.dtype = QuantDType::kFp8E4M3;
  EXPECT_THROW(oracle_kind_for(act_only), UnsupportedError);
}

TEST(QuantOracles, WrongKernelRejectedNamingTheScheme) {
  const Case nv = nvfp4_case(false);
  // The capability record rejects it ...
  const SupportResult r = CpuFp8Experts::klass().is_supported_config(
      nv.moe, qk::kNvfp4Static, qk::kNvfp4Dynamic, ActivationFormat::kStandard);
  EXPECT_FALSE(r.supported);
  EXPECT_NE(r.reason.find("kernel does not support quantization scheme"), std::string::npos);
  EXPECT_NE(r.reason.find(qk::kNvfp4Static.to_string()), std::string::npos) << r.reason;
  // ... forcing the experts onto the scheme through an oracle fails with that reason ...
  Fp8MoEKernelOracle fp8(nv.moe, qk::kNvfp4Static, qk::kNvfp4Dynamic);
  expect_error_containing(
      [&] { fp8.return_or_raise("cpu"); },
      "kernel does not support quantization scheme " + qk::kNvfp4Static.to_string());
  // ... and so does constructing the class with the wrong QuantConfig.
  expect_error_containing([&] { CpuFp8Experts(nv.moe, nv.quant); },
                          "CpuFp8Experts: kernel does not support quantization scheme");
  expect_error_containing(
      [&] { CpuMxfp4Experts(nv.moe, fp8_case(Fp8Kind::kBlock).quant); },
      "kernel does not support quantization scheme " + qk::kFp8Static128BlockSym.to_string());
}

// NOTE: the quant-config helpers are static now and take the chosen backend's record: what they
// read is its traits (weight_only, per_expert_input_global_scale), never its name.
TEST(QuantOracles, MakeQuantConfigOfBackends) {
  const Case c = fp8_case(Fp8Kind::kTensorStatic);
  Fp8W8A8Params p;
  p.w1_scale = c.quant.w1.scale;
  p.w2_scale = c.quant.w2.scale;
  p.a1_scale = c.quant.a1.scale;
  p.a2_scale = c.quant.a2.scale;
  const Fp8MoEKernelOracle o(c.moe);
  const auto shape = MoEWeightShape::from(c.moe);
  EXPECT_TRUE(o.backend("marlin").traits.weight_only);
  EXPECT_FALSE(o.backend("cpu").traits.weight_only);
  EXPECT_EQ(
      quant_keys_of(Fp8MoEKernelOracle::make_quant_config(o.backend("marlin"), shape, p)).second,
      std::nullopt);
  EXPECT_EQ(quant_keys_of(Fp8MoEKernelOracle::make_quant_config(o.backend("cpu"), shape, p)).second,
            qk::kFp8StaticTensorSym);
  // The traits decide, not the name: a record named "marlin" without the trait is W8A8, and any
  // other name with it is W8A16.
  ExpertsBackend not_weight_only = o.backend("marlin");
  not_weight_only.traits.weight_only = false;
  EXPECT_EQ(quant_keys_of(Fp8MoEKernelOracle::make_quant_config(not_weight_only, shape, p)).second,
            qk::kFp8StaticTensorSym);
  ExpertsBackend weight_only = o.backend("cpu");
  weight_only.name = "some_w8a16_kernel";
  weight_only.traits.weight_only = true;
  const QuantConfig w8a16 = Fp8MoEKernelOracle::make_quant_config(weight_only, shape, p);
  EXPECT_EQ(quant_keys_of(w8a16).second, std::nullopt);
  EXPECT_EQ(quant_keys_of(w8a16).first, qk::kFp8StaticTensorSym);
  EXPECT_FALSE(w8a16.a1.scale.defined());
  // The unquantized oracle's no-argument make_quant_config still throws.
  EXPECT_THROW(o.make_quant_config(), Error);

  // NVFP4: per-expert activation global scales follow traits.per_expert_input_global_scale.
  const Nvfp4MoEKernelOracle nv(nvfp4_case(false).moe);
  EXPECT_TRUE(nv.backend("emulation").traits.per_expert_input_global_scale);
  EXPECT_TRUE(nv.backend("vllm_cutlass").traits.per_expert_input_global_scale);
  EXPECT_FALSE(nv.backend("flashinfer_cutlass").traits.per_expert_input_global_scale);
  EXPECT_EQ(nvfp4_case(false, "flashinfer_cutlass").quant.a2.alpha_or_gscale.numel(), 1);
  EXPECT_EQ(nvfp4_case(false, "vllm_cutlass").quant.a2.alpha_or_gscale.numel(), 6);
  // Again the traits decide, not the name.
  ExpertsBackend renamed = nv.backend("flashinfer_cutlass");
  renamed.traits.per_expert_input_global_scale = true;
  EXPECT_EQ(nvfp4_case(false, renamed).quant.a2.alpha_or_gscale.numel(), 6);
  ExpertsBackend shared = nv.backend("emulation");
  shared.traits.per_expert_input_global_scale = false;
  const Case one_scale = nvfp4_case(false, shared);
  EXPECT_EQ(one_scale.quant.a1.alpha_or_gscale.numel(), 1);
  EXPECT_EQ(one_scale.quant.a2.alpha_or_gscale.numel(), 1);
}

}  // namespace
}  // namespace moekit
