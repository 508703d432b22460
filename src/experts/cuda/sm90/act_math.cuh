// The activation math of the experts, in fp32: the one device copy used by the activation kernel
// (experts/cuda/moe_activation.cu) and by the GEMM epilogue that fuses the gated activation
// (experts/cuda/sm90/epilogue.cuh). g is the gate, u the up projection, L the clamp limit.
#pragma once

#include <cstdint>

namespace moekit::cuda::act {

// NOTE: the exponential and the division run on the special-function unit: __expf (a multiply and
// ex2.approx; within 2 + 1.2 |x| fp32 ulps) and __fdividef (rcp.approx and a multiply; 2 ulps, 0
// once the divisor passes 2^126, where the exact quotient is below 1e-36). Both sit far below the
// bf16 / f16 rounding of every output (2^-9 / 2^-12 relative), and the library's correctly
// rounded expf and IEEE division took about twice the instructions in the fused GEMM1 epilogue,
// which runs while the tensor cores wait (bench/results/2026-12-07-h100-fp8-producer).
__device__ __forceinline__ float sigmoidf(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}
__device__ __forceinline__ float siluf(float x) {
  return __fdividef(x, 1.0f + __expf(-x));
}
// NOTE: both gelus are written without the cancellation of 1 + erf / 1 + tanh for negative x:
// 0.5 x (1 + erf(x / sqrt2)) = 0.5 x erfc(-x / sqrt2), and 0.5 x (1 + tanh z) = x sigmoid(2 z).
__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * erfcf(-x * 0.70710678118654752f);
}
__device__ __forceinline__ float gelu_tanh(float x) {
  const float z = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return __fdividef(x, 1.0f + __expf(-2.0f * z));
}
__device__ __forceinline__ float relu2(float x) {
  const float r = fmaxf(x, 0.0f);
  return r * r;
}
__device__ __forceinline__ float clampf(float v, float lim) {
  return fminf(fmaxf(v, -lim), lim);
}

// The gated kinds, each its own straight-line function of (g, u): callers that know the kind for
// a whole tile instantiate one (a per-element switch in the GEMM epilogue measured ~20 us per
// 128x256 item slower: bench/grouped_gemm_notes.md).
enum class Gated : uint8_t { kSilu, kSiluClamp, kGelu, kGeluTanh, kSwigluOai, kSwigluStep, kRelu2 };

template <Gated kA>
__device__ __forceinline__ float gated(float g, float u, float limit, float alpha) {
  if constexpr (kA == Gated::kSilu) {
    return siluf(g) * u;
  } else if constexpr (kA == Gated::kSiluClamp) {  // silu(min(g, L)) * clamp(u, -L, L)
    return siluf(fminf(g, limit)) * clampf(u, limit);
  } else if constexpr (kA == Gated::kGelu) {
    return gelu_erf(g) * u;
  } else if constexpr (kA == Gated::kGeluTanh) {
    return gelu_tanh(g) * u;
  } else if constexpr (kA == Gated::kSwigluOai) {  // (clamp(u) + 1) * g' * sigmoid(alpha g')
    const float gc = fminf(g, limit);
    const float uc = clampf(u, limit);
    return (uc + 1.0f) * gc * sigmoidf(alpha * gc);
  } else if constexpr (kA == Gated::kSwigluStep) {  // min(silu(g), L) * clamp(u, -L, L)
    return fminf(siluf(g), limit) * clampf(u, limit);
  } else {
    return relu2(g) * u;
  }
}

}  // namespace moekit::cuda::act
