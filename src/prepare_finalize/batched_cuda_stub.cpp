// Builds without CUDA: the GPU half of PrepareFinalizeBatched is unavailable.
#ifndef MOEKIT_WITH_CUDA
#include "moekit/core/error.h"
#include "prepare_finalize/batched_cuda.h"

namespace moekit::detail {

PrepareResult batched_prepare_device(std::shared_ptr<BatchedDeviceState>&, const Tensor& a1,
                                     const Tensor&, const Tensor&, int64_t, int, int64_t, int,
                                     RunContext) {
  throw UnsupportedError("moekit: PrepareFinalizeBatched: a1 is on " + a1.device().to_string() +
                         " but moekit was built without CUDA");
}

void batched_finalize_device(const std::shared_ptr<BatchedDeviceState>&, Tensor, const Tensor&,
                             const Tensor&, bool, RunContext) {
  throw UnsupportedError("moekit: PrepareFinalizeBatched: moekit was built without CUDA");
}

}  // namespace moekit::detail
#endif
