#include "moekit/layer/moe_layer.h"

#include <fmt/format.h>

#include <cmath>

#include "core/elementwise.h"
#include "moekit/core/checks.h"
#include "moekit/core/logging.h"
#include "moekit/experts/cpu_reference.h"
#include "moekit/oracle/unquantized.h"

namespace moekit {
namespace {

// Deterministic uniform value in [-1, 1) for element `i` of stream `seed` (splitmix64).
float hashed_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

Tensor random_host(const Shape& shape, DType dtype, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    store_float(t.data(), dtype, i, scale * hashed_uniform(seed, static_cast<uint64_t>(i)));
  }
  return t;
}

Tensor on_device(Tensor host, Device device) {
  return device.is_cpu() ? host : host.to(device);
}

void check_weight(const Tensor& t, std::string_view name, std::initializer_list<int64_t> shape,
                  DType dtype, Device device) {
  expect_shape(t, name, shape);
  expect_dtype(t, name, {dtype});
  expect_device(t, name, device);
  expect_contiguous(t, name);
}

}  // namespace

MoEConfig MoELayer::make_moe_config(const ModelPreset& model, const MoELayerOptions& options) {
  MoEConfig moe;
  moe.num_experts = model.num_experts;
  moe.experts_per_token = model.top_k;
  moe.hidden_dim = model.hidden_size;
  moe.intermediate_size = model.intermediate_size;
  moe.parallel = options.parallel;
  MOEKIT_CHECK(model.num_experts % options.parallel.ep_size == 0,
               "num_experts={} must be divisible by ep_size={}", model.num_experts,
               options.parallel.ep_size);
  moe.num_local_experts = model.num_experts / options.parallel.ep_size;
  moe.num_logical_experts = model.num_experts;
  moe.activation = model.activation;
  moe.device = options.device;
  moe.routing_method = model.routing_method();
  moe.in_dtype = options.dtype;
  moe.router_logits_dtype = DType::kF32;
  moe.hidden_dim_unpadded = model.hidden_size;
  moe.intermediate_size_per_partition_unpadded = model.intermediate_size / options.parallel.tp_size;
  moe.moe_backend = options.backend;
  moe.max_num_tokens = options.max_num_tokens;
  moe.has_bias = model.has_bias;
  moe.swiglu_limit = model.swiglu_limit;
  moe.swiglu_alpha = model.swiglu_alpha;
  moe.swiglu_beta = model.swiglu_beta;
  moe.validate();
  return moe;
}

RouterConfig MoELayer::make_router_config(const ModelPreset& model, const Tensor& bias) {
  RouterConfig r;
  r.num_experts = model.num_experts;
  r.top_k = model.top_k;
  r.scoring = model.scoring;
  r.renormalize = model.renormalize;
  r.use_grouped_topk = model.num_expert_group > 0;
  r.num_expert_group = model.num_expert_group;
  r.topk_group = model.topk_group;
  r.routed_scaling_factor = model.routed_scaling_factor;
  r.e_score_correction_bias = bias;
  r.llama4_top1 = model.llama4_top1;
  return r;
}

MoELayerWeights MoELayer::random_weights(const ModelPreset& model, const MoELayerOptions& options,
                                         uint64_t seed) {
  const MoEConfig moe = make_moe_config(model, options);
  const int64_t E = moe.num_local_experts;
  const int64_t H = model.hidden_size;
  const int64_t I = moe.intermediate_size_per_partition();
  const int64_t N = is_gated(model.activation) ? 2 * I : I;
  const Device device = options.device.device();
  const uint64_t rank_seed = seed * 1000003ull + static_cast<uint64_t>(options.parallel.ep_rank);
  MoELayerWeights w;
  // Scaled so that GEMM outputs stay O(1) for O(1) inputs.
  const float s1 = 1.0f / std::sqrt(static_cast<float>(H));
  const float s2 = 1.0f / std::sqrt(static_cast<float>(I));
  w.w13 = on_device(random_host({E, N, H}, options.dtype, rank_seed + 1, 2.0f * s1), device);
  w.w2 = on_device(random_host({E, H, I}, options.dtype, rank_seed + 2, 2.0f * s2), device);
  if (model.has_bias) {
    w.w13_bias = on_device(random_host({E, N}, options.dtype, rank_seed + 3, 0.1f), device);
    w.w2_bias = on_device(random_host({E, H}, options.dtype, rank_seed + 4, 0.1f), device);
  }
  if (model.has_e_score_correction_bias) {
    w.e_score_correction_bias =
        on_device(random_host({model.num_experts}, DType::kF32, seed + 5, 0.05f), device);
  }
  if (model.num_shared_experts > 0) {
    const int64_t Is = model.shared_intermediate_size * model.num_shared_experts;
    const int64_t Ns = is_gated(model.activation) ? 2 * Is : Is;
    w.shared_w13 = on_device(random_host({Ns, H}, options.dtype, seed + 6, 2.0f * s1), device);
    w.shared_w2 = on_device(
        random_host({H, Is}, options.dtype, seed + 7, 2.0f / std::sqrt(static_cast<float>(Is))),
        device);
  }
  return w;
}

