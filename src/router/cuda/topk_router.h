// Fused top-k router for the GPU: one launch turns router logits [M, E] into topk_weights [M, k]
// (fp32) and topk_ids [M, k] (int32). Covers softmax / sigmoid scoring, the DeepSeek-V3 grouped
// selection with an e_score_correction_bias, renormalization, routed_scaling_factor, and the
// Llama4 top-1 sigmoid router.
//
// NOTE: launchers never allocate and never synchronize with the host, so they can be captured in a
// CUDA graph. Results are deterministic (no atomics; ties go to the lower expert id).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/elem_type.h"

namespace moekit::cuda {

// How the logits become scores.
enum class RouterScoring : uint8_t {
  kSoftmax,  // scores = softmax(logits) over the E experts of the row
  kSigmoid,  // scores = sigmoid(logits)
  // Llama4: select by the raw logit, weight = sigmoid(logit). Usually top_k = 1, no renormalize.
  kLlama4,
};

// Parameters of one routing call. Pointers are device pointers.
struct TopkRouterParams {
  const void* logits = nullptr;            // (M, E) with row stride logits_row_stride elements
  ElemType logits_type = ElemType::kBF16;  // f32, bf16 or f16
  int64_t logits_row_stride = 0;           // elements between rows; >= num_experts
  int64_t num_tokens = 0;                  // M (0 is valid: nothing is launched)
  int num_experts = 0;                     // E, 1..1024
  int top_k = 0;                           // k, 1..min(32, E)
  RouterScoring scoring = RouterScoring::kSoftmax;
  // (E,) fp32 or nullptr. Added to the scores for SELECTION only; weights use unbiased scores.
  const float* e_score_correction_bias = nullptr;
  // Grouped selection (DeepSeek-V3): 0 or 1 = off. Otherwise E % num_expert_group == 0 and
  // 1 <= topk_group <= num_expert_group. Group score = sum of the top-2 selection scores of the
  // group when a bias is given, else the max score of the group.
  int num_expert_group = 0;
  int topk_group = 0;
  bool renormalize = false;            // divide the k weights by their sum (when the sum is > 0)
  float routed_scaling_factor = 1.0f;  // applied last
  float* topk_weights = nullptr;       // (M, k + extra_slots) fp32 out
  int32_t* topk_ids = nullptr;         // (M, k + extra_slots) int32 out, in decreasing score
  // Slots appended to every row after the k selected: ids extra_first_id + j, weight 1 (the
  // shared experts folded into the routed ones). 0 = none.
  int extra_slots = 0;
  int extra_first_id = 0;
};

// nullptr when the launcher supports `p`, otherwise a one-line reason.
const char* topk_router_unsupported_reason(const TopkRouterParams& p);

// Workspace: none.
inline size_t topk_router_workspace_bytes(const TopkRouterParams&) {
  return 0;
}

// Enqueues the routing kernel on `stream`. Returns cudaErrorInvalidValue when
// topk_router_unsupported_reason(p) is non-null, else the launch status.
//
// Numerics: fp32 math with the NaN / Inf rules of include/moekit/router/router.h (the CPU
// router's): a NaN logit scores 0, stays out of the softmax normalization and selects last; a
// -inf logit selects by its score (+ bias) like any other; +inf experts share the softmax mass;
// -0 and +0 select alike. ids are always distinct and in [0, E). Renormalize skips the division
// when the k weights sum to 0.
cudaError_t launch_topk_router(const TopkRouterParams& p, cudaStream_t stream);

}  // namespace moekit::cuda
