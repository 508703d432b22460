#include "quant/cuda/quantize_rows.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/elem_io.cuh"

namespace moekit::cuda {
namespace {

constexpr float kAmaxFloor = 1e-10f;  // quant::kAmaxFloor

__device__ __forceinline__ float load_x(const void* x, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
    case ElemType::kF16:
      return __half2float(static_cast<const __half*>(x)[i]);
    default:
      return static_cast<const float*>(x)[i];
  }
}

// The code of x / divisor: e4m3 round-to-nearest-even saturating to +-448, or int8
// round-to-nearest-even of the value clamped to [-128, 127] (NaN -> 0).
__device__ __forceinline__ uint8_t encode(float x, float divisor, ElemType q) {
  const float y = x / divisor;
  if (q == ElemType::kE4M3) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  }
  if (isnan(y)) return 0;
  return static_cast<uint8_t>(
      static_cast<int8_t>(__float2int_rn(fminf(fmaxf(y, -128.0f), 127.0f))));
}

__device__ __forceinline__ float qmax_of(ElemType q) {
  return q == ElemType::kE4M3 ? 448.0f : 127.0f;
}

__device__ __forceinline__ bool row_valid(const QuantizeRowsArgs& a, int64_t r) {
  return r < a.rows && (a.num_rows == nullptr || r < static_cast<int64_t>(*a.num_rows));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// kGroup: one warp per (row, group).
__global__ void quantize_groups_kernel(const QuantizeRowsArgs a) {
  const int64_t groups = (a.cols + a.group - 1) / a.group;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t wi = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       wi < a.rows * groups; wi += warps) {
    const int64_t r = wi / groups, g = wi % groups;
    if (!row_valid(a, r)) continue;
    const int64_t c0 = g * a.group, c1 = min(a.cols, c0 + a.group);
    float amax = 0.0f;
    for (int64_t c = c0 + lane; c < c1; c += 32)
      amax = fmaxf(amax, fabsf(load_x(a.x, a.x_type, r * a.x_ld + c)));
    amax = warp_max(amax);
    const float divisor = fmaxf(amax, kAmaxFloor) / qmax_of(a.q_type);
    uint8_t* q = static_cast<uint8_t*>(a.q) + r * a.q_ld;
    for (int64_t c = c0 + lane; c < c1; c += 32)
      q[c] = encode(load_x(a.x, a.x_type, r * a.x_ld + c), divisor, a.q_type);
    if (lane == 0) a.scale[r * a.scale_ld + g] = divisor;
  }
}

// kRow: one block per row.
__global__ void quantize_rows_kernel(const QuantizeRowsArgs a) {
  __shared__ float s_warp[32];
  __shared__ float s_divisor;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    if (!row_valid(a, r)) continue;
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x)
      amax = fmaxf(amax, fabsf(load_x(a.x, a.x_type, r * a.x_ld + c)));
    amax = warp_max(amax);
    if ((threadIdx.x & 31) == 0) s_warp[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x < 32) {
      float v = threadIdx.x < blockDim.x / 32 ? s_warp[threadIdx.x] : 0.0f;
      v = warp_max(v);
      if (threadIdx.x == 0) {
        s_divisor = fmaxf(v, kAmaxFloor) / qmax_of(a.q_type);
        a.scale[r] = s_divisor;
      }
    }
    __syncthreads();
    const float divisor = s_divisor;
    uint8_t* q = static_cast<uint8_t*>(a.q) + r * a.q_ld;
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x)
      q[c] = encode(load_x(a.x, a.x_type, r * a.x_ld + c), divisor, a.q_type);
    __syncthreads();  // s_divisor / s_warp are reused by the next row
  }
}

// kTensorDynamic, pass 1: the amax of every valid element into *amax_workspace (as the bits of a
// non-negative float, which order like unsigned integers).
__global__ void tensor_amax_kernel(const QuantizeRowsArgs a) {
  float amax = 0.0f;
  const int64_t n = a.rows * a.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / a.cols, c = i % a.cols;
    if (row_valid(a, r)) amax = fmaxf(amax, fabsf(load_x(a.x, a.x_type, r * a.x_ld + c)));
  }
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) atomicMax(a.amax_workspace, __float_as_uint(amax));
}

