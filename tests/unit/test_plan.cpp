// One layer, one plan: the plan a layer is built from (experts + prepare/finalize + weight
// layout, decided once), the prepare/finalize factory and its reasons, the single-rank
// communicator, backend weight layouts (in place, exactly invertible) and weights held once.
#include <gtest/gtest.h>

#include <numeric>

#include "core/cuda_seam.h"
#include "moekit/comm/communicator.h"
#include "moekit/config/quant_key.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/oracle/plan.h"
#include "moekit/oracle/unquantized.h"
#include "moekit/prepare_finalize/factory.h"
#include "moekit/prepare_finalize/no_ep.h"
#include "previewed_h200.h"
#include "testing.h"

namespace moekit {
namespace {

using testing::contains_all;
using testing::error_of;

MoEConfig config_of(const std::string& preset, MoELayerOptions options = {}) {
  return MoELayer::make_moe_config(find_preset(preset), options);
}

MoELayerOptions ep_options(int dp, All2AllBackend backend = All2AllBackend::kNaive) {
  MoELayerOptions o;
  o.parallel = ParallelConfig::make(/*tp=*/1, dp, /*dp_rank=*/0, /*tp_rank=*/0,
                                    /*enable_ep=*/true, backend);
  return o;
}

// ---- the plan --------------------------------------------------------------------------------

TEST(Plan, SingleRankUnquantizedOnTheCpu) {
  const MoEConfig moe = config_of("small");
  const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized());
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_EQ(plan.oracle, QuantOracleKind::kUnquantized);
  EXPECT_EQ(plan.backend->name, "cpu");
  EXPECT_EQ(plan.experts->name(), "CpuReferenceExperts");
  EXPECT_EQ(plan.prepare_finalize->name, "no_ep");
  EXPECT_FALSE(plan.weight_layout.has_value());
  EXPECT_EQ(plan.error(), "");
  EXPECT_NO_THROW(plan.check());
  // The experts table is the oracle's explain() of the same deployment (one decision).
  const OracleReport again = UnquantizedMoEKernelOracle(moe).explain();
  EXPECT_EQ(plan.experts_report.to_string(), again.to_string());
  const std::string text = plan.to_string();
  EXPECT_TRUE(contains_all(text, {"Unquantized MoE oracle", "Prepare/finalize", "no_ep", "CHOSEN",
                                  "weights: standard layout"}))
      << text;
}

TEST(Plan, QuantizedSchemesPickTheirOracle) {
  const MoEConfig moe = config_of("small");
  const MoEPlan plan = plan_moe(moe, QuantOracleKind::kFp8, quant_keys::kFp8Static128BlockSym,
                                quant_keys::kFp8Dynamic128Sym);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_EQ(plan.oracle, QuantOracleKind::kFp8);
  EXPECT_EQ(plan.experts->name(), "CpuFp8Experts");
  // Every declared seed backend appears, rejected because moekit has no kernel for it.
  EXPECT_TRUE(contains_all(plan.to_string(), {"FP8 MoE oracle", "triton", "deep_gemm",
                                              std::string(kNoKernelRegisteredReason)}));
}

TEST(Plan, ExpertParallelDeploymentNamesEveryPrepareFinalizeCandidate) {
  const MoEConfig moe = config_of("small-deepseek", ep_options(2));
  const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized());
  EXPECT_FALSE(plan.ok());
  EXPECT_TRUE(plan.experts_report.ok()) << "the experts themselves can serve the rank";
  const PrepareFinalizeReport& pf = plan.prepare_finalize_report;
  EXPECT_EQ(pf.key, "naive");
  ASSERT_GE(pf.candidates.size(), 6u);
  for (const auto& c : pf.candidates) {
    EXPECT_FALSE(c.supported) << c.name;
    if (c.name == "naive_allgather") {
      EXPECT_TRUE(contains_all(c.reason, {"needs a communicator of 2 ranks"})) << c.reason;
    } else {
      EXPECT_TRUE(contains_all(c.reason, {"not naive"})) << c.reason;
    }
  }
  EXPECT_TRUE(contains_all(plan.error(), {"no prepare/finalize can serve", "naive_allgather"}));
  EXPECT_TRUE(contains_all(error_of<UnsupportedError>([&] { plan.check(); }), {"naive"}));
  // Planning only (explain): the factory that would serve it once the communicator is given.
  PlanOptions preview;
  preview.preview = true;
  const MoEPlan planned = plan_moe(moe, QuantConfig::unquantized(), preview);
  ASSERT_TRUE(planned.ok()) << planned.error();
  EXPECT_EQ(planned.prepare_finalize->name, "naive_allgather");
  // The layer refuses the deployment with the same reasons.
  const ModelPreset& model = find_preset("small-deepseek");
  const MoELayerOptions o = ep_options(2);
  EXPECT_TRUE(contains_all(error_of<UnsupportedError>(
                               [&] { MoELayer(model, MoELayer::random_weights(model, o, 1), o); }),
                           {"needs a communicator of 2 ranks", "naive"}));
}

