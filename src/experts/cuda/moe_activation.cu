// Gated / elementwise activations over rows.
//
// This kernel does, one block per row:
//   1. skip the row when it is masked (row >= *valid_rows, or permuted_rows[row] < 0);
//   2. per thread, load VEC outputs' worth of gate (and up) values with 16-byte loads when the
//      shapes and pointers allow (VEC = 8), else one element at a time (VEC = 1);
//   3. apply the activation in fp32 (experts/cuda/sm90/act_math.cuh, the math the GEMM epilogue
//      fuses) and round once to the output type.
#include "experts/cuda/moe_activation.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/cuda/cuda_check.cuh"
#include "core/cuda/elem_io.cuh"
#include "core/cuda/pdl.cuh"
#include "experts/cuda/sm90/act_math.cuh"

namespace moekit::cuda {
namespace {

constexpr int kThreads = 128;

struct ActArgs {
  ActKind kind;
  bool has_clamp;
  float limit;
  float alpha;
};

__device__ __forceinline__ float apply_act(const ActArgs& a, float g, float u) {
  using act::Gated;
  switch (a.kind) {
    case ActKind::kSilu:
      if (a.has_clamp) return act::gated<Gated::kSiluClamp>(g, u, a.limit, a.alpha);
      return act::gated<Gated::kSilu>(g, u, a.limit, a.alpha);
    case ActKind::kGelu:
      return act::gated<Gated::kGelu>(g, u, a.limit, a.alpha);
    case ActKind::kGeluTanh:
      return act::gated<Gated::kGeluTanh>(g, u, a.limit, a.alpha);
    case ActKind::kSwigluOai:
      return act::gated<Gated::kSwigluOai>(g, u, a.limit, a.alpha);
    case ActKind::kSwigluStep:
      return act::gated<Gated::kSwigluStep>(g, u, a.limit, a.alpha);
    case ActKind::kRelu2:
      return act::gated<Gated::kRelu2>(g, u, a.limit, a.alpha);
    case ActKind::kSiluNoMul:
      return act::siluf(g);
    case ActKind::kGeluNoMul:
      return act::gelu_erf(g);
    case ActKind::kGeluTanhNoMul:
      return act::gelu_tanh(g);
    default:  // kRelu2NoMul
      return act::relu2(g);
  }
}

template <typename TIn, typename TOut, int VEC>
__global__ void __launch_bounds__(kThreads) activation_kernel(const MoeActivationParams p) {
  pdl_wait_and_release();
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
      o[i] = apply_act(a, g[i], u[i]);
    store_vec<TOut, VEC>(out + c * VEC, o);
  }
}

template <typename TIn, typename TOut>
cudaError_t launch_typed(const MoeActivationParams& p, bool vec, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows));
  if (vec) {
    return launch_pdl(activation_kernel<TIn, TOut, 8>, grid, dim3(kThreads), 0, stream, p);
  }
  return launch_pdl(activation_kernel<TIn, TOut, 1>, grid, dim3(kThreads), 0, stream, p);
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
  cudaError_t err = cudaSuccess;
  dispatch_elem_types(p.in_type, p.out_type, [&](auto in_tag, auto out_tag) {
    err = launch_typed<decltype(in_tag), decltype(out_tag)>(p, vec, stream);
  });
  return err != cudaSuccess ? err : cudaGetLastError();
}

ActKind act_kind_of(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return ActKind::kSilu;
    case Activation::kGelu:
      return ActKind::kGelu;
    case Activation::kGeluTanh:
      return ActKind::kGeluTanh;
    case Activation::kSwigluOai:
      return ActKind::kSwigluOai;
    case Activation::kSwigluStep:
      return ActKind::kSwigluStep;
    case Activation::kRelu2:
      return ActKind::kRelu2;
    case Activation::kSiluNoMul:
      return ActKind::kSiluNoMul;
    case Activation::kGeluNoMul:
      return ActKind::kGeluNoMul;
    case Activation::kGeluTanhNoMul:
      return ActKind::kGeluTanhNoMul;
    case Activation::kRelu2NoMul:
      return ActKind::kRelu2NoMul;
  }
  return ActKind::kSilu;
}

void run_activation(Activation act, const ActivationParams& params, const void* in, void* out,
                    DType dtype, int64_t rows, int64_t n, const int32_t* valid_rows,
                    const int32_t* permuted_rows, Stream stream) {
  MoeActivationParams p;
  p.kind = act_kind_of(act);
  p.in = in;
  p.in_type = float_storage_of(dtype);
  p.in_row_stride = n;
  p.d = activation_output_dim(act, n);
  p.out = out;
  p.out_type = p.in_type;
  p.out_row_stride = p.d;
  p.rows = rows;
  p.has_clamp_limit = params.clamp_limit.has_value();
  if (params.clamp_limit) p.clamp_limit = *params.clamp_limit;
  p.alpha = params.alpha;
  p.valid_rows = valid_rows;
  p.permuted_rows = permuted_rows;
  if (const char* why = moe_activation_unsupported_reason(p)) {
    MOEKIT_CHECK(false, "activation {}: {}", activation_name(act), why);
  }
  MOEKIT_CUDA_CHECK(launch_moe_activation(p, to_cuda(stream)));
}

}  // namespace moekit::cuda