// kTensorStatic / kTensorDynamic pass 2: every valid element with the one scale.
__global__ void quantize_tensor_kernel(const QuantizeRowsArgs a, bool dynamic) {
  const float divisor =
      dynamic ? fmaxf(__uint_as_float(*a.amax_workspace), kAmaxFloor) / qmax_of(a.q_type)
              : *a.static_scale;
  if (dynamic && blockIdx.x == 0 && threadIdx.x == 0) a.scale[0] = divisor;
  const int64_t n = a.rows * a.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / a.cols, c = i % a.cols;
    if (!row_valid(a, r)) continue;
    const uint8_t code = encode(load_x(a.x, a.x_type, r * a.x_ld + c), divisor, a.q_type);
    if (a.codes_as_bf16) {
      const float v = __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
      static_cast<__nv_bfloat16*>(a.q)[r * a.q_ld + c] = __float2bfloat16_rn(v);
    } else {
      static_cast<uint8_t*>(a.q)[r * a.q_ld + c] = code;
    }
  }
}

int grid_for(int64_t work, int per_block) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, 4096));
}

}  // namespace

const char* quantize_rows_unsupported_reason(const QuantizeRowsArgs& a) {
  if (a.x_type != ElemType::kBF16 && a.x_type != ElemType::kF16 && a.x_type != ElemType::kF32) {
    return "x must be bf16, f16 or f32";
  }
  if (a.q_type != ElemType::kE4M3 && a.q_type != ElemType::kS8) return "q must be e4m3 or int8";
  if (a.codes_as_bf16 && (a.q_type != ElemType::kE4M3 || (a.kind != RowQuant::kTensorStatic &&
                                                          a.kind != RowQuant::kTensorDynamic))) {
    return "codes as bf16 are e4m3 codes of a per-tensor scale";
  }
  if (a.rows < 0 || a.cols <= 0 || a.x_ld < a.cols || a.q_ld < a.cols) {
    return "rows >= 0, cols > 0, x_ld >= cols and q_ld >= cols are required";
  }
  if (a.rows > 0 && (a.x == nullptr || a.q == nullptr)) return "x and q are required";
  switch (a.kind) {
    case RowQuant::kTensorStatic:
      if (a.static_scale == nullptr) return "a static per-tensor scale is required";
      break;
    case RowQuant::kTensorDynamic:
      if (a.scale == nullptr || a.amax_workspace == nullptr) {
        return "a dynamic per-tensor scale needs scale and amax_workspace";
      }
      break;
    case RowQuant::kRow:
      if (a.scale == nullptr) return "per-row scales need scale";
      break;
    case RowQuant::kGroup:
      if (a.scale == nullptr || a.group <= 0 || a.scale_ld < (a.cols + a.group - 1) / a.group) {
        return "per-group scales need scale, group > 0 and scale_ld >= ceil(cols / group)";
      }
      break;
  }
  return nullptr;
}

cudaError_t launch_quantize_rows(const QuantizeRowsArgs& a, cudaStream_t stream) {
  if (quantize_rows_unsupported_reason(a) != nullptr) return cudaErrorInvalidValue;
  if (a.rows == 0) {
    if (a.kind != RowQuant::kTensorDynamic) return cudaSuccess;
  }
  constexpr int kThreads = 256;
  switch (a.kind) {
    case RowQuant::kGroup: {
      const int64_t warps = a.rows * ((a.cols + a.group - 1) / a.group);
      quantize_groups_kernel<<<grid_for(warps, kThreads / 32), kThreads, 0, stream>>>(a);
      break;
    }
    case RowQuant::kRow:
      quantize_rows_kernel<<<grid_for(a.rows, 1), kThreads, 0, stream>>>(a);
      break;
    case RowQuant::kTensorStatic:
      quantize_tensor_kernel<<<grid_for(a.rows * a.cols, kThreads), kThreads, 0, stream>>>(a,
                                                                                           false);
      break;
    case RowQuant::kTensorDynamic: {
      if (cudaError_t e = cudaMemsetAsync(a.amax_workspace, 0, sizeof(unsigned int), stream);
          e != cudaSuccess) {
        return e;
      }
      const int grid = grid_for(a.rows * a.cols, kThreads * 8);
      tensor_amax_kernel<<<grid, kThreads, 0, stream>>>(a);
      quantize_tensor_kernel<<<grid_for(a.rows * a.cols, kThreads), kThreads, 0, stream>>>(a, true);
      break;
    }
  }
  return cudaGetLastError();
}

}  // namespace moekit::cuda
