// The FusedMoEKernel contract: awkward sizes, -1 ids, inplace, shared experts (with their own
// input, overlapping an asynchronous finalize), router weight on the input, async vs sync
// prepare/finalize, the caller-owned workspace manager, construction-time pairing errors, and the
// messages of bad inputs (each names the tensor or value at fault).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moekit/config/activation.h"
#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/core/error.h"
#include "moekit/core/tensor.h"
#include "moekit/core/tolerance.h"
#include "moekit/core/workspace.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/unquantized.h"
#include "moekit/prepare_finalize/batched.h"
#include "moekit/prepare_finalize/no_ep.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::contains_all;
using testing::error_of;

using testing::first_bad_element;
using testing::has_nan;
using testing::random_routing;
using testing::random_tensor;
using testing::relative_l2_error;

// ---- helpers ----------------------------------------------------------------------------------

double silu_d(double x) {
  return x / (1.0 + std::exp(-x));
}

// Which (prepare/finalize, experts) pair builds the kernel.
enum class Pair { kStandard, kBatched };
const char* pair_name(Pair p) {
  return p == Pair::kStandard ? "NoEP+CpuReferenceExperts" : "Batched+CpuBatchedReferenceExperts";
}

// One modular forward's inputs: silu (gated) or relu2_no_mul experts, random everything.
struct Problem {
  int64_t M = 0, H = 32, I = 48;
  int E_global = 8, E_local = 8, topk = 2;
  int64_t max_tokens = 64;  // batched pair capacity per expert
  Activation act = Activation::kSilu;
  DType dtype = DType::kBF16;
  Tensor x, w13, w2, topk_ids, topk_weights, expert_map;

  static Problem make(int64_t M, int E, int topk, uint64_t seed, DType dtype = DType::kBF16,
                      int64_t H = 32, int64_t I = 48, Activation act = Activation::kSilu) {
    Problem p;
    p.M = M;
    p.H = H;
    p.I = I;
    p.E_global = p.E_local = E;
    p.topk = topk;
    p.act = act;
    p.dtype = dtype;
    p.x = random_tensor({M, H}, dtype, seed + 1);
    const int64_t N = is_gated(act) ? 2 * I : I;
    p.w13 = random_tensor({E, N, H}, dtype, seed + 2, -0.3f, 0.3f);
    p.w2 = random_tensor({E, H, I}, dtype, seed + 3, -0.25f, 0.25f);
    random_routing(M, topk, E, seed + 4, &p.topk_ids, &p.topk_weights);
    return p;
  }

  void set_ids(const std::vector<int64_t>& ids) {
    ASSERT_EQ(static_cast<int64_t>(ids.size()), M * topk);
    topk_ids = Tensor::from_ints(ids, {M, topk}, DType::kInt32);
  }

  MoEConfig moe() const {
    MoEConfig c;
    c.num_experts = E_global;
    c.experts_per_token = topk;
    c.hidden_dim = H;
    c.intermediate_size = I;
    c.num_local_experts = E_local;
    c.num_logical_experts = E_global;
    c.activation = act;
    c.device = cpu_device_info();
    c.in_dtype = dtype;
    c.max_num_tokens = max_tokens;
    return c;
  }

  std::unique_ptr<FusedMoEKernel> kernel(Pair pair = Pair::kStandard,
                                         std::shared_ptr<SharedExperts> shared = nullptr,
                                         bool inplace = false) const {
    const QuantConfig quant = QuantConfig::unquantized();
    if (pair == Pair::kStandard) {
      return std::make_unique<FusedMoEKernel>(std::make_unique<PrepareFinalizeNoEP>(),
                                              std::make_unique<CpuReferenceExperts>(moe(), quant),
                                              shared, std::nullopt, inplace);
    }
    return std::make_unique<FusedMoEKernel>(
        std::make_unique<PrepareFinalizeBatched>(max_tokens, E_local),
        std::make_unique<CpuBatchedReferenceExperts>(moe(), quant, max_tokens, 1), shared,
        std::nullopt, inplace);
  }

  ModularApplyArgs args(Tensor output = {}) const {
    ModularApplyArgs a;
    a.hidden_states = x;
    a.w1 = w13;
    a.w2 = w2;
    a.topk_weights = topk_weights;
    a.topk_ids = topk_ids;
    a.activation = act;
    a.global_num_experts = E_global;
    a.expert_map = expert_map;
    a.output = std::move(output);
    return a;
  }

