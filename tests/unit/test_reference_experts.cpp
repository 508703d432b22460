// The CPU reference parts of the modular kernel: TopKWeightAndReduce, PrepareFinalizeNoEP,
// PrepareFinalizeBatched, CpuReferenceExperts, CpuBatchedReferenceExperts,
// CpuReferenceSharedExperts.
//   - closed-form cases (integer / power-of-two values) compared bitwise;
//   - random cases against a float64 recomputation written here, every activation, with and
//     without bias and expert_map, with -1 ids;
//   - batched pipeline == standard pipeline bitwise; async == sync; clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/modular/kernel.h"
#include "moekit/modular/topk_weight_and_reduce.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/no_ep.h"
#include "moekit/quant/moe_input_quant.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::error_of;

// NOTE: the tolerance table of this file: ||out - ref|| / ||ref|| against float64, per dtype. The
// reference rounds the GEMM1 output, the activation and the final output to the dtype.
struct DTypeTolerance {
  DType dtype;
  double rel_l2;
};
constexpr DTypeTolerance kTolerances[] = {
    {DType::kF32, 1e-5},
    {DType::kF16, 2e-3},
    {DType::kBF16, 1.6e-2},
};

double tolerance_of(DType dtype) {
  for (const DTypeTolerance& t : kTolerances) {
    if (t.dtype == dtype) return t.rel_l2;
  }
  ADD_FAILURE() << "no tolerance for " << dtype_name(dtype);
  return 0;
}

constexpr RunContext kCtx{};

// ---- helpers
// -------------------------------------------------------------------------------------

using testing::poisoned;
bool same_bytes(const Tensor& a, const Tensor& b) {
  return testing::bitwise_equal(a, b);
}

Tensor ints(const std::vector<int64_t>& values, const Shape& shape) {
  return Tensor::from_ints(values, shape, DType::kInt32);
}

Tensor floats(const std::vector<float>& values, const Shape& shape, DType dtype) {
  return Tensor::from_floats(values, shape, dtype);
}

// ---- the problem and its float64 reference
// -------------------------------------------------------

struct Problem {
  DType dtype = DType::kBF16;
  Activation act = Activation::kSilu;
  int64_t M = 33, K = 40, I = 24;
  int E_global = 8, E_local = 8, topk = 2;
  bool bias = false;
  bool use_map = false;   // E_local of E_global experts live here, through an expert_map
  int num_invalid = 3;    // slots whose id is set to -1
  float w1_range = 3.0f;  // w1 ~ U(-r, r) / sqrt(K)
  uint64_t seed = 1;

  Tensor x, w1, w2, b1, b2, ids, weights, expert_map;

  int64_t N() const { return is_gated(act) ? 2 * I : I; }
  int64_t D() const { return I; }
};

void materialize(Problem& p) {
  using testing::random_tensor;
  const float r1 = p.w1_range / std::sqrt(static_cast<float>(p.K));
  const float r2 = 2.0f / std::sqrt(static_cast<float>(p.D()));
  p.x = random_tensor({p.M, p.K}, p.dtype, p.seed);
  p.w1 = random_tensor({p.E_local, p.N(), p.K}, p.dtype, p.seed + 1, -r1, r1);
  p.w2 = random_tensor({p.E_local, p.K, p.D()}, p.dtype, p.seed + 2, -r2, r2);
  if (p.bias) {
    p.b1 = random_tensor({p.E_local, p.N()}, p.dtype, p.seed + 3, -0.5f, 0.5f);
    p.b2 = random_tensor({p.E_local, p.K}, p.dtype, p.seed + 4, -0.5f, 0.5f);
  }
  testing::random_routing(p.M, p.topk, p.E_global, p.seed + 5, &p.ids, &p.weights);
  std::vector<int64_t> ids = p.ids.to_int_vector();
  for (int i = 0; i < p.num_invalid && !ids.empty(); ++i) {
    ids[static_cast<size_t>((7 * i + 3) % static_cast<int64_t>(ids.size()))] = -1;
  }
  p.ids = ints(ids, {p.M, p.topk});
  if (p.use_map) {
    std::vector<int64_t> perm(static_cast<size_t>(p.E_global));
    for (int e = 0; e < p.E_global; ++e)
      perm[static_cast<size_t>(e)] = e;
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(p.seed + 6));
    std::vector<int64_t> map(static_cast<size_t>(p.E_global), -1);
    for (int l = 0; l < p.E_local; ++l)
      map[static_cast<size_t>(perm[static_cast<size_t>(l)])] = l;
    p.expert_map = ints(map, {p.E_global});
  } else {
    ASSERT_EQ(p.E_local, p.E_global);
  }
}

double act_silu(double v) {
  return v / (1.0 + std::exp(-v));
}
double act_gelu(double v) {
  return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
}
double act_gelu_tanh(double v) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v)));
}
double act_relu2(double v) {
  return v > 0 ? v * v : 0.0;
}

// Default ActivationParams: no clamp for silu; swigluoai alpha 1.702, beta 1, limit 7; swiglustep
// limit 7.
std::vector<double> activation_f64(Activation act, const std::vector<double>& g) {
  const size_t n = g.size();
  const size_t d = is_gated(act) ? n / 2 : n;
  std::vector<double> out(d);
  for (size_t i = 0; i < d; ++i) {
    const double gate = g[i], up = is_gated(act) ? g[i + d] : 0.0;
    switch (act) {
      case Activation::kSilu:
        out[i] = act_silu(gate) * up;
        break;
      case Activation::kGelu:
        out[i] = act_gelu(gate) * up;
        break;
      case Activation::kGeluTanh:
        out[i] = act_gelu_tanh(gate) * up;
        break;
      case Activation::kSwigluOai: {
        const double gg = std::min(g[2 * i], 7.0);
        const double uu = std::clamp(g[2 * i + 1], -7.0, 7.0);
        out[i] = (uu + 1.0) * gg / (1.0 + std::exp(-1.702 * gg));
        break;
      }
      case Activation::kSwigluStep:
        out[i] = std::min(act_silu(gate), 7.0) * std::clamp(up, -7.0, 7.0);
        break;
      case Activation::kRelu2:
        out[i] = act_relu2(gate) * up;
        break;
      case Activation::kSiluNoMul:
        out[i] = act_silu(gate);
        break;
      case Activation::kGeluNoMul:
        out[i] = act_gelu(gate);
        break;
      case Activation::kGeluTanhNoMul:
        out[i] = act_gelu_tanh(gate);
        break;
      case Activation::kRelu2NoMul:
        out[i] = act_relu2(gate);
        break;
    }
  }
  return out;
}

