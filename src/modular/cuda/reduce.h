// Device entry point of TopKWeightAndReduceContiguous (modular/cuda/reduce.cu): the CPU
// implementation in topk_weight_and_reduce.cpp hands CUDA tensors to it.
#pragma once

#include "moekit/core/device.h"
#include "moekit/core/tensor.h"

namespace moekit {

// output[m, :] = sum_j w[m, j] * y[m, j, :] in order j = 0..topk-1, fp32 accumulation, rounded once
// to output's dtype; slots whose id is negative contribute nothing; w = 1 when
// apply_router_weight_on_input. Runs on `stream`, no host synchronization.
//   output               (M, K) any float dtype, contiguous, written (not read)
//   fused_expert_output  (M, topk, K) contiguous, same device
//   topk_weights         (M, topk) f32; undefined when apply_router_weight_on_input
//   topk_ids             (M, topk) int32 or int64; undefined: every slot is valid
void reduce_topk_on_device(const Tensor& output, const Tensor& fused_expert_output,
                           const Tensor& topk_weights, const Tensor& topk_ids,
                           bool apply_router_weight_on_input, Stream stream);

}  // namespace moekit