  // Float64 recomputation from the stored weights; ids of -1 (or unmapped by the expert_map) add
  // nothing.
  std::vector<double> reference(bool weight_on_input = false) const {
    const std::vector<float> xs = x.to_float_vector();
    const std::vector<float> a13 = w13.to_float_vector();
    const std::vector<float> a2 = w2.to_float_vector();
    const std::vector<int64_t> ids = topk_ids.to_int_vector();
    const std::vector<float> ws = topk_weights.to_float_vector();
    const std::vector<int64_t> map =
        expert_map.defined() ? expert_map.to_int_vector() : std::vector<int64_t>{};
    const int64_t N = is_gated(act) ? 2 * I : I;
    std::vector<double> out(static_cast<size_t>(M * H), 0.0);
    std::vector<double> g(static_cast<size_t>(N)), a(static_cast<size_t>(I));
    for (int64_t m = 0; m < M; ++m) {
      for (int j = 0; j < topk; ++j) {
        const int64_t id = ids[static_cast<size_t>(m * topk + j)];
        if (id < 0) continue;
        const int64_t e = map.empty() ? id : map[static_cast<size_t>(id)];
        if (e < 0) continue;
        const double w = ws[static_cast<size_t>(m * topk + j)];
        const double in_scale = weight_on_input ? w : 1.0;
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0;
          for (int64_t h = 0; h < H; ++h)
            acc += static_cast<double>(a13[static_cast<size_t>((e * N + n) * H + h)]) * in_scale *
                   xs[static_cast<size_t>(m * H + h)];
          g[static_cast<size_t>(n)] = acc;
        }
        for (int64_t i = 0; i < I; ++i) {
          const double gate = g[static_cast<size_t>(i)];
          a[static_cast<size_t>(i)] = is_gated(act)
                                          ? silu_d(gate) * g[static_cast<size_t>(I + i)]
                                          : (gate > 0 ? gate * gate : 0.0);  // relu2_no_mul
        }
        for (int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (int64_t i = 0; i < I; ++i)
            acc += static_cast<double>(a2[static_cast<size_t>((e * H + h) * I + i)]) *
                   a[static_cast<size_t>(i)];
          out[static_cast<size_t>(m * H + h)] += (weight_on_input ? 1.0 : w) * acc;
        }
      }
    }
    return out;
  }
};

void expect_matches(const Tensor& out, const std::vector<double>& ref, DType dtype,
                    const std::string& what) {
  const Tolerance& tol = tolerance_for(dtype);
  ASSERT_FALSE(has_nan(out)) << what << ": NaN (poison) left in the output";
  EXPECT_LE(relative_l2_error(out, ref), tol.rel_l2) << what;
  const int64_t bad = first_bad_element(out, ref, tol);
  EXPECT_EQ(bad, -1) << what << ": first element outside the tolerance";
}

Tensor ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  return Tensor::from_ints(values, shape, dtype);
}

using testing::bitwise_equal;
using testing::poisoned;

// A prepare/finalize that forwards to PrepareFinalizeNoEP and records what the kernel called; it
// can hide the async support to force the synchronous schedule.
struct PfLog {
  int prepares = 0, finalizes = 0, async_prepares = 0, async_finalizes = 0;
  std::vector<std::string> events;
};

class RecordingPF final : public PrepareFinalizeModular {
 public:
  RecordingPF(bool async, std::shared_ptr<PfLog> log) : async_(async), log_(std::move(log)) {}
  std::string name() const override { return "RecordingPF"; }
  ActivationFormat activation_format() const override { return inner_.activation_format(); }
  std::optional<DType> topk_indices_dtype() const override { return inner_.topk_indices_dtype(); }
  std::optional<int64_t> max_num_tokens_per_rank() const override {
    return inner_.max_num_tokens_per_rank();
  }
  int num_dispatchers() const override { return inner_.num_dispatchers(); }
  bool output_is_reduced() const override { return inner_.output_is_reduced(); }
  bool supports_async() const override { return async_; }

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override {
    ++log_->prepares;
    log_->events.push_back("prepare");
    return inner_.prepare(args, ctx);
  }
  void finalize(const FinalizeArgs& args, RunContext ctx) override {
    ++log_->finalizes;
    log_->events.push_back("finalize");
    inner_.finalize(args, ctx);
  }
  AsyncHandle<PrepareResult> prepare_async(const PrepareArgs& args, RunContext ctx) override {
    ++log_->async_prepares;
    log_->events.push_back("prepare_async");
    return inner_.prepare_async(args, ctx);
  }
  AsyncHandle<void> finalize_async(const FinalizeArgs& args, RunContext ctx) override {
    ++log_->async_finalizes;
    log_->events.push_back("finalize_async");
    AsyncHandle<void> h = inner_.finalize_async(args, ctx);
    std::shared_ptr<PfLog> log = log_;
    std::function<void()> hook = h.hook;
    h.hook = [log, hook]() {
      log->events.push_back("finalize_hook");
      if (hook) hook();
    };
    return h;
  }

 private:
  PrepareFinalizeNoEP inner_;
  bool async_;
  std::shared_ptr<PfLog> log_;
};