// A preview has no communicator: the exchanges are judged by the deployment's device, and every
// one serves GPU ranks (`moekit explain --device h200 --all2all ...`), the low-latency one with the
// batched Hopper experts.
TEST(Plan, PreviewedGpuRanksGetEveryExchange) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA: no Hopper backends";
  const std::pair<All2AllBackend, const char*> cases[] = {
      {All2AllBackend::kNcclAllToAll, "all2all"},
      {All2AllBackend::kNaive, "naive_allgather"},
      {All2AllBackend::kAllGatherReduceScatter, "allgather_reducescatter"},
      {All2AllBackend::kBatchedLowLatency, "batched_low_latency"}};
  for (const auto& [backend, name] : cases) {
    SCOPED_TRACE(name);
    testing::PreviewedH200 h200 = testing::previewed_h200();
    MoELayerOptions o = ep_options(2, backend);
    o.device = h200.layer.device;
    const MoEPlan gpu =
        plan_moe(config_of("small-deepseek", o), QuantConfig::unquantized(), h200.plan);
    ASSERT_TRUE(gpu.ok()) << gpu.error();
    EXPECT_EQ(gpu.prepare_finalize_report.chosen, name);
    EXPECT_EQ(gpu.experts->name(), backend == All2AllBackend::kBatchedLowLatency
                                       ? "Sm90BatchedExperts"
                                       : "Sm90GroupedExperts");
  }
}

// fp8 under the low-latency exchange: the batched fp8 experts (the codes and their scales
// travel); every fp8 scheme, the dynamic per-tensor one too (its amax over the rows that exist).
TEST(Plan, PreviewedGpuRanksDispatchFp8ToTheBatchedFp8Experts) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA: no Hopper backends";
  const std::pair<QuantKey, QuantKey> schemes[] = {
      {quant_keys::kFp8Static128BlockSym, quant_keys::kFp8Dynamic128Sym},
      {quant_keys::kFp8StaticChannelSym, quant_keys::kFp8DynamicTokenSym},
      {quant_keys::kFp8StaticTensorSym, quant_keys::kFp8StaticTensorSym},
      {quant_keys::kFp8StaticTensorSym, quant_keys::kFp8DynamicTensorSym}};
  for (const auto& [weight, activation] : schemes) {
    SCOPED_TRACE(activation.to_string());
    testing::PreviewedH200 h200 = testing::previewed_h200();
    MoELayerOptions o = ep_options(2, All2AllBackend::kBatchedLowLatency);
    o.device = h200.layer.device;
    const MoEPlan plan = plan_moe(config_of("small-deepseek", o), QuantOracleKind::kFp8, weight,
                                  activation, h200.plan);
    ASSERT_TRUE(plan.ok()) << plan.error();
    EXPECT_EQ(plan.prepare_finalize_report.chosen, "batched_low_latency");
    EXPECT_EQ(plan.experts->name(), "Sm90BatchedFp8Experts");
  }
}