// The layer in float64: out[m] = sum_j w[m, j] * MLP_{e(m, j)}(x[m]) over the local, valid slots.
std::vector<double> reference_f64(const Problem& p, bool weight_on_input) {
  const std::vector<float> x = p.x.to_float_vector(), w1 = p.w1.to_float_vector(),
                           w2 = p.w2.to_float_vector(), tw = p.weights.to_float_vector();
  const std::vector<float> b1 = p.bias ? p.b1.to_float_vector() : std::vector<float>{};
  const std::vector<float> b2 = p.bias ? p.b2.to_float_vector() : std::vector<float>{};
  const std::vector<int64_t> ids = p.ids.to_int_vector();
  const std::vector<int64_t> map =
      p.use_map ? p.expert_map.to_int_vector() : std::vector<int64_t>{};
  const int64_t N = p.N(), D = p.D(), K = p.K;
  std::vector<double> out(static_cast<size_t>(p.M * K), 0.0);
  for (int64_t m = 0; m < p.M; ++m) {
    for (int64_t j = 0; j < p.topk; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * p.topk + j)];
      if (e < 0) continue;
      const int64_t l = p.use_map ? map[static_cast<size_t>(e)] : e;
      if (l < 0) continue;
      const double w = tw[static_cast<size_t>(m * p.topk + j)];
      const double in_scale = weight_on_input ? w : 1.0;
      const double out_scale = weight_on_input ? 1.0 : w;
      std::vector<double> g(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        double acc = p.bias ? b1[static_cast<size_t>(l * N + n)] : 0.0;
        for (int64_t k = 0; k < K; ++k) {
          acc += static_cast<double>(w1[static_cast<size_t>((l * N + n) * K + k)]) *
                 (in_scale * x[static_cast<size_t>(m * K + k)]);
        }
        g[static_cast<size_t>(n)] = acc;
      }
      const std::vector<double> a = activation_f64(p.act, g);
      for (int64_t k = 0; k < K; ++k) {
        double acc = p.bias ? b2[static_cast<size_t>(l * K + k)] : 0.0;
        for (int64_t d = 0; d < D; ++d) {
          acc += static_cast<double>(w2[static_cast<size_t>((l * K + k) * D + d)]) *
                 a[static_cast<size_t>(d)];
        }
        out[static_cast<size_t>(m * K + k)] += out_scale * acc;
      }
    }
  }
  return out;
}

// ---- the two pipelines
// ---------------------------------------------------------------------------

MoEConfig moe_config_of(const Problem& p) {
  MoEConfig moe;
  moe.num_experts = p.E_global;
  moe.experts_per_token = p.topk;
  moe.hidden_dim = p.K;
  moe.intermediate_size = p.I;
  moe.num_local_experts = p.E_local;
  moe.num_logical_experts = p.E_global;
  moe.activation = p.act;
  moe.in_dtype = p.dtype;
  moe.has_bias = p.bias;
  moe.hidden_dim_unpadded = p.K;
  moe.intermediate_size_per_partition_unpadded = p.I;
  if (p.use_map) {
    moe.parallel.use_ep = true;
    moe.parallel.ep_size = 2;
  }
  return moe;
}

QuantConfig quant_config_of(const Problem& p) {
  return p.bias ? QuantConfig::biased(p.b1, p.b2) : QuantConfig::unquantized();
}

struct RunOptions {
  bool weight_on_input = false;
  bool async = false;
  Tensor expert_output;  // out: the experts' unreduced output
};

PrepareArgs prepare_args_of(const Problem& p, const QuantConfig& quant, bool weight_on_input,
                            const Tensor& expert_map) {
  PrepareArgs args;
  args.a1 = p.x;
  args.topk_weights = p.weights;
  args.topk_ids = p.ids;
  args.num_experts = p.E_global;
  args.expert_map = expert_map;
  args.apply_router_weight_on_input = weight_on_input;
  args.quant_config = &quant;
  return args;
}

ExpertsApplyArgs apply_args_of(const Problem& p, const PrepareResult& prepared, Tensor output,
                               const WorkspaceShapes& shapes, const Tensor& expert_map,
                               bool weight_on_input) {
  ExpertsApplyArgs args;
  args.output = std::move(output);
  args.hidden_states = prepared.a1q;
  args.w1 = p.w1;
  args.w2 = p.w2;
  args.topk_weights = p.weights;
  args.topk_ids = p.ids;
  args.activation = p.act;
  args.global_num_experts = p.E_global;
  args.expert_map = expert_map;
  args.a1q_scale = prepared.a1q_scale;
  args.workspace13 = poisoned(shapes.workspace13, p.dtype);
  args.workspace2 = poisoned(shapes.workspace2, p.dtype);
  args.expert_tokens_meta = prepared.expert_tokens_meta ? &*prepared.expert_tokens_meta : nullptr;
  args.apply_router_weight_on_input = weight_on_input;
  return args;
}

// PrepareFinalizeNoEP + CpuReferenceExperts -> (M, K).
Tensor run_standard(const Problem& p, RunOptions* opts = nullptr) {
  RunOptions defaults;
  RunOptions& o = opts ? *opts : defaults;
  const QuantConfig quant = quant_config_of(p);
  PrepareFinalizeNoEP pf;
  CpuReferenceExperts experts(moe_config_of(p), quant);
  const PrepareArgs pargs = prepare_args_of(p, quant, o.weight_on_input, p.expert_map);
  PrepareResult prepared;
  if (o.async) {
    AsyncHandle<PrepareResult> h = pf.prepare_async(pargs, kCtx);
    if (h.hook) h.hook();
    prepared = h.receiver();
  } else {
    prepared = pf.prepare(pargs, kCtx);
  }
  const WorkspaceShapes shapes =
      experts.workspace_shapes(p.M, p.N(), p.K, p.topk, p.E_global, p.E_local, nullptr, p.act);
  EXPECT_EQ(shapes.output, (Shape{p.M, p.topk, p.K}));
  o.expert_output = poisoned(shapes.output, p.dtype);
  experts.apply(
      apply_args_of(p, prepared, o.expert_output, shapes, p.expert_map, o.weight_on_input), kCtx);
  Tensor out = poisoned({p.M, p.K}, p.dtype);
  FinalizeArgs fargs{out,   o.expert_output,   p.weights,
                     p.ids, o.weight_on_input, experts.finalize_weight_and_reduce_impl()};
  if (o.async) {
    AsyncHandle<void> h = pf.finalize_async(fargs, kCtx);
    if (h.hook) h.hook();
    h.receiver();
  } else {
    pf.finalize(fargs, kCtx);
  }
  return out;
}

