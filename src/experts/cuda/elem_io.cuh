// Internal: element conversions and vectorized row loads/stores shared by the MoE CUDA kernels
// (fp32 math on bf16 / f16 / f32 storage, 16-byte accesses when the row allows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "experts/cuda/moe_activation.h"  // ElemType

namespace moekit::cuda::detail {

template <typename T>
__device__ __forceinline__ float ld1(const T* p);
template <>
__device__ __forceinline__ float ld1<float>(const float* p) {
  return *p;
}
template <>
__device__ __forceinline__ float ld1<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
template <>
__device__ __forceinline__ float ld1<__half>(const __half* p) {
  return __half2float(*p);
}

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

// Loads N consecutive elements as floats; 16-byte loads when N * sizeof(T) is a multiple of 16.
template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[N]) {
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int v = 0; v < N / kPer; ++v) {
      const uint4 raw = reinterpret_cast<const uint4*>(p)[v];
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        f[v * kPer + i] = ld1(e + i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      f[i] = ld1(p + i);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[N]) {
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int kPer = 16 / sizeof(T);
#pragma unroll
    for (int v = 0; v < N / kPer; ++v) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        e[i] = from_f32<T>(f[v * kPer + i]);
      reinterpret_cast<uint4*>(p)[v] = raw;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      p[i] = from_f32<T>(f[i]);
  }
}

// Calls f(TIn{}, TOut{}) with the element types named at run time (value-initialized tags).
template <typename F>
void dispatch_elem_types(ElemType in, ElemType out, F&& f) {
  auto with_out = [&](auto in_tag) {
    switch (out) {
      case ElemType::kF32:
        f(in_tag, float{});
        break;
      case ElemType::kBF16:
        f(in_tag, __nv_bfloat16{});
        break;
      default:
        f(in_tag, __half{});
        break;
    }
  };
  switch (in) {
    case ElemType::kF32:
      with_out(float{});
      break;
    case ElemType::kBF16:
      with_out(__nv_bfloat16{});
      break;
    default:
      with_out(__half{});
      break;
  }
}

inline bool aligned16(const void* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

}  // namespace moekit::cuda::detail
