#include "moekit/modular/kernel.h"

#include <fmt/format.h>

#include <algorithm>

#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

// Validates the routing tensors of a modular forward; on the host it also checks every id.
void check_routing(const ModularApplyArgs& args, int64_t global_experts, int64_t local_experts) {
  const Tensor& x = args.hidden_states;
  expect_dim(x, "hidden_states", 2);
  expect_dtype(x, "hidden_states", {DType::kBF16, DType::kF16, DType::kF32});
  const int64_t M = x.size(0);
  expect_dim(args.topk_ids, "topk_ids", 2);
  const int64_t topk = args.topk_ids.size(1);
  expect_shape(args.topk_ids, "topk_ids", {M, topk});
  expect_dtype(args.topk_ids, "topk_ids", {DType::kInt32});
  expect_shape(args.topk_weights, "topk_weights", {M, topk});
  expect_dtype(args.topk_weights, "topk_weights", {DType::kF32});
  MOEKIT_CHECK(topk >= 1 && topk <= global_experts, "top_k={} > num_experts={}", topk,
               global_experts);
  MOEKIT_CHECK(!args.apply_router_weight_on_input || topk == 1,
               "apply_router_weight_on_input needs top_k == 1 but top_k={}", topk);
  expect_dim(args.w1, "w1", 3);
  expect_dim(args.w2, "w2", 3);
  // Float weights have K columns; packed quantized weights (fp4, int4, fp6 bytes) have fewer, and
  // their experts check the packing.
  if (is_floating(args.w1.dtype()) && element_size(args.w1.dtype()) >= 2) {
    // Unquantized weights must be in the activations' dtype: mixing formats is never silent.
    MOEKIT_CHECK(args.w1.dtype() == x.dtype() && args.w2.dtype() == x.dtype(),
                 "w1 ({}) and w2 ({}) must have the dtype of hidden_states ({})",
                 dtype_name(args.w1.dtype()), dtype_name(args.w2.dtype()), dtype_name(x.dtype()));
    MOEKIT_CHECK(args.w1.size(2) == x.size(1), "w1 has K={} but hidden_states has hidden size {}",
                 args.w1.size(2), x.size(1));
  }
  MOEKIT_CHECK(args.w2.size(0) == local_experts && args.w2.size(1) == x.size(1),
               "w2 has shape {} but must be [{}, {}, *]", shape_to_string(args.w2.shape()),
               local_experts, x.size(1));
  for (const auto& [t, name] :
       {std::pair{&args.topk_ids, "topk_ids"}, std::pair{&args.topk_weights, "topk_weights"},
        std::pair{&args.w1, "w1"}, std::pair{&args.w2, "w2"}}) {
    expect_device(*t, name, x.device());
  }
  if (args.expert_map.defined()) {
    expect_shape(args.expert_map, "expert_map", {global_experts});
    expect_dtype(args.expert_map, "expert_map", {DType::kInt32});
    expect_device(args.expert_map, "expert_map", x.device());
    if (args.expert_map.device().is_cpu()) {
      const int32_t* map = args.expert_map.data_as<int32_t>();
      for (int64_t e = 0; e < global_experts; ++e) {
        MOEKIT_CHECK(map[e] >= -1 && map[e] < local_experts,
                     "expert_map[{}]={} must be -1 or a local expert id in [0, {})", e, map[e],
                     local_experts);
      }
    }
  }
  if (args.topk_ids.device().is_cpu() && args.topk_ids.is_contiguous()) {
    const int32_t* ids = args.topk_ids.data_as<int32_t>();
    for (int64_t i = 0; i < M * topk; ++i) {
      MOEKIT_CHECK(ids[i] >= -1 && ids[i] < global_experts,
                   "topk_ids[{}, {}]={} is outside [-1, num_experts={})", i / topk, i % topk,
                   ids[i], global_experts);
    }
  }
}

}  // namespace

FusedMoEKernel::FusedMoEKernel(std::unique_ptr<PrepareFinalize> prepare_finalize,
                               std::unique_ptr<Experts> experts,
                               std::shared_ptr<SharedExperts> shared_experts,
                               std::optional<ParallelConfig> parallel, bool inplace)
    : prepare_finalize_(std::move(prepare_finalize)),
      experts_(std::move(experts)),
      shared_experts_(std::move(shared_experts)),
      parallel_(std::move(parallel)),
      inplace_(inplace) {
  MOEKIT_CHECK(prepare_finalize_ != nullptr && experts_ != nullptr,
               "FusedMoEKernel needs a prepare/finalize and an experts part");
  MOEKIT_CHECK(
      prepare_finalize_->is_monolithic() == experts_->is_monolithic(),
      "prepare_finalize and fused_experts must both be either monolithic or non-monolithic "
      "but got {} and {}",
      prepare_finalize_->name(), experts_->name());
  if (is_monolithic()) {
    MOEKIT_CHECK(shared_experts_ == nullptr, "monolithic kernels do not take shared experts");
    MOEKIT_CHECK(!inplace_, "monolithic kernels do not support inplace");
  }
  MOEKIT_CHECK(!(inplace_ && shared_experts_), "inplace kernels cannot have shared experts");
  prepare_finalize_->post_init_setup(*experts_);
  MOEKIT_CHECK(prepare_finalize_->activation_format() == experts_->activation_format(),
               "{} produces {} activations but {} expects {}", prepare_finalize_->name(),
               activation_format_name(prepare_finalize_->activation_format()), experts_->name(),
               activation_format_name(experts_->activation_format()));
}

std::vector<WorkspaceRequest> FusedMoEKernel::workspace_requests(
    int64_t M, int64_t N, int64_t K, int64_t topk, int64_t global_num_experts,
    int64_t local_num_experts, Activation activation, DType act_dtype) const {
  std::vector<WorkspaceRequest> out =
      prepare_finalize_->workspace_requests(M, K, topk, act_dtype, experts_->quant_config());
  if (shared_experts_) {
    for (WorkspaceRequest& r : shared_experts_->workspace_requests(M))
      out.push_back(std::move(r));
  }
  if (is_monolithic()) return out;
  auto& experts = static_cast<ExpertsModular&>(*experts_);
  const int64_t m = experts.max_num_tokens().value_or(prepare_finalize_->max_dispatched_tokens(M));
  const WorkspaceShapes s = experts.workspace_shapes(m, N, K, topk, global_num_experts,
                                                     local_num_experts, nullptr, activation);
  const size_t es = element_size(experts.workspace_dtype(act_dtype));
  const int64_t slot0 = std::max(numel_of(s.workspace13), numel_of(s.output));
  out.push_back({std::string(workspace_slots::kExperts13), static_cast<size_t>(slot0) * es});
  out.push_back(
      {std::string(workspace_slots::kExperts2), static_cast<size_t>(numel_of(s.workspace2)) * es});
  return out;
}