// PrepareFinalizeBatched + CpuBatchedReferenceExperts -> (M, K).
Tensor run_batched(const Problem& p, int64_t max_num_tokens, int rank = 0,
                   const Tensor* expert_map_override = nullptr, bool weight_on_input = false) {
  const QuantConfig quant = quant_config_of(p);
  const Tensor& map = expert_map_override ? *expert_map_override : p.expert_map;
  PrepareFinalizeBatched pf(max_num_tokens, p.E_local, /*num_dispatchers=*/1, rank);
  CpuBatchedReferenceExperts experts(moe_config_of(p), quant, max_num_tokens, 1);
  const PrepareResult prepared = pf.prepare(prepare_args_of(p, quant, weight_on_input, map), kCtx);
  EXPECT_TRUE(prepared.expert_tokens_meta.has_value());
  const WorkspaceShapes shapes = experts.workspace_shapes(
      max_num_tokens, p.N(), p.K, p.topk, p.E_global, p.E_local,
      prepared.expert_tokens_meta ? &*prepared.expert_tokens_meta : nullptr, p.act);
  EXPECT_EQ(shapes.output, (Shape{p.E_local, max_num_tokens, p.K}));
  Tensor expert_out = poisoned(shapes.output, p.dtype);
  experts.apply(apply_args_of(p, prepared, expert_out, shapes, map, weight_on_input), kCtx);
  EXPECT_FALSE(testing::has_nan(expert_out)) << "batched experts left rows unwritten";
  Tensor out = poisoned({p.M, p.K}, p.dtype);
  pf.finalize(FinalizeArgs{out, expert_out, p.weights, p.ids, weight_on_input,
                           experts.finalize_weight_and_reduce_impl()},
              kCtx);
  return out;
}

// ---- TopKWeightAndReduce: closed form
// ------------------------------------------------------------

TEST(TopKWeightAndReduce, ContiguousClosedFormSkipsInvalidSlots) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t M = 3, topk = 3, K = 5;
    std::vector<float> y(static_cast<size_t>(M * topk * K));
    for (size_t i = 0; i < y.size(); ++i)
      y[i] = static_cast<float>(static_cast<int>(i % 11) - 4);
    const std::vector<float> w = {0.5f, 0.25f, 2.0f, 1.0f, 4.0f, 0.125f, 8.0f, 0.5f, 1.0f};
    const std::vector<int64_t> ids = {0, 3, 1, -1, 2, 0, 1, 1, -1};
    const Tensor fused = floats(y, {M, topk, K}, dtype);
    for (bool on_input : {false, true}) {
      Tensor out = poisoned({M, K}, dtype);
      const Tensor res = TopKWeightAndReduceContiguous().apply(
          out, fused, floats(w, {M, topk}, DType::kF32), ints(ids, {M, topk}), on_input, kCtx);
      EXPECT_EQ(res.data(), out.data());
      const std::vector<float> got = out.to_float_vector();
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t k = 0; k < K; ++k) {
          float expect = 0;
          for (int64_t j = 0; j < topk; ++j) {
            const size_t s = static_cast<size_t>(m * topk + j);
            if (ids[s] < 0) continue;
            expect += (on_input ? 1.0f : w[s]) * y[s * K + static_cast<size_t>(k)];
          }
          EXPECT_EQ(got[static_cast<size_t>(m * K + k)], expect) << "m=" << m << " k=" << k;
        }
      }
    }
  }
}

TEST(TopKWeightAndReduce, ContiguousAllocatesAndAcceptsFlatInputAndOtherOutputDtype) {
  const int64_t M = 4, topk = 2, K = 3;
  const Tensor fused = testing::random_tensor({M * topk, K}, DType::kBF16, 7);
  Tensor ids, w;
  testing::random_routing(M, topk, 5, 8, &ids, &w);
  const Tensor a = TopKWeightAndReduceContiguous().apply({}, fused, w, ids, false, kCtx);
  ASSERT_TRUE(a.defined());
  EXPECT_EQ(a.shape(), (Shape{M, K}));
  EXPECT_EQ(a.dtype(), DType::kBF16);
  Tensor b = poisoned({M, K}, DType::kF32);  // accumulate, round once to f32
  TopKWeightAndReduceContiguous().apply(b, fused.view({M, topk, K}), w, ids, false, kCtx);
  const std::vector<float> fa = a.to_float_vector(), fb = b.to_float_vector();
  for (size_t i = 0; i < fa.size(); ++i)
    EXPECT_EQ(fa[i], round_to_bf16(fb[i])) << i;
}

TEST(TopKWeightAndReduce, NoOpCopiesAndDelegateThrows) {
  const Tensor src = testing::random_tensor({3, 4}, DType::kF16, 3);
  Tensor dst = poisoned({3, 4}, DType::kF16);
  TopKWeightAndReduceNoOp().apply(dst, src, {}, {}, false, kCtx);
  EXPECT_TRUE(same_bytes(dst, src));
  const Tensor same = TopKWeightAndReduceNoOp().apply(src, src, {}, {}, false, kCtx);
  EXPECT_EQ(same.data(), src.data());
  const std::string msg =
      error_of([&] { TopKWeightAndReduceDelegate().apply(dst, src, {}, {}, false, kCtx); });
  EXPECT_NE(msg.find("prepare/finalize"), std::string::npos) << msg;
}

