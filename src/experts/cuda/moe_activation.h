// The experts' activation between GEMM1 and GEMM2, on the GPU.
//
// Gated kinds read rows of 2d values and write rows of d: gate = first half, up = second half,
// except kSwigluOai whose input is interleaved (gate = x[2i], up = x[2i+1]). `_NoMul` kinds are
// elementwise [rows, d] -> [rows, d]. Math is fp32; the output is rounded once (round to nearest
// even). Launchers never allocate or synchronize (CUDA-graph capturable).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/elem_type.h"
#include "moekit/config/activation.h"
#include "moekit/core/device.h"

namespace moekit::cuda {

// NOTE: the gated kinds come first (kernels test kind <= kRelu2).
enum class ActKind : uint8_t {
  kSilu,        // silu(g) * u; with clamp_limit L: silu(min(g, L)) * clamp(u, -L, L)
  kGelu,        // gelu_erf(g) * u
  kGeluTanh,    // gelu_tanh(g) * u
  kSwigluOai,   // interleaved; g = min(g, L); u = clamp(u, -L, L); (u + 1) * g * sigmoid(alpha * g)
  kSwigluStep,  // min(silu(g), L) * clamp(u, -L, L)
  kRelu2,       // relu(g)^2 * u
  kSiluNoMul,   // silu(x)
  kGeluNoMul,   // gelu_erf(x)
  kGeluTanhNoMul,  // gelu_tanh(x)
  kRelu2NoMul,     // relu(x)^2
};

inline bool act_is_gated(ActKind k) {
  return k == ActKind::kSilu || k == ActKind::kGelu || k == ActKind::kGeluTanh ||
         k == ActKind::kSwigluOai || k == ActKind::kSwigluStep || k == ActKind::kRelu2;
}

struct MoeActivationParams {
  ActKind kind = ActKind::kSilu;
  const void* in = nullptr;  // (rows, 2d) gated or (rows, d), row stride in_row_stride elements
  ElemType in_type = ElemType::kBF16;  // f32, bf16 or f16 (also out_type)
  int64_t in_row_stride = 0;
  void* out = nullptr;  // (rows, d), row stride out_row_stride elements
  ElemType out_type = ElemType::kBF16;
  int64_t out_row_stride = 0;
  int64_t rows = 0;
  int64_t d = 0;  // output columns
  // kSilu: clamp when has_clamp_limit. kSwigluOai / kSwigluStep: always clamp (default L = 7).
  bool has_clamp_limit = false;
  float clamp_limit = 7.0f;
  float alpha = 1.702f;  // kSwigluOai
  // Optional row masks (device pointers): rows r >= *valid_rows are skipped; rows with
  // permuted_rows[r] < 0 (padding) are skipped. Skipped rows of `out` are not written.
  const int32_t* valid_rows = nullptr;     // (1,)
  const int32_t* permuted_rows = nullptr;  // (rows,)
};

// nullptr when supported, else a one-line reason.
const char* moe_activation_unsupported_reason(const MoeActivationParams& p);

cudaError_t launch_moe_activation(const MoeActivationParams& p, cudaStream_t stream);

// The kernel's kind of a library activation.
ActKind act_kind_of(Activation activation);

// Rows of (rows, n) -> (rows, activation_output_dim(n)) of one float dtype, with the optional
// device row masks; throws moekit::Error with the kernel's reason or the failing launch.
void run_activation(Activation act, const ActivationParams& params, const void* in, void* out,
                    DType dtype, int64_t rows, int64_t n, const int32_t* valid_rows,
                    const int32_t* permuted_rows, Stream stream);

}  // namespace moekit::cuda
