// Weighted unpermute / top-k reduce on the GPU: brings the experts' output rows back to token order
// and sums each token's k contributions.
//
//   out[m, :] (=|+=) sum_{j = 0..k-1} w(m, j) * y[row(m, j), :]
//
// in that fixed order, fp32 accumulation (fused multiply-add), output rounded once; slots whose row
// is -1 are skipped; a row with no valid slot is written as zeros (or left as is when
// accumulating). Launchers never allocate or synchronize (CUDA-graph capturable).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/elem_type.h"

namespace moekit::cuda {

// Where the expert outputs y live.
enum class UnpermuteLayout : uint8_t {
  kStandard,  // y (rows, H): row(m, j) = slot_to_row[m*k + j]
  // y (E_local, max_tokens, H): slot_to_row / expert_offsets of launch_moe_align give (e, t);
  // slots with t >= max_tokens (overflowed) are skipped.
  kBatched,
};

struct MoeUnpermuteParams {
  UnpermuteLayout layout = UnpermuteLayout::kStandard;
  const void* y = nullptr;  // see UnpermuteLayout; row stride y_row_stride elements
  ElemType y_type = ElemType::kBF16;
  int64_t y_row_stride = 0;
  const int32_t* slot_to_row = nullptr;  // (M * k,) row in y, or -1
  const float* topk_weights = nullptr;   // (M, k) fp32; unused when apply_router_weight_on_input
  bool apply_router_weight_on_input = false;  // weights were applied before GEMM1: w = 1
  int64_t num_tokens = 0;                     // M
  int top_k = 0;
  int64_t hidden = 0;  // H
  // kBatched only.
  const int32_t* expert_offsets = nullptr;  // (E_local + 1,)
  int num_local_experts = 0;
  int max_tokens = 0;

  void* out = nullptr;  // (M, H), row stride out_row_stride elements
  ElemType out_type = ElemType::kBF16;
  int64_t out_row_stride = 0;
  bool accumulate = false;  // out = round(float(out) + sum) instead of out = round(sum)
  // A row with no valid slot is left unwritten instead of zeroed (the expert-parallel peer
  // experts: most of their received rows have no expert on this rank and are never sent back).
  bool skip_empty_rows = false;
};

// nullptr when supported, else a one-line reason.
const char* moe_unpermute_unsupported_reason(const MoeUnpermuteParams& p);

cudaError_t launch_moe_unpermute(const MoeUnpermuteParams& p, cudaStream_t stream);

}  // namespace moekit::cuda
