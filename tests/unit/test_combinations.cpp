// The combination sweep of the modular kernel (in the spirit of vLLM's modular-kernel combination
// test): every (prepare/finalize x experts x activation x routing method x dtype x expert map x
// shared experts) combination whose two parts agree on the activation format runs on random inputs
// and is compared with a float64 recomputation written here from the stored weights. Pairs whose
// formats differ are pruned with a stated reason, and a separate test checks that the pruned set is
// exactly the format-mismatch set (and that the library refuses to build exactly those pairs).
//
// Also here: the standard and batched pipelines agree bitwise, and the CPU reference rounds at the
// points its header documents (GEMM1 output, activation output, GEMM2 output, reduced output).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moekit/config/activation.h"
#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/core/error.h"
#include "moekit/core/half.h"
#include "moekit/core/tensor.h"
#include "moekit/core/tolerance.h"
#include "moekit/core/workspace.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/no_ep.h"
#include "moekit/router/router.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::first_bad_element;
using testing::has_nan;
using testing::random_tensor;
using testing::relative_l2_error;

// ---- the sweep's shape ------------------------------------------------------------------------

constexpr int64_t kH = 32;        // hidden
constexpr int64_t kI = 48;        // intermediate per expert
constexpr int64_t kIShared = 40;  // shared experts' intermediate (differs from kI on purpose)
constexpr int kE = 8;             // global experts
constexpr int kTopK = 2;
constexpr int kELocalEp = 4;  // experts of this rank under the EP simulation
constexpr int64_t kMaxTokens = 8;
constexpr std::array<int64_t, 2> kTokenCounts = {1, 7};
// EP simulation: this rank owns global experts {1, 3, 4, 6} (local 0..3); ids of the other experts
// are skipped (a non-contiguous map, so a "first expert" offset would be wrong).
constexpr std::array<int32_t, kE> kEpMap = {-1, 0, -1, 1, 2, -1, 3, -1};

enum class PF { kNoEP, kBatched };
enum class Exp { kStandard, kBatched };
enum class Routing { kSoftmaxRenorm, kSoftmax, kSigmoid, kGroupedBiasScaled, kLlama4 };

constexpr std::array<PF, 2> kPFs = {PF::kNoEP, PF::kBatched};
constexpr std::array<Exp, 2> kExperts = {Exp::kStandard, Exp::kBatched};
constexpr std::array<Routing, 5> kRoutings = {Routing::kSoftmaxRenorm, Routing::kSoftmax,
                                              Routing::kSigmoid, Routing::kGroupedBiasScaled,
                                              Routing::kLlama4};
constexpr std::array<DType, 3> kDTypes = {DType::kBF16, DType::kF16, DType::kF32};

struct Combo {
  PF pf = PF::kNoEP;
  Exp experts = Exp::kStandard;
  Activation act = Activation::kSilu;
  Routing routing = Routing::kSoftmaxRenorm;
  DType dtype = DType::kBF16;
  bool ep = false;
  bool shared = false;
  uint64_t seed = 0;
};

const char* pf_name(PF pf) {
  return pf == PF::kNoEP ? "NoEP" : "Batched";
}
const char* experts_name(Exp e) {
  return e == Exp::kStandard ? "CpuRef" : "CpuBatchedRef";
}
const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kSoftmaxRenorm:
      return "softmax_renorm";
    case Routing::kSoftmax:
      return "softmax";
    case Routing::kSigmoid:
      return "sigmoid";
    case Routing::kGroupedBiasScaled:
      return "grouped_bias_scaled";
    case Routing::kLlama4:
      return "llama4_top1";
  }
  return "?";
}

std::string combo_name(const Combo& c) {
  return std::string(pf_name(c.pf)) + "_" + experts_name(c.experts) + "_" +
         std::string(activation_name(c.act)) + "_" + routing_name(c.routing) + "_" +
         std::string(dtype_name(c.dtype)) + (c.ep ? "_ep" : "_noep") +
         (c.shared ? "_shared" : "_noshared");
}

// gpt-oss-style layers carry expert biases; the sweep gives them to swigluoai.
bool combo_has_bias(const Combo& c) {
  return c.act == Activation::kSwigluOai;
}

