#include "moekit/prepare_finalize/no_ep.h"

#include <memory>
#include <optional>

#include "moekit/comm/communicator.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/prepare_finalize/factory.h"
#include "prepare_finalize/exchange_common.h"
#include "prepare_finalize/prepare_common.h"

namespace moekit {
namespace {

constexpr const char* kWho = "PrepareFinalizeNoEP";

}  // namespace

PrepareResult PrepareFinalizeNoEP::prepare(const PrepareArgs& args, RunContext ctx) {
  detail::check_prepare_args(args, kWho);
  Tensor a1 = args.a1;
  if (args.apply_router_weight_on_input) {
    a1 = detail::apply_router_weight_to_input(a1, args.topk_weights, kWho, &weighted_input_,
                                              ctx.stream);
  }
  QuantizedInput q =
      detail::maybe_quantize_input(a1, args.quant_config, args.defer_input_quant, ctx);
  PrepareResult result;
  result.a1q = std::move(q.data);
  result.a1q_scale = std::move(q.scale);
  return result;
}

std::vector<WorkspaceRequest> PrepareFinalizeNoEP::workspace_requests(
    int64_t max_num_tokens, int64_t hidden, int64_t, DType, const QuantConfig& quant) const {
  return detail::input_quant_requests(max_num_tokens, hidden, quant);
}

void PrepareFinalizeNoEP::finalize(const FinalizeArgs& args, RunContext ctx) {
  expect_defined(args.output, "output");
  detail::resolve_weight_and_reduce(args.weight_and_reduce)
      ->apply(args.output, args.fused_expert_output, args.topk_weights, args.topk_ids,
              args.apply_router_weight_on_input, ctx);
}

// NOTE: there is no communication to overlap on one rank; the async variants only postpone the
// work to the hook (or, when the hook is skipped, the receiver) so the kernel's async schedule is
// exercised with the same results as the synchronous calls.
AsyncHandle<PrepareResult> PrepareFinalizeNoEP::prepare_async(const PrepareArgs& args,
                                                              RunContext ctx) {
  auto state = std::make_shared<std::optional<PrepareResult>>();
  auto run = [this, args, ctx, state]() {
    if (!state->has_value()) *state = prepare(args, ctx);
  };
  AsyncHandle<PrepareResult> handle;
  handle.hook = run;
  handle.receiver = [run, state]() {
    run();
    return **state;
  };
  return handle;
}

AsyncHandle<void> PrepareFinalizeNoEP::finalize_async(const FinalizeArgs& args, RunContext ctx) {
  auto done = std::make_shared<bool>(false);
  auto run = [this, args, ctx, done]() {
    if (!*done) {
      finalize(args, ctx);
      *done = true;
    }
  };
  AsyncHandle<void> handle;
  handle.hook = run;
  handle.receiver = run;
  return handle;
}

int64_t PrepareFinalizePassThrough::max_dispatched_tokens(int64_t max_num_tokens) const {
  return max_num_tokens * (comm_ != nullptr ? comm_->world_size() : 1);
}

PrepareMonolithicResult PrepareFinalizeMonolithicNoEP::prepare(const Tensor& a1,
                                                               const Tensor& router_logits,
                                                               const QuantConfig& quant_config,
                                                               bool defer_input_quant,
                                                               RunContext ctx) {
  expect_defined(a1, "a1");
  expect_dim(a1, "a1", 2);
  expect_dtype(a1, "a1", {DType::kBF16, DType::kF16, DType::kF32});
  expect_defined(router_logits, "router_logits");
  expect_shape(router_logits, "router_logits", {a1.size(0), kAnyDim});
  QuantizedInput q = detail::maybe_quantize_input(a1, &quant_config, defer_input_quant, ctx);
  return PrepareMonolithicResult{std::move(q.data), std::move(q.scale), router_logits};
}

Tensor PrepareFinalizeMonolithicNoEP::finalize(const Tensor& fused_expert_output, RunContext ctx) {
  return fused_expert_output;
}

// ---- factory registration ----------------------------------------------------------------------

MOEKIT_REGISTER_PREPARE_FINALIZE(no_ep, [] {
  PrepareFinalizeFactory f;
  f.name = "no_ep";
  f.all2all = std::nullopt;
  f.priority = 10;
  f.description = "no token exchange: quantize in prepare, weight and reduce in finalize";
  f.check = [](const PrepareFinalizeRequest& r) -> std::string {
    if (is_batched(r.experts->activation_format())) {
      return r.experts->name() + " takes the batched format";
    }
    return {};
  };
  f.make = [](const PrepareFinalizeRequest& r) -> std::unique_ptr<PrepareFinalize> {
    if (r.experts->is_monolithic()) return std::make_unique<PrepareFinalizeMonolithicNoEP>();
    return std::make_unique<PrepareFinalizeNoEP>();
  };
  return f;
}());

MOEKIT_REGISTER_PREPARE_FINALIZE(passthrough, [] {
  PrepareFinalizeFactory f;
  f.name = "passthrough";
  f.all2all = All2AllBackend::kMegakernel;
  f.priority = 40;
  f.description =
      "DP+EP for experts that exchange tokens themselves (the megakernel): prepare and finalize "
      "of one rank, the communicator handed to the experts";
  f.check = [](const PrepareFinalizeRequest& r) -> std::string {
    if (r.experts->is_monolithic() || !r.experts->caps().parallel.requires_ep) {
      return r.experts->name() +
             " does not exchange tokens itself (only the megakernel experts do)";
    }
    return detail::check_exchange_request(r, /*batched=*/false, /*bootstrap_only=*/true);
  };
  f.make = [](const PrepareFinalizeRequest& r) -> std::unique_ptr<PrepareFinalize> {
    return std::make_unique<PrepareFinalizePassThrough>(r.comm);
  };
  return f;
}());

}  // namespace moekit
