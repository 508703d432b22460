// Routers: turn router logits (M, E) into topk_ids (M, k) int32 and topk_weights (M, k) fp32.
//
// Families (the seed's routers, created by make_router in the seed's priority order):
//   FusedTopKRouter     softmax or sigmoid scores -> top-k -> optional renormalize
//   FusedTopKBiasRouter scores + e_score_correction_bias select; weights are the unbiased scores
//   GroupedTopKRouter   DeepSeek-V3 grouped selection (num_expert_group, topk_group, bias)
//   Llama4Router        top-1 by raw logit, weight = sigmoid(logit), applied on the input
//
// Numerics (the CPU and the GPU router follow the same rules; the GPU kernel computes in fp32 with
// expf, the CPU in double rounded to f32, so weights agree to ~1e-6 relative and ids agree unless
// two selection scores are closer than that):
//   - Scores are computed from the f32 value of each logit (in double, rounded to f32); selection
//     compares the f32 selection scores; the sum of renormalization is accumulated in double.
//   - Ties go to the lower expert id (-0 and +0 tie). ids are distinct per row, in [0, E), in
//     decreasing selection score. Weights are always finite.
//   - A NaN logit selects as -inf and scores 0 (weight 0). A -inf logit is not special for the
//     selection: it selects by its score (+ bias), 0 unless the softmax row is all -inf.
//   - Softmax over a row: NaN logits are left out of the normalization. If some logit is +inf, the
//     +inf experts share the probability mass equally (one +inf expert gets 1, the rest 0). If
//     every non-NaN logit is -inf, the non-NaN experts share it equally. A row of only NaN scores 0
//     everywhere: its ids are the lowest k ids and its weights are 0.
//   - Renormalize divides by the sum of the k weights only when that sum is > 0 (an all-NaN row
//     keeps weights 0). routed_scaling_factor, when set, multiplies the weights last.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "moekit/config/routing.h"
#include "moekit/core/tensor.h"
#include "moekit/modular/types.h"

namespace moekit {

// Everything a router needs; plain data. validate() (called by every router constructor) checks it.
struct RouterConfig {
  int num_experts = 0;  // E (global)
  int top_k = 0;        // k, 1..E
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  bool renormalize = true;  // divide the k weights by their sum
  // DeepSeek-V3 grouped selection. With num_expert_group 0 or 1, or one expert per group
  // (num_expert_group == num_experts), grouping selects like plain top-k, which then runs.
  bool use_grouped_topk = false;
  int num_expert_group = 0;
  int topk_group = 0;  // groups kept per token, 1..num_expert_group
  // Multiplies the final weights (after renormalization). Finite and > 0 when set.
  std::optional<float> routed_scaling_factor;
  Tensor e_score_correction_bias;  // (E,) f32, on the logits' device; selection only. Optional.
  // Llama4 custom routing: top-1 by raw logit, weight = sigmoid(logit), weight applied on the
  // input. Ignores `scoring` and `renormalize`; takes no bias, no grouping, no scaling factor;
  // top_k = 1.
  bool llama4_top1 = false;

  bool has_bias() const { return e_score_correction_bias.defined(); }
  // kLlama4 for llama4_top1; otherwise routing_method_type_for(...) of
  // include/moekit/config/routing.h (num_expert_group counts only with use_grouped_topk).
  RoutingMethodType routing_method_type() const;
  // Throws moekit::Error naming the field, its value and the requirement (e.g. "top_k=9 >
  // num_experts=8", "num_experts=10 is not divisible by num_expert_group=4").
  void validate() const;
  // "grouped_topk(E=256, k=8, sigmoid, renormalize, groups=8, topk_group=4, bias, scale=2.5)"
  std::string to_string() const;
};

struct RoutingResult {
  Tensor topk_weights;  // (M, k) f32, on the logits' device
  Tensor topk_ids;      // (M, k) int32, on the logits' device
};

// A router: stateless apart from its config; select_experts may be called concurrently.
class Router {
 public:
  explicit Router(RouterConfig config);  // validates the config
  virtual ~Router() = default;
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  const RouterConfig& config() const { return config_; }
  virtual RoutingMethodType routing_method_type() const { return config_.routing_method_type(); }
  // True when the top-k weight multiplies the input of the experts instead of their output.
  virtual bool apply_router_weight_on_input() const { return false; }
  virtual std::string name() const = 0;

