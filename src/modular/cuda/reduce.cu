// The device half of TopKWeightAndReduceContiguous (see modular/cuda/reduce.h).
#include "modular/cuda/reduce.h"

#include "core/cuda/cuda_check.cuh"
#include "core/cuda/elem_io.cuh"
#include "moekit/core/checks.h"

namespace moekit {
namespace {

// One block per token; threads stride over the hidden dimension. Slots are summed in j order.
template <typename TY, typename TOut>
__global__ void reduce_contiguous_kernel(TOut* out, const TY* y, const float* weights,
                                         const int32_t* ids32, const int64_t* ids64, int64_t topk,
                                         int64_t K) {
  const int64_t m = blockIdx.x;
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t slot = m * topk + j;
      const int64_t id = ids32 ? ids32[slot] : (ids64 ? ids64[slot] : 0);
      if (id < 0) continue;
      const float w = weights ? weights[slot] : 1.f;
      acc = fmaf(w, cuda::ld1(y + slot * K + c), acc);
    }
    out[m * K + c] = cuda::from_f32<TOut>(acc);
  }
}

}  // namespace

void reduce_topk_on_device(const Tensor& output, const Tensor& fused_expert_output,
                           const Tensor& topk_weights, const Tensor& topk_ids,
                           bool apply_router_weight_on_input, Stream stream) {
  MOEKIT_CHECK(stream.handle != nullptr, "the device top-k reduction needs a CUDA stream");
  expect_contiguous(output, "output");
  expect_contiguous(fused_expert_output, "fused_expert_output");
  const int64_t M = output.size(0), K = output.size(1);
  const int64_t topk = M > 0 ? fused_expert_output.numel() / (M * K) : 1;
  if (M == 0) return;
  const float* w = apply_router_weight_on_input || !topk_weights.defined()
                       ? nullptr
                       : topk_weights.data_as<const float>();
  const int32_t* ids32 = topk_ids.defined() && topk_ids.dtype() == DType::kInt32
                             ? topk_ids.data_as<const int32_t>()
                             : nullptr;
  const int64_t* ids64 = topk_ids.defined() && topk_ids.dtype() == DType::kInt64
                             ? topk_ids.data_as<const int64_t>()
                             : nullptr;
  cuda::dispatch_elem_types(
      cuda::float_storage_of(fused_expert_output.dtype()), cuda::float_storage_of(output.dtype()),
      [&](auto y_tag, auto out_tag) {
        using TY = decltype(y_tag);
        using TOut = decltype(out_tag);
        reduce_contiguous_kernel<<<static_cast<unsigned>(M), 256, 0, to_cuda(stream)>>>(
            static_cast<TOut*>(output.data()), static_cast<const TY*>(fused_expert_output.data()),
            w, ids32, ids64, topk, K);
      });
  MOEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit
