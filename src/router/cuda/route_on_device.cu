// The device path of the routers: RouterConfig -> one launch of the top-k router kernel.
#include "router/cuda/route_on_device.h"

#include "core/cuda/cuda_check.cuh"
#include "moekit/core/checks.h"
#include "router/cuda/topk_router.h"

namespace moekit {

void route_on_device_into(const RouterConfig& config, const Tensor& router_logits,
                          const Tensor& topk_weights, const Tensor& topk_ids, RunContext ctx,
                          Router::ExtraSlots extra) {
  MOEKIT_CHECK(ctx.stream.handle != nullptr, "the GPU router needs a CUDA stream in RunContext");
  expect_dim(router_logits, "router_logits", 2);
  MOEKIT_CHECK(router_logits.stride(1) == 1, "router_logits {} must have unit column stride",
               router_logits.describe());
  cuda::TopkRouterParams p;
  p.logits = router_logits.data();
  expect_dtype(router_logits, "router_logits", {DType::kF32, DType::kBF16, DType::kF16});
  p.logits_type = cuda::elem_type_of(router_logits.dtype());
  p.logits_row_stride = router_logits.size(0) > 1 ? router_logits.stride(0) : config.num_experts;
  p.num_tokens = router_logits.size(0);
  p.num_experts = config.num_experts;
  p.top_k = config.top_k;
  if (config.llama4_top1) {
    p.scoring = cuda::RouterScoring::kLlama4;
  } else {
    p.scoring = config.scoring == ScoringFunc::kSoftmax ? cuda::RouterScoring::kSoftmax
                                                        : cuda::RouterScoring::kSigmoid;
  }
  if (config.has_bias()) {
    expect_device(config.e_score_correction_bias, "e_score_correction_bias",
                  router_logits.device());
    p.e_score_correction_bias = config.e_score_correction_bias.data_as<const float>();
  }
  if (config.use_grouped_topk) {
    p.num_expert_group = config.num_expert_group;
    p.topk_group = config.topk_group;
  }
  p.renormalize = config.renormalize && !config.llama4_top1;
  p.routed_scaling_factor = config.routed_scaling_factor.value_or(1.0f);
  p.topk_weights = topk_weights.data_as<float>();
  p.topk_ids = topk_ids.data_as<int32_t>();
  p.extra_slots = extra.count;
  p.extra_first_id = extra.first_id;
  if (const char* why = cuda::topk_router_unsupported_reason(p)) {
    MOEKIT_CHECK(false, "the GPU router cannot run {}: {}", config.to_string(), why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_topk_router(p, to_cuda(ctx.stream)));
}

}  // namespace moekit