TEST(TopKWeightAndReduce, NaiveBatchedReadsTheBatchedLayout) {
  // E_local = 2 on rank 1 of E_global = 4: global 2 -> local 0, 3 -> local 1.
  const int64_t M = 3, topk = 2, K = 2, T = 4;
  const std::vector<int64_t> ids = {2, 3, 0, 2, 3, -1};
  const std::vector<float> w = {1.0f, 0.5f, 2.0f, 4.0f, 0.25f, 8.0f};
  // local 0 rows: (m0, j0), (m1, j1); local 1 rows: (m0, j1), (m2, j0).
  std::vector<float> y(static_cast<size_t>(2 * T * K), 1000.0f);  // unused rows must not be read
  auto put = [&](int64_t e, int64_t r, float a, float b) {
    y[static_cast<size_t>((e * T + r) * K)] = a;
    y[static_cast<size_t>((e * T + r) * K + 1)] = b;
  };
  put(0, 0, 1, 2);
  put(0, 1, 3, 4);
  put(1, 0, 5, 6);
  put(1, 1, 7, 8);
  Tensor out = poisoned({M, K}, DType::kF32);
  TopKWeightAndReduceNaiveBatched(/*rank=*/1, /*num_local_experts=*/2)
      .apply(out, floats(y, {2, T, K}, DType::kF32), floats(w, {M, topk}, DType::kF32),
             ints(ids, {M, topk}), false, kCtx);
  const std::vector<float> expect = {1 * 1 + 0.5f * 5, 1 * 2 + 0.5f * 6, 4 * 3, 4 * 4,
                                     0.25f * 7,        0.25f * 8};
  EXPECT_EQ(out.to_float_vector(), expect);
  // The same layout through an expert_map instead of the rank's range.
  Tensor out2 = poisoned({M, K}, DType::kF32);
  TopKWeightAndReduceNaiveBatched(0, 2, ints({-1, -1, 0, 1}, {4}))
      .apply(out2, floats(y, {2, T, K}, DType::kF32), floats(w, {M, topk}, DType::kF32),
             ints(ids, {M, topk}), false, kCtx);
  EXPECT_EQ(out2.to_float_vector(), expect);
}

// ---- closed-form layers, bitwise
// -----------------------------------------------------------------

// E = 2, K = I = 4. W1[e]: gate rows (e+1) * Id, up rows Id (gated); W2[e] = Id. Integer inputs in
// {-1, 0, 1, 2} and weights in {0.5, 1, 2}: every intermediate is exact in bf16.
struct ClosedForm {
  Problem p;
  std::vector<double> expect;  // (M, K)
};

ClosedForm closed_form(DType dtype, Activation act, bool bias) {
  ClosedForm c;
  Problem& p = c.p;
  p.dtype = dtype;
  p.act = act;
  p.bias = bias;
  p.M = 9;
  p.K = 4;
  p.I = 4;
  p.E_global = p.E_local = 2;
  p.topk = 2;
  const int64_t N = p.N(), K = p.K;
  std::vector<float> w1(static_cast<size_t>(2 * N * K), 0.f),
      w2(static_cast<size_t>(2 * K * K), 0.f);
  std::vector<float> b1(static_cast<size_t>(2 * N)), b2(static_cast<size_t>(2 * K));
  for (int e = 0; e < 2; ++e) {
    for (int k = 0; k < K; ++k) {
      w1[static_cast<size_t>((e * N + k) * K + k)] = static_cast<float>(e + 1);
      if (is_gated(act)) w1[static_cast<size_t>((e * N + K + k) * K + k)] = 1.f;
      w2[static_cast<size_t>((e * K + k) * K + k)] = 1.f;
      b2[static_cast<size_t>(e * K + k)] = static_cast<float>(e);
    }
    for (int n = 0; n < N; ++n)
      b1[static_cast<size_t>(e * N + n)] = n < K ? 1.f : -1.f;
  }
  p.w1 = floats(w1, {2, N, K}, dtype);
  p.w2 = floats(w2, {2, K, K}, dtype);
  if (bias) {
    p.b1 = floats(b1, {2, N}, dtype);
    p.b2 = floats(b2, {2, K}, dtype);
  }
  std::vector<float> x(static_cast<size_t>(p.M * K));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(static_cast<int>((i * 5 + 1) % 4) - 1);
  p.x = floats(x, {p.M, K}, dtype);
  std::vector<int64_t> ids(static_cast<size_t>(p.M * 2));
  std::vector<float> w(ids.size());
  const float choices[3] = {0.5f, 1.f, 2.f};
  for (int64_t m = 0; m < p.M; ++m) {
    ids[static_cast<size_t>(m * 2)] = m % 2;
    ids[static_cast<size_t>(m * 2 + 1)] = m % 4 == 3 ? -1 : (m + 1) % 2;
    for (int j = 0; j < 2; ++j)
      w[static_cast<size_t>(m * 2 + j)] = choices[(m + j) % 3];
  }
  p.ids = ints(ids, {p.M, 2});
  p.weights = floats(w, {p.M, 2}, DType::kF32);

  // Closed form of one expert on one element.
  auto expert = [&](int e, double xv) {
    const double s = e + 1;
    double a;
    if (act == Activation::kRelu2) {
      a = bias ? act_relu2(s * xv + 1) * (xv - 1) : act_relu2(s * xv) * xv;
    } else {  // relu2_no_mul
      a = bias ? act_relu2(s * xv + 1) : act_relu2(s * xv);
    }
    return a + (bias ? e : 0);
  };
  c.expect.assign(static_cast<size_t>(p.M * K), 0.0);
  for (int64_t m = 0; m < p.M; ++m) {
    for (int j = 0; j < 2; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * 2 + j)];
      if (e < 0) continue;
      for (int64_t k = 0; k < K; ++k) {
        c.expect[static_cast<size_t>(m * K + k)] +=
            w[static_cast<size_t>(m * 2 + j)] *
            expert(static_cast<int>(e), x[static_cast<size_t>(m * K + k)]);
      }
    }
  }
  return c;
}

TEST(ReferenceExperts, ClosedFormBitwise) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Activation act : {Activation::kRelu2, Activation::kRelu2NoMul}) {
      for (bool bias : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} bias={}", dtype_name(dtype), activation_name(act), bias));
        const ClosedForm c = closed_form(dtype, act, bias);
        const std::vector<float> std_out = run_standard(c.p).to_float_vector();
        const std::vector<float> bat_out = run_batched(c.p, /*max_num_tokens=*/9).to_float_vector();
        bool any_nonzero = false;
        for (size_t i = 0; i < c.expect.size(); ++i) {
          EXPECT_EQ(std_out[i], static_cast<float>(c.expect[i])) << "standard, element " << i;
          EXPECT_EQ(bat_out[i], static_cast<float>(c.expect[i])) << "batched, element " << i;
          any_nonzero |= c.expect[i] != 0;
        }
        EXPECT_TRUE(any_nonzero);
      }
    }
  }
}

