// Device entry points of the Hopper experts (experts/cuda/sm90_experts.cu): the launch sequences
// behind Sm90GroupedExperts, Sm90BatchedExperts and Sm90SharedExperts
// (include/moekit/experts/sm90_experts.h). Only moekit types: host code reaches them through the
// seam of core/cuda_seam.h.
#pragma once

#include "moekit/experts/sm90_experts.h"

namespace moekit::sm90 {

// Workspaces of the Standard-format launch sequence (align tables live in workspace2).
WorkspaceShapes grouped_workspace_shapes(const MoEConfig& moe, int64_t M, int64_t N, int64_t K,
                                         int64_t topk, int64_t local_num_experts,
                                         Activation activation);

// align -> GEMM1 (+ fused activation) -> (activation) -> GEMM2 -> weighted unpermute.
void grouped_apply(const ExpertsModular& experts, const ExpertsApplyArgs& args, RunContext ctx);
// GEMM1 (+ fused activation) -> (activation) -> GEMM2 on the batched schedule.
void batched_apply(const ExpertsModular& experts, const ExpertsApplyArgs& args, RunContext ctx);

// The shared dense MLP of Sm90SharedExperts: its weights and the buffers allocated once.
struct SharedMlp {
  Tensor w13, w2;           // (N, H), (H, I)
  Tensor hidden, act, out;  // (max_tokens, N), (max_tokens, I), (max_tokens, H)
  Tensor offsets;           // (2,) int32 on the device: {0, M} of the single "expert"
  Activation activation = Activation::kSilu;
  ActivationParams params;
};
// GEMM1 -> activation -> GEMM2 over every token of x (M, H); returns mlp.out's first M rows.
Tensor shared_forward(SharedMlp& mlp, const Tensor& x, RunContext ctx);

}  // namespace moekit::sm90