// Shared experts that record when they run (into the same event log) and delegate to the CPU MLP.
class RecordingShared final : public SharedExperts {
 public:
  RecordingShared(std::shared_ptr<CpuReferenceSharedExperts> inner, std::shared_ptr<PfLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  Tensor forward(const Tensor& x, RunContext ctx) override {
    log_->events.push_back("shared_forward");
    return inner_->forward(x, ctx);
  }

 private:
  std::shared_ptr<CpuReferenceSharedExperts> inner_;
  std::shared_ptr<PfLog> log_;
};

std::shared_ptr<CpuReferenceSharedExperts> make_shared_mlp(int64_t H, DType dtype, uint64_t seed) {
  const int64_t Is = 24;
  return std::make_shared<CpuReferenceSharedExperts>(
      random_tensor({2 * Is, H}, dtype, seed, -0.3f, 0.3f),
      random_tensor({H, Is}, dtype, seed + 1, -0.3f, 0.3f), Activation::kSilu);
}

std::unique_ptr<FusedMoEKernel> recording_kernel(const Problem& p, bool async,
                                                 std::shared_ptr<PfLog> log,
                                                 std::shared_ptr<SharedExperts> shared = nullptr) {
  return std::make_unique<FusedMoEKernel>(
      std::make_unique<RecordingPF>(async, std::move(log)),
      std::make_unique<CpuReferenceExperts>(p.moe(), QuantConfig::unquantized()),
      std::move(shared));
}

// ---- awkward sizes ----------------------------------------------------------------------------

class AwkwardSizes : public ::testing::TestWithParam<Pair> {};

TEST_P(AwkwardSizes, ZeroTokensGiveAnEmptyOutputAndStillFinalize) {
  const Problem p = Problem::make(0, 8, 2, 11);
  Tensor out = Tensor::empty({0, p.H}, p.dtype);
  const MoEOutput r = p.kernel(GetParam())->apply(p.args(out), {});
  EXPECT_EQ(r.output.shape(), (Shape{0, p.H}));
  EXPECT_EQ(r.output.dtype(), p.dtype);
  // Without a preallocated output, too.
  const MoEOutput r2 = p.kernel(GetParam())->apply(p.args(), {});
  EXPECT_EQ(r2.output.shape(), (Shape{0, p.H}));

  // finalize still runs (collectives must see every rank), with shared experts too.
  auto log = std::make_shared<PfLog>();
  auto shared = std::make_shared<RecordingShared>(make_shared_mlp(p.H, p.dtype, 5), log);
  for (bool async : {false, true}) {
    *log = PfLog{};
    const MoEOutput r3 = recording_kernel(p, async, log, shared)->apply(p.args(), {});
    EXPECT_EQ(r3.output.shape(), (Shape{0, p.H}));
    EXPECT_EQ(log->prepares + log->async_prepares, 1) << "async=" << async;
    EXPECT_EQ(log->finalizes + log->async_finalizes, 1) << "async=" << async;
    ASSERT_TRUE(r3.shared_output.defined());
    EXPECT_EQ(r3.shared_output.shape(), (Shape{0, p.H}));
  }
}

TEST_P(AwkwardSizes, OneAndThirtyThreeTokens) {
  for (int64_t M : {1, 33}) {
    const Problem p = Problem::make(M, 8, 2, 20 + static_cast<uint64_t>(M));
    Tensor out = poisoned({M, p.H}, p.dtype);
    const MoEOutput r = p.kernel(GetParam())->apply(p.args(out), {});
    EXPECT_EQ(r.output.data(), out.data());
    expect_matches(r.output, p.reference(), p.dtype,
                   std::string(pair_name(GetParam())) + " M=" + std::to_string(M));
  }
}

TEST_P(AwkwardSizes, AnExpertWithNoTokens) {
  Problem p = Problem::make(33, 8, 2, 31);
  // Expert 3 receives nothing: its slots move to expert 4, and a row that then holds 4 twice
  // moves its second slot to expert 5 (ids stay distinct per row).
  std::vector<int64_t> ids = p.topk_ids.to_int_vector();
  for (int64_t m = 0; m < p.M; ++m) {
    int64_t& a = ids[static_cast<size_t>(2 * m)];
    int64_t& b = ids[static_cast<size_t>(2 * m + 1)];
    if (a == 3) a = 4;
    if (b == 3) b = 4;
    if (a == b) b = a == 5 ? 6 : 5;
  }
  p.set_ids(ids);
  ASSERT_EQ(std::count(ids.begin(), ids.end(), 3), 0);
  Tensor out = poisoned({p.M, p.H}, p.dtype);
  p.kernel(GetParam())->apply(p.args(out), {});
  expect_matches(out, p.reference(), p.dtype, "expert 3 has no tokens");
}

TEST_P(AwkwardSizes, EveryTokenOnOneExpert) {
  Problem p = Problem::make(33, 8, 1, 41);
  p.set_ids(std::vector<int64_t>(33, 5));
  Tensor out = poisoned({p.M, p.H}, p.dtype);
  p.kernel(GetParam())->apply(p.args(out), {});
  expect_matches(out, p.reference(), p.dtype, "every token on expert 5");
}

TEST_P(AwkwardSizes, TopKEqualsNumExperts) {
  Problem p = Problem::make(7, 8, 8, 51);
  Tensor out = poisoned({p.M, p.H}, p.dtype);
  p.kernel(GetParam())->apply(p.args(out), {});
  expect_matches(out, p.reference(), p.dtype, "top_k = E = 8");
}

TEST_P(AwkwardSizes, MinusOneIdsContributeNothing) {
  Problem p = Problem::make(9, 8, 3, 61);
  std::vector<int64_t> ids = p.topk_ids.to_int_vector();
  ids[0 * 3 + 1] = -1;                                    // token 0: one slot empty
  ids[2 * 3 + 0] = -1;                                    // token 2: first slot empty
  ids[5 * 3 + 0] = ids[5 * 3 + 1] = ids[5 * 3 + 2] = -1;  // token 5: no expert at all
  p.set_ids(ids);
  Tensor out = poisoned({p.M, p.H}, p.dtype);
  p.kernel(GetParam())->apply(p.args(out), {});
  expect_matches(out, p.reference(), p.dtype, "-1 ids");
  const std::vector<float> o = out.to_float_vector();
  for (int64_t h = 0; h < p.H; ++h)
    EXPECT_EQ(o[static_cast<size_t>(5 * p.H + h)], 0.0f) << "token 5 has no expert, column " << h;
  // A -1 slot with a huge weight changes nothing.
  Problem q = p;
  std::vector<float> w = p.topk_weights.to_float_vector();
  w[0 * 3 + 1] = 1e30f;
  q.topk_weights = Tensor::from_floats(w, {p.M, 3}, DType::kF32);
  Tensor out2 = poisoned({p.M, p.H}, p.dtype);
  q.kernel(GetParam())->apply(q.args(out2), {});
  EXPECT_TRUE(bitwise_equal(out, out2)) << "the weight of a -1 slot leaked into the output";
}

INSTANTIATE_TEST_SUITE_P(Pairs, AwkwardSizes, ::testing::Values(Pair::kStandard, Pair::kBatched),
                         [](const ::testing::TestParamInfo<Pair>& info) {
                           return info.param == Pair::kStandard ? std::string("Standard")
                                                                : std::string("Batched");
                         });

TEST(ModularKernel, NoMulActivationRuns) {
  Problem p = Problem::make(5, 8, 2, 71, DType::kF32, 32, 48, Activation::kRelu2NoMul);
  Tensor out = poisoned({p.M, p.H}, p.dtype);
  p.kernel()->apply(p.args(out), {});
  expect_matches(out, p.reference(), p.dtype, "relu2_no_mul");
}

// ---- inplace, shared experts, router weight on input ------------------------------------------

TEST(ModularKernel, InplaceWritesIntoHiddenStatesAndEqualsTheOutOfPlaceResult) {
  for (Pair pair : {Pair::kStandard, Pair::kBatched}) {
    Problem p = Problem::make(13, 8, 2, 81);
    const Tensor expected = p.kernel(pair)->apply(p.args(), {}).output;
    const Tensor original = p.x.clone();
    Problem q = p;
    q.x = p.x.clone();
    void* const x_data = q.x.data();
    const MoEOutput r = q.kernel(pair, nullptr, /*inplace=*/true)->apply(q.args(), {});
    EXPECT_EQ(r.output.data(), x_data) << pair_name(pair) << ": inplace output must alias x";
    EXPECT_TRUE(bitwise_equal(q.x, expected)) << pair_name(pair);
    EXPECT_FALSE(bitwise_equal(q.x, original)) << pair_name(pair) << ": x was not overwritten";
  }
}

TEST(ModularKernel, InplaceWithSharedExpertsIsRejected) {
  const Problem p = Problem::make(3, 8, 2, 91);
  const std::string msg =
      error_of([&] { (void)p.kernel(Pair::kStandard, make_shared_mlp(p.H, p.dtype, 1), true); });
  EXPECT_TRUE(contains_all(msg, {"inplace", "shared"}));
}

TEST(ModularKernel, SharedExpertsUseTheirSeparateInput) {
  Problem p = Problem::make(6, 8, 2, 101);
  auto mlp = make_shared_mlp(p.H, p.dtype, 7);
  const Tensor latent = random_tensor({p.M, p.H}, p.dtype, 999);
  ModularApplyArgs args = p.args();
  args.shared_experts_input = latent;
  const MoEOutput r = p.kernel(Pair::kStandard, mlp)->apply(args, {});
  ASSERT_TRUE(r.shared_output.defined());
  EXPECT_TRUE(bitwise_equal(r.shared_output, mlp->forward(latent, {})));
  EXPECT_FALSE(bitwise_equal(r.shared_output, mlp->forward(p.x, {})));
  // The routed experts still read hidden_states.
  expect_matches(r.output, p.reference(), p.dtype, "routed output beside a latent shared input");
  // Without the separate input the shared experts read hidden_states.
  const MoEOutput r2 = p.kernel(Pair::kStandard, mlp)->apply(p.args(), {});
  EXPECT_TRUE(bitwise_equal(r2.shared_output, mlp->forward(p.x, {})));
}

TEST(ModularKernel, RouterWeightOnInputWithTopOne) {
  for (Pair pair : {Pair::kStandard, Pair::kBatched}) {
    Problem p = Problem::make(10, 8, 1, 111, DType::kF32);
    // top-1 routing weights of random_routing are all 1 after normalization: use others.
    p.topk_weights = random_tensor({p.M, 1}, DType::kF32, 112, 0.2f, 0.9f);
    ModularApplyArgs args = p.args(poisoned({p.M, p.H}, p.dtype));
    args.apply_router_weight_on_input = true;
    const MoEOutput r = p.kernel(pair)->apply(args, {});
    expect_matches(r.output, p.reference(/*weight_on_input=*/true), p.dtype, pair_name(pair));
    // Differs from weighting the output when the MLP is not linear in its input.
    const Tensor weighted_after = p.kernel(pair)->apply(p.args(), {}).output;
    EXPECT_FALSE(bitwise_equal(r.output, weighted_after));
  }
}

TEST(ModularKernel, RouterWeightOnInputWithTopKAboveOneIsAnError) {
  const Problem p = Problem::make(4, 8, 2, 121);
  ModularApplyArgs args = p.args();
  args.apply_router_weight_on_input = true;
  const std::string msg = error_of([&] { p.kernel()->apply(args, {}); });
  EXPECT_TRUE(contains_all(msg, {"apply_router_weight_on_input", "top_k", "2"}));
}

// ---- async vs sync ----------------------------------------------------------------------------

TEST(ModularKernel, AsyncAndSyncPrepareFinalizeAreBitwiseIdentical) {
  for (int64_t M : {1, 17}) {
    const Problem p = Problem::make(M, 8, 2, 131 + static_cast<uint64_t>(M));
    auto mlp = make_shared_mlp(p.H, p.dtype, 3);
    auto sync_log = std::make_shared<PfLog>();
    auto async_log = std::make_shared<PfLog>();
    const MoEOutput s =
        recording_kernel(p, false, sync_log, std::make_shared<RecordingShared>(mlp, sync_log))
            ->apply(p.args(poisoned({M, p.H}, p.dtype)), {});
    const MoEOutput a =
        recording_kernel(p, true, async_log, std::make_shared<RecordingShared>(mlp, async_log))
            ->apply(p.args(poisoned({M, p.H}, p.dtype)), {});
    EXPECT_TRUE(bitwise_equal(s.output, a.output)) << "M=" << M;
    EXPECT_TRUE(bitwise_equal(s.shared_output, a.shared_output)) << "M=" << M;
    expect_matches(a.output, p.reference(), p.dtype, "async");
    // Each schedule used its own calls.
    EXPECT_EQ(sync_log->prepares, 1);
    EXPECT_EQ(sync_log->finalizes, 1);
    EXPECT_EQ(sync_log->async_prepares + sync_log->async_finalizes, 0);
    EXPECT_EQ(async_log->async_prepares, 1);
    EXPECT_EQ(async_log->async_finalizes, 1);
    EXPECT_EQ(async_log->prepares + async_log->finalizes, 0);
    // The shared experts overlap the asynchronous combine: they run after finalize_async is
    // started and before its hook waits for it.
    EXPECT_EQ(async_log->events, (std::vector<std::string>{"prepare_async", "finalize_async",
                                                           "shared_forward", "finalize_hook"}));
    EXPECT_EQ(sync_log->events,
              (std::vector<std::string>{"prepare", "finalize", "shared_forward"}));
  }
}

TEST(ModularKernel, NoEPAsyncHandlesEqualTheSyncCalls) {
  const Problem p = Problem::make(5, 8, 2, 141);
  PrepareFinalizeNoEP pf;
  ASSERT_TRUE(pf.supports_async());
  const QuantConfig quant = QuantConfig::unquantized();
  PrepareArgs pa{p.x, p.topk_weights, p.topk_ids, 8, Tensor{}, false, &quant, false};
  const PrepareResult sync = pf.prepare(pa, {});
  AsyncHandle<PrepareResult> h = pf.prepare_async(pa, {});
  ASSERT_TRUE(static_cast<bool>(h.receiver));
  if (h.hook) h.hook();
  const PrepareResult async = h.receiver();
  EXPECT_TRUE(bitwise_equal(sync.a1q, async.a1q));
  // A receiver called without the hook still does the work.
  AsyncHandle<PrepareResult> h2 = pf.prepare_async(pa, {});
  EXPECT_TRUE(bitwise_equal(h2.receiver().a1q, sync.a1q));
}

// ---- workspace --------------------------------------------------------------------------------

TEST(ModularKernel, UsesTheCallerOwnedWorkspaceManager) {
  const Problem p = Problem::make(9, 8, 2, 151);
  auto kernel = p.kernel();
  WorkspaceManager ws;
  EXPECT_EQ(ws.total_bytes(), 0u);
  const std::vector<WorkspaceRequest> need =
      kernel->workspace_requests(p.M, 2 * p.I, p.H, p.topk, 8, 8, p.act, p.dtype);
  ASSERT_EQ(need.size(), 2u);
  EXPECT_EQ(need[0].slot, workspace_slots::kExperts13);
  EXPECT_EQ(need[1].slot, workspace_slots::kExperts2);
  EXPECT_GT(need[0].bytes, 0u);
  EXPECT_GT(need[1].bytes, 0u);
  const MoEOutput r = kernel->apply(p.args(poisoned({p.M, p.H}, p.dtype)), RunContext{{}, &ws});
  for (const WorkspaceRequest& n : need)
    EXPECT_GE(ws.capacity(n.slot), n.bytes) << n.slot;
  expect_matches(r.output, p.reference(), p.dtype, "with a caller workspace");
  // A second forward reuses it without growing it.
  const size_t total = ws.total_bytes();
  kernel->apply(p.args(), RunContext{{}, &ws});
  EXPECT_EQ(ws.total_bytes(), total);
}

TEST(ModularKernel, LockedWorkspaceTooSmallNamesMaxNumTokens) {
  // Never reserved: capacity 0.
  {
    const Problem p = Problem::make(4, 8, 2, 161);
    WorkspaceManager ws;
    ws.set_growth_locked(true);
    const std::string msg = error_of([&] { p.kernel()->apply(p.args(), RunContext{{}, &ws}); });
    EXPECT_TRUE(contains_all(msg, {"max_num_tokens", "workspace"}));
    EXPECT_EQ(ws.total_bytes(), 0u) << "a locked manager must not grow";
  }
  // Reserved for fewer tokens than the forward brings (slots round up to 2 MiB, so the forward
  // needs more than that: 6000 tokens * 2 slots * 96 f32 values = 4.6 MB).
  {
    const Problem p = Problem::make(6000, 8, 2, 171, DType::kF32);
    auto kernel = p.kernel();
    WorkspaceManager ws;
    ws.reserve(kernel->workspace_requests(16, 2 * p.I, p.H, p.topk, 8, 8, p.act, p.dtype));
    ws.set_growth_locked(true);
    const size_t total = ws.total_bytes();
    const std::string msg = error_of([&] { kernel->apply(p.args(), RunContext{{}, &ws}); });
    EXPECT_TRUE(contains_all(msg, {"max_num_tokens"}));
    EXPECT_EQ(ws.total_bytes(), total);
  }
}

TEST(ModularKernel, OneWorkspaceManagerServesLayersOfDifferentSizes) {
  const Problem small = Problem::make(5, 8, 2, 181);
  const Problem large = Problem::make(40, 4, 2, 191, DType::kBF16, 64, 96);
  auto k_small = small.kernel();
  auto k_large = large.kernel();
  WorkspaceManager ws;
  // Each slot grows to the larger of the two layers' requests.
  ws.reserve(
      k_small->workspace_requests(small.M, 2 * small.I, small.H, 2, 8, 8, small.act, small.dtype));
  ws.reserve(
      k_large->workspace_requests(large.M, 2 * large.I, large.H, 2, 4, 4, large.act, large.dtype));
  ws.set_growth_locked(true);  // sized once for the worst case
  for (int round = 0; round < 2; ++round) {
    const Tensor a = k_small->apply(small.args(), RunContext{{}, &ws}).output;
    const Tensor b = k_large->apply(large.args(), RunContext{{}, &ws}).output;
    expect_matches(a, small.reference(), small.dtype,
                   "small layer, round " + std::to_string(round));
    expect_matches(b, large.reference(), large.dtype,
                   "large layer, round " + std::to_string(round));
  }
}

// ---- construction errors ----------------------------------------------------------------------

TEST(ModularKernel, ModularMonolithicMismatchIsRejectedAtConstruction) {
  const Problem p = Problem::make(1, 8, 2, 201);
  const std::string msg = error_of([&] {
    FusedMoEKernel k(std::make_unique<PrepareFinalizeMonolithicNoEP>(),
                     std::make_unique<CpuReferenceExperts>(p.moe(), QuantConfig::unquantized()));
  });
  EXPECT_TRUE(
      contains_all(msg, {"monolithic", "PrepareFinalizeMonolithicNoEP", "CpuReferenceExperts"}));
}

TEST(ModularKernel, ActivationFormatMismatchIsRejectedAtConstruction) {
  const Problem p = Problem::make(1, 8, 2, 211);
  const QuantConfig quant = QuantConfig::unquantized();
  const std::string a = error_of([&] {
    FusedMoEKernel k(std::make_unique<PrepareFinalizeBatched>(16, 8),
                     std::make_unique<CpuReferenceExperts>(p.moe(), quant));
  });
  EXPECT_TRUE(contains_all(
      a, {"PrepareFinalizeBatched", "CpuReferenceExperts", "batched_experts", "standard"}));
  const std::string b = error_of([&] {
    FusedMoEKernel k(std::make_unique<PrepareFinalizeNoEP>(),
                     std::make_unique<CpuBatchedReferenceExperts>(p.moe(), quant, 16, 1));
  });
  EXPECT_TRUE(contains_all(
      b, {"PrepareFinalizeNoEP", "CpuBatchedReferenceExperts", "batched_experts", "standard"}));
}

TEST(ModularKernel, ForcedUnsupportedBackendListsTheCandidates) {
  const Problem p = Problem::make(1, 8, 2, 221);
  MoEConfig moe = p.moe();
  moe.moe_backend = "sm90_grouped";
  moe.device = cpu_device_info();
  UnquantizedMoEKernelOracle oracle(moe);
  const std::string msg = error_of<UnsupportedError>([&] { (void)oracle.select_backend(); });
  EXPECT_TRUE(contains_all(msg, {"sm90_grouped", "Candidates", "no fallback"}));
}

// ---- bad inputs -------------------------------------------------------------------------------

class BadInputs : public ::testing::Test {
 protected:
  Problem p = Problem::make(5, 8, 2, 231);