// The GEMM1 output and the activation output are rounded to the activation dtype before the next
// step, as a kernel storing them in bf16 would. bf16, relu2_no_mul, K = N = 2, x = [1, 1]:
//   expert 0: g = [1 + 2^-8, 1] rounds (ties to even) to [1, 1]; y = Id a = [1, 1]
//             (without that rounding y0 = (1 + 2^-8)^2 -> 1 + 2^-7)
//   expert 1: g = [1 + 3 * 2^-7, 1]; a0 = g0^2 = 1.0474.. rounds to 1 + 6 * 2^-7; y0 = a0 - a1 =
//             0.046875 (without that rounding y0 = 0.04736..)
TEST(ReferenceExperts, RoundsWhereAKernelStores) {
  Problem p;
  p.dtype = DType::kBF16;
  p.act = Activation::kRelu2NoMul;
  p.M = 2;
  p.K = p.I = 2;
  p.E_global = p.E_local = 2;
  p.topk = 1;
  const float t8 = 1.0f / 256, t7 = 1.0f / 128;
  p.w1 = floats({1, t8, 0, 1, /*expert 1*/ 1, 3 * t7, 1, 0}, {2, 2, 2}, p.dtype);
  p.w2 = floats({1, 0, 0, 1, /*expert 1*/ 1, -1, 0, 1}, {2, 2, 2}, p.dtype);
  p.x = floats({1, 1, 1, 1}, {2, 2}, p.dtype);
  p.ids = ints({0, 1}, {2, 1});
  p.weights = floats({1, 1}, {2, 1}, DType::kF32);
  const std::vector<float> expect = {1.0f, 1.0f, 0.046875f, 1.0f};
  EXPECT_EQ(run_standard(p).to_float_vector(), expect);
  EXPECT_EQ(run_batched(p, 2).to_float_vector(), expect);
}

// ---- random layers vs float64, and batched == standard
// -------------------------------------------

struct SweepCase {
  DType dtype;
  Activation act;
  bool bias;
  bool use_map;
};

std::string sweep_name(const ::testing::TestParamInfo<SweepCase>& info) {
  const SweepCase& c = info.param;
  return fmt::format("{}_{}_{}_{}", dtype_name(c.dtype), activation_name(c.act),
                     c.bias ? "bias" : "nobias", c.use_map ? "map" : "nomap");
}

std::vector<SweepCase> sweep_cases() {
  std::vector<SweepCase> cases;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Activation act : all_activations()) {
      for (bool bias : {false, true}) {
        for (bool use_map : {false, true})
          cases.push_back({dtype, act, bias, use_map});
      }
    }
  }
  return cases;
}

class ReferenceSweep : public ::testing::TestWithParam<SweepCase> {
 protected:
  Problem make() const {
    const SweepCase& c = GetParam();
    Problem p;
    p.dtype = c.dtype;
    p.act = c.act;
    p.bias = c.bias;
    p.use_map = c.use_map;
    if (c.use_map) p.E_local = 3;
    // The clamped activations also see gate/up values beyond their limit of 7.
    if (c.act == Activation::kSwigluOai || c.act == Activation::kSwigluStep) p.w1_range = 12.0f;
    p.seed = 100 + static_cast<uint64_t>(c.act) * 10 + (c.bias ? 1 : 0) + (c.use_map ? 2 : 0);
    materialize(p);
    return p;
  }
};

TEST_P(ReferenceSweep, MatchesFloat64) {
  const Problem p = make();
  RunOptions opts;
  const Tensor out = run_standard(p, &opts);
  ASSERT_FALSE(testing::has_nan(opts.expert_output)) << "experts left rows unwritten";
  ASSERT_FALSE(testing::has_nan(out)) << "finalize left rows unwritten";
  const std::vector<double> ref = reference_f64(p, false);
  const double err = testing::relative_l2_error(out, ref);
  EXPECT_LE(err, tolerance_of(p.dtype)) << "relative L2 error vs float64";
  double ref_norm = 0;
  for (double v : ref)
    ref_norm += v * v;
  EXPECT_GT(ref_norm, 0.0);
}

TEST_P(ReferenceSweep, BatchedEqualsStandardBitwise) {
  const Problem p = make();
  const Tensor standard = run_standard(p);
  const Tensor batched = run_batched(p, /*max_num_tokens=*/p.M);
  EXPECT_TRUE(same_bytes(standard, batched));
}

INSTANTIATE_TEST_SUITE_P(AllActivations, ReferenceSweep, ::testing::ValuesIn(sweep_cases()),
                         sweep_name);

TEST(ReferenceExperts, InvalidAndForeignSlotsAreZeroRows) {
  Problem p;
  p.dtype = DType::kBF16;
  p.use_map = true;
  p.E_local = 3;
  p.num_invalid = 5;
  materialize(p);
  RunOptions opts;
  run_standard(p, &opts);
  const std::vector<float> y = opts.expert_output.to_float_vector();
  const std::vector<int64_t> ids = p.ids.to_int_vector(), map = p.expert_map.to_int_vector();
  int zero_rows = 0, live_rows = 0;
  for (int64_t s = 0; s < p.M * p.topk; ++s) {
    const int64_t e = ids[static_cast<size_t>(s)];
    const bool local = e >= 0 && map[static_cast<size_t>(e)] >= 0;
    double norm = 0;
    for (int64_t k = 0; k < p.K; ++k)
      norm += std::fabs(y[static_cast<size_t>(s * p.K + k)]);
    if (local) {
      EXPECT_GT(norm, 0.0) << "slot " << s;
      ++live_rows;
    } else {
      EXPECT_EQ(norm, 0.0) << "slot " << s << " (id " << e << ") must be zeros";
      ++zero_rows;
    }
  }
  EXPECT_GT(zero_rows, 0);
  EXPECT_GT(live_rows, 0);
}

TEST(ReferenceExperts, OutOfRangeIdsAreSkipped) {
  Problem p;
  p.dtype = DType::kF32;
  p.num_invalid = 0;
  materialize(p);
  std::vector<int64_t> ids = p.ids.to_int_vector();
  ids[1] = p.E_global + 5;  // out of range: contributes nothing
  Problem q = p;
  q.ids = ints(ids, {p.M, p.topk});
  RunOptions opts;
  const Tensor out = run_standard(q, &opts);
  const std::vector<float> y = opts.expert_output.to_float_vector();
  for (int64_t k = 0; k < p.K; ++k)
    EXPECT_EQ(y[static_cast<size_t>(p.K + k)], 0.0f);
  ids[1] = -1;
  q.ids = ints(ids, {p.M, p.topk});
  EXPECT_TRUE(same_bytes(out, run_standard(q)));
}