std::unique_ptr<PrepareFinalize> make_pf(PF pf, int num_local_experts) {
  if (pf == PF::kNoEP) return std::make_unique<PrepareFinalizeNoEP>();
  return std::make_unique<PrepareFinalizeBatched>(kMaxTokens, num_local_experts,
                                                  /*num_dispatchers=*/1, /*rank=*/0);
}

const ExpertsClass& experts_class(Exp e) {
  return e == Exp::kStandard ? CpuReferenceExperts::klass() : CpuBatchedReferenceExperts::klass();
}

// The format each part uses, as this test expects it (independent of the objects).
ActivationFormat expected_pf_format(PF pf) {
  return pf == PF::kNoEP ? ActivationFormat::kStandard : ActivationFormat::kBatchedExperts;
}
ActivationFormat expected_experts_format(Exp e) {
  return e == Exp::kStandard ? ActivationFormat::kStandard : ActivationFormat::kBatchedExperts;
}

// Pruning: a pair runs only when the prepare/finalize's format equals the experts' format (as the
// objects report them).
std::optional<std::string> prune_reason(const Combo& c) {
  const auto pf = make_pf(c.pf, c.ep ? kELocalEp : kE);
  const ExpertsClass& klass = experts_class(c.experts);
  if (pf->activation_format() == klass.activation_format()) return std::nullopt;
  return "format mismatch: " + pf->name() + " produces " +
         std::string(activation_format_name(pf->activation_format())) + " activations but " +
         klass.name() + " expects " +
         std::string(activation_format_name(klass.activation_format()));
}

struct Sweep {
  std::vector<Combo> all;
  std::vector<Combo> runnable;
  std::vector<std::pair<Combo, std::string>> pruned;
};

const Sweep& sweep() {
  static const Sweep s = [] {
    Sweep out;
    uint64_t seed = 1000;
    for (PF pf : kPFs)
      for (Exp ex : kExperts)
        for (Activation act : all_activations())
          for (Routing r : kRoutings)
            for (DType dt : kDTypes)
              for (bool ep : {false, true})
                for (bool shared : {false, true}) {
                  Combo c{pf, ex, act, r, dt, ep, shared, seed};
                  seed += 101;
                  out.all.push_back(c);
                  if (auto why = prune_reason(c)) {
                    out.pruned.emplace_back(c, *why);
                  } else {
                    out.runnable.push_back(c);
                  }
                }
    return out;
  }();
  return s;
}

// ---- the float64 recomputation ----------------------------------------------------------------

