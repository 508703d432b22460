// CpuReferenceMonolithicExperts: the CPU reference behind the monolithic interface. It does
//   1. build a RouterConfig from the routing method (moe config) and the routing args;
//   2. route the logits with the library's router (make_router);
//   3. fold the top-1 router weight into the input when it goes there (the no-EP prepare's helper);
//   4. run CpuReferenceExperts into an unweighted (M, topk, K) buffer;
//   5. weight and reduce with the experts' own TopKWeightAndReduce (Contiguous) into (M, K).
// Steps 3-5 are the modular no-EP pipeline's own code, so both paths agree bitwise.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "modular/cpu_rows.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/oracle/backend.h"
#include "prepare_finalize/prepare_common.h"

namespace moekit {
namespace {

constexpr const char* kName = "CpuReferenceMonolithicExperts";

// The routing methods the library's routers implement, with the scoring and normalization each
// one implies. kTopK (weights = raw logits) has no router here.
struct MethodRouting {
  RoutingMethodType method;
  ScoringFunc scoring;
  bool renormalize;
  bool llama4_top1;
};

constexpr MethodRouting kMethodRouting[] = {
    {RoutingMethodType::kDefault, ScoringFunc::kSoftmax, false, false},
    {RoutingMethodType::kRenormalize, ScoringFunc::kSoftmax, true, false},
    {RoutingMethodType::kRenormalizeNaive, ScoringFunc::kSoftmax, true, false},
    {RoutingMethodType::kSigmoid, ScoringFunc::kSigmoid, false, false},
    {RoutingMethodType::kSigmoidRenorm, ScoringFunc::kSigmoid, true, false},
    {RoutingMethodType::kDeepSeekV3, ScoringFunc::kSigmoid, true, false},
    {RoutingMethodType::kMiniMax2, ScoringFunc::kSigmoid, true, false},
    {RoutingMethodType::kLlama4, ScoringFunc::kSigmoid, false, true},
};

std::vector<RoutingMethodType> supported_methods() {
  std::vector<RoutingMethodType> out;
  for (const MethodRouting& m : kMethodRouting)
    out.push_back(m.method);
  return out;
}

ExpertsCapabilities monolithic_caps() {
  ExpertsCapabilities caps;
  caps.name = kName;
  caps.format = ActivationFormat::kStandard;
  caps.monolithic = true;
  caps.device_types = {DeviceType::kCPU};
  caps.supports_no_act_and_mul = true;
  const auto acts = all_activations();
  caps.activations.assign(acts.begin(), acts.end());
  caps.quant_schemes = {QuantScheme{std::nullopt, std::nullopt}};
  caps.parallel = ParallelSupport{};
  caps.routing_methods = supported_methods();
  caps.router_logits_dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  caps.in_dtypes = {DType::kBF16, DType::kF16, DType::kF32};
  caps.supports_expert_map = true;
  caps.supports_bias = true;
  caps.supports_lora = false;
  caps.expects_unquantized_inputs = false;
  return caps;
}

// expert_map (E_global,) int32 with values in [-1, E_local), as the modular kernel checks it.
void check_expert_map(const Tensor& expert_map, int64_t global_experts, int64_t local_experts) {
  if (!expert_map.defined()) return;
  expect_shape(expert_map, "expert_map", {global_experts});
  expect_dtype(expert_map, "expert_map", {DType::kInt32});
  MOEKIT_CHECK(expert_map.device().is_cpu(), "{}: expert_map must be on the CPU, got {}", kName,
               expert_map.device().to_string());
  const std::vector<int64_t> map = expert_map.to_int_vector();
  for (int64_t e = 0; e < global_experts; ++e) {
    const int64_t v = map[static_cast<size_t>(e)];
    MOEKIT_CHECK(v >= -1 && v < local_experts,
                 "expert_map[{}]={} must be -1 or a local expert id in [0, {})", e, v,
                 local_experts);
  }
}

}  // namespace

CpuReferenceMonolithicExperts::CpuReferenceMonolithicExperts(const MoEConfig& moe,
                                                             const QuantConfig& quant,
                                                             std::optional<int64_t> max_num_tokens,
                                                             std::optional<int> num_dispatchers)
    : ExpertsMonolithic(klass(), moe, quant, max_num_tokens, num_dispatchers),
      experts_(moe, quant, max_num_tokens, num_dispatchers) {}

const ExpertsClass& CpuReferenceMonolithicExperts::klass() {
  static const ExpertsClass k(
      monolithic_caps(),
      [](const MoEConfig& moe, const QuantConfig& quant, std::optional<int64_t> max_num_tokens,
         std::optional<int> num_dispatchers) -> std::unique_ptr<Experts> {
        return std::make_unique<CpuReferenceMonolithicExperts>(moe, quant, max_num_tokens,
                                                               num_dispatchers);
      });
  return k;
}

RouterConfig CpuReferenceMonolithicExperts::router_config(const MoEConfig& moe,
                                                          const MonolithicApplyArgs& args) {
  const auto* m =
      std::find_if(std::begin(kMethodRouting), std::end(kMethodRouting),
                   [&](const MethodRouting& r) { return r.method == moe.routing_method; });
  if (m == std::end(kMethodRouting)) {
    std::string listed;
    for (const MethodRouting& r : kMethodRouting)
      listed += (listed.empty() ? "" : ", ") + std::string(routing_method_name(r.method));
    throw UnsupportedError(fmt::format("{} cannot route with routing method {}; it routes with {}",
                                       kName, routing_method_name(moe.routing_method), listed));
  }
  RouterConfig r;
  r.num_experts =
      static_cast<int>(args.global_num_experts > 0 ? args.global_num_experts : moe.num_experts);
  r.top_k = moe.experts_per_token;
  r.scoring = m->scoring;
  r.renormalize = m->renormalize;
  r.llama4_top1 = m->llama4_top1;
  const int groups = args.num_expert_group.value_or(0);
  r.use_grouped_topk = groups > 0;
  r.num_expert_group = groups;
  r.topk_group = args.topk_group.value_or(0);
  r.routed_scaling_factor = args.routed_scaling_factor;
  r.e_score_correction_bias = args.e_score_correction_bias;
  return r;
}

Tensor CpuReferenceMonolithicExperts::apply(const MonolithicApplyArgs& args, RunContext ctx) {
  const Tensor& x = args.hidden_states;
  expect_defined(x, "hidden_states");
  expect_dim(x, "hidden_states", 2);
  expect_dtype(x, "hidden_states", {DType::kBF16, DType::kF16, DType::kF32});
  MOEKIT_CHECK(x.device().is_cpu(), "{}: hidden_states must be on the CPU, got {}", kName,
               x.device().to_string());
  MOEKIT_CHECK(!args.a1q_scale.defined(),
               "{}: a1q_scale is set but the reference experts take unquantized inputs only",
               kName);
  expect_dim(args.w1, "w1", 3);
  expect_dim(args.w2, "w2", 3);
  // Unquantized weights must be in the activations' dtype (as the modular kernel requires).
  MOEKIT_CHECK(args.w1.dtype() == x.dtype() && args.w2.dtype() == x.dtype(),
               "w1 ({}) and w2 ({}) must have the dtype of hidden_states ({})",
               dtype_name(args.w1.dtype()), dtype_name(args.w2.dtype()), dtype_name(x.dtype()));
  const int64_t M = x.size(0);
  const int64_t K = x.size(1);
  const RouterConfig config = router_config(moe_config(), args);
  expect_shape(args.router_logits, "router_logits", {M, config.num_experts});
  check_expert_map(args.expert_map, config.num_experts, args.w1.size(0));
  const std::unique_ptr<Router> router = make_router(config);  // validates the config
  const bool weight_on_input =
      args.apply_router_weight_on_input || router->apply_router_weight_on_input();
  if (M == 0) {
    // The router and experts still check their inputs; nothing to compute.
    (void)router->select_experts(x, args.router_logits, ctx);
    return Tensor::empty({0, K}, x.dtype());
  }

  // [Router]
  const RoutingResult routed = router->select_experts(x, args.router_logits, ctx);
  ctx.stage_done("router");

  // [Prepare]: the same fold as PrepareFinalizeNoEP.
  const Tensor a1 =
      weight_on_input ? detail::apply_router_weight_to_input(x, routed.topk_weights, kName) : x;

  // [Experts]: unweighted (M, topk, K) rows in the workspace dtype (the activations' dtype).
  const int64_t topk = routed.topk_ids.size(1);
  Tensor fused = Tensor::empty({M, topk, K}, experts_.workspace_dtype(x.dtype()));
  ExpertsApplyArgs experts_args;
  experts_args.output = fused;
  experts_args.hidden_states = a1;
  experts_args.w1 = args.w1;
  experts_args.w2 = args.w2;
  experts_args.topk_weights = routed.topk_weights;
  experts_args.topk_ids = routed.topk_ids;
  experts_args.activation = args.activation;
  experts_args.global_num_experts = config.num_experts;
  experts_args.expert_map = args.expert_map;
  experts_args.apply_router_weight_on_input = weight_on_input;
  experts_.apply(experts_args, ctx);
  ctx.stage_done("experts");

  // [Weight and reduce] into a new (M, K) tensor of the activations' dtype.
  Tensor out = experts_.finalize_weight_and_reduce_impl()->apply(
      Tensor::empty({M, K}, x.dtype()), fused, routed.topk_weights, routed.topk_ids,
      weight_on_input, ctx);
  ctx.stage_done("finalize");
  return out;
}

// NOTE: last on purpose. On the CPU, routing inside the experts saves nothing: it runs the same
// router and the same reference pipeline as "cpu" (bitwise the same result), so it can only win
// when forced, which is what it is for: exercising the monolithic path end to end. A GPU
// monolithic kernel, which fuses the router into the experts' launch, would rank first instead.
MOEKIT_REGISTER_EXPERTS_BACKEND(cpu_monolithic, [] {
  ExpertsBackend b;
  b.oracle = QuantOracleKind::kUnquantized;
  b.name = "cpu_monolithic";
  b.priority = kPriorityCpu + 90;
  b.classes = {&CpuReferenceMonolithicExperts::klass()};
  b.description = "the CPU reference routing inside the experts (router logits in)";
  return b;
}());

}  // namespace moekit
