#include "moekit/router/router.h"

#include <fmt/format.h>

#include <cmath>
#include <string>
#include <utility>

#include "core/cuda_seam.h"
#include "core/elementwise.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/core/logging.h"
#include "router/cuda/route_on_device.h"

namespace moekit {

// ---- RouterConfig -------------------------------------------------------------------------------

RoutingMethodType RouterConfig::routing_method_type() const {
  if (llama4_top1) return RoutingMethodType::kLlama4;
  return routing_method_type_for(scoring, top_k, renormalize,
                                 use_grouped_topk ? num_expert_group : 0, has_bias(),
                                 routed_scaling_factor);
}

void RouterConfig::validate() const {
  MOEKIT_CHECK(num_experts >= 1, "RouterConfig.num_experts={} must be >= 1", num_experts);
  MOEKIT_CHECK(top_k >= 1, "RouterConfig.top_k={} must be >= 1", top_k);
  MOEKIT_CHECK(top_k <= num_experts, "RouterConfig.top_k={} > num_experts={}", top_k, num_experts);
  if (routed_scaling_factor) {
    const float s = *routed_scaling_factor;
    MOEKIT_CHECK(std::isfinite(s) && s > 0.0f,
                 "RouterConfig.routed_scaling_factor={} must be finite and > 0", s);
  }
  if (has_bias()) {
    const Tensor& b = e_score_correction_bias;
    expect_dtype(b, "e_score_correction_bias", {DType::kF32});
    expect_shape(b, "e_score_correction_bias", {num_experts});
    expect_contiguous(b, "e_score_correction_bias");
    if (b.device().is_cpu()) {
      const float* v = b.data_as<const float>();
      for (int e = 0; e < num_experts; ++e) {
        MOEKIT_CHECK(std::isfinite(v[e]), "e_score_correction_bias[{}]={} must be finite", e, v[e]);
      }
    }
  }
  if (use_grouped_topk) {
    MOEKIT_CHECK(num_expert_group >= 0, "RouterConfig.num_expert_group={} must be >= 0",
                 num_expert_group);
    if (num_expert_group > 1) {
      MOEKIT_CHECK(num_experts % num_expert_group == 0,
                   "RouterConfig: num_experts={} is not divisible by num_expert_group={}",
                   num_experts, num_expert_group);
      MOEKIT_CHECK(topk_group >= 1 && topk_group <= num_expert_group,
                   "RouterConfig.topk_group={} must be in [1, num_expert_group={}]", topk_group,
                   num_expert_group);
      // One expert per group (num_expert_group == num_experts) runs the ungrouped top-k instead.
      const int per_group = num_experts / num_expert_group;
      MOEKIT_CHECK(per_group == 1 || static_cast<int64_t>(topk_group) * per_group >= top_k,
                   "RouterConfig: top_k={} > topk_group={} * experts per group={} (the kept groups "
                   "hold too few experts)",
                   top_k, topk_group, per_group);
    } else {
      MOEKIT_CHECK(topk_group >= 0 && topk_group <= 1,
                   "RouterConfig.topk_group={} must be 0 or 1 when num_expert_group={}", topk_group,
                   num_expert_group);
    }
  }
  if (llama4_top1) {
    MOEKIT_CHECK(top_k == 1, "RouterConfig: llama4_top1 routes top-1 but top_k={}", top_k);
    MOEKIT_CHECK(!use_grouped_topk,
                 "RouterConfig: llama4_top1 cannot be combined with use_grouped_topk");
    MOEKIT_CHECK(!has_bias(), "RouterConfig: llama4_top1 takes no e_score_correction_bias (got {})",
                 e_score_correction_bias.describe());
    MOEKIT_CHECK(!routed_scaling_factor || *routed_scaling_factor == 1.0f,
                 "RouterConfig: llama4_top1 takes no routed_scaling_factor (got {})",
                 routed_scaling_factor.value_or(1.0f));
  }
}

std::string RouterConfig::to_string() const {
  std::string s;
  if (llama4_top1) {
    s = fmt::format("llama4_top1(E={}, k={}", num_experts, top_k);
  } else {
    s = fmt::format("{}(E={}, k={}, {}, {}", use_grouped_topk ? "grouped_topk" : "topk",
                    num_experts, top_k, scoring_func_name(scoring),
                    renormalize ? "renormalize" : "no renormalize");
    if (use_grouped_topk) {
      s += fmt::format(", groups={}, topk_group={}", num_expert_group, topk_group);
    }
    if (has_bias()) s += ", bias";
    if (routed_scaling_factor) s += fmt::format(", scale={}", *routed_scaling_factor);
  }
  return s + ")";
}

// ---- Router -------------------------------------------------------------------------------------

Router::Router(RouterConfig config) : config_(std::move(config)) {
  config_.validate();
}

namespace {

void check_inputs(const RouterConfig& c, const Tensor& hidden_states, const Tensor& logits) {
  expect_dtype(logits, "router_logits", {DType::kF32, DType::kBF16, DType::kF16});
  expect_shape(logits, "router_logits", {kAnyDim, c.num_experts});
  if (hidden_states.defined()) {
    expect_dim(hidden_states, "hidden_states", 2);
    MOEKIT_CHECK(hidden_states.size(0) == logits.size(0),
                 "hidden_states has {} tokens (shape {}) but router_logits has {} (shape {})",
                 hidden_states.size(0), shape_to_string(hidden_states.shape()), logits.size(0),
                 shape_to_string(logits.shape()));
    expect_device(hidden_states, "hidden_states", logits.device());
  }
  if (c.has_bias())
    expect_device(c.e_score_correction_bias, "e_score_correction_bias", logits.device());
}

}  // namespace

RoutingResult Router::select_experts(const Tensor& hidden_states, const Tensor& router_logits,
                                     RunContext ctx) const {
  check_inputs(config_, hidden_states, router_logits);
  const int64_t M = router_logits.size(0);
  RoutingResult r;
  r.topk_weights = Tensor::empty({M, config_.top_k}, DType::kF32, router_logits.device());
  r.topk_ids = Tensor::empty({M, config_.top_k}, DType::kInt32, router_logits.device());
  if (M > 0) compute(router_logits, r.topk_weights, r.topk_ids, ctx);
  return r;
}

void Router::select_experts_into(const Tensor& hidden_states, const Tensor& router_logits,
                                 const Tensor& topk_weights, const Tensor& topk_ids,
                                 RunContext ctx) const {
  check_inputs(config_, hidden_states, router_logits);
  const int64_t M = router_logits.size(0);
  expect_dtype(topk_weights, "topk_weights", {DType::kF32});
  expect_shape(topk_weights, "topk_weights", {M, config_.top_k});
  expect_device(topk_weights, "topk_weights", router_logits.device());
  expect_contiguous(topk_weights, "topk_weights");
  expect_dtype(topk_ids, "topk_ids", {DType::kInt32});
  expect_shape(topk_ids, "topk_ids", {M, config_.top_k});
  expect_device(topk_ids, "topk_ids", router_logits.device());
  expect_contiguous(topk_ids, "topk_ids");
  if (M > 0) compute(router_logits, topk_weights, topk_ids, ctx);
}

void Router::select_experts_with_extra_into(const Tensor& hidden_states,
                                            const Tensor& router_logits, const Tensor& topk_weights,
                                            const Tensor& topk_ids, ExtraSlots extra,
                                            RunContext ctx) const {
  if (extra.count == 0) {
    select_experts_into(hidden_states, router_logits, topk_weights, topk_ids, ctx);
    return;
  }
  check_inputs(config_, hidden_states, router_logits);
  const int64_t M = router_logits.size(0), k = config_.top_k, k2 = k + extra.count;
  MOEKIT_CHECK(extra.count > 0 && extra.first_id >= config_.num_experts,
               "extra slots: count={} first_id={} (ids must follow the E={} routed experts)",
               extra.count, extra.first_id, config_.num_experts);
  const Device device = router_logits.device();
  expect_tensor(topk_weights, "topk_weights with the extra slots", {M, k2}, {DType::kF32}, device);
  expect_contiguous(topk_weights, "topk_weights with the extra slots");
  expect_tensor(topk_ids, "topk_ids with the extra slots", {M, k2}, {DType::kInt32}, device);
  expect_contiguous(topk_ids, "topk_ids with the extra slots");
  if (M == 0) return;
  const RouterConfig& kc = kernel_config();
  if (device.is_cuda()) {
    if constexpr (kCudaBuild) {
      route_on_device_into(kc, router_logits, topk_weights, topk_ids, ctx, extra);
      return;
    } else {
      throw_no_cuda("routing with extra slots on a GPU");
    }
  }
  // The CPU: route into (M, k), then widen each row (as the layer's append_shared_slots).
  const Tensor w = Tensor::empty({M, k}, DType::kF32), ids = Tensor::empty({M, k}, DType::kInt32);
  route_cpu(kc, router_logits, w, ids);
  Tensor out_w = topk_weights, out_ids = topk_ids;
  append_shared_slots(ids, w, extra.first_id, extra.count, Tensor{}, Tensor{}, out_ids, out_w,
                      Stream{});
}

void Router::compute(const Tensor& router_logits, const Tensor& topk_weights,
                     const Tensor& topk_ids, RunContext ctx) const {
  if (router_logits.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      route_on_device_into(kernel_config(), router_logits, topk_weights, topk_ids, ctx);
    } else {
      throw_no_cuda(fmt::format("routing router_logits {} (router {})", router_logits.describe(),
                                kernel_config().to_string()));
    }
  } else {
    route_cpu(kernel_config(), router_logits, topk_weights, topk_ids);
  }
}

