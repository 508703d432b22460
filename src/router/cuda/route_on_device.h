// Device entry points of moekit::Router for CUDA router logits (router/cuda/route_on_device.cu, on
// top of the kernel of router/cuda/topk_router.h). `config` is the router's kernel config: already
// validated, with any grouped fallback applied (use_grouped_topk is true only when the grouped
// selection must run). The semantics are those of include/moekit/router/router.h.
#pragma once

#include "moekit/modular/types.h"
#include "moekit/router/router.h"

namespace moekit {

// router_logits (M, E) f32/bf16/f16 on a CUDA device, unit column stride, into caller-owned
// contiguous outputs on the logits' device: topk_weights (M, k) f32, topk_ids (M, k) int32.
// Allocates nothing and never synchronizes (CUDA-graph capturable).
// With extra.count > 0 the outputs are (M, k + extra.count) and the kernel also writes the extra
// slots (Router::ExtraSlots).
void route_on_device_into(const RouterConfig& config, const Tensor& router_logits,
                          const Tensor& topk_weights, const Tensor& topk_ids, RunContext ctx,
                          Router::ExtraSlots extra = {});

}  // namespace moekit