MoELayer::MoELayer(const ModelPreset& model, MoELayerWeights weights, MoELayerOptions options)
    : model_(model), options_(std::move(options)), weights_(std::move(weights)) {
  moe_ = make_moe_config(model_, options_);
  const Device device = options_.device.device();
  MOEKIT_CHECK(options_.device.present, "cannot build a layer on {}: the device is not present",
               options_.device.to_string());
  const int64_t E = moe_.num_local_experts;
  const int64_t H = moe_.hidden_dim;
  const int64_t I = moe_.intermediate_size_per_partition();
  const int64_t N = moe_.is_act_and_mul() ? 2 * I : I;
  check_weight(weights_.w13, "w13", {E, N, H}, options_.dtype, device);
  check_weight(weights_.w2, "w2", {E, H, I}, options_.dtype, device);
  MOEKIT_CHECK(weights_.w13_bias.defined() == model_.has_bias &&
                   weights_.w2_bias.defined() == model_.has_bias,
               "model {} {} expert biases but w13_bias is {} and w2_bias is {}", model_.name,
               model_.has_bias ? "has" : "has no", weights_.w13_bias.defined() ? "given" : "absent",
               weights_.w2_bias.defined() ? "given" : "absent");
  if (model_.has_bias) {
    check_weight(weights_.w13_bias, "w13_bias", {E, N}, options_.dtype, device);
    check_weight(weights_.w2_bias, "w2_bias", {E, H}, options_.dtype, device);
  }

  // This rank owns experts [first, first + E_local); the expert_map sends the others to -1.
  first_local_expert_ = static_cast<int>(moe_.parallel.ep_rank * E);
  if (moe_.parallel.use_ep) {
    std::vector<int64_t> map(static_cast<size_t>(moe_.num_experts), -1);
    for (int64_t e = 0; e < E; ++e)
      map[first_local_expert_ + e] = e;
    expert_map_ = on_device(Tensor::from_ints(map, {moe_.num_experts}, DType::kInt32), device);
  }

  router_ = make_router(make_router_config(model_, weights_.e_score_correction_bias));

  UnquantizedMoEKernelOracle oracle(moe_);
  report_ = oracle.explain();
  const auto selection = oracle.select_backend();
  auto [w13, w2] =
      oracle.convert_to_kernel_format(selection.backend, moe_, weights_.w13, weights_.w2);
  weights_.w13 = w13;
  weights_.w2 = w2;

  std::shared_ptr<SharedExperts> shared;
  if (model_.num_shared_experts > 0) {
    MOEKIT_CHECK(weights_.shared_w13.defined() && weights_.shared_w2.defined(),
                 "model {} has {} shared expert(s) but shared_w13/shared_w2 were not given",
                 model_.name, model_.num_shared_experts);
    MOEKIT_CHECK(device.is_cpu(), "shared experts on {} are not available yet", device.to_string());
    shared = std::make_shared<CpuReferenceSharedExperts>(
        weights_.shared_w13, weights_.shared_w2, model_.activation, moe_.activation_params());
  }
  const QuantConfig quant = model_.has_bias
                                ? QuantConfig::biased(weights_.w13_bias, weights_.w2_bias)
                                : QuantConfig::unquantized();
  kernel_ = oracle.make_kernel(quant, moe_, selection.backend, *selection.experts, shared);

  workspace_ = std::make_unique<WorkspaceManager>(device);
  const auto [b0, b1] =
      kernel_->workspace_bytes(options_.max_num_tokens, N, H, model_.top_k, moe_.num_experts, E,
                               moe_.activation, options_.dtype);
  workspace_->reserve(b0, b1);
  workspace_->set_growth_locked(device.is_cuda());
}

Tensor MoELayer::forward(const Tensor& hidden_states, const Tensor& router_logits, RunContext ctx) {
  expect_shape(router_logits, "router_logits",
               {hidden_states.defined() ? hidden_states.size(0) : kAnyDim, moe_.num_experts});
  const RoutingResult routing = router_->select_experts(hidden_states, router_logits, ctx);
  return forward_routed(hidden_states, routing.topk_ids, routing.topk_weights, ctx);
}

Tensor MoELayer::forward_routed(const Tensor& hidden_states, const Tensor& topk_ids,
                                const Tensor& topk_weights, RunContext ctx) {
  expect_shape(hidden_states, "hidden_states", {kAnyDim, moe_.hidden_dim});
  expect_dtype(hidden_states, "hidden_states", {options_.dtype});
  expect_device(hidden_states, "hidden_states", options_.device.device());
  MOEKIT_CHECK(hidden_states.size(0) <= options_.max_num_tokens,
               "hidden_states has M={} tokens but the layer was built for max_num_tokens={}",
               hidden_states.size(0), options_.max_num_tokens);
  Tensor ids = topk_ids;
  if (topk_ids.defined() && topk_ids.dtype() == DType::kInt64) {
    ids = Tensor::empty(topk_ids.shape(), DType::kInt32, topk_ids.device());
    convert_ids_to_int32(topk_ids, ids, ctx.stream);
  }
  if (ctx.workspace == nullptr) ctx.workspace = workspace_.get();
  ModularApplyArgs args;
  args.hidden_states = hidden_states;
  args.w1 = weights_.w13;
  args.w2 = weights_.w2;
  args.topk_weights = topk_weights;
  args.topk_ids = ids;
  args.activation = moe_.activation;
  args.global_num_experts = moe_.num_experts;
  args.expert_map = expert_map_;
  args.apply_router_weight_on_input = router_->apply_router_weight_on_input();
  MoEOutput out = kernel_->apply(args, ctx);
  if (out.shared_output.defined()) add_inplace(out.output, out.shared_output, ctx.stream);
  return out.output;
}

}  // namespace moekit
