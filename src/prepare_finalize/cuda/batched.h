// Device entry points of PrepareFinalizeBatched (prepare_finalize/cuda/batched.cu), and the row
// movers the exchanges on GPU ranks (prepare_finalize/exchange.h) build on.
//
// prepare: align (count, sort by local expert, expert_map applied) then scatter the token rows
// into a1q (E_local, T, K) in the same order as the CPU path (increasing token, then slot);
// finalize: the weighted combine of the experts' (E_local, T, K) output back to (M, K), reading the
// routing tables prepare left behind. Buffers are sized for T tokens on first use and reused.
// exchange_pack_device / gather_rows_device / sum_rows_device: the low-latency exchange's
// reordering of received rows by expert, and the all-to-all's row gather and per-token sum.
#pragma once

#include <memory>

#include "moekit/modular/prepare_finalize.h"

namespace moekit::detail {

struct BatchedDeviceState;

// Scatters a1 (M, K) (already router-weighted if needed, or its codes) on its GPU, and a1_scale
// (M, G) f32 beside it when defined (the codes' per-row scales: a1q_scale (E_local, T, G)).
// Tokens an expert receives beyond T are dropped (the CPU path rejects them; on the GPU M <= T
// rules that out unless a row repeats an expert).
PrepareResult batched_prepare_device(std::shared_ptr<BatchedDeviceState>& state, const Tensor& a1,
                                     const Tensor& a1_scale, const Tensor& topk_ids,
                                     const Tensor& expert_map, int64_t num_global_experts,
                                     int num_local_experts, int64_t T, int rank, RunContext ctx);

// output (M, K) = sum over each token's slots of w * y[e, t, :], in slot order, fp32 accumulation.
void batched_finalize_device(const std::shared_ptr<BatchedDeviceState>& state, Tensor output,
                             const Tensor& fused_expert_output, const Tensor& topk_weights,
                             bool apply_router_weight_on_input, RunContext ctx);

// The low-latency exchange's receive side on the GPU (cuda::launch_exchange_pack): exchanged
// (W * E_local * capacity, K) rows with counts (W * E_local, 1) int32 packed into
// packed (E_local, W * capacity, K) and expert_num_tokens (E_local,) int32, or (unpack) the
// packed rows copied back into the blocks they answer (expert_num_tokens undefined).
void exchange_pack_device(const Tensor& exchanged, const Tensor& packed, const Tensor& counts,
                          const Tensor& expert_num_tokens, int world, int64_t capacity, bool unpack,
                          RunContext ctx);

// out (n, ...) = src's rows index[i] (int32 on the GPU; zeros where index[i] < 0), bitwise.
void gather_rows_device(const Tensor& src, const Tensor& index, const Tensor& out, RunContext ctx);

// output (M, K) = sum over j < per_token of rows[row_of[m * per_token + j]] (-1: none), in j
// order, f32 accumulation, rounded once (the all-to-all combine's partials of each token).
void sum_rows_device(const Tensor& output, const Tensor& rows, const Tensor& row_of, int per_token,
                     RunContext ctx);

}  // namespace moekit::detail
