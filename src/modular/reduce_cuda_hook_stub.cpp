// Without the CUDA path there is no device reduction: say so clearly.
#ifndef MOEKIT_WITH_CUDA

#include "modular/reduce_cuda_hook.h"

#include "moekit/core/error.h"

namespace moekit {

void reduce_topk_on_device(const Tensor& output, const Tensor& fused_expert_output,
                           const Tensor& topk_weights, const Tensor& topk_ids,
                           bool apply_router_weight_on_input, Stream stream) {
  throw UnsupportedError(fmt::format(
      "TopKWeightAndReduceContiguous: fused_expert_output is on {} but moekit was built without "
      "CUDA; the device reduction is unavailable (move the tensors to the CPU)",
      fused_expert_output.device().to_string()));
}

}  // namespace moekit

#endif  // MOEKIT_WITH_CUDA
