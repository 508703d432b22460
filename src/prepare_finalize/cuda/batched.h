// Device entry points of PrepareFinalizeBatched (prepare_finalize/cuda/batched.cu).
//
// prepare: align (count, sort by local expert, expert_map applied) then scatter the token rows
// into a1q (E_local, T, K) in the same order as the CPU path (increasing token, then slot);
// finalize: the weighted combine of the experts' (E_local, T, K) output back to (M, K), reading the
// routing tables prepare left behind. Buffers are sized for T tokens on first use and reused.
#pragma once

#include <memory>

#include "moekit/modular/prepare_finalize.h"

namespace moekit::detail {

struct BatchedDeviceState;

// Scatters a1 (M, K) (already router-weighted if needed) on its GPU. Tokens an expert receives
// beyond T are dropped (the CPU path rejects them; on the GPU M <= T rules that out unless a row
// repeats an expert).
PrepareResult batched_prepare_device(std::shared_ptr<BatchedDeviceState>& state, const Tensor& a1,
                                     const Tensor& topk_ids, const Tensor& expert_map,
                                     int64_t num_global_experts, int num_local_experts, int64_t T,
                                     int rank, RunContext ctx);

// output (M, K) = sum over each token's slots of w * y[e, t, :], in slot order, fp32 accumulation.
void batched_finalize_device(const std::shared_ptr<BatchedDeviceState>& state, Tensor output,
                             const Tensor& fused_expert_output, const Tensor& topk_weights,
                             bool apply_router_weight_on_input, RunContext ctx);

}  // namespace moekit::detail