TEST(ReferenceExperts, BatchedOnAnotherRankEqualsStandardWithMap) {
  // Rank 1 of 2 owns experts 4..7 of 8 (no expert_map: the rank's range).
  Problem p;
  p.dtype = DType::kBF16;
  p.E_global = 8;
  p.E_local = 4;
  p.use_map = true;  // materialize builds a random map; replace it by the range map
  materialize(p);
  p.expert_map = ints({-1, -1, -1, -1, 0, 1, 2, 3}, {8});
  const Tensor standard = run_standard(p);
  const Tensor no_map;
  const Tensor batched = run_batched(p, p.M, /*rank=*/1, &no_map);
  EXPECT_TRUE(same_bytes(standard, batched));
  EXPECT_LE(testing::relative_l2_error(standard, reference_f64(p, false)), tolerance_of(p.dtype));
}

TEST(ReferenceExperts, RouterWeightOnInputTop1) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Problem p;
    p.dtype = dtype;
    p.topk = 1;
    p.num_invalid = 2;
    materialize(p);
    // top-1 routing weights are 1 after normalization: use other values.
    p.weights = testing::random_tensor({p.M, 1}, DType::kF32, 77, 0.25f, 1.75f);
    RunOptions opts;
    opts.weight_on_input = true;
    const Tensor out = run_standard(p, &opts);
    ASSERT_FALSE(testing::has_nan(out));
    const double err = testing::relative_l2_error(out, reference_f64(p, true));
    EXPECT_LE(err, tolerance_of(dtype));
    // Weighting the input is not weighting the output (silu is not linear).
    EXPECT_GT(testing::relative_l2_error(out, reference_f64(p, false)), 10 * tolerance_of(dtype));
    EXPECT_TRUE(same_bytes(out, run_batched(p, p.M, 0, nullptr, /*weight_on_input=*/true)));
  }
  Problem p;
  p.topk = 2;
  materialize(p);
  const std::string msg = error_of([&] {
    RunOptions opts;
    opts.weight_on_input = true;
    run_standard(p, &opts);
  });
  EXPECT_NE(msg.find("topk == 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("topk = 2"), std::string::npos) << msg;
}

// The parts inside FusedMoEKernel (async NoEP path, workspaces from the manager, ws13 aliased with
// the output) give the same bits as the parts called one by one.
TEST(ReferenceExperts, InsideFusedMoEKernel) {
  Problem p;
  p.dtype = DType::kBF16;
  p.act = Activation::kSwigluOai;
  p.bias = true;
  p.use_map = true;
  p.E_local = 5;
  materialize(p);
  const Tensor expect = run_standard(p);
  ModularApplyArgs args;
  args.hidden_states = p.x;
  args.w1 = p.w1;
  args.w2 = p.w2;
  args.topk_weights = p.weights;
  args.topk_ids = p.ids;
  args.activation = p.act;
  args.global_num_experts = p.E_global;
  args.expert_map = p.expert_map;
  WorkspaceManager workspace;
  const RunContext ctx{Stream{}, &workspace};
  auto shared = std::make_shared<CpuReferenceSharedExperts>(
      testing::random_tensor({p.N(), p.K}, p.dtype, 41),
      testing::random_tensor({p.K, p.D()}, p.dtype, 42), p.act);
  FusedMoEKernel standard(
      std::make_unique<PrepareFinalizeNoEP>(),
      std::make_unique<CpuReferenceExperts>(moe_config_of(p), quant_config_of(p)), shared);
  const MoEOutput out = standard.apply(args, ctx);
  EXPECT_TRUE(same_bytes(out.output, expect));
  ASSERT_TRUE(out.shared_output.defined());
  EXPECT_TRUE(same_bytes(out.shared_output, shared->forward(p.x, kCtx)));

  FusedMoEKernel batched(
      std::make_unique<PrepareFinalizeBatched>(p.M, p.E_local),
      std::make_unique<CpuBatchedReferenceExperts>(moe_config_of(p), quant_config_of(p), p.M, 1));
  EXPECT_TRUE(same_bytes(batched.apply(args, ctx).output, expect));
}

// ---- prepare / finalize
// --------------------------------------------------------------------------

TEST(PrepareFinalizeNoEP, Properties) {
  PrepareFinalizeNoEP pf;
  EXPECT_EQ(pf.activation_format(), ActivationFormat::kStandard);
  EXPECT_FALSE(pf.topk_indices_dtype().has_value());
  EXPECT_FALSE(pf.max_num_tokens_per_rank().has_value());
  EXPECT_EQ(pf.num_dispatchers(), 1);
  EXPECT_FALSE(pf.output_is_reduced());
  EXPECT_FALSE(pf.is_monolithic());
  EXPECT_TRUE(pf.supports_async());
  PrepareFinalizeMonolithicNoEP mono;
  EXPECT_TRUE(mono.is_monolithic());
  EXPECT_EQ(mono.activation_format(), ActivationFormat::kStandard);
}

TEST(PrepareFinalizeNoEP, PrepareChecksInputs) {
  Problem p;
  materialize(p);
  const QuantConfig quant = QuantConfig::unquantized();
  PrepareFinalizeNoEP pf;
  PrepareArgs args = prepare_args_of(p, quant, false, {});
  const PrepareResult r = pf.prepare(args, kCtx);
  EXPECT_EQ(r.a1q.data(), p.x.data());  // unquantized: passed through
  EXPECT_FALSE(r.a1q_scale.defined());
  EXPECT_FALSE(r.expert_tokens_meta.has_value());
  EXPECT_FALSE(r.topk_ids.defined());
  EXPECT_FALSE(r.topk_weights.defined());

  PrepareArgs bad = args;
  bad.topk_ids = p.ids.to_dtype(DType::kInt64);
  EXPECT_NE(error_of([&] { pf.prepare(bad, kCtx); }).find("topk_ids"), std::string::npos);
  bad = args;
  bad.topk_weights = p.weights.to_dtype(DType::kBF16);
  EXPECT_NE(error_of([&] { pf.prepare(bad, kCtx); }).find("topk_weights"), std::string::npos);
  bad = args;
  bad.a1 = p.x.slice(0, 0, p.M - 1);
  EXPECT_NE(error_of([&] { pf.prepare(bad, kCtx); }).find("topk_ids"), std::string::npos);
  bad = args;
  bad.a1 = p.x.to_dtype(DType::kF64);
  EXPECT_NE(error_of([&] { pf.prepare(bad, kCtx); }).find("a1"), std::string::npos);

  // Quantized activations go through quantize_moe_input (UnsupportedError while the format is not
  // implemented there).
  QuantConfig fp8 = QuantConfig::unquantized();
  fp8.a1.dtype = QuantDType::kFp8E4M3;
  args.quant_config = &fp8;
  try {
    const PrepareResult q = pf.prepare(args, kCtx);
    EXPECT_EQ(q.a1q.dtype(), DType::kFp8E4M3);
    EXPECT_TRUE(q.a1q_scale.defined());
  } catch (const UnsupportedError&) {
    // not implemented yet for this format
  }
  args.defer_input_quant = true;  // the experts quantize: no error
  EXPECT_EQ(pf.prepare(args, kCtx).a1q.data(), p.x.data());
}

TEST(PrepareFinalizeNoEP, AsyncIsLazyAndEqualsSync) {
  Problem p;
  p.topk = 1;  // so the prepare does real work (router weight on input)
  materialize(p);
  const QuantConfig quant = QuantConfig::unquantized();
  PrepareFinalizeNoEP pf;
  const PrepareArgs args = prepare_args_of(p, quant, /*weight_on_input=*/true, {});
  const PrepareResult sync = pf.prepare(args, kCtx);
  EXPECT_NE(sync.a1q.data(), p.x.data());
  {
    AsyncHandle<PrepareResult> h = pf.prepare_async(args, kCtx);
    ASSERT_TRUE(h.hook);
    h.hook();
    EXPECT_TRUE(same_bytes(h.receiver().a1q, sync.a1q));
  }
  {
    AsyncHandle<PrepareResult> h = pf.prepare_async(args, kCtx);  // receiver without the hook
    EXPECT_TRUE(same_bytes(h.receiver().a1q, sync.a1q));
  }
  // finalize: nothing is written before the hook / receiver runs.
  const Tensor fused = testing::random_tensor({p.M, p.topk, p.K}, p.dtype, 9);
  Tensor sync_out = poisoned({p.M, p.K}, p.dtype);
  pf.finalize({sync_out, fused, p.weights, p.ids, false, nullptr}, kCtx);
  Tensor async_out = poisoned({p.M, p.K}, p.dtype);
  AsyncHandle<void> h = pf.finalize_async(
      {async_out, fused, p.weights, p.ids, false, std::make_shared<TopKWeightAndReduceDelegate>()},
      kCtx);
  EXPECT_TRUE(testing::has_nan(async_out)) << "finalize_async must defer its work";
  h.hook();
  h.receiver();
  EXPECT_TRUE(same_bytes(async_out, sync_out));
  EXPECT_FALSE(testing::has_nan(async_out));

  // The whole pipeline, async against sync.
  Problem q;
  q.dtype = DType::kF16;
  q.use_map = true;
  q.E_local = 5;
  materialize(q);
  RunOptions o;
  o.async = true;
  EXPECT_TRUE(same_bytes(run_standard(q, &o), run_standard(q)));
}

TEST(PrepareFinalizeNoEP, EmptyBatch) {
  Problem p;
  p.M = 0;
  p.num_invalid = 0;
  materialize(p);
  const Tensor out = run_standard(p);
  EXPECT_EQ(out.shape(), (Shape{0, p.K}));
  const Tensor out_b = run_batched(p, 4);
  EXPECT_EQ(out_b.shape(), (Shape{0, p.K}));
}

TEST(PrepareFinalizeMonolithicNoEP, PassesThrough) {
  const Tensor a1 = testing::random_tensor({5, 8}, DType::kBF16, 1);
  const Tensor logits = testing::random_tensor({5, 4}, DType::kF32, 2);
  PrepareFinalizeMonolithicNoEP pf;
  const PrepareMonolithicResult r = pf.prepare(a1, logits, QuantConfig::unquantized(), false, kCtx);
  EXPECT_EQ(r.a1q.data(), a1.data());
  EXPECT_EQ(r.router_logits.data(), logits.data());
  EXPECT_FALSE(r.a1q_scale.defined());
  const Tensor y = testing::random_tensor({5, 8}, DType::kBF16, 3);
  EXPECT_EQ(pf.finalize(y, kCtx).data(), y.data());
}

TEST(PrepareFinalizeBatched, LayoutCountsAndZeroPadding) {
  // E_global = 4, rank 0 owns all. ids row by row.
  const int64_t M = 5, topk = 2, K = 3, T = 4;
  const std::vector<int64_t> ids = {2, 0, 0, 2, 3, -1, 2, 9, 0, 3};
  std::vector<float> x(static_cast<size_t>(M * K));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(i + 1);
  Problem p;
  p.dtype = DType::kBF16;
  p.M = M;
  p.K = K;
  p.topk = topk;
  p.x = floats(x, {M, K}, DType::kBF16);
  p.ids = ints(ids, {M, topk});
  p.weights = floats(std::vector<float>(M * topk, 1.f), {M, topk}, DType::kF32);
  const QuantConfig quant = QuantConfig::unquantized();
  PrepareFinalizeBatched pf(T, /*num_local_experts=*/4);
  EXPECT_EQ(pf.activation_format(), ActivationFormat::kBatchedExperts);
  EXPECT_EQ(pf.max_num_tokens_per_rank().value_or(-1), T);
  EXPECT_EQ(pf.num_dispatchers(), 1);
  const PrepareResult r = pf.prepare(prepare_args_of(p, quant, false, {}), kCtx);
  ASSERT_EQ(r.a1q.shape(), (Shape{4, T, K}));
  ASSERT_TRUE(r.expert_tokens_meta.has_value());
  const std::vector<int32_t> counts = {3, 0, 3, 2};  // id 9 is out of range: skipped
  ASSERT_TRUE(r.expert_tokens_meta->expert_num_tokens_cpu.has_value());
  EXPECT_EQ(*r.expert_tokens_meta->expert_num_tokens_cpu, counts);
  std::vector<int64_t> counts64(counts.begin(), counts.end());
  EXPECT_EQ(r.expert_tokens_meta->expert_num_tokens.to_int_vector(), counts64);
  // Rows per expert, in token order: expert 0 <- tokens 0, 1, 4; 2 <- 0, 1, 3; 3 <- 2, 4.
  const std::vector<std::vector<int64_t>> rows = {{0, 1, 4}, {}, {0, 1, 3}, {2, 4}};
  const std::vector<float> a = r.a1q.to_float_vector();
  for (int64_t e = 0; e < 4; ++e) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        const float got = a[static_cast<size_t>((e * T + t) * K + k)];
        const auto& re = rows[static_cast<size_t>(e)];
        const float expect = t < static_cast<int64_t>(re.size())
                                 ? x[static_cast<size_t>(re[static_cast<size_t>(t)] * K + k)]
                                 : 0.0f;
        EXPECT_EQ(got, expect) << "e=" << e << " t=" << t << " k=" << k;
      }
    }
  }
}

