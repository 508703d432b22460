// The device half of TopKWeightAndReduceContiguous (see modular/cuda/reduce.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/cuda_check.cuh"
#include "modular/cuda/reduce.h"
#include "moekit/core/checks.h"

namespace moekit {
namespace {

__device__ float load_elem(const void* p, int type, int64_t i) {
  if (type == 0) return static_cast<const float*>(p)[i];
  if (type == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}

__device__ void store_elem(void* p, int type, int64_t i, float v) {
  if (type == 0) {
    static_cast<float*>(p)[i] = v;
  } else if (type == 1) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  }
}

// One block per token; threads stride over the hidden dimension. Slots are summed in j order.
__global__ void reduce_contiguous_kernel(void* out, int out_type, const void* y, int y_type,
                                         const float* weights, const int32_t* ids32,
                                         const int64_t* ids64, int64_t topk, int64_t K) {
  const int64_t m = blockIdx.x;
  for (int64_t c = threadIdx.x; c < K; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t slot = m * topk + j;
      const int64_t id = ids32 ? ids32[slot] : (ids64 ? ids64[slot] : 0);
      if (id < 0) continue;
      const float w = weights ? weights[slot] : 1.f;
      acc = fmaf(w, load_elem(y, y_type, slot * K + c), acc);
    }
    store_elem(out, out_type, m * K + c, acc);
  }
}

int type_code(DType d) {
  switch (d) {
    case DType::kF32:
      return 0;
    case DType::kBF16:
      return 1;
    case DType::kF16:
      return 2;
    default:
      MOEKIT_CHECK(false, "reduce: dtype {} must be f32, bf16 or f16", dtype_name(d));
  }
  return 0;
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
  reduce_contiguous_kernel<<<static_cast<unsigned>(M), 256, 0, to_cuda(stream)>>>(
      output.data(), type_code(output.dtype()), fused_expert_output.data(),
      type_code(fused_expert_output.dtype()), w, ids32, ids64, topk, K);
  MOEKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moekit
