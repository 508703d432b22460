#include "quant/cuda/quantize_rows.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "core/cuda/elem_io.cuh"
#include "quant/cuda/codes.cuh"

namespace moekit::cuda {
namespace {

__device__ __forceinline__ bool row_valid(const QuantizeRowsArgs& a, int64_t r) {
  if (r >= a.rows || (a.num_rows != nullptr && r >= static_cast<int64_t>(*a.num_rows))) {
    return false;
  }
  if (a.batch_counts == nullptr) return true;
  const int64_t block = r / a.batch_rows;
  return r - block * a.batch_rows < static_cast<int64_t>(__ldg(&a.batch_counts[block]));
}

// Max over the kLanes lanes of each aligned segment of the warp (every lane takes part).
template <int kLanes = 32>
__device__ __forceinline__ float segment_max(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A chunk: kV consecutive elements of one row (cols, x_ld, q_ld and the group are multiples of
// kV, so chunks never straddle a row or a group). kV = 16 / 8: vector loads and stores
// (launch_quantize_rows checks the alignment); 1: element by element.
template <typename X, int kV>
struct Chunk {
  float v[kV];

  __device__ __forceinline__ void load(const QuantizeRowsArgs& a, int64_t r, int64_t c) {
    load_vec<X, kV>(static_cast<const X*>(a.x) + r * a.x_ld + c, v);
  }
  __device__ __forceinline__ float amax() const {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < kV; ++i)
      m = fmaxf(m, fabsf(v[i]));
    return m;
  }
  // The codes of v / divisor at (r, c) of q (as bf16 values with codes_as_bf16).
  __device__ __forceinline__ void store(const QuantizeRowsArgs& a, int64_t r, int64_t c,
                                        float divisor) const {
    uint8_t code[kV];
#pragma unroll
    for (int i = 0; i < kV; ++i)
      code[i] = encode_code(v[i], divisor, a.q_type);
    if (a.codes_as_bf16) {
      float f[kV];
#pragma unroll
      for (int i = 0; i < kV; ++i)
        f[i] = __half2float(__half(__nv_cvt_fp8_to_halfraw(code[i], __NV_E4M3)));
      store_vec<__nv_bfloat16, kV>(static_cast<__nv_bfloat16*>(a.q) + r * a.q_ld + c, f);
      return;
    }
    uint8_t* dst = static_cast<uint8_t*>(a.q) + r * a.q_ld + c;
    if constexpr (kV % 8 == 0) {
      uint32_t w[kV / 4];
#pragma unroll
      for (int i = 0; i < kV / 4; ++i) {
        w[i] = code[4 * i] | (code[4 * i + 1] << 8) | (code[4 * i + 2] << 16) |
               (static_cast<uint32_t>(code[4 * i + 3]) << 24);
      }
      if constexpr (kV == 16) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kV; ++i)
        dst[i] = code[i];
    }
  }
};

// kGroup: kLanes lanes per (row, group), 32 / kLanes of them per warp step; each lane takes the
// group's chunks lane, lane + kLanes, ... (loaded twice: the second time from L1).
template <typename X, int kV, int kLanes>
__global__ void quantize_groups_kernel(const QuantizeRowsArgs a) {
  constexpr int kPerWarp = 32 / kLanes;
  const int64_t groups = (a.cols + a.group - 1) / a.group;
  const int64_t units = a.rows * groups;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int sub = lane % kLanes;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t wi = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       wi * kPerWarp < units; wi += warps) {
    const int64_t u = wi * kPerWarp + lane / kLanes;
    const int64_t r = u / groups, g = u % groups;
    const bool active = u < units && row_valid(a, r);  // warp-uniform loop, per-lane work
    const int64_t c0 = g * a.group, c1 = min(a.cols, c0 + a.group);
    float amax = 0.0f;
    if (active) {
      for (int64_t c = c0 + sub * kV; c < c1; c += kLanes * kV) {
        Chunk<X, kV> ch;
        ch.load(a, r, c);
        amax = fmaxf(amax, ch.amax());
      }
    }
    amax = segment_max<kLanes>(amax);
    if (!active) continue;
    const float divisor = fmaxf(amax, kAmaxFloor) / code_max(a.q_type);
    for (int64_t c = c0 + sub * kV; c < c1; c += kLanes * kV) {
      Chunk<X, kV> ch;
      ch.load(a, r, c);
      ch.store(a, r, c, divisor);
    }
    if (sub == 0) a.scale[r * a.scale_ld + g] = divisor;
  }
}

// kRow: kWarps warps per row (1, or the whole block for long rows, so that one row's loads are
// spread over the block rather than serialised in one warp), blockDim.x / (32 kWarps) rows per
// block step.
template <typename X, int kV, int kWarps>
__global__ void quantize_rows_kernel(const QuantizeRowsArgs a) {
  constexpr int kThreads = 32 * kWarps;  // per row
  __shared__ float s_amax[kWarps];
  const int t = static_cast<int>(threadIdx.x) % kThreads;
  const int per_block = static_cast<int>(blockDim.x) / kThreads;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.x) * per_block; r0 < a.rows;
       r0 += static_cast<int64_t>(gridDim.x) * per_block) {  // block-uniform
    const int64_t r = r0 + static_cast<int>(threadIdx.x) / kThreads;
    const bool active = r < a.rows && row_valid(a, r);  // uniform over the row's threads
    float amax = 0.0f;
    if (active) {
      for (int64_t c = t * kV; c < a.cols; c += kThreads * kV) {
        Chunk<X, kV> ch;
        ch.load(a, r, c);
        amax = fmaxf(amax, ch.amax());
      }
    }
    amax = segment_max(amax);
    if constexpr (kWarps > 1) {
      if ((t & 31) == 0) s_amax[t / 32] = amax;
      __syncthreads();
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        amax = fmaxf(amax, s_amax[w]);
      __syncthreads();  // s_amax is rewritten by the next row
    }
    if (!active) continue;
    const float divisor = fmaxf(amax, kAmaxFloor) / code_max(a.q_type);
    for (int64_t c = t * kV; c < a.cols; c += kThreads * kV) {
      Chunk<X, kV> ch;
      ch.load(a, r, c);
      ch.store(a, r, c, divisor);
    }
    if (t == 0) a.scale[r] = divisor;
  }
}