TEST(Plan, BatchedFormatAcrossRanksNeedsTheLowLatencyAllToAll) {
  const MoEConfig moe = config_of("small", ep_options(2, All2AllBackend::kBatchedLowLatency));
  const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized());
  ASSERT_TRUE(plan.experts_report.ok());
  EXPECT_EQ(plan.experts->name(), "CpuBatchedReferenceExperts");
  EXPECT_EQ(plan.prepare_finalize_report.key, "batched_low_latency");
  EXPECT_TRUE(contains_all(plan.error(), {"batched_low_latency"}));
}

TEST(PrepareFinalizeFactory, BatchedExpertsOnOneRankGetTheLocalScatter) {
  const MoEConfig moe = config_of("small");
  const QuantConfig q = QuantConfig::unquantized();
  const PrepareFinalizeSelection pf =
      select_prepare_finalize({&moe, &q, &CpuBatchedReferenceExperts::klass(), nullptr});
  ASSERT_TRUE(pf.chosen.has_value()) << pf.report.error;
  EXPECT_EQ(pf.chosen->name, "batched_local");
  const auto& c = pf.report.candidates;
  auto no_ep = std::find_if(c.begin(), c.end(), [](const auto& x) { return x.name == "no_ep"; });
  ASSERT_NE(no_ep, c.end());
  EXPECT_TRUE(contains_all(no_ep->reason, {"batched format"})) << no_ep->reason;
  // Monolithic experts take the standard format: the no-EP monolithic prepare/finalize.
  const PrepareFinalizeSelection mono =
      select_prepare_finalize({&moe, &q, &CpuReferenceMonolithicExperts::klass(), nullptr});
  ASSERT_TRUE(mono.chosen.has_value());
  EXPECT_TRUE(mono.chosen->make({&moe, &q, &CpuReferenceMonolithicExperts::klass(), nullptr})
                  ->is_monolithic());
}

TEST(Plan, ALayerGivenAPlanDoesNotSelectAgainButChecksItsOracle) {
  const ModelPreset& model = find_preset("small");
  MoELayerOptions o;
  const MoEConfig moe = MoELayer::make_moe_config(model, o);
  MoEPlan fp8 = plan_moe(moe, QuantOracleKind::kFp8, quant_keys::kFp8StaticTensorSym,
                         quant_keys::kFp8StaticTensorSym);
  EXPECT_TRUE(contains_all(error_of([&] {
                             MoELayer(model, QuantConfig::unquantized(),
                                      MoELayer::random_weights(model, o, 1), o, fp8);
                           }),
                           {"fp8 oracle", "unquantized"}));
  MoEPlan plan = plan_moe(moe, QuantConfig::unquantized());
  plan.experts_report.oracle_name = "marked";  // not recomputed by the layer
  MoELayer layer(model, QuantConfig::unquantized(), MoELayer::random_weights(model, o, 1), o, plan);
  EXPECT_EQ(layer.selection().oracle_name, "marked");
}

TEST(Plan, BackendNamesAreUniqueIgnoringCaseAndUnknownNamesListTheValidOnes) {
  BackendRegistry registry;
  ExpertsBackend b;
  b.oracle = QuantOracleKind::kUnquantized;
  b.name = "fast";
  b.aliases = {"quick"};
  b.classes = {&CpuReferenceExperts::klass()};
  registry.add(b);
  for (const char* taken : {"FAST", "Quick"}) {
    ExpertsBackend dup = b;
    dup.name = taken;
    dup.aliases.clear();
    EXPECT_TRUE(contains_all(error_of([&] { registry.add(dup); }), {"already", taken}));
  }
  const UnquantizedMoEKernelOracle oracle(config_of("small"), std::nullopt, std::nullopt, registry);
  EXPECT_EQ(oracle.map_backend("QUICK"), "fast");
  EXPECT_TRUE(contains_all(error_of([&] { (void)oracle.try_backend("fsat"); }),
                           {"Unknown", "'fsat'", "fast", "quick -> fast"}));
}

// ---- the prepare/finalize factory ------------------------------------------------------------