// ---- concrete routers ---------------------------------------------------------------------------

FusedTopKRouter::FusedTopKRouter(RouterConfig config) : Router(std::move(config)) {
  const RouterConfig& c = this->config();
  MOEKIT_CHECK(!c.has_bias(),
               "FusedTopKRouter takes no e_score_correction_bias (got {}); use "
               "FusedTopKBiasRouter or make_router",
               c.e_score_correction_bias.describe());
  MOEKIT_CHECK(!c.use_grouped_topk && !c.llama4_top1,
               "FusedTopKRouter cannot run {}; use make_router", c.to_string());
}

FusedTopKBiasRouter::FusedTopKBiasRouter(RouterConfig config) : Router(std::move(config)) {
  const RouterConfig& c = this->config();
  MOEKIT_CHECK(c.has_bias(), "FusedTopKBiasRouter needs an e_score_correction_bias ({})",
               c.to_string());
  MOEKIT_CHECK(!c.use_grouped_topk && !c.llama4_top1,
               "FusedTopKBiasRouter cannot run {}; use make_router", c.to_string());
}

namespace {
// Grouping changes nothing with one group, or with one expert per group (the kept groups then hold
// at least top_k experts, and selecting the best experts of the best one-expert groups is plain
// top-k); the seed falls back to the ungrouped routers there.
bool grouping_changes_selection(const RouterConfig& c) {
  return c.use_grouped_topk && c.num_expert_group > 1 && c.num_expert_group < c.num_experts;
}
}  // namespace