// The chunks of the whole matrix, row-major: chunk i is (i / per_row, (i % per_row) * kV).
template <int kV>
struct FlatChunks {
  int64_t per_row, count;
  __device__ __forceinline__ explicit FlatChunks(const QuantizeRowsArgs& a)
      : per_row(a.cols / kV), count(a.rows * (a.cols / kV)) {}
};

// kTensorDynamic, pass 1: the amax of every valid element into *amax_workspace (as the bits of a
// non-negative float, which order like unsigned integers).
template <typename X, int kV>
__global__ void tensor_amax_kernel(const QuantizeRowsArgs a) {
  const FlatChunks<kV> f(a);
  float amax = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < f.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / f.per_row;
    if (!row_valid(a, r)) continue;
    Chunk<X, kV> ch;
    ch.load(a, r, (i - r * f.per_row) * kV);
    amax = fmaxf(amax, ch.amax());
  }
  amax = segment_max(amax);
  if ((threadIdx.x & 31) == 0) atomicMax(a.amax_workspace, __float_as_uint(amax));
}

// kTensorStatic / kTensorDynamic pass 2: every valid element with the one scale.
template <typename X, int kV>
__global__ void quantize_tensor_kernel(const QuantizeRowsArgs a, bool dynamic) {
  const float divisor =
      dynamic ? fmaxf(__uint_as_float(*a.amax_workspace), kAmaxFloor) / code_max(a.q_type)
              : *a.static_scale;
  if (dynamic && blockIdx.x == 0 && threadIdx.x == 0) a.scale[0] = divisor;
  const FlatChunks<kV> f(a);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < f.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / f.per_row;
    if (!row_valid(a, r)) continue;
    const int64_t c = (i - r * f.per_row) * kV;
    Chunk<X, kV> ch;
    ch.load(a, r, c);
    ch.store(a, r, c, divisor);
  }
}