TEST(PrepareFinalizeFactory, DispatchKeys) {
  EXPECT_EQ(dispatch_key(ParallelConfig::single()), std::nullopt);
  // EP inside one data-parallel group: every rank sees every token, outputs are summed.
  EXPECT_EQ(dispatch_key(ParallelConfig::make(4, 1, 0, 1, true)), std::nullopt);
  EXPECT_EQ(dispatch_key(ParallelConfig::make(1, 2, 1, 0, true)), All2AllBackend::kNaive);
  EXPECT_EQ(dispatch_key(ParallelConfig::make(1, 2, 0, 0, true, All2AllBackend::kNcclAllToAll)),
            All2AllBackend::kNcclAllToAll);
  // Data parallelism without EP still exchanges tokens (the naive all-gather).
  EXPECT_EQ(dispatch_key(ParallelConfig::make(1, 2, 0, 0, false)), All2AllBackend::kNaive);
  EXPECT_EQ(dispatch_key(ParallelConfig::make(2, 1, 0, 0, true, All2AllBackend::kMegakernel)),
            All2AllBackend::kMegakernel);
  EXPECT_EQ(dispatch_key_name(std::nullopt), "no token exchange");
}

TEST(PrepareFinalizeFactory, ARegisteredFactoryServesItsKeyWithReasons) {
  PrepareFinalizeRegistry registry;
  PrepareFinalizeFactory f;
  f.name = "toy_all2all";
  f.all2all = All2AllBackend::kNcclAllToAll;
  f.check = [](const PrepareFinalizeRequest& r) -> std::string {
    return r.comm ? "" : "needs a communicator";
  };
  f.make = [](const PrepareFinalizeRequest&) -> std::unique_ptr<PrepareFinalize> {
    return std::make_unique<PrepareFinalizeNoEP>();
  };
  PrepareFinalizeRegistration reg(f, registry);
  EXPECT_TRUE(contains_all(error_of([&] { registry.add(f); }), {"toy_all2all", "already"}));

  const MoEConfig moe = config_of("small", ep_options(2, All2AllBackend::kNcclAllToAll));
  const QuantConfig q = QuantConfig::unquantized();
  const ExpertsClass& experts = CpuReferenceExperts::klass();
  PrepareFinalizeSelection none = select_prepare_finalize({&moe, &q, &experts, nullptr}, registry);
  EXPECT_FALSE(none.chosen.has_value());
  ASSERT_EQ(none.report.candidates.size(), 1u);
  EXPECT_EQ(none.report.candidates[0].reason, "needs a communicator");
  EXPECT_TRUE(contains_all(
      none.report.error, {"no prepare/finalize can serve", "toy_all2all", "needs a communicator"}));
  SingleRankCommunicator comm;
  PrepareFinalizeSelection one = select_prepare_finalize({&moe, &q, &experts, &comm}, registry);
  ASSERT_TRUE(one.chosen.has_value());
  EXPECT_EQ(one.report.chosen, "toy_all2all");
  EXPECT_TRUE(one.report.ok());
  // Another key: rejected with the mismatch.
  const MoEConfig naive = config_of("small", ep_options(2));
  PrepareFinalizeSelection other = select_prepare_finalize({&naive, &q, &experts, &comm}, registry);
  EXPECT_TRUE(contains_all(other.report.candidates[0].reason, {"nccl_all2all", "not naive"}));
  EXPECT_TRUE(contains_all(other.report.error, {"no prepare/finalize is registered", "naive"}));
}

TEST(PrepareFinalizeFactory, ScopedRegistrationRestoresTheOneItDisplaced) {
  PrepareFinalizeRegistry registry;
  auto make = [](std::string description) {
    PrepareFinalizeFactory f;
    f.name = "x";
    f.description = std::move(description);
    f.check = [](const PrepareFinalizeRequest&) { return std::string(); };
    f.make = [](const PrepareFinalizeRequest&) -> std::unique_ptr<PrepareFinalize> {
      return nullptr;
    };
    return f;
  };
  PrepareFinalizeRegistration outer(make("outer"), registry);
  {
    PrepareFinalizeRegistration inner(make("inner"), registry);
    ASSERT_EQ(registry.factories().size(), 1u);
    EXPECT_EQ(registry.factories()[0].description, "inner");
  }
  ASSERT_EQ(registry.factories().size(), 1u);
  EXPECT_EQ(registry.factories()[0].description, "outer");
}