  // hidden_states (M, H) (only checked: 2-d, M rows, same device; may be an undefined Tensor),
  // router_logits (M, E) f32/bf16/f16, any strides. Allocates the outputs on the logits' device.
  // M = 0 returns (0, k) tensors.
  RoutingResult select_experts(const Tensor& hidden_states, const Tensor& router_logits,
                               RunContext ctx = {}) const;
  // Same, into caller-owned contiguous outputs on the logits' device: topk_weights (M, k) f32 and
  // topk_ids (M, k) int32. Allocates nothing.
  void select_experts_into(const Tensor& hidden_states, const Tensor& router_logits,
                           const Tensor& topk_weights, const Tensor& topk_ids,
                           RunContext ctx = {}) const;
  // Slots every row gains after its k selected experts: ids first_id .. first_id + count - 1 with
  // weight 1 (MoELayer's folded shared experts, written in the same launch on the GPU).
  struct ExtraSlots {
    int first_id = 0;
    int count = 0;
  };
  // select_experts_into with outputs (M, k + extra.count): the routing, then the extra slots.
  void select_experts_with_extra_into(const Tensor& hidden_states, const Tensor& router_logits,
                                      const Tensor& topk_weights, const Tensor& topk_ids,
                                      ExtraSlots extra, RunContext ctx = {}) const;

 protected:
  // The configuration the computation runs (after fallbacks), handed to the CPU and GPU paths.
  virtual const RouterConfig& kernel_config() const { return config_; }
  // Inputs already checked; outputs are (M, k) contiguous, on the logits' device. The default runs
  // the CPU reference or the device hook on kernel_config().
  virtual void compute(const Tensor& router_logits, const Tensor& topk_weights,
                       const Tensor& topk_ids, RunContext ctx) const;

 private:
  RouterConfig config_;
};

// softmax or sigmoid -> top-k -> (renormalize) -> (scale). Takes no bias and no grouping.
class FusedTopKRouter final : public Router {
 public:
  explicit FusedTopKRouter(RouterConfig config);
  std::string name() const override { return "fused_topk"; }
};

// Selection by score + e_score_correction_bias; weights are the unbiased scores of the chosen
// experts, renormalized (when renormalize) and then multiplied by routed_scaling_factor.
class FusedTopKBiasRouter final : public Router {
 public:
  explicit FusedTopKBiasRouter(RouterConfig config);
  std::string name() const override { return "fused_topk_bias"; }
};

// DeepSeek-V3 grouped top-k:
//   1. scores = softmax or sigmoid of the logits; selection score = score (+ bias when given).
//   2. group score = sum of the top-2 selection scores of the group with a bias, else their max.
//   3. keep the topk_group best groups (ties: lower group id); top-k among their experts.
//   4. weights = unbiased scores; renormalize (when renormalize), then * routed_scaling_factor.
// Needs use_grouped_topk. With num_expert_group <= 1 or one expert per group, grouping changes
// nothing and it runs the ungrouped (bias) top-k instead.
class GroupedTopKRouter final : public Router {
 public:
  explicit GroupedTopKRouter(RouterConfig config);
  std::string name() const override { return "grouped_topk"; }
  // Whether the grouped selection runs (false: the ungrouped fallback).
  bool grouping_active() const { return kernel_config_.use_grouped_topk; }

 protected:
  const RouterConfig& kernel_config() const override { return kernel_config_; }

 private:
  RouterConfig kernel_config_;
};

// Llama4: top-1 expert by raw logit, weight = sigmoid(logit), applied on the input.
class Llama4Router final : public Router {
 public:
  explicit Llama4Router(RouterConfig config);
  RoutingMethodType routing_method_type() const override { return RoutingMethodType::kLlama4; }
  bool apply_router_weight_on_input() const override { return true; }
  std::string name() const override { return "llama4_top1"; }
};

// The seed's create_fused_moe_router priority: GroupedTopKRouter (use_grouped_topk; it runs the
// ungrouped top-k itself when the grouping changes nothing) -> Llama4Router (llama4_top1) ->
// FusedTopKBiasRouter (bias given) -> FusedTopKRouter. Validates the config first.
std::unique_ptr<Router> make_router(const RouterConfig& config);

// The CPU reference: routes every row of router_logits (M, E) (f32/bf16/f16, any strides, on the
// CPU) with `config` (validated by the caller) into contiguous CPU outputs (M, k).
void route_cpu(const RouterConfig& config, const Tensor& router_logits, const Tensor& topk_weights,
               const Tensor& topk_ids);

}  // namespace moekit