MoEOutput FusedMoEKernel::apply(const ModularApplyArgs& args, RunContext ctx) {
  MOEKIT_CHECK(!is_monolithic(), "apply() called on a monolithic kernel; use apply_monolithic()");
  auto& pf = static_cast<PrepareFinalizeModular&>(*prepare_finalize_);
  auto& experts = static_cast<ExpertsModular&>(*experts_);
  const Tensor& x = args.hidden_states;
  expect_dim(args.w1, "w1", 3);
  const int64_t local_experts = args.w1.size(0);
  const int64_t global_experts =
      args.global_num_experts == -1 ? local_experts : args.global_num_experts;
  check_routing(args, global_experts, local_experts);
  MOEKIT_CHECK(!args.expert_map.defined() || experts.supports_expert_map(),
               "{} does not support an expert_map", experts.name());

  Tensor output;
  if (inplace_) {
    output = x;
  } else if (args.output.defined()) {
    expect_shape(args.output, "output", {x.size(0), x.size(1)});
    expect_dtype(args.output, "output", {x.dtype()});
    output = args.output;
  } else {
    output = Tensor::empty(x.shape(), x.dtype(), x.device());
  }

  // [Quantize + Dispatch]
  PrepareArgs prepare_args{x,
                           args.topk_weights,
                           args.topk_ids,
                           global_experts,
                           args.expert_map,
                           args.apply_router_weight_on_input,
                           &experts.quant_config(),
                           experts.expects_unquantized_inputs()};
  PrepareResult prepared;
  if (pf.supports_async()) {
    AsyncHandle<PrepareResult> handle = pf.prepare_async(prepare_args, ctx);
    if (handle.hook) handle.hook();
    prepared = handle.receiver();
  } else {
    prepared = pf.prepare(prepare_args, ctx);
  }
  ctx.stage_done("dispatch");  // [Quantize + Dispatch] done
  const Tensor topk_ids = prepared.topk_ids.defined() ? prepared.topk_ids : args.topk_ids;
  const Tensor topk_weights =
      prepared.topk_weights.defined() ? prepared.topk_weights : args.topk_weights;

  // [Permute -> Experts -> Unpermute]
  const ProblemSize p = experts.moe_problem_size(prepared.a1q, args.w1, args.w2, topk_ids);
  Tensor fused_out;
  if (p.M == 0 && !experts.exchanges_tokens()) {
    // A zero-size view of the experts' output shape: nothing to allocate or compute, but finalize
    // still runs (it may take part in collectives). Experts that exchange tokens themselves run:
    // the other ranks' tokens arrive here.
    const WorkspaceShapes shapes = experts.workspace_shapes(
        0, p.N, p.K, p.topk, global_experts, local_experts,
        prepared.expert_tokens_meta ? &*prepared.expert_tokens_meta : nullptr, args.activation);
    fused_out = Tensor::from_blob(x.data(), shapes.output, x.dtype(), x.device());
  } else {
    WorkspaceManager fallback(x.device());
    WorkspaceManager& ws = ctx.workspace ? *ctx.workspace : fallback;
    MOEKIT_CHECK(ws.device() == x.device(), "workspace manager is on {} but hidden_states on {}",
                 ws.device().to_string(), x.device().to_string());
    const DType ws_dtype = experts.workspace_dtype(x.dtype());
    const WorkspaceShapes shapes = experts.workspace_shapes(
        p.M, p.N, p.K, p.topk, global_experts, local_experts,
        prepared.expert_tokens_meta ? &*prepared.expert_tokens_meta : nullptr, args.activation);
    // Experts that weight and reduce themselves (finalize NoOp) can write the caller's output
    // directly, saving finalize's copy — unless it aliases the input (inplace).
    // (Not when the prepare/finalize moved tokens: its finalize combines across ranks.)
    const bool direct = !inplace_ && !prepared.topk_ids.defined() &&
                        shapes.output == output.shape() && ws_dtype == output.dtype() &&
                        output.is_contiguous() && output.device() == x.device() &&
                        dynamic_cast<const TopKWeightAndReduceNoOp*>(
                            experts.finalize_weight_and_reduce_impl().get()) != nullptr;
    const int64_t common = direct ? numel_of(shapes.workspace13)
                                  : std::max(numel_of(shapes.workspace13), numel_of(shapes.output));
    const Tensor slot0 = ws.get(workspace_slots::kExperts13, {common}, ws_dtype);
    const Tensor slot1 = ws.get(workspace_slots::kExperts2, shapes.workspace2, ws_dtype);
    // Otherwise GEMM1's workspace is reused for the experts' output: by the time GEMM2 writes it,
    // ws13 is dead.
    Tensor workspace13 = slot0.reinterpret(shapes.workspace13, ws_dtype);
    fused_out = direct ? output : slot0.reinterpret(shapes.output, ws_dtype);
    ExpertsApplyArgs apply_args;
    apply_args.output = fused_out;
    apply_args.hidden_states = prepared.a1q;
    apply_args.w1 = args.w1;
    apply_args.w2 = args.w2;
    apply_args.topk_weights = topk_weights;
    apply_args.topk_ids = topk_ids;
    apply_args.activation = args.activation;
    apply_args.global_num_experts = global_experts;
    apply_args.expert_map = args.expert_map;
    apply_args.a1q_scale = prepared.a1q_scale;
    apply_args.a2_scale = experts.a2_scale();
    apply_args.workspace13 = workspace13;
    apply_args.workspace2 = slot1;
    apply_args.expert_tokens_meta =
        prepared.expert_tokens_meta ? &*prepared.expert_tokens_meta : nullptr;
    apply_args.apply_router_weight_on_input = args.apply_router_weight_on_input;
    experts.apply(apply_args, ctx);
  }
  ctx.stage_done("experts");

  // [Combine], with the shared experts overlapping an asynchronous finalize.
  FinalizeArgs finalize_args{output,
                             fused_out,
                             topk_weights,
                             topk_ids,
                             args.apply_router_weight_on_input,
                             experts.finalize_weight_and_reduce_impl()};
  const Tensor& shared_in = args.shared_experts_input.defined() ? args.shared_experts_input : x;
  MoEOutput result;
  if (pf.supports_async()) {
    // Stage marks follow the order of the work: the shared experts, then the combine.
    AsyncHandle<void> handle = pf.finalize_async(finalize_args, ctx);
    if (shared_experts_ && !args.skip_shared_experts) {
      result.shared_output = shared_experts_->forward(shared_in, ctx);
      ctx.stage_done("shared_experts");
    }
    if (handle.hook) handle.hook();
    handle.receiver();
    ctx.stage_done("finalize");
  } else {
    pf.finalize(finalize_args, ctx);
    ctx.stage_done("finalize");
    if (shared_experts_ && !args.skip_shared_experts) {
      result.shared_output = shared_experts_->forward(shared_in, ctx);
      ctx.stage_done("shared_experts");
    }
  }
  result.output = output;
  return result;
}

Tensor FusedMoEKernel::apply_monolithic(const MonolithicApplyArgs& args, RunContext ctx) {
  MOEKIT_CHECK(is_monolithic(), "apply_monolithic() called on a modular kernel; use apply()");
  auto& pf = static_cast<PrepareFinalizeMonolithic&>(*prepare_finalize_);
  auto& experts = static_cast<ExpertsMonolithic&>(*experts_);
  expect_dim(args.hidden_states, "hidden_states", 2);
  expect_shape(args.router_logits, "router_logits", {args.hidden_states.size(0), kAnyDim});
  PrepareMonolithicResult prepared =
      pf.prepare(args.hidden_states, args.router_logits, experts.quant_config(),
                 experts.expects_unquantized_inputs(), ctx);
  MonolithicApplyArgs experts_args = args;
  experts_args.hidden_states = prepared.a1q;
  experts_args.a1q_scale = prepared.a1q_scale;
  experts_args.router_logits = prepared.router_logits;
  Tensor out = experts.apply(experts_args, ctx);
  return pf.finalize(out, ctx);
}

}  // namespace moekit