// ---- the single-rank communicator -------------------------------------------------------------

TEST(Communicator, SingleRankCollectivesAreLocalCopies) {
  SingleRankCommunicator comm;
  EXPECT_EQ(comm.name(), "single");
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  const Tensor send = testing::random_tensor({6, 4}, DType::kF32, 5);
  Tensor recv = testing::poisoned({6, 4}, DType::kF32);
  comm.all_gather(send, recv, {});
  EXPECT_TRUE(testing::bitwise_equal(send, recv));
  recv = testing::poisoned({6, 4}, DType::kF32);
  comm.reduce_scatter(send, recv, {});
  EXPECT_TRUE(testing::bitwise_equal(send, recv));
  Tensor inout = send.clone();
  comm.all_reduce(inout, {});
  EXPECT_TRUE(testing::bitwise_equal(send, inout));
  // all_to_all_v moves the first count rows; the rest of recv is untouched.
  recv = testing::poisoned({6, 4}, DType::kF32);
  comm.all_to_all_v(send, {4}, recv, {4}, {});
  EXPECT_TRUE(testing::bitwise_equal(recv.slice(0, 0, 4), send.slice(0, 0, 4)));
  EXPECT_TRUE(testing::has_nan(recv.slice(0, 4, 6)));
  comm.all_to_all_v(send, {0}, recv, {0}, {});  // an idle rank
  EXPECT_EQ(comm.all_to_all_host({7}), std::vector<int64_t>{7});
  EXPECT_TRUE(contains_all(error_of([&] {
                             (void)comm.all_to_all_host({1, 2});
                           }),
                           {"all_to_all_host over 1 ranks", "one per rank"}));
  comm.barrier();
  EXPECT_TRUE(contains_all(error_of([&] {
                             comm.all_to_all_v(send, {4, 2}, recv, {6}, {});
                           }),
                           {"one count"}));
  EXPECT_TRUE(
      contains_all(error_of([&] { comm.all_to_all_v(send, {7}, recv, {7}, {}); }), {"fit"}));
  Tensor wrong = Tensor::empty({6, 4}, DType::kBF16);
  EXPECT_TRUE(contains_all(error_of([&] { comm.all_gather(send, wrong, {}); }), {"bf16", "f32"}));
  Tensor small = Tensor::empty({3, 4}, DType::kF32);
  EXPECT_TRUE(contains_all(error_of([&] { comm.all_gather(send, small, {}); }), {"shape"}));
}

// ---- kernel notes ---------------------------------------------------------------------------