TEST(PrepareFinalizeBatched, TooManyTokensForAnExpertIsAClearError) {
  Problem p;
  p.M = 6;
  p.topk = 1;
  p.E_global = p.E_local = 2;
  materialize(p);
  p.ids = ints({1, 1, 0, 1, 0, 1}, {6, 1});
  const QuantConfig quant = QuantConfig::unquantized();
  PrepareFinalizeBatched pf(/*max_num_tokens=*/3, 2);
  const std::string msg = error_of([&] { pf.prepare(prepare_args_of(p, quant, false, {}), kCtx); });
  EXPECT_NE(msg.find("local expert 1 received 4 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 4]"), std::string::npos) << msg;
  PrepareFinalizeBatched big(4, 2);
  EXPECT_NO_THROW(big.prepare(prepare_args_of(p, quant, false, {}), kCtx));
}

// ---- experts classes
// -----------------------------------------------------------------------------

TEST(ReferenceExperts, CapabilitiesAndWorkspaces) {
  const ExpertsCapabilities& caps = CpuReferenceExperts::klass().caps();
  EXPECT_EQ(caps.name, "CpuReferenceExperts");
  EXPECT_EQ(caps.format, ActivationFormat::kStandard);
  EXPECT_FALSE(caps.monolithic);
  EXPECT_EQ(caps.device_types, std::vector<DeviceType>{DeviceType::kCPU});
  EXPECT_EQ(caps.activations.size(), all_activations().size());
  ASSERT_EQ(caps.quant_schemes.size(), 1u);
  EXPECT_FALSE(caps.quant_schemes[0].weight.has_value());
  EXPECT_FALSE(caps.quant_schemes[0].activation.has_value());
  EXPECT_TRUE(caps.supports_bias);
  EXPECT_TRUE(caps.supports_expert_map);
  EXPECT_TRUE(caps.supports_no_act_and_mul);
  EXPECT_EQ(caps.in_dtypes.size(), 3u);
  EXPECT_EQ(CpuBatchedReferenceExperts::klass().name(), "CpuBatchedReferenceExperts");
  EXPECT_EQ(CpuBatchedReferenceExperts::klass().activation_format(),
            ActivationFormat::kBatchedExperts);

  Problem p;
  const MoEConfig moe = moe_config_of(p);
  CpuReferenceExperts ex(moe, QuantConfig::unquantized());
  WorkspaceShapes s = ex.workspace_shapes(7, 48, 40, 2, 8, 8, nullptr, Activation::kSilu);
  EXPECT_EQ(s.workspace13, (Shape{14, 48}));
  EXPECT_EQ(s.workspace2, (Shape{14, 24}));
  EXPECT_EQ(s.output, (Shape{7, 2, 40}));
  s = ex.workspace_shapes(7, 24, 40, 2, 8, 8, nullptr, Activation::kRelu2NoMul);
  EXPECT_EQ(s.workspace13, (Shape{14, 40}));
  EXPECT_EQ(s.workspace2, (Shape{14, 24}));
  EXPECT_EQ(ex.finalize_weight_and_reduce_impl()->name(), "Contiguous");

  CpuBatchedReferenceExperts bex(moe, QuantConfig::unquantized(), 16, 2);
  s = bex.workspace_shapes(16, 48, 40, 2, 8, 3, nullptr, Activation::kSilu);
  EXPECT_EQ(s.workspace13, (Shape{3, 32, 48}));
  EXPECT_EQ(s.workspace2, (Shape{3, 32, 24}));
  EXPECT_EQ(s.output, (Shape{3, 32, 40}));
  EXPECT_EQ(bex.finalize_weight_and_reduce_impl()->name(), "Delegate");

  std::unique_ptr<Experts> made =
      CpuReferenceExperts::klass().make(moe, QuantConfig::unquantized());
  EXPECT_EQ(made->name(), "CpuReferenceExperts");
}

