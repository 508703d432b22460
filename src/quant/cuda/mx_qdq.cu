#include "quant/cuda/mx_qdq.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

namespace moekit::cuda {
namespace {

// The element format's grid: explicit mantissa bits, the exponent of its smallest normal, its
// largest value and the exponent of that value (the e8m0 rule's emax).
struct Grid {
  int mantissa;
  int emin;
  float max;
  int emax;
};

__device__ __forceinline__ Grid grid_of(MxElement e) {
  switch (e) {
    case MxElement::kE3M2:
      return {2, -2, 28.0f, 4};
    case MxElement::kE2M3:
      return {3, 0, 7.5f, 2};
    default:
      return {1, 0, 6.0f, 2};
  }
}

// y rounded to the grid: nearest, ties to even, saturating; NaN -> +max (the host's encoders).
__device__ __forceinline__ float round_to_grid(float y, const Grid& g) {
  if (isnan(y)) return g.max;
  const float a = fabsf(y);
  if (a >= g.max) return copysignf(g.max, y);
  if (a == 0.0f) return y;
  const int ex = max(ilogbf(a), g.emin);
  const float ulp = ldexpf(1.0f, ex - g.mantissa);
  const float q = fminf(rintf(a / ulp) * ulp, g.max);
  return copysignf(q, y);
}

// One warp per 32-column group, lane = column; grid-stride over (row, group).
__global__ void mx_qdq_kernel(MxQdqArgs a) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t groups_per_row = a.cols / 32;
  const int64_t rows =
      a.num_rows != nullptr ? min(a.rows, static_cast<int64_t>(*a.num_rows)) : a.rows;
  const int64_t groups = rows * groups_per_row;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const Grid g = grid_of(a.element);
  const auto* x = static_cast<const __nv_bfloat16*>(a.x);
  auto* y = static_cast<__nv_bfloat16*>(a.y);
  for (int64_t w = warp; w < groups; w += warps) {
    const int64_t r = w / groups_per_row;
    const int64_t c = (w % groups_per_row) * 32 + lane;
    const float v = __bfloat162float(x[r * a.x_ld + c]);
    float amax = fabsf(v);  // NaN drops out of fmaxf, as out of the host's std::max
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const int e = amax > 0.0f ? min(max(ilogbf(amax) - g.emax, -127), 127) : -127;
    const float q = round_to_grid(ldexpf(v, -e), g);
    y[r * a.y_ld + c] = __float2bfloat16_rn(ldexpf(q, e));
  }
}

}  // namespace

const char* mx_qdq_unsupported_reason(const MxQdqArgs& a) {
  if (a.rows < 0 || a.cols < 0) return "rows and cols must be >= 0";
  if (a.cols % 32 != 0) return "cols must be a multiple of 32 (whole MX groups)";
  if (a.rows > 0 && (a.x == nullptr || a.y == nullptr)) return "x and y are required";
  if (a.x_ld < a.cols || a.y_ld < a.cols) return "row strides must be >= cols";
  return nullptr;
}

cudaError_t launch_mx_qdq(const MxQdqArgs& a, cudaStream_t stream) {
  if (mx_qdq_unsupported_reason(a) != nullptr) return cudaErrorInvalidValue;
  const int64_t groups = a.rows * (a.cols / 32);
  if (groups == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((groups * 32 + kThreads - 1) / kThreads, 4096);
  mx_qdq_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace moekit::cuda