// The Standard-format Hopper backends describe their GEMM tiles by batch size (`moekit explain`):
// the decode and prefill rows of each family, and why the swap-AB row gives way when K does not
// divide into its steps. Planned for a previewed H200, so it runs on a CPU-only machine.
TEST(KernelNotes, Sm90BackendsNameTheirTilesByBatchSize) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA: no Hopper backends";
  const testing::PreviewedH200 h200 = testing::previewed_h200();
  const PlanOptions& preview = h200.plan;
  MoELayerOptions o = h200.layer;
  const MoEPlan bf16 = plan_moe(config_of("small", o), QuantConfig::unquantized(), preview);
  ASSERT_TRUE(bf16.ok()) << bf16.error();
  EXPECT_EQ(bf16.backend->name, "sm90_grouped");
  EXPECT_TRUE(contains_all(bf16.to_string(),
                           {"kernels:", "M=1      gemm1 16x64    gemm2 16x64",
                            "M=16384  gemm1 128x256  gemm2 128x256", "rows per expert <= "}))
      << bf16.to_string();
  // gpt-oss's MXFP4 layer: the CUDA-core row at one token per expert (gpt-oss-120b: 4 rows over
  // 128 experts), passed by where many experts would get two rows (the small presets' 8 and 16
  // experts at M = 1, gpt-oss-120b at M = 16), then swap-AB; the tiny preset's I = 96 keeps GEMM2
  // off swap-AB.
  {
    const MoEPlan plan = plan_moe(config_of("gpt-oss-120b", o), QuantOracleKind::kMxfp4,
                                  quant_keys::kMxfp4Static, std::nullopt, preview);
    ASSERT_TRUE(plan.ok()) << plan.error();
    const std::string text = plan.to_string();
    EXPECT_TRUE(contains_all(
        text, {"M=1      gemm1 1x64simt gemm2 1x64simt", "CUDA-core",
               "M=16     gemm1 16x64    gemm2 16x64", "tile 1x64simt: 64 rows over 128 experts"}))
        << text;
  }
  for (const char* preset : {"small-gpt-oss", "tiny"}) {
    SCOPED_TRACE(preset);
    const MoEConfig moe = config_of(preset, o);
    const MoEPlan plan =
        plan_moe(moe, QuantOracleKind::kMxfp4, quant_keys::kMxfp4Static, std::nullopt, preview);
    ASSERT_TRUE(plan.ok()) << plan.error();
    const std::string text = plan.to_string();
    EXPECT_TRUE(contains_all(
        text, {"M=1      gemm1 16x64", "tile 1x64simt: ", "would read their weights twice",
               "swap-AB", "M=16384  gemm1 128x128"}))
        << text;
    const bool k96 = std::string(preset) == "tiny";
    EXPECT_EQ(
        text.find("k=96 is not a multiple of 64 (whole K steps of packed weights), so 64x64") !=
            std::string::npos,
        k96)
        << text;
  }
  // A forced tile is named as such.
  o.tile_config = "128x256";
  const MoEPlan forced = plan_moe(config_of("small", o), QuantConfig::unquantized(), preview);
  ASSERT_TRUE(forced.ok()) << forced.error();
  EXPECT_TRUE(
      contains_all(forced.to_string(), {"every GEMM: tile 128x256 (MoEConfig::tile_config"}))
      << forced.to_string();
}

// ---- weight layouts ---------------------------------------------------------------------------

// The Hopper backends' fused-activation layout, applied on the CPU: in place, and to_standard is
// its exact inverse (per expert, weights and bias; plain and gpt-oss pairwise sources).
TEST(WeightLayout, Sm90GateUpBlocksRoundTripInPlace) {
  const auto backend =
      BackendRegistry::global().find(QuantOracleKind::kUnquantized, "sm90_grouped");
  ASSERT_TRUE(backend.has_value());
  for (const char* preset : {"small", "small-gpt-oss"}) {
    SCOPED_TRACE(preset);
    MoELayerOptions o;
    o.device = DeviceInfo{};  // the layout does not depend on the device
    MoEConfig moe = config_of(preset, o);
    const std::optional<WeightLayout> layout = backend->layout_for(moe);
    ASSERT_TRUE(layout.has_value());
    const int64_t E = 3, N = 2 * moe.intermediate_size_per_partition(), H = moe.hidden_dim;
    const Tensor w13 = testing::random_tensor({E, N, H}, DType::kBF16, 9);
    const Tensor bias = testing::random_tensor({E, N}, DType::kBF16, 10);
    ExpertWeights w{w13.clone(), Tensor{}, bias.clone(), Tensor{}};
    const void* data = w.w13.data();
    layout->to_kernel(w, moe, Stream{});
    EXPECT_EQ(w.w13.data(), data) << "rewritten in place";
    EXPECT_FALSE(testing::bitwise_equal(w.w13, w13));
    // The fused layout: kernel rows [64b, 64b + 32) are gate rows, the next 32 the up rows.
    const int64_t I = N / 2;
    const bool pairwise = moe.activation == Activation::kSwigluOai;
    const int64_t gate_of_col5 = pairwise ? 10 : 5, up_of_col5 = pairwise ? 11 : I + 5;
    EXPECT_TRUE(
        testing::bitwise_equal(w.w13.slice(1, 5, 6), w13.slice(1, gate_of_col5, gate_of_col5 + 1)));
    EXPECT_TRUE(
        testing::bitwise_equal(w.w13.slice(1, 37, 38), w13.slice(1, up_of_col5, up_of_col5 + 1)));
    for (int64_t e = 0; e < E; ++e) {
      ExpertWeights one{w.w13.slice(0, e, e + 1).clone(), Tensor{},
                        w.w13_bias.slice(0, e, e + 1).clone(), Tensor{}};
      layout->to_standard(one, moe);
      EXPECT_TRUE(testing::bitwise_equal(one.w13, w13.slice(0, e, e + 1))) << e;
      EXPECT_TRUE(testing::bitwise_equal(one.w13_bias, bias.slice(0, e, e + 1))) << e;
    }
  }
  // Layers whose activation is not fused keep the standard layout.
  MoEConfig no_mul = config_of("small");
  no_mul.activation = Activation::kSiluNoMul;
  EXPECT_FALSE(backend->layout_for(no_mul).has_value());
}