  std::string run(const ModularApplyArgs& args) {
    return error_of([&] { p.kernel()->apply(args, {}); });
  }
  ModularApplyArgs with_ids(std::vector<int64_t> ids, DType dtype = DType::kInt32) {
    ModularApplyArgs a = p.args();
    a.topk_ids = Tensor::from_ints(ids, {p.M, p.topk}, dtype);
    return a;
  }
};

TEST_F(BadInputs, IdEqualToNumExperts) {
  std::vector<int64_t> ids = p.topk_ids.to_int_vector();
  ids[3] = 8;  // token 1, slot 1
  EXPECT_TRUE(contains_all(run(with_ids(ids)), {"topk_ids[1, 1]=8", "num_experts=8"}));
}

TEST_F(BadInputs, IdBelowMinusOne) {
  std::vector<int64_t> ids = p.topk_ids.to_int_vector();
  ids[4] = -2;  // token 2, slot 0
  EXPECT_TRUE(contains_all(run(with_ids(ids)), {"topk_ids[2, 0]=-2", "[-1"}));
}

TEST_F(BadInputs, Int64IdsAtTheKernel) {
  EXPECT_TRUE(contains_all(run(with_ids(p.topk_ids.to_int_vector(), DType::kInt64)),
                           {"topk_ids", "int64", "int32"}));
}

TEST_F(BadInputs, WeightDtypeDiffersFromInputDtype) {
  ModularApplyArgs a = p.args();  // bf16 hidden states
  a.w1 = p.w13.to_dtype(DType::kF16);
  a.w2 = p.w2.to_dtype(DType::kF16);
  EXPECT_TRUE(contains_all(run(a), {"w1", "f16", "bf16"}));
}

TEST_F(BadInputs, HiddenStatesDtypeAndRank) {
  ModularApplyArgs a = p.args();
  a.hidden_states = Tensor::zeros({p.M, p.H}, DType::kInt32);
  EXPECT_TRUE(contains_all(run(a), {"hidden_states", "int32"}));
  a = p.args();
  a.hidden_states = p.x.view({1, p.M, p.H});
  EXPECT_TRUE(contains_all(run(a), {"hidden_states", "2-d"}));
}

TEST_F(BadInputs, TopkWeightsShapeAndDtype) {
  ModularApplyArgs a = p.args();
  a.topk_weights = random_tensor({p.M, p.topk + 1}, DType::kF32, 5);
  EXPECT_TRUE(contains_all(run(a), {"topk_weights", "[5, 2]"}));
  a = p.args();
  a.topk_weights = p.topk_weights.to_dtype(DType::kBF16);
  EXPECT_TRUE(contains_all(run(a), {"topk_weights", "bf16", "f32"}));
}

TEST_F(BadInputs, IdsRowsDifferFromTokens) {
  ModularApplyArgs a = p.args();
  a.topk_ids = p.topk_ids.slice(0, 0, p.M - 1);
  EXPECT_TRUE(contains_all(run(a), {"topk_ids", "[4, 2]"}));
}

TEST_F(BadInputs, WeightShapes) {
  ModularApplyArgs a = p.args();
  a.w1 = random_tensor({8, 2 * p.I, p.H + 1}, p.dtype, 3);
  EXPECT_TRUE(contains_all(run(a), {"w1", "33", "32"}));
  a = p.args();
  a.w2 = random_tensor({7, p.H, p.I}, p.dtype, 4);
  EXPECT_TRUE(contains_all(run(a), {"w2", "[7, 32, 48]"}));
  a = p.args();
  a.w1 = p.w13.view({8 * 2 * p.I, p.H});
  EXPECT_TRUE(contains_all(run(a), {"w1", "3-d"}));
}

TEST_F(BadInputs, PreallocatedOutputShapeAndDtype) {
  EXPECT_TRUE(contains_all(run(p.args(Tensor::empty({p.M + 1, p.H}, p.dtype))), {"output"}));
  EXPECT_TRUE(
      contains_all(run(p.args(Tensor::empty({p.M, p.H}, DType::kF32))), {"output", "f32", "bf16"}));
}

TEST_F(BadInputs, ExpertMapEntryNotALocalExpert) {
  // 4 local experts of 8: the map may only hold -1 or 0..3.
  Problem q = Problem::make(5, 8, 2, 241);
  q.E_local = 4;
  q.w13 = q.w13.slice(0, 0, 4).clone();
  q.w2 = q.w2.slice(0, 0, 4).clone();
  q.expert_map = ints({-1, 0, -1, 1, 2, -1, 4, -1}, {8}, DType::kInt32);
  const std::string msg = error_of([&] { q.kernel()->apply(q.args(), {}); });
  EXPECT_TRUE(contains_all(msg, {"expert_map[6]=4", "[0, 4)"}));
}

TEST_F(BadInputs, ExpertMapWrongLength) {
  Problem q = Problem::make(5, 8, 2, 251);
  q.E_local = 4;
  q.w13 = q.w13.slice(0, 0, 4).clone();
  q.w2 = q.w2.slice(0, 0, 4).clone();
  q.expert_map = ints({0, 1, 2, 3, -1, -1}, {6}, DType::kInt32);
  const std::string msg = error_of([&] { q.kernel()->apply(q.args(), {}); });
  EXPECT_TRUE(contains_all(msg, {"expert_map", "[6]", "[8]"}));
}

TEST_F(BadInputs, ExpertMapDtype) {
  Problem q = Problem::make(5, 8, 2, 261);
  q.expert_map = ints({0, 1, 2, 3, 4, 5, 6, 7}, {8}, DType::kInt64);
  const std::string msg = error_of([&] { q.kernel()->apply(q.args(), {}); });
  EXPECT_TRUE(contains_all(msg, {"expert_map", "int64"}));
}

TEST_F(BadInputs, TopKAboveNumExperts) {
  ModularApplyArgs a = p.args();
  std::vector<int64_t> ids;
  for (int64_t m = 0; m < p.M; ++m)
    for (int j = 0; j < 9; ++j)
      ids.push_back(j % 8);
  a.topk_ids = Tensor::from_ints(ids, {p.M, 9}, DType::kInt32);
  a.topk_weights = random_tensor({p.M, 9}, DType::kF32, 9, 0.1f, 1.0f);
  EXPECT_TRUE(contains_all(run(a), {"top_k=9", "num_experts=8"}));
}

TEST_F(BadInputs, DefaultGlobalExpertCountIsTheLocalCount) {
  // global_num_experts = -1 means "the local expert count": with 4 local experts and no
  // expert_map, id 7 is out of range.
  Problem q = Problem::make(5, 8, 2, 271);
  q.E_local = 4;
  q.w13 = q.w13.slice(0, 0, 4).clone();
  q.w2 = q.w2.slice(0, 0, 4).clone();
  std::vector<int64_t> ids(10, 1);
  ids[0] = 0;
  ids[6] = 7;  // token 3, slot 0
  q.set_ids(ids);
  ModularApplyArgs a = q.args();
  a.global_num_experts = -1;
  const std::string msg = error_of([&] { q.kernel()->apply(a, {}); });
  EXPECT_TRUE(contains_all(msg, {"topk_ids[3, 0]=7", "num_experts=4"}));
}

}  // namespace
}  // namespace moekit