int grid_for(int64_t work, int per_block) {
  return static_cast<int>(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, 4096));
}

bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Elements per chunk: 16 or 8 where every chunk's loads and stores are whole aligned vectors,
// else 1.
int chunk_width(const QuantizeRowsArgs& a) {
  const int q_bytes = a.codes_as_bf16 ? 2 : 1;
  for (const int v : {16, 8}) {
    const int xb = v * elem_bytes(a.x_type), qb = v * q_bytes;  // bytes of a chunk: 16 .. 64
    const int x_align = std::min(xb, 16), q_align = std::min(qb, 16);
    if (a.cols % v != 0 || a.x_ld % v != 0 || a.q_ld % v != 0) continue;
    if (a.kind == RowQuant::kGroup && a.group % v != 0) continue;
    if (!aligned(a.x, x_align) || !aligned(a.q, q_align)) continue;
    if ((a.x_ld * elem_bytes(a.x_type)) % x_align != 0 || (a.q_ld * q_bytes) % q_align != 0)
      continue;
    return v;
  }
  return 1;
}

// Calls f(X{}, std::integral_constant<int, kV>{}) for the launch's element type and chunk width.
template <typename F>
void dispatch_chunks(const QuantizeRowsArgs& a, F&& f) {
  const int v = chunk_width(a);
  dispatch_float_type(a.x_type, [&](auto x_tag) {
    if (v == 16) {
      f(x_tag, std::integral_constant<int, 16>{});
    } else if (v == 8) {
      f(x_tag, std::integral_constant<int, 8>{});
    } else {
      f(x_tag, std::integral_constant<int, 1>{});
    }
  });
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
  if (a.batch_counts != nullptr && (a.batch_rows <= 0 || a.rows % a.batch_rows != 0)) {
    return "batch_counts need batch_rows > 0 dividing rows";
  }
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
  cudaError_t status = cudaSuccess;
  dispatch_chunks(a, [&](auto x_tag, auto v_tag) {
    using X = decltype(x_tag);
    constexpr int kV = decltype(v_tag)::value;
    const int64_t chunks = a.rows * (a.cols / kV);
    switch (a.kind) {
      case RowQuant::kGroup: {
        const int64_t lanes = (a.group / kV) >= 32 ? 32 : 8;  // per (row, group)
        const int64_t warps = (a.rows * ((a.cols + a.group - 1) / a.group) * lanes + 31) / 32;
        const int grid = grid_for(warps, kThreads / 32);
        if (lanes == 32) {
          quantize_groups_kernel<X, kV, 32><<<grid, kThreads, 0, stream>>>(a);
        } else {
          quantize_groups_kernel<X, kV, 8><<<grid, kThreads, 0, stream>>>(a);
        }
        break;
      }
      case RowQuant::kRow:
        if (a.cols / kV >= kThreads) {  // long rows: the block on each row
          quantize_rows_kernel<X, kV, kThreads / 32>
              <<<grid_for(a.rows, 1), kThreads, 0, stream>>>(a);
        } else {
          quantize_rows_kernel<X, kV, 1>
              <<<grid_for(a.rows, kThreads / 32), kThreads, 0, stream>>>(a);
        }
        break;
      case RowQuant::kTensorStatic:
        quantize_tensor_kernel<X, kV>
            <<<grid_for(chunks, kThreads), kThreads, 0, stream>>>(a, false);
        break;
      case RowQuant::kTensorDynamic: {
        status = cudaMemsetAsync(a.amax_workspace, 0, sizeof(unsigned int), stream);
        if (status != cudaSuccess) return;
        const int grid = grid_for(chunks, kThreads * 4);
        tensor_amax_kernel<X, kV><<<grid, kThreads, 0, stream>>>(a);
        quantize_tensor_kernel<X, kV><<<grid_for(chunks, kThreads), kThreads, 0, stream>>>(a, true);
        break;
      }
    }
  });
  if (status != cudaSuccess) return status;
  return cudaGetLastError();
}

}  // namespace moekit::cuda
