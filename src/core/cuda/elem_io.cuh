// The one element load/store header of the CUDA kernels: fp32 math on bf16 / f16 / f32 storage
// (to_f32, from_f32, packed pairs), 16-byte row accesses when the row allows (load_vec, store_vec),
// and the dispatch from the run-time ElemType to the storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/cuda/elem_type.h"

namespace moekit::cuda {

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ float ld1(const T* p) {
  return to_f32(*p);
}

// Rounds to nearest even.
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

// Two adjacent 16-bit elements as one 32-bit store: Pair<T>::make(x, y) rounds both.
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float x, float y) {
    return __floats2bfloat162_rn(x, y);
  }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ type make(float x, float y) { return __floats2half2_rn(x, y); }
};

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

// Calls f(T{}) with the float storage type named at run time (value-initialized tag). NOTE: the
// caller has checked is_float_storage(t) (elem_type.h).
template <typename F>
void dispatch_float_type(ElemType t, F&& f) {
  switch (t) {
    case ElemType::kF32:
      f(float{});
      break;
    case ElemType::kBF16:
      f(__nv_bfloat16{});
      break;
    default:
      f(__half{});
      break;
  }
}

// Calls f(TIn{}, TOut{}) with the two float storage types named at run time.
template <typename F>
void dispatch_elem_types(ElemType in, ElemType out, F&& f) {
  dispatch_float_type(in, [&](auto in_tag) {
    dispatch_float_type(out, [&](auto out_tag) { f(in_tag, out_tag); });
  });
}

inline bool aligned16(const void* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0;
}

}  // namespace moekit::cuda