double silu_d(double x) {
  return x / (1.0 + std::exp(-x));
}
double sigmoid_d(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
double gelu_d(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double gelu_tanh_d(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double relu2_d(double x) {
  return x > 0 ? x * x : 0.0;
}

// g has 2d values (gated) or d values; returns d values. Defaults of the header: swigluoai alpha
// 1.702, beta 1, limit 7; swiglustep limit 7.
std::vector<double> activation_ref(Activation act, const std::vector<double>& g) {
  const size_t d = is_gated(act) ? g.size() / 2 : g.size();
  std::vector<double> a(d);
  for (size_t i = 0; i < d; ++i) {
    const double gate = g[i];
    const double up = is_gated(act) ? g[d + i] : 0.0;
    switch (act) {
      case Activation::kSilu:
        a[i] = silu_d(gate) * up;
        break;
      case Activation::kGelu:
        a[i] = gelu_d(gate) * up;
        break;
      case Activation::kGeluTanh:
        a[i] = gelu_tanh_d(gate) * up;
        break;
      case Activation::kSwigluOai: {
        const double gg = std::min(g[2 * i], 7.0);
        const double uu = std::clamp(g[2 * i + 1], -7.0, 7.0);
        a[i] = (uu + 1.0) * gg * sigmoid_d(1.702 * gg);
        break;
      }
      case Activation::kSwigluStep:
        a[i] = std::min(silu_d(gate), 7.0) * std::clamp(up, -7.0, 7.0);
        break;
      case Activation::kRelu2:
        a[i] = relu2_d(gate) * up;
        break;
      case Activation::kSiluNoMul:
        a[i] = silu_d(gate);
        break;
      case Activation::kGeluNoMul:
        a[i] = gelu_d(gate);
        break;
      case Activation::kGeluTanhNoMul:
        a[i] = gelu_tanh_d(gate);
        break;
      case Activation::kRelu2NoMul:
        a[i] = relu2_d(gate);
        break;
    }
  }
  return a;
}

std::vector<double> as_doubles(const Tensor& t) {
  if (!t.defined()) return {};
  const std::vector<float> f = t.to_float_vector();
  return std::vector<double>(f.begin(), f.end());
}

// The stored (already rounded) weights of E experts as doubles.
struct HostMlp {
  std::vector<double> w13, w2, b1, b2;  // (E, N, H), (E, H, D), (E, N) or empty, (E, H) or empty
  int64_t N = 0, D = 0, H = 0;
  Activation act = Activation::kSilu;

  HostMlp(const Tensor& w13_t, const Tensor& w2_t, const Tensor& b1_t, const Tensor& b2_t,
          Activation a)
      : w13(as_doubles(w13_t)),
        w2(as_doubles(w2_t)),
        b1(as_doubles(b1_t)),
        b2(as_doubles(b2_t)),
        N(w13_t.size(-2)),
        D(w2_t.size(-1)),
        H(w13_t.size(-1)),
        act(a) {}

  // y = W2[e] @ act(W13[e] @ x + b1[e]) + b2[e]
  std::vector<double> forward(int64_t e, const double* x) const {
    std::vector<double> g(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      double acc = b1.empty() ? 0.0 : b1[static_cast<size_t>(e * N + n)];
      const double* w = &w13[static_cast<size_t>((e * N + n) * H)];
      for (int64_t h = 0; h < H; ++h)
        acc += w[h] * x[h];
      g[static_cast<size_t>(n)] = acc;
    }
    const std::vector<double> a = activation_ref(act, g);
    std::vector<double> y(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) {
      double acc = b2.empty() ? 0.0 : b2[static_cast<size_t>(e * H + h)];
      const double* w = &w2[static_cast<size_t>((e * H + h) * D)];
      for (int64_t i = 0; i < D; ++i)
        acc += w[i] * a[static_cast<size_t>(i)];
      y[static_cast<size_t>(h)] = acc;
    }
    return y;
  }
};

// ---- one combination --------------------------------------------------------------------------

RouterConfig router_config(Routing r, uint64_t seed) {
  RouterConfig c;
  c.num_experts = kE;
  c.top_k = kTopK;
  switch (r) {
    case Routing::kSoftmaxRenorm:
      c.scoring = ScoringFunc::kSoftmax;
      c.renormalize = true;
      break;
    case Routing::kSoftmax:
      c.scoring = ScoringFunc::kSoftmax;
      c.renormalize = false;
      break;
    case Routing::kSigmoid:
      c.scoring = ScoringFunc::kSigmoid;
      c.renormalize = false;
      break;
    case Routing::kGroupedBiasScaled:
      c.scoring = ScoringFunc::kSigmoid;
      c.renormalize = true;
      c.use_grouped_topk = true;
      c.num_expert_group = 4;
      c.topk_group = 2;
      c.routed_scaling_factor = 2.5f;
      c.e_score_correction_bias = random_tensor({kE}, DType::kF32, seed, -0.2f, 0.2f);
      break;
    case Routing::kLlama4:
      c.top_k = 1;
      c.llama4_top1 = true;
      c.scoring = ScoringFunc::kSigmoid;
      c.renormalize = false;
      break;
  }
  return c;
}

// Everything one forward of a combination needs, built from the combo and M.
struct Case {
  Combo combo;
  int64_t M = 0;
  int E_local = kE;
  int topk = kTopK;
  Tensor x, w13, w2, b1, b2, expert_map, topk_ids, topk_weights;
  Tensor shared_w13, shared_w2;
  bool weight_on_input = false;
  MoEConfig moe;
  QuantConfig quant;

  Case(const Combo& c, int64_t m) : combo(c), M(m) {
    const uint64_t s = c.seed * 16 + static_cast<uint64_t>(m);
    E_local = c.ep ? kELocalEp : kE;
    const int64_t N = is_gated(c.act) ? 2 * kI : kI;
    x = random_tensor({M, kH}, c.dtype, s + 1);
    w13 = random_tensor({E_local, N, kH}, c.dtype, s + 2, -0.3f, 0.3f);
    w2 = random_tensor({E_local, kH, kI}, c.dtype, s + 3, -0.25f, 0.25f);
    if (combo_has_bias(c)) {
      b1 = random_tensor({E_local, N}, c.dtype, s + 4, -0.1f, 0.1f);
      b2 = random_tensor({E_local, kH}, c.dtype, s + 5, -0.1f, 0.1f);
    }
    if (c.ep) {
      expert_map = Tensor::from_ints(std::vector<int64_t>(kEpMap.begin(), kEpMap.end()), {kE},
                                     DType::kInt32);
    }
    if (c.shared) {
      const int64_t Ns = is_gated(c.act) ? 2 * kIShared : kIShared;
      shared_w13 = random_tensor({Ns, kH}, c.dtype, s + 6, -0.3f, 0.3f);
      shared_w2 = random_tensor({kH, kIShared}, c.dtype, s + 7, -0.25f, 0.25f);
    }
    const RouterConfig rc = router_config(c.routing, s + 8);
    const std::unique_ptr<Router> router = make_router(rc);
    const Tensor logits = random_tensor({M, kE}, DType::kF32, s + 9, -2.0f, 2.0f);
    RoutingResult routed = router->select_experts(x, logits);
    topk_ids = routed.topk_ids;
    topk_weights = routed.topk_weights;
    topk = rc.top_k;
    weight_on_input = router->apply_router_weight_on_input();

    moe.num_experts = kE;
    moe.experts_per_token = topk;
    moe.hidden_dim = kH;
    moe.intermediate_size = kI;
    moe.num_local_experts = E_local;
    moe.num_logical_experts = kE;
    moe.activation = c.act;
    moe.device = cpu_device_info();
    moe.routing_method = router->routing_method_type();
    moe.in_dtype = c.dtype;
    moe.router_logits_dtype = DType::kF32;
    moe.hidden_dim_unpadded = kH;
    moe.intermediate_size_per_partition_unpadded = kI;
    moe.max_num_tokens = kMaxTokens;
    moe.has_bias = combo_has_bias(c);
    if (c.ep) {
      moe.parallel.ep_size = 2;
      moe.parallel.use_ep = true;
    }
    quant = combo_has_bias(c) ? QuantConfig::biased(b1, b2) : QuantConfig::unquantized();
  }

  std::unique_ptr<FusedMoEKernel> kernel() const {
    std::shared_ptr<SharedExperts> shared;
    if (combo.shared) {
      shared = std::make_shared<CpuReferenceSharedExperts>(shared_w13, shared_w2, combo.act);
    }
    return assemble_moe_kernel(quant, moe, experts_class(combo.experts), make_pf(combo.pf, E_local),
                               shared);
  }

  // (routed, shared) float64 references; routed holds only this rank's experts.
  std::pair<std::vector<double>, std::vector<double>> reference() const {
    const HostMlp experts(w13, w2, b1, b2, combo.act);
    const std::vector<double> xs = as_doubles(x);
    const std::vector<int64_t> ids = topk_ids.to_int_vector();
    const std::vector<float> ws = topk_weights.to_float_vector();
    std::vector<double> out(static_cast<size_t>(M * kH), 0.0);
    for (int64_t m = 0; m < M; ++m) {
      for (int j = 0; j < topk; ++j) {
        const int64_t e = ids[static_cast<size_t>(m * topk + j)];
        const int64_t local = combo.ep ? kEpMap[static_cast<size_t>(e)] : e;
        if (local < 0) continue;
        const double w = ws[static_cast<size_t>(m * topk + j)];
        std::vector<double> xin(xs.begin() + m * kH, xs.begin() + (m + 1) * kH);
        if (weight_on_input) {
          for (double& v : xin)
            v *= w;
        }
        const std::vector<double> y = experts.forward(local, xin.data());
        const double scale = weight_on_input ? 1.0 : w;
        for (int64_t h = 0; h < kH; ++h)
          out[static_cast<size_t>(m * kH + h)] += scale * y[static_cast<size_t>(h)];
      }
    }
    std::vector<double> shared;
    if (combo.shared) {
      const HostMlp mlp(shared_w13.view({1, shared_w13.size(0), kH}),
                        shared_w2.view({1, kH, kIShared}), Tensor{}, Tensor{}, combo.act);
      shared.resize(static_cast<size_t>(M * kH));
      for (int64_t m = 0; m < M; ++m) {
        const std::vector<double> y = mlp.forward(0, &xs[static_cast<size_t>(m * kH)]);
        std::copy(y.begin(), y.end(), shared.begin() + m * kH);
      }
    }
    return {out, shared};
  }
};

// Reserves the workspaces the kernel asks for and poisons them (0xFF bytes = NaN in every float
// format), so a read of an unwritten workspace element shows up as NaN.
void reserve_poisoned(WorkspaceManager& ws, const FusedMoEKernel& kernel, const Case& c) {
  const int64_t N = c.w13.size(1);
  ws.reserve(
      kernel.workspace_requests(c.M, N, kH, c.topk, kE, c.E_local, c.combo.act, c.combo.dtype));
  for (const WorkspaceRequest& slot : ws.slots()) {
    ws.get(slot.slot, {static_cast<int64_t>(slot.bytes)}, DType::kUInt8).fill_bytes(0xFF);
  }
}

ModularApplyArgs apply_args(const Case& c, const Tensor& output) {
  ModularApplyArgs args;
  args.hidden_states = c.x;
  args.w1 = c.w13;
  args.w2 = c.w2;
  args.topk_weights = c.topk_weights;
  args.topk_ids = c.topk_ids;
  args.activation = c.combo.act;
  args.global_num_experts = kE;
  args.expert_map = c.expert_map;
  args.apply_router_weight_on_input = c.weight_on_input;
  args.output = output;
  return args;
}

void expect_close(const Tensor& out, const std::vector<double>& ref, DType dtype,
                  const std::string& what) {
  const Tolerance& tol = tolerance_for(dtype);
  ASSERT_FALSE(has_nan(out)) << what << ": NaN left in the output (an element was not written)";
  const double rel = relative_l2_error(out, ref);
  EXPECT_LE(rel, tol.rel_l2) << what << ": relative L2 error vs the float64 recomputation";
  const int64_t bad = first_bad_element(out, ref, tol);
  if (bad >= 0) {
    const std::vector<float> o = out.to_float_vector();
    ADD_FAILURE() << what << ": element " << bad << " (token " << bad / kH << ", column "
                  << bad % kH << ") is " << o[static_cast<size_t>(bad)] << ", float64 reference "
                  << ref[static_cast<size_t>(bad)] << " (tolerance " << tol.name << ": abs "
                  << tol.abs_elem << " + rel " << tol.rel_elem << ")";
  }
}

// ---- the sweep --------------------------------------------------------------------------------

// One test instance per (prepare/finalize, experts, activation, routing method); each runs its
// dtype x expert-map x shared-experts combinations at every token count, and a failure names the
// full combination. (One instance per combination would mean ~1200 processes under ctest.)
struct Group {
  PF pf = PF::kNoEP;
  Exp experts = Exp::kStandard;
  Activation act = Activation::kSilu;
  Routing routing = Routing::kSoftmaxRenorm;
  std::vector<Combo> combos;
};

std::string group_name(const Group& g) {
  return std::string(pf_name(g.pf)) + "_" + experts_name(g.experts) + "_" +
         std::string(activation_name(g.act)) + "_" + routing_name(g.routing);
}

const std::vector<Group>& groups() {
  static const std::vector<Group> out = [] {
    std::vector<Group> gs;
    for (const Combo& c : sweep().runnable) {
      if (gs.empty() || gs.back().pf != c.pf || gs.back().experts != c.experts ||
          gs.back().act != c.act || gs.back().routing != c.routing) {
        gs.push_back(Group{c.pf, c.experts, c.act, c.routing, {}});
      }
      gs.back().combos.push_back(c);
    }
    return gs;
  }();
  return out;
}

void run_combo(const Combo& combo, int64_t M) {
  const std::string what = combo_name(combo) + " M=" + std::to_string(M);
  SCOPED_TRACE(what);
  const Case c(combo, M);
  std::unique_ptr<FusedMoEKernel> kernel = c.kernel();
  ASSERT_EQ(kernel->has_shared_experts(), combo.shared);
  WorkspaceManager ws;
  reserve_poisoned(ws, *kernel, c);
  Tensor out = Tensor::empty({M, kH}, combo.dtype);
  out.fill_bytes(0xFF);
  const MoEOutput result = kernel->apply(apply_args(c, out), RunContext{{}, &ws});

  ASSERT_EQ(result.output.data(), out.data()) << "the preallocated output was not used";
  ASSERT_EQ(result.output.shape(), (Shape{M, kH}));
  ASSERT_EQ(result.output.dtype(), combo.dtype);
  const auto [ref, shared_ref] = c.reference();
  expect_close(result.output, ref, combo.dtype, what + " routed output");
  if (combo.shared) {
    ASSERT_TRUE(result.shared_output.defined()) << "no shared experts output";
    ASSERT_EQ(result.shared_output.shape(), (Shape{M, kH}));
    expect_close(result.shared_output, shared_ref, combo.dtype, what + " shared output");
  } else {
    EXPECT_FALSE(result.shared_output.defined());
  }
}

class CombinationTest : public ::testing::TestWithParam<Group> {};

TEST_P(CombinationTest, MatchesFloat64Recomputation) {
  const Group& g = GetParam();
  ASSERT_EQ(g.combos.size(), kDTypes.size() * 2 * 2) << group_name(g);
  for (const Combo& combo : g.combos) {
    for (int64_t M : kTokenCounts)
      run_combo(combo, M);
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, CombinationTest, ::testing::ValuesIn(groups()),
                         [](const ::testing::TestParamInfo<Group>& info) {
                           return group_name(info.param);
                         });

// The pruned set is exactly the format-mismatch set, and the library itself refuses exactly those
// pairs (assemble_moe_kernel and the FusedMoEKernel constructor both throw).
TEST(CombinationSweep, PrunedSetIsExactlyTheFormatMismatchSet) {
  const Sweep& s = sweep();
  const size_t expected_total = kPFs.size() * kExperts.size() * all_activations().size() *
                                kRoutings.size() * kDTypes.size() * 2 * 2;
  ASSERT_EQ(s.all.size(), expected_total);
  ASSERT_EQ(s.runnable.size() + s.pruned.size(), s.all.size());

  size_t expected_mismatches = 0;
  for (const Combo& c : s.all) {
    if (expected_pf_format(c.pf) != expected_experts_format(c.experts)) ++expected_mismatches;
  }
  EXPECT_EQ(s.pruned.size(), expected_mismatches);
  EXPECT_EQ(s.pruned.size(), s.all.size() / 2);  // half of the (P/F, experts) pairs disagree

  std::map<std::string, size_t> reasons;
  for (const auto& [c, why] : s.pruned) {
    EXPECT_NE(expected_pf_format(c.pf), expected_experts_format(c.experts))
        << combo_name(c) << " was pruned but its formats agree: " << why;
    EXPECT_NE(why.find("format mismatch"), std::string::npos) << why;
    ++reasons[why];
    // The library agrees: it refuses to pair them.
    const Case k(c, 1);
    try {
      (void)k.kernel();
      ADD_FAILURE() << combo_name(c) << ": assemble_moe_kernel accepted a format mismatch";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(experts_class(c.experts).name()), std::string::npos) << msg;
      EXPECT_NE(msg.find("standard"), std::string::npos) << msg;
      EXPECT_NE(msg.find("batched_experts"), std::string::npos) << msg;
    }
  }
  for (const Combo& c : s.runnable) {
    EXPECT_EQ(expected_pf_format(c.pf), expected_experts_format(c.experts))
        << combo_name(c) << " runs but its formats differ";
  }
  // One reason per mismatched (P/F, experts) pair.
  EXPECT_EQ(reasons.size(), 2u);

  std::string summary;
  for (const auto& [why, n] : reasons)
    summary += "\n    " + std::to_string(n) + " x " + why;
  size_t grouped = 0;
  for (const Group& g : groups())
    grouped += g.combos.size();
  EXPECT_EQ(grouped, s.runnable.size()) << "every runnable combination belongs to a test instance";
  std::printf(
      "[combinations] %zu combinations: %zu ran (in %zu test instances, x %zu token counts = %zu "
      "forwards), %zu pruned:%s\n",
      s.all.size(), s.runnable.size(), groups().size(), kTokenCounts.size(),
      s.runnable.size() * kTokenCounts.size(), s.pruned.size(), summary.c_str());
}

// ---- standard vs batched: bitwise ---------------------------------------------------------------

class StandardVsBatchedTest : public ::testing::TestWithParam<Activation> {};

// The header promises that the batched pipeline (PrepareFinalizeBatched + CpuBatchedReference
// Experts) and the standard one (PrepareFinalizeNoEP + CpuReferenceExperts) agree bitwise.
TEST_P(StandardVsBatchedTest, AgreeBitwise) {
  const Activation act = GetParam();
  for (DType dtype : kDTypes) {
    for (bool ep : {false, true}) {
      Combo standard{PF::kNoEP, Exp::kStandard, act, Routing::kSoftmaxRenorm, dtype, ep, false, 77};
      SCOPED_TRACE(combo_name(standard));
      Combo batched = standard;
      batched.pf = PF::kBatched;
      batched.experts = Exp::kBatched;
      const int64_t M = 7;
      const Case a(standard, M);
      const Case b(batched, M);  // same seed: same inputs, weights and routing
      Tensor out_a = Tensor::empty({M, kH}, dtype);
      Tensor out_b = Tensor::empty({M, kH}, dtype);
      out_a.fill_bytes(0xFF);
      out_b.fill_bytes(0xFF);
      a.kernel()->apply(apply_args(a, out_a), {});
      b.kernel()->apply(apply_args(b, out_b), {});
      ASSERT_FALSE(has_nan(out_a));
      ASSERT_EQ(out_a.nbytes(), out_b.nbytes());
      const auto* pa = static_cast<const uint8_t*>(out_a.data());
      const auto* pb = static_cast<const uint8_t*>(out_b.data());
      for (size_t i = 0; i < out_a.nbytes(); ++i) {
        ASSERT_EQ(pa[i], pb[i]) << "byte " << i
                                << " differs between the standard and batched pipelines";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, StandardVsBatchedTest,
                         ::testing::ValuesIn(all_activations().begin(), all_activations().end()),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           return std::string(activation_name(info.param));
                         });

// ---- documented rounding points -----------------------------------------------------------------

class RoundingPointsTest : public ::testing::TestWithParam<Activation> {};

// cpu_reference.h documents the numerics: g = W1 @ h (+ b1) rounded to the activation dtype,
// a = act(g) rounded, y = W2 @ a (+ b2) rounded, then the fp32 top-k reduce rounded once. This
// emulation follows those steps (float64 dot products; the library's activation row in fp32), so
// with fp32 accumulation in the kernel almost every output matches bitwise. A missing or extra
// rounding step moves a large fraction of the outputs by an ulp or more.
void check_rounding_points(Activation act, DType dtype, PF pf) {
  Combo combo{pf,    pf == PF::kNoEP ? Exp::kStandard : Exp::kBatched,
              act,   Routing::kSoftmaxRenorm,
              dtype, false,
              false, 4242};
  const int64_t M = 7;  // kMaxTokens bounds the batched path
  const Case c(combo, M);
  Tensor out = Tensor::empty({M, kH}, dtype);
  out.fill_bytes(0xFF);
  c.kernel()->apply(apply_args(c, out), {});
  ASSERT_FALSE(has_nan(out));

  const HostMlp mlp(c.w13, c.w2, c.b1, c.b2, act);
  const std::vector<double> xs = as_doubles(c.x);
  const std::vector<int64_t> ids = c.topk_ids.to_int_vector();
  const std::vector<float> ws = c.topk_weights.to_float_vector();
  const ActivationParams params;  // defaults, as the sweep's MoEConfig leaves swiglu_* unset
  // emulate(round_gemm1) -> (M, H) expected values
  auto emulate = [&](bool round_gemm1) {
    std::vector<float> result(static_cast<size_t>(M * kH));
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> acc(static_cast<size_t>(kH), 0.0f);
      for (int j = 0; j < c.topk; ++j) {
        const int64_t e = ids[static_cast<size_t>(m * c.topk + j)];
        std::vector<float> g(static_cast<size_t>(mlp.N));
        for (int64_t n = 0; n < mlp.N; ++n) {
          double v = 0;
          for (int64_t h = 0; h < kH; ++h)
            v += mlp.w13[static_cast<size_t>((e * mlp.N + n) * kH + h)] *
                 xs[static_cast<size_t>(m * kH + h)];
          float f = static_cast<float>(v);
          if (!mlp.b1.empty()) f += static_cast<float>(mlp.b1[static_cast<size_t>(e * mlp.N + n)]);
          g[static_cast<size_t>(n)] = round_gemm1 ? round_to_dtype(f, dtype) : f;
        }
        std::vector<float> a(static_cast<size_t>(mlp.D));
        apply_activation_row(act, params, g.data(), a.data(), mlp.D);
        for (float& v : a)
          v = round_to_dtype(v, dtype);
        for (int64_t h = 0; h < kH; ++h) {
          double v = 0;
          for (int64_t i = 0; i < mlp.D; ++i)
            v += mlp.w2[static_cast<size_t>((e * kH + h) * mlp.D + i)] * a[static_cast<size_t>(i)];
          float y = static_cast<float>(v);
          if (!mlp.b2.empty()) y += static_cast<float>(mlp.b2[static_cast<size_t>(e * kH + h)]);
          y = round_to_dtype(y, dtype);
          acc[static_cast<size_t>(h)] += ws[static_cast<size_t>(m * c.topk + j)] * y;
        }
      }
      for (int64_t h = 0; h < kH; ++h)
        result[static_cast<size_t>(m * kH + h)] =
            round_to_dtype(acc[static_cast<size_t>(h)], dtype);
    }
    return result;
  };
  const std::vector<float> got = out.to_float_vector();
  auto mismatches = [&](const std::vector<float>& want) {
    size_t n = 0;
    for (size_t i = 0; i < got.size(); ++i)
      n += got[i] != want[i] ? 1 : 0;
    return n;
  };
  const std::vector<float> with_rounding = emulate(/*round_gemm1=*/true);
  const std::vector<float> without_rounding = emulate(/*round_gemm1=*/false);
  // The check can fail: the two emulations themselves differ in a large share of the outputs.
  size_t emulations_differ = 0;
  for (size_t i = 0; i < got.size(); ++i)
    emulations_differ += with_rounding[i] != without_rounding[i] ? 1 : 0;
  ASSERT_GE(emulations_differ * 5, got.size()) << "the test cannot tell the rounding points apart";
  const size_t documented = mismatches(with_rounding);
  const size_t without_gemm1_rounding = mismatches(without_rounding);
  // fp32 vs float64 dot products flip a rounding only near a tie: allow 5% of the outputs.
  EXPECT_LE(documented * 20, got.size())
      << documented << " of " << got.size()
      << " outputs differ from the documented rounding points (GEMM1 output rounded to "
      << dtype_name(dtype) << "); an emulation that skips the GEMM1 rounding differs in "
      << without_gemm1_rounding << " — is the GEMM1 output rounded to the activation dtype?";
}

TEST_P(RoundingPointsTest, FollowsTheDocumentedRoundingPoints) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (PF pf : kPFs) {
      SCOPED_TRACE(std::string(activation_name(GetParam())) + " " + std::string(dtype_name(dtype)) +
                   " " + pf_name(pf));
      check_rounding_points(GetParam(), dtype, pf);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, RoundingPointsTest,
                         ::testing::Values(Activation::kSilu, Activation::kGeluTanh,
                                           Activation::kSwigluOai, Activation::kRelu2NoMul),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           return std::string(activation_name(info.param));
                         });

}  // namespace
}  // namespace moekit
