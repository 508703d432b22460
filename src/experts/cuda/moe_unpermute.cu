// Weighted unpermute / top-k reduce.
//
// This kernel does, one block per token m:
//   1. threads j < k resolve slot (m, j) to a source row of y (or -1) and its weight, in shared
//      memory (batched layout: binary search of the row in expert_offsets gives (e, t));
//   2. each thread takes VEC columns at a time (16-byte loads when shapes and pointers allow) and
//      accumulates w_j * y[row_j] for j = 0..k-1 in order with fp32 fused multiply-adds;
//   3. the sum (plus the old output when accumulating) is rounded once and stored.
#include "experts/cuda/moe_unpermute.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/elem_io.cuh"
#include "core/cuda/pdl.cuh"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxTopK = 64;

// Expert of row r: the largest e with offsets[e] <= r (empty experts share offsets).
__device__ __forceinline__ int expert_of_row(const int32_t* offsets, int E, int r) {
  int lo = 0, hi = E;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (offsets[mid] <= r) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <typename TY, typename TOut, int VEC>
__global__ void __launch_bounds__(kThreads) unpermute_kernel(const MoeUnpermuteParams p) {
  pdl_wait_and_release();
  __shared__ int64_t src_row[kMaxTopK];
  __shared__ float weight[kMaxTopK];
  const int64_t m = blockIdx.x;
  const int k = p.top_k;
  if (threadIdx.x < k) {
    const int j = threadIdx.x;
    const int r = p.slot_to_row[m * k + j];
    int64_t src = r;
    if (r >= 0 && p.layout == UnpermuteLayout::kBatched) {
      const int e = expert_of_row(p.expert_offsets, p.num_local_experts, r);
      const int t = r - p.expert_offsets[e];
      src = t < p.max_tokens ? static_cast<int64_t>(e) * p.max_tokens + t : -1;
    }
    src_row[j] = src;
    weight[j] = p.apply_router_weight_on_input ? 1.0f : p.topk_weights[m * k + j];
  }
  __syncthreads();
  if (p.skip_empty_rows) {
    bool any = false;
    for (int j = 0; j < k; ++j)
      any |= src_row[j] >= 0;
    if (!any) return;
  }
  const TY* y = static_cast<const TY*>(p.y);
  TOut* out = static_cast<TOut*>(p.out) + m * p.out_row_stride;
  // One VEC-wide chunk per thread; blockIdx.y walks the row so that a single token still spreads
  // over many SMs (decode), and the k loads of a chunk are independent.
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= p.hidden / VEC) return;
  float acc[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i)
    acc[i] = 0.0f;
  for (int j = 0; j < k; ++j) {
    const int64_t r = src_row[j];
    if (r < 0) continue;
    const float w = weight[j];
    float v[VEC];
    load_vec<TY, VEC>(y + r * p.y_row_stride + c * VEC, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      acc[i] = __fmaf_rn(w, v[i], acc[i]);
  }
  if (p.accumulate) {
    float old[VEC];
    load_vec<TOut, VEC>(out + c * VEC, old);
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      acc[i] = old[i] + acc[i];
  }
  store_vec<TOut, VEC>(out + c * VEC, acc);
}

template <typename TY, typename TOut>
cudaError_t launch_typed(const MoeUnpermuteParams& p, bool vec, cudaStream_t stream) {
  const int64_t chunks = vec ? p.hidden / 8 : p.hidden;
  const dim3 grid(static_cast<unsigned>(p.num_tokens),
                  static_cast<unsigned>((chunks + kThreads - 1) / kThreads));
  if (vec) {
    return launch_pdl(unpermute_kernel<TY, TOut, 8>, grid, dim3(kThreads), 0, stream, p);
  }
  return launch_pdl(unpermute_kernel<TY, TOut, 1>, grid, dim3(kThreads), 0, stream, p);
}

}  // namespace

const char* moe_unpermute_unsupported_reason(const MoeUnpermuteParams& p) {
  if (p.num_tokens < 0 || p.hidden < 0) return "negative num_tokens or hidden";
  if (p.num_tokens > 0x7fffffff) return "num_tokens > 2^31 - 1";
  if (p.top_k < 1 || p.top_k > kMaxTopK) return "top_k must be in [1, 64]";
  if ((p.hidden + kThreads - 1) / kThreads > 65535) return "hidden > 65535 * 128 columns";
  if (p.y_row_stride < p.hidden || p.out_row_stride < p.hidden) return "row stride < hidden";
  if (p.num_tokens > 0 && p.hidden > 0 &&
      (p.y == nullptr || p.out == nullptr || p.slot_to_row == nullptr))
    return "null y / out / slot_to_row";
  if (!p.apply_router_weight_on_input && p.num_tokens > 0 && p.topk_weights == nullptr)
    return "null topk_weights";
  if (!is_float_storage(p.y_type) || !is_float_storage(p.out_type))
    return "y_type / out_type must be f32, bf16 or f16";
  if (p.layout == UnpermuteLayout::kBatched &&
      (p.expert_offsets == nullptr || p.num_local_experts < 1 || p.max_tokens < 0))
    return "batched layout needs expert_offsets, num_local_experts >= 1, max_tokens >= 0";
  return nullptr;
}

cudaError_t launch_moe_unpermute(const MoeUnpermuteParams& p, cudaStream_t stream) {
  if (moe_unpermute_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.num_tokens == 0 || p.hidden == 0) return cudaSuccess;
  const bool vec = p.hidden % 8 == 0 && p.y_row_stride % 8 == 0 && p.out_row_stride % 8 == 0 &&
                   aligned16(p.y) && aligned16(p.out);
  cudaError_t err = cudaSuccess;
  dispatch_elem_types(p.y_type, p.out_type, [&](auto in_tag, auto out_tag) {
    err = launch_typed<decltype(in_tag), decltype(out_tag)>(p, vec, stream);
  });
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace moekit::cuda