TEST(LayerWeights, HeldOnceAndReadBackOneExpertAtATime) {
  const ModelPreset& model = find_preset("small");
  const MoELayerOptions o;
  MoELayerWeights w = MoELayer::random_weights(model, o, 4);
  const Tensor w13_copy = w.w13.clone(), w2_copy = w.w2.clone();
  const void* w13_data = w.w13.data();
  const MoELayer layer(model, std::move(w), o);
  EXPECT_EQ(layer.kernel_weights().w13.data(), w13_data) << "taken over, not copied";
  EXPECT_FALSE(layer.weights().w13.defined()) << "the routed experts live in kernel_weights()";
  EXPECT_EQ(layer.expert_weight_bytes(), w13_copy.nbytes() + w2_copy.nbytes());
  const ExpertWeights e2 = layer.expert_reference(2);
  EXPECT_EQ(e2.w13.dtype(), DType::kF32);
  EXPECT_TRUE(testing::bitwise_equal(e2.w13, w13_copy.select(2).to_dtype(DType::kF32)));
  EXPECT_TRUE(testing::bitwise_equal(e2.w2, w2_copy.select(2).to_dtype(DType::kF32)));
  EXPECT_TRUE(contains_all(error_of([&] { (void)layer.expert_reference(model.num_experts); }),
                           {"outside"}));
  // Reserved workspace slots are the kernel's requests.
  const auto& requests = layer.workspace_requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].slot, workspace_slots::kExperts13);
}

TEST(LayerWeights, RouterLogitsNeedTheRouterWeight) {
  const ModelPreset& model = find_preset("tiny");
  const MoELayerOptions o;
  MoELayerWeights w = MoELayer::random_weights(model, o, 4);
  const MoELayer no_gate(model, w, o);
  const Tensor x = testing::random_tensor({3, model.hidden_size}, DType::kBF16, 1);
  EXPECT_TRUE(contains_all(error_of([&] { (void)no_gate.router_logits(x); }), {"router"}));
  w.router_weight = testing::random_tensor({model.num_experts, model.hidden_size}, DType::kF32, 2);
  const MoELayer gated(model, w, o);
  const Tensor logits = gated.router_logits(x);
  ASSERT_EQ(logits.shape(), (Shape{3, model.num_experts}));
  const std::vector<float> xv = x.to_float_vector(), wv = w.router_weight.to_float_vector();
  double expect = 0.0;
  for (int64_t h = 0; h < model.hidden_size; ++h)
    expect += static_cast<double>(xv[model.hidden_size + h]) * wv[2 * model.hidden_size + h];
  EXPECT_FLOAT_EQ(logits.to_float_vector()[model.num_experts + 2], static_cast<float>(expect));
}

}  // namespace
}  // namespace moekit