GroupedTopKRouter::GroupedTopKRouter(RouterConfig config)
    : Router(std::move(config)), kernel_config_(this->config()) {
  MOEKIT_CHECK(this->config().use_grouped_topk, "GroupedTopKRouter needs use_grouped_topk ({})",
               this->config().to_string());
  if (!grouping_changes_selection(kernel_config_)) {
    log::debug(
        fmt::format("GroupedTopKRouter: the grouping of {} selects like plain top-k; "
                    "running the ungrouped top-k",
                    kernel_config_.to_string()));
    kernel_config_.use_grouped_topk = false;
    kernel_config_.num_expert_group = 0;
    kernel_config_.topk_group = 0;
  }
}

Llama4Router::Llama4Router(RouterConfig config) : Router(std::move(config)) {
  MOEKIT_CHECK(this->config().llama4_top1, "Llama4Router needs llama4_top1 ({})",
               this->config().to_string());
}

std::unique_ptr<Router> make_router(const RouterConfig& config) {
  config.validate();
  // NOTE: the seed leaves the grouped router only for an Unspecified routing method, which softmax
  // and sigmoid scoring never give; a grouping that changes nothing runs the ungrouped top-k inside
  // GroupedTopKRouter, which keeps the config's routing method (e.g. DeepSeekV3 with one group).
  std::unique_ptr<Router> router;
  if (config.use_grouped_topk) {
    router = std::make_unique<GroupedTopKRouter>(config);
  } else if (config.llama4_top1) {
    router = std::make_unique<Llama4Router>(config);
  } else if (config.has_bias()) {
    router = std::make_unique<FusedTopKBiasRouter>(config);
  } else {
    router = std::make_unique<FusedTopKRouter>(config);
  }
  log::debug(fmt::format("make_router: {} for {}", router->name(), config.to_string()));
  return router;
}

}  // namespace moekit
