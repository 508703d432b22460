// The unquantized MoE layer on the GPU against the CPU reference: presets, dtypes, activations,
// expert maps, shared experts, awkward M, garbage ids, CUDA-graph capture/replay, routers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "graph_replay.h"
#include "moekit/core/tolerance.h"
#include "moekit/experts/sm90_experts.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/layer/reference.h"
#include "moekit/oracle/make_moe_kernel.h"
#include "moekit/prepare_finalize/batched.h"
#include "require_gpu.h"
#include "testing.h"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit {
namespace {

MoELayerWeights to_device(const MoELayerWeights& w, Device d) {
  auto mv = [d](const Tensor& t) { return t.defined() ? t.to(d) : Tensor{}; };
  return {mv(w.w13),
          mv(w.w2),
          mv(w.w13_bias),
          mv(w.w2_bias),
          mv(w.e_score_correction_bias),
          mv(w.shared_w13),
          mv(w.shared_w2),
          w.router_weight,
          w.router_bias,
          mv(w.shared_gate)};
}

struct Pair {
  std::unique_ptr<MoELayer> cpu, gpu;
};

Pair make_pair(const ModelPreset& model, DType dtype, int64_t max_tokens,
               ParallelConfig parallel = {}, uint64_t seed = 7,
               const std::string& gpu_backend = "auto") {
  MoELayerOptions cpu_opt;
  cpu_opt.dtype = dtype;
  cpu_opt.max_num_tokens = max_tokens;
  cpu_opt.parallel = parallel;
  MoELayerOptions gpu_opt = cpu_opt;
  gpu_opt.device = default_device_info();
  gpu_opt.backend = gpu_backend;
  const MoELayerWeights w = MoELayer::random_weights(model, cpu_opt, seed);
  Pair p;
  p.cpu = std::make_unique<MoELayer>(model, w, cpu_opt);
  p.gpu = std::make_unique<MoELayer>(model, to_device(w, gpu_opt.device.device()), gpu_opt);
  return p;
}

// Routes on the CPU (so both layers see the same experts) and compares the two layers.
double compare_routed(Pair& p, int64_t M, uint64_t seed, std::string* detail = nullptr) {
  const ModelPreset& model = p.cpu->model();
  const DType dtype = p.cpu->moe_config().in_dtype;
  const Tensor x = testing::random_tensor({M, model.hidden_size}, dtype, seed);
  const Tensor logits =
      testing::random_tensor({M, model.num_experts}, DType::kF32, seed + 1, -3, 3);
  const RoutingResult r = p.cpu->router().select_experts(x, logits);
  const Tensor ref = p.cpu->forward_routed(x, r.topk_ids, r.topk_weights);
  const Device gd = p.gpu->moe_config().device.device();
  Tensor out = Tensor::empty({M, model.hidden_size}, dtype, gd);
  out.fill_bytes(0xFF);  // poison: an unwritten element stays NaN
  const Tensor xg = x.to(gd), ids = r.topk_ids.to(gd), w = r.topk_weights.to(gd);
  RunContext ctx{p.gpu->default_stream(), nullptr};
  p.gpu->forward_routed_into(out, xg, ids, w, ctx);
  synchronize(ctx.stream);
  const Tensor got = out.to(Device::cpu());
  EXPECT_FALSE(testing::has_nan(got)) << "unwritten (poisoned) output elements";
  const std::vector<float> rv = ref.to_float_vector();
  const double err = testing::relative_l2_error(got, std::vector<double>(rv.begin(), rv.end()));
  if (detail) *detail = model.summary();
  return err;
}

struct PresetCase {
  std::string preset;
  DType dtype;
  int64_t M;
};

void PrintTo(const PresetCase& c, std::ostream* os) {
  *os << c.preset << "/" << dtype_name(c.dtype) << "/M=" << c.M;
}

class GpuVsCpu : public ::testing::TestWithParam<PresetCase> {};

TEST_P(GpuVsCpu, MatchesReference) {
  REQUIRE_SM90_GPU();
  const PresetCase c = GetParam();
  Pair p = make_pair(find_preset(c.preset), c.dtype, std::max<int64_t>(c.M, 1));
  EXPECT_EQ(p.gpu->kernel().fused_experts().name(), "Sm90GroupedExperts");
  const double err = compare_routed(p, c.M, 11);
  EXPECT_LE(err, tolerance_for(c.dtype).rel_l2) << c.preset;
}

std::vector<PresetCase> preset_cases() {
  std::vector<PresetCase> v;
  for (const char* preset :
       {"tiny", "small", "small-deepseek", "small-gpt-oss", "small-qwen2-moe"}) {
    for (DType d : {DType::kBF16, DType::kF16}) {
      for (int64_t M : {1, 33, 257})
        v.push_back({preset, d, M});
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Presets, GpuVsCpu, ::testing::ValuesIn(preset_cases()),
                         [](const auto& info) {
                           return testing::param_name(info.param.preset + "_" +
                                                      std::string(dtype_name(info.param.dtype)) +
                                                      "_M" + std::to_string(info.param.M));
                         });

TEST(GpuLayer, EveryActivation) {
  REQUIRE_SM90_GPU();
  for (Activation a : all_activations()) {
    ModelPreset m = find_preset("tiny");
    m.activation = a;
    m.name = std::string("tiny-") + std::string(activation_name(a));
    Pair p = make_pair(m, DType::kBF16, 64);
    const double err = compare_routed(p, 40, 3);
    EXPECT_LE(err, tolerance("bf16").rel_l2) << activation_name(a);
  }
}

TEST(GpuLayer, ExpertMapRanksSumToTheWholeLayer) {
  REQUIRE_SM90_GPU();
  const ModelPreset m = find_preset("small");
  for (int rank = 0; rank < 2; ++rank) {
    const ParallelConfig par = ParallelConfig::make(2, 1, 0, rank, /*enable_ep=*/true);
    ASSERT_TRUE(par.use_ep);
    Pair p = make_pair(m, DType::kBF16, 64, par);
    ASSERT_TRUE(p.gpu->expert_map().defined());
    EXPECT_LE(compare_routed(p, 50, 5), tolerance("bf16").rel_l2) << "rank " << rank;
  }
}

// The batched pair (PrepareFinalizeBatched + Sm90BatchedExperts) is what a batched all-to-all
// deployment gets; on one rank the oracle keeps the standard format, so the pair is assembled here
// directly, as the combination sweep does, and compared with the layer's CPU reference.
double compare_batched(Pair& p, int64_t M, int64_t T, uint64_t seed) {
  const ModelPreset& model = p.cpu->model();
  const MoEConfig& moe = p.gpu->moe_config();
  const QuantConfig quant = model.has_bias ? QuantConfig::biased(p.gpu->kernel_weights().w13_bias,
                                                                 p.gpu->kernel_weights().w2_bias)
                                           : QuantConfig::unquantized();
  auto kernel =
      assemble_moe_kernel(quant, moe, Sm90BatchedExperts::klass(),
                          std::make_unique<PrepareFinalizeBatched>(T, moe.num_local_experts, 1, 0));
  EXPECT_EQ(kernel->fused_experts().name(), "Sm90BatchedExperts");
  const Tensor x = testing::random_tensor({M, model.hidden_size}, DType::kBF16, seed);
  const Tensor logits =
      testing::random_tensor({M, model.num_experts}, DType::kF32, seed + 1, -3, 3);
  const RoutingResult r = p.cpu->router().select_experts(x, logits);
  // The CPU layer adds shared experts; compare routed experts only, so use a model without them.
  const Tensor ref = p.cpu->forward_routed(x, r.topk_ids, r.topk_weights);
  const Device gd = moe.device.device();
  Tensor out = Tensor::empty({M, model.hidden_size}, DType::kBF16, gd);
  out.fill_bytes(0xFF);
  ModularApplyArgs args;
  args.hidden_states = x.to(gd);
  args.w1 = p.gpu->kernel_weights().w13;  // the layout the sm90 experts read
  args.w2 = p.gpu->kernel_weights().w2;
  args.topk_ids = r.topk_ids.to(gd);
  args.topk_weights = r.topk_weights.to(gd);
  args.activation = model.activation;
  args.global_num_experts = model.num_experts;
  args.apply_router_weight_on_input = p.cpu->router().apply_router_weight_on_input();
  args.output = out;
  WorkspaceManager ws(gd);
  RunContext ctx{p.gpu->default_stream(), &ws};
  kernel->apply(args, ctx);
  synchronize(ctx.stream);
  const Tensor got = out.to(Device::cpu());
  EXPECT_FALSE(testing::has_nan(got));
  const std::vector<float> rv = ref.to_float_vector();
  return testing::relative_l2_error(got, std::vector<double>(rv.begin(), rv.end()));
}

TEST(GpuLayer, BatchedFormatMatchesReference) {
  REQUIRE_SM90_GPU();
  for (const char* preset : {"tiny", "small", "small-gpt-oss"}) {
    Pair p = make_pair(find_preset(preset), DType::kBF16, 96);
    for (int64_t M : {1, 37, 96}) {
      EXPECT_LE(compare_batched(p, M, 96, 40 + M), tolerance("bf16").rel_l2)
          << preset << " M=" << M;
    }
  }
}

TEST(GpuLayer, Llama4RouterWeightOnInput) {
  REQUIRE_SM90_GPU();
  ModelPreset m = find_preset("tiny");
  m.name = "tiny-llama4";
  m.top_k = 1;
  m.llama4_top1 = true;
  m.scoring = ScoringFunc::kSigmoid;
  m.renormalize = false;
  Pair p = make_pair(m, DType::kBF16, 64, {}, 9);
  EXPECT_TRUE(p.gpu->router().apply_router_weight_on_input());
  EXPECT_LE(compare_routed(p, 45, 8), tolerance("bf16").rel_l2) << "standard";
  EXPECT_LE(compare_batched(p, 45, 64, 8), tolerance("bf16").rel_l2) << "batched";
  // With shared experts too (the layer path).
  m.num_shared_experts = 1;
  m.shared_intermediate_size = 64;
  Pair q = make_pair(m, DType::kBF16, 64, {}, 10);
  EXPECT_LE(compare_routed(q, 45, 11), tolerance("bf16").rel_l2) << "shared";
}

TEST(GpuLayer, AwkwardTokenCounts) {
  REQUIRE_SM90_GPU();
  const ModelPreset m = find_preset("tiny");
  Pair p = make_pair(m, DType::kBF16, 65537);
  for (int64_t M : {0, 1, 33, 8192, 65537}) {
    if (M == 0) {
      const Device gd = p.gpu->moe_config().device.device();
      Tensor out = Tensor::empty({0, m.hidden_size}, DType::kBF16, gd);
      const Tensor x = Tensor::empty({0, m.hidden_size}, DType::kBF16, gd);
      const Tensor logits = Tensor::empty({0, m.num_experts}, DType::kF32, gd);
      RunContext ctx{p.gpu->default_stream(), nullptr};
      EXPECT_NO_THROW(p.gpu->forward_into(out, x, logits, ctx));
      synchronize(ctx.stream);
      continue;
    }
    EXPECT_LE(compare_routed(p, M, 100 + M), tolerance("bf16").rel_l2) << "M=" << M;
  }
}

TEST(GpuLayer, OneExpertTakesEveryTokenAndOthersNone) {
  REQUIRE_SM90_GPU();
  const ModelPreset m = find_preset("tiny");
  Pair p = make_pair(m, DType::kBF16, 64);
  const int64_t M = 64;
  std::vector<int64_t> ids(M * m.top_k);
  std::vector<float> w(ids.size());
  for (int64_t i = 0; i < M; ++i) {
    ids[i * m.top_k] = 3;      // every token on expert 3
    ids[i * m.top_k + 1] = 5;  // and on expert 5; the others get none
    w[i * m.top_k] = 0.75f;
    w[i * m.top_k + 1] = 0.25f;
  }
  const Tensor tid = Tensor::from_ints(ids, {M, m.top_k}, DType::kInt32);
  const Tensor tw = Tensor::from_floats(w, {M, m.top_k}, DType::kF32);
  const Tensor x = testing::random_tensor({M, m.hidden_size}, DType::kBF16, 9);
  const Tensor ref = p.cpu->forward_routed(x, tid, tw);
  const Device gd = p.gpu->moe_config().device.device();
  const Tensor got = p.gpu->forward_routed(x.to(gd), tid.to(gd), tw.to(gd)).to(Device::cpu());
  const std::vector<float> rv = ref.to_float_vector();
  EXPECT_LE(testing::relative_l2_error(got, std::vector<double>(rv.begin(), rv.end())),
            tolerance("bf16").rel_l2);
}

TEST(GpuLayer, GarbageIdsAreSkipped) {
  REQUIRE_SM90_GPU();
  const ModelPreset m = find_preset("tiny");
  Pair p = make_pair(m, DType::kBF16, 64);
  const int64_t M = 33;
  std::mt19937 rng(1);
  std::vector<int64_t> garbage(M * m.top_k), clean(M * m.top_k);
  std::vector<float> w(garbage.size());
  const int64_t bad[] = {-1, -7, 8, 1000, 1 << 30};
  for (size_t i = 0; i < garbage.size(); ++i) {
    w[i] = 0.5f;
    if (rng() % 3 == 0) {
      garbage[i] = bad[rng() % 5];
      clean[i] = -1;  // the CPU's checked path rejects out-of-range ids: -1 means "no expert"
    } else {
      garbage[i] = clean[i] = static_cast<int64_t>(rng() % 8);
    }
  }
  const Tensor x = testing::random_tensor({M, m.hidden_size}, DType::kBF16, 4);
  const Tensor tw = Tensor::from_floats(w, {M, m.top_k}, DType::kF32);
  const Tensor ref =
      p.cpu->forward_routed(x, Tensor::from_ints(clean, {M, m.top_k}, DType::kInt32), tw);
  const Device gd = p.gpu->moe_config().device.device();
  Tensor out = Tensor::empty({M, m.hidden_size}, DType::kBF16, gd);
  out.fill_bytes(0xFF);
  RunContext ctx{p.gpu->default_stream(), nullptr};
  p.gpu->forward_routed_into(out, x.to(gd),
                             Tensor::from_ints(garbage, {M, m.top_k}, DType::kInt32).to(gd),
                             tw.to(gd), ctx);
  synchronize(ctx.stream);
  const Tensor got = out.to(Device::cpu());
  EXPECT_FALSE(testing::has_nan(got));
  const std::vector<float> rv = ref.to_float_vector();
  EXPECT_LE(testing::relative_l2_error(got, std::vector<double>(rv.begin(), rv.end())),
            tolerance("bf16").rel_l2);
}

// The GPU router (make_router on device tensors) against the library's CPU router on the same
// logits: ids as sets, the same id the same weight. Returns the rows whose id sets differ.
int64_t router_mismatches(const ModelPreset& m, const Tensor& logits, const Tensor& bias) {
  const int64_t M = logits.size(0);
  const auto cpu_router = make_router(MoELayer::make_router_config(m, bias));
  const Device gd = default_device_info().device();
  const auto gpu_router =
      make_router(MoELayer::make_router_config(m, bias.defined() ? bias.to(gd) : Tensor{}));
  const RoutingResult rc = cpu_router->select_experts(Tensor{}, logits);
  CudaStream stream;
  const RoutingResult rg =
      gpu_router->select_experts(Tensor{}, logits.to(gd), {stream.get(), nullptr});
  stream.synchronize();
  const auto ic = rc.topk_ids.to_int_vector(), ig = rg.topk_ids.to(Device::cpu()).to_int_vector();
  const auto wc = rc.topk_weights.to_float_vector(),
             wg = rg.topk_weights.to(Device::cpu()).to_float_vector();
  int64_t mismatched_rows = 0;
  for (int64_t r = 0; r < M; ++r) {
    std::set<int64_t> a(ic.begin() + r * m.top_k, ic.begin() + (r + 1) * m.top_k);
    std::set<int64_t> b(ig.begin() + r * m.top_k, ig.begin() + (r + 1) * m.top_k);
    if (a != b) {
      ++mismatched_rows;
      continue;
    }
    for (int j = 0; j < m.top_k; ++j) {
      // Same id -> same weight (ids are in decreasing score on both paths).
      for (int j2 = 0; j2 < m.top_k; ++j2) {
        if (ic[r * m.top_k + j] == ig[r * m.top_k + j2]) {
          EXPECT_TRUE(std::isfinite(wg[r * m.top_k + j2])) << "row " << r;
          EXPECT_NEAR(wc[r * m.top_k + j], wg[r * m.top_k + j2],
                      1e-5 * std::max(1.0f, std::fabs(wc[r * m.top_k + j])))
              << "row " << r;
        }
      }
    }
  }
  return mismatched_rows;
}

Tensor router_bias(const ModelPreset& m) {
  if (!m.has_e_score_correction_bias) return Tensor{};
  return testing::random_tensor({m.num_experts}, DType::kF32, 22, -0.1f, 0.1f);
}

TEST(GpuLayer, RouterMatchesCpu) {
  REQUIRE_SM90_GPU();
  for (const char* preset : {"qwen3-30b-a3b", "deepseek-v3", "small-deepseek", "gpt-oss-120b"}) {
    const ModelPreset m = find_preset(preset);
    const Tensor logits = testing::random_tensor({200, m.num_experts}, DType::kF32, 21, -4, 4);
    // Random continuous logits: exact ties are practically impossible; allow none.
    EXPECT_EQ(router_mismatches(m, logits, router_bias(m)), 0) << preset;
  }
}

// The router's extra slots (folded shared experts) on the GPU: the same routing as without them
// (the CPU's), and the slots written in the same launch.
TEST(GpuLayer, RouterExtraSlotsMatchCpu) {
  REQUIRE_SM90_GPU();
  for (const char* preset : {"deepseek-v3", "qwen3-30b-a3b"}) {
    const ModelPreset m = find_preset(preset);
    const int64_t M = 70, k = m.top_k, c = 3;
    const Tensor logits = testing::random_tensor({M, m.num_experts}, DType::kF32, 31, -4, 4);
    const Tensor bias = router_bias(m);
    const auto cpu_router = make_router(MoELayer::make_router_config(m, bias));
    const Device gd = default_device_info().device();
    const auto gpu_router =
        make_router(MoELayer::make_router_config(m, bias.defined() ? bias.to(gd) : Tensor{}));
    Tensor wc = Tensor::empty({M, k + c}, DType::kF32),
           ic = Tensor::empty({M, k + c}, DType::kInt32);
    cpu_router->select_experts_with_extra_into(Tensor{}, logits, wc, ic, {m.num_experts, 3});
    Tensor wg = Tensor::empty({M, k + c}, DType::kF32, gd);
    Tensor ig = Tensor::empty({M, k + c}, DType::kInt32, gd);
    wg.fill_bytes(0xFF);
    ig.fill_bytes(0xFF);
    CudaStream stream;
    gpu_router->select_experts_with_extra_into(Tensor{}, logits.to(gd), wg, ig, {m.num_experts, 3},
                                               {stream.get(), nullptr});
    stream.synchronize();
    const auto xc = ic.to_int_vector(), xg = ig.to(Device::cpu()).to_int_vector();
    const auto a = wc.to_float_vector(), b = wg.to(Device::cpu()).to_float_vector();
    const int64_t k2 = k + c;
    for (int64_t r = 0; r < M; ++r) {
      // The routed slots: the same (id, weight) pairs; the extra slots: ids E.., weight 1.
      for (int64_t j = 0; j < k; ++j) {
        const auto* at = std::find(&xg[r * k2], &xg[r * k2] + k, xc[r * k2 + j]);
        ASSERT_NE(at, &xg[r * k2] + k) << preset << " row " << r;
        const float wgot = b[static_cast<size_t>(at - xg.data())];
        EXPECT_NEAR(a[r * k2 + j], wgot, 1e-5f * std::max(1.0f, std::fabs(a[r * k2 + j])));
      }
      for (int64_t j = k; j < k2; ++j) {
        EXPECT_EQ(xg[r * k2 + j], m.num_experts + (j - k)) << preset << " row " << r;
        EXPECT_EQ(b[r * k2 + j], 1.0f) << preset << " row " << r;
      }
    }
  }
}

// NaN and +-inf logits follow one convention on both paths (include/moekit/router/router.h).
TEST(GpuLayer, RouterNanAndInfMatchCpu) {
  REQUIRE_SM90_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const char* preset : {"qwen3-30b-a3b", "deepseek-v3", "small-deepseek", "gpt-oss-120b"}) {
    const ModelPreset m = find_preset(preset);
    const int E = m.num_experts;
    std::vector<float> base(E), v;
    for (int e = 0; e < E; ++e)
      base[e] = static_cast<float>((e * 37) % E) * (8.0f / E) - 4.0f;  // distinct, spaced
    auto row = [&](auto edit) {
      std::vector<float> r = base;
      for (int e = 0; e < E; ++e)
        edit(e, r[e]);
      v.insert(v.end(), r.begin(), r.end());
    };
    row([&](int, float& x) { x = nan; });
    row([&](int, float& x) { x = -inf; });
    row([&](int, float& x) { x = inf; });
    row([&](int e, float& x) { x = e % 3 == 0 ? nan : x; });
    row([&](int e, float& x) { x = e % 5 == 1 ? -inf : e % 7 == 2 ? nan : x; });
    row([&](int e, float& x) { x = e == 3 || e == E - 2 ? inf : e % 4 == 0 ? nan : x; });
    row([&](int e, float& x) { x = e == 17 % E ? 0.25f : nan; });
    row([&](int e, float& x) { x = e % 2 == 0 ? -inf : nan; });
    const int64_t M = static_cast<int64_t>(v.size()) / E;
    const Tensor logits = Tensor::from_floats(v, {M, E}, DType::kF32);
    EXPECT_EQ(router_mismatches(m, logits, router_bias(m)), 0) << preset;
  }
}

#ifdef MOEKIT_WITH_CUDA
// The stages a forward reports, in order.
struct StageNames final : StageObserver {
  mutable std::vector<std::string> names;
  void stage_done(std::string_view stage, Stream) const override { names.emplace_back(stage); }
};

// The decode pair (GEMM1 + activation and GEMM2 in one launch, on the CUDA-core tile) against the
// same layer launching the two GEMMs apart: bitwise at decode sizes, for presets with biases,
// swigluoai, folded shared experts with their gate; and within tolerance of the CPU reference.
TEST(GpuLayer, DecodePairMatchesTwoLaunchesBitwise) {
  REQUIRE_SM90_GPU();
  for (const char* preset : {"small", "small-deepseek", "small-gpt-oss", "small-qwen2-moe"}) {
    SCOPED_TRACE(preset);
    const ModelPreset& m = find_preset(preset);
    MoELayerOptions cpu_opt;
    cpu_opt.max_num_tokens = 8;
    MoELayerOptions gpu_opt = cpu_opt;
    gpu_opt.device = default_device_info();
    gpu_opt.tile_config = "1x64simt";
    const MoELayerWeights w = MoELayer::random_weights(m, cpu_opt, 5);
    MoELayer cpu(m, w, cpu_opt);
    MoELayer gpu(m, to_device(w, gpu_opt.device.device()), gpu_opt);
    auto* experts = dynamic_cast<Sm90StandardExpertsBase*>(&gpu.kernel().fused_experts());
    ASSERT_NE(experts, nullptr);
    const Device gd = gpu_opt.device.device();
    for (int64_t M : {1, 3, 8}) {
      SCOPED_TRACE(M);
      const Tensor x = testing::random_tensor({M, m.hidden_size}, DType::kBF16, 40 + M);
      const Tensor logits = testing::random_tensor({M, m.num_experts}, DType::kF32, 50 + M, -3, 3);
      const RoutingResult r = cpu.router().select_experts(x, logits);
      const Tensor ref = cpu.forward_routed(x, r.topk_ids, r.topk_weights);
      const Tensor xg = x.to(gd), ids = r.topk_ids.to(gd), tw = r.topk_weights.to(gd);
      Tensor outs[2];
      for (int pair = 1; pair >= 0; --pair) {
        experts->allow_decode_pair(pair == 1);
        StageNames stages;
        RunContext ctx{gpu.default_stream(), nullptr, &stages};
        Tensor out = Tensor::empty({M, m.hidden_size}, DType::kBF16, gd);
        out.fill_bytes(0xFF);
        gpu.forward_routed_into(out, xg, ids, tw, ctx);
        synchronize(ctx.stream);
        outs[pair] = out.to(Device::cpu());
        const bool paired = std::find(stages.names.begin(), stages.names.end(), "gemm1+gemm2") !=
                            stages.names.end();
        EXPECT_EQ(paired, pair == 1) << "stages reported: " << stages.names.size();
      }
      experts->allow_decode_pair(true);
      ASSERT_FALSE(testing::has_nan(outs[1]));
      EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[1].nbytes()));
      const std::vector<float> rv = ref.to_float_vector();
      EXPECT_LE(testing::relative_l2_error(outs[1], std::vector<double>(rv.begin(), rv.end())),
                tolerance("bf16").rel_l2);
    }
  }
}

