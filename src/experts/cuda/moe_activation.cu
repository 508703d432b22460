// Gated / elementwise activations over rows.
//
// This kernel does, one block per row:
//   1. skip the row when it is masked (row >= *valid_rows, or permuted_rows[row] < 0);
//   2. per thread, load VEC outputs' worth of gate (and up) values with 16-byte loads when the
//      shapes and pointers allow (VEC = 8), else one element at a time (VEC = 1);
//   3. apply the activation in fp32 and round once to the output type.
#include "experts/cuda/moe_activation.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/elem_io.cuh"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float sigmoidf(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float siluf(float x) {
  return x / (1.0f + expf(-x));
}
// NOTE: both gelus are written without the cancellation of 1 + erf / 1 + tanh for negative x:
// 0.5 x (1 + erf(x / sqrt2)) = 0.5 x erfc(-x / sqrt2), and 0.5 x (1 + tanh z) = x sigmoid(2 z).
__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * erfcf(-x * 0.70710678118654752f);
}
__device__ __forceinline__ float gelu_tanh(float x) {
  const float z = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return x / (1.0f + expf(-2.0f * z));
}
__device__ __forceinline__ float clampf(float v, float lim) {
  return fminf(fmaxf(v, -lim), lim);
}

struct ActArgs {
  ActKind kind;
  bool has_clamp;
  float limit;
  float alpha;
};

__device__ __forceinline__ float act(const ActArgs& a, float g, float u) {
  switch (a.kind) {
    case ActKind::kSilu:
      if (a.has_clamp) return siluf(fminf(g, a.limit)) * clampf(u, a.limit);
      return siluf(g) * u;
    case ActKind::kGelu:
      return gelu_erf(g) * u;
    case ActKind::kGeluTanh:
      return gelu_tanh(g) * u;
    case ActKind::kSwigluOai: {
      const float gc = fminf(g, a.limit);
      const float uc = clampf(u, a.limit);
      return (uc + 1.0f) * gc * sigmoidf(a.alpha * gc);
    }
    case ActKind::kSwigluStep:
      return fminf(siluf(g), a.limit) * clampf(u, a.limit);
    case ActKind::kRelu2: {
      const float r = fmaxf(g, 0.0f);
      return r * r * u;
    }
    case ActKind::kSiluNoMul:
      return siluf(g);
    case ActKind::kGeluNoMul:
      return gelu_erf(g);
    case ActKind::kGeluTanhNoMul:
      return gelu_tanh(g);
    default: {  // kRelu2NoMul
      const float r = fmaxf(g, 0.0f);
      return r * r;
    }
  }
}

template <typename TIn, typename TOut, int VEC>
__global__ void __launch_bounds__(kThreads) activation_kernel(const MoeActivationParams p) {
  const int64_t row = blockIdx.x;
  if (p.valid_rows != nullptr && row >= *p.valid_rows) return;
  if (p.permuted_rows != nullptr && p.permuted_rows[row] < 0) return;
  const ActArgs a{p.kind, p.has_clamp_limit, p.clamp_limit, p.alpha};
  const TIn* in = static_cast<const TIn*>(p.in) + row * p.in_row_stride;
  TOut* out = static_cast<TOut*>(p.out) + row * p.out_row_stride;
  const int64_t chunks = p.d / VEC;
  const bool gated = p.kind <= ActKind::kRelu2;  // NOTE: gated kinds come first in ActKind
  const bool interleaved = p.kind == ActKind::kSwigluOai;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    float g[VEC], u[VEC], o[VEC];
    if (interleaved) {
      float x[2 * VEC];
      load_vec<TIn, 2 * VEC>(in + 2 * c * VEC, x);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        g[i] = x[2 * i];
        u[i] = x[2 * i + 1];
      }
    } else {
      load_vec<TIn, VEC>(in + c * VEC, g);
      if (gated) {
        load_vec<TIn, VEC>(in + p.d + c * VEC, u);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          u[i] = 1.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      o[i] = act(a, g[i], u[i]);
    store_vec<TOut, VEC>(out + c * VEC, o);
  }
}

template <typename TIn, typename TOut>
void launch_typed(const MoeActivationParams& p, bool vec, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vec) {
    activation_kernel<TIn, TOut, 8><<<grid, kThreads, 0, stream>>>(p);
  } else {
    activation_kernel<TIn, TOut, 1><<<grid, kThreads, 0, stream>>>(p);
  }
}

}  // namespace

const char* moe_activation_unsupported_reason(const MoeActivationParams& p) {
  if (p.rows < 0 || p.d < 0) return "negative rows or d";
  if (p.rows > 0x7fffffff) return "rows > 2^31 - 1";
  if (static_cast<int>(p.kind) > static_cast<int>(ActKind::kRelu2NoMul))
    return "unknown activation";
  const int64_t in_cols = act_is_gated(p.kind) ? 2 * p.d : p.d;
  if (p.in_row_stride < in_cols) return "in_row_stride smaller than the input row";
  if (p.out_row_stride < p.d) return "out_row_stride < d";
  if (p.rows > 0 && p.d > 0 && (p.in == nullptr || p.out == nullptr)) return "null in / out";
  if (!is_float_storage(p.in_type) || !is_float_storage(p.out_type))
    return "in_type / out_type must be f32, bf16 or f16";
  if ((p.kind == ActKind::kSwigluOai || p.kind == ActKind::kSwigluStep ||
       (p.kind == ActKind::kSilu && p.has_clamp_limit)) &&
      !(p.clamp_limit > 0.0f))
    return "clamp_limit must be > 0";
  return nullptr;
}

cudaError_t launch_moe_activation(const MoeActivationParams& p, cudaStream_t stream) {
  if (moe_activation_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.d == 0) return cudaSuccess;
  const bool vec = p.d % 8 == 0 && p.in_row_stride % 8 == 0 && p.out_row_stride % 8 == 0 &&
                   aligned16(p.in) && aligned16(p.out);
  dispatch_elem_types(p.in_type, p.out_type, [&](auto in_tag, auto out_tag) {
    launch_typed<decltype(in_tag), decltype(out_tag)>(p, vec, stream);
  });
  return cudaGetLastError();
}

}  // namespace moekit::cuda