TEST(ReferenceExperts, QuantizedConfigsAreRejected) {
  Problem p;
  QuantConfig fp8 = QuantConfig::unquantized();
  fp8.w1.dtype = QuantDType::kFp8E4M3;
  fp8.a1.dtype = QuantDType::kFp8E4M3;
  EXPECT_THROW(CpuReferenceExperts(moe_config_of(p), fp8), UnsupportedError);
  const Tensor a = testing::random_tensor({2, 4}, DType::kBF16, 1);
  EXPECT_EQ(quantize_moe_input(a, QuantDesc{}, kCtx).data.data(), a.data());
}

TEST(ReferenceExperts, BadWeightShapesAreClearErrors) {
  Problem p;
  materialize(p);
  Problem q = p;
  q.w2 = testing::random_tensor({p.E_local, p.K, p.D() + 1}, p.dtype, 4);
  EXPECT_NE(error_of([&] { run_standard(q); }).find("w2"), std::string::npos);
}

TEST(ReferenceSharedExperts, MatchesFloat64) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (Activation act : {Activation::kSilu, Activation::kRelu2NoMul, Activation::kSwigluOai}) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(dtype), activation_name(act)));
      // A shared expert is a one-expert layer with top-1 and weight 1.
      Problem p;
      p.dtype = dtype;
      p.act = act;
      p.M = 17;
      p.E_global = p.E_local = 1;
      p.topk = 1;
      p.num_invalid = 0;
      materialize(p);
      p.weights = floats(std::vector<float>(static_cast<size_t>(p.M), 1.f), {p.M, 1}, DType::kF32);
      CpuReferenceSharedExperts shared(p.w1.view({p.N(), p.K}), p.w2.view({p.K, p.D()}), act);
      const Tensor out = shared.forward(p.x, kCtx);
      ASSERT_EQ(out.shape(), (Shape{p.M, p.K}));
      EXPECT_EQ(out.dtype(), dtype);
      EXPECT_LE(testing::relative_l2_error(out, reference_f64(p, false)), tolerance_of(dtype));
      // Same numerics as the routed reference experts: bitwise equal to the one-expert layer.
      EXPECT_TRUE(same_bytes(out, run_standard(p)));
    }
  }
}

}  // namespace
}  // namespace moekit