TEST(GpuLayer, CudaGraphReplayIsBitwiseIdentical) {
  REQUIRE_SM90_GPU();
  const ModelPreset m = find_preset("small-deepseek");  // router + shared experts in the graph
  MoELayerOptions opt;
  opt.device = default_device_info();
  opt.max_num_tokens = 128;
  MoELayer layer(m, MoELayer::random_weights(m, opt, 3), opt);
  testing::expect_graph_replay_bitwise(layer, 77);
  // Both ways of running shared experts, with Qwen2-MoE's per-token gate among them: the folded
  // slots (with the gate) and the separate pass (its gate and scaled add).
  for (const char* name : {"small-deepseek", "small-qwen2-moe"}) {
    const ModelPreset q = find_preset(name);
    for (SharedExpertsMode mode : {SharedExpertsMode::kFolded, SharedExpertsMode::kSeparate}) {
      SCOPED_TRACE(std::string(name) + " " + shared_experts_mode_name(mode));
      opt.shared_experts = mode;
      MoELayer l(q, MoELayer::random_weights(q, opt, 4), opt);
      ASSERT_EQ(l.shared_chunks() > 0, mode == SharedExpertsMode::kFolded);
      testing::expect_graph_replay_bitwise(l, 78);
    }
  }
}

// Folded shared experts (one pass of the grouped GEMMs) and the separate pass agree on the GPU,
// and each matches the float64 recomputation; the same routed weights serve both.
TEST(GpuLayer, SharedExpertsFoldedAndSeparateAgree) {
  REQUIRE_SM90_GPU();
  for (const char* name : {"small-deepseek", "small-qwen2-moe", "qwen1.5-moe-a2.7b"}) {
    SCOPED_TRACE(name);
    const ModelPreset& m = find_preset(name);
    MoELayerOptions opt;
    opt.device = default_device_info();
    opt.max_num_tokens = 300;
    opt.shared_experts = SharedExpertsMode::kFolded;
    MoELayerOptions sep = opt;
    sep.shared_experts = SharedExpertsMode::kSeparate;
    const MoELayerWeights w = MoELayer::random_weights(m, opt, 9);
    MoELayerWeights w_copy = w;
    for (Tensor* t : {&w_copy.w13, &w_copy.w2, &w_copy.shared_w13, &w_copy.shared_w2})
      *t = t->clone();  // the separate layer rewrites its routed weights in place
    MoELayerWeights w_auto = w;
    for (Tensor* t : {&w_auto.w13, &w_auto.w2, &w_auto.shared_w13, &w_auto.shared_w2})
      *t = t->clone();
    MoELayerOptions automatic_opt = opt;
    automatic_opt.shared_experts = SharedExpertsMode::kAuto;  // narrow chunks: slots up to 256
    MoELayer folded(m, w, opt), separate(m, w_copy, sep), automatic(m, w_auto, automatic_opt);
    ASSERT_EQ(folded.shared_fold_reason(), "");
    EXPECT_EQ(folded.shared_chunks(),
              m.shared_intermediate_size * m.num_shared_experts / m.intermediate_size);
    EXPECT_EQ(folded.kernel().fused_experts().name(), "Sm90GroupedExperts");
    for (int64_t M : {1, 37, 300}) {
      SCOPED_TRACE(M);
      const Tensor x = testing::random_tensor({M, m.hidden_size}, DType::kBF16, 10 + M);
      const Tensor logits = testing::random_tensor({M, m.num_experts}, DType::kF32, 20 + M, -3, 3);
      const Device gd = opt.device.device();
      const Tensor xg = x.to(gd), lg = logits.to(gd);
      Tensor yf = Tensor::empty({M, m.hidden_size}, DType::kBF16, gd);
      Tensor ys = Tensor::empty({M, m.hidden_size}, DType::kBF16, gd);
      yf.fill_bytes(0xFF);
      ys.fill_bytes(0xFF);
      RunContext ctx{folded.default_stream(), nullptr};
      Tensor ya = Tensor::empty({M, m.hidden_size}, DType::kBF16, gd);
      ya.fill_bytes(0xFF);
      folded.forward_into(yf, xg, lg, ctx);
      separate.forward_into(ys, xg, lg, ctx);
      automatic.forward_into(ya, xg, lg, ctx);
      synchronize(ctx.stream);
      const Tensor f = yf.to(Device::cpu()), s = ys.to(Device::cpu()), a = ya.to(Device::cpu());
      ASSERT_FALSE(testing::has_nan(a));
      ASSERT_FALSE(testing::has_nan(f));
      ASSERT_FALSE(testing::has_nan(s));
      // The layer's own routing (its router holds the bias on the GPU), read back.
      const RoutingResult rg = folded.router().select_experts(xg, lg, ctx);
      synchronize(ctx.stream);
      const RoutingResult r{rg.topk_weights.to(Device::cpu()), rg.topk_ids.to(Device::cpu())};
      std::vector<int64_t> rows;
      for (int64_t row = 0; row < M; row += std::max<int64_t>(1, M / 24))
        rows.push_back(row);
      const std::vector<double> ref = reference_forward(folded, x, r, rows);
      const double tol = tolerance("bf16").rel_l2;
      EXPECT_LT(relative_error(f, ref, rows), tol);
      EXPECT_LT(relative_error(s, ref, rows), tol);
      EXPECT_LT(relative_error(a, ref, rows), tol) << automatic.shared_fold_reason();
      const std::vector<float> sv = s.to_float_vector();
      EXPECT_LT(testing::relative_l2_error(f, std::vector<double>(sv.begin(), sv.end())), tol);
    }
  }
}
#endif

}  // namespace
}  // namespace moekit
