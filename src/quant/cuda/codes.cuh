// The 8-bit activation codes of the device quantizers (quantize_rows.cu) and of the grouped GEMMs'
// epilogues that quantize their output for the next GEMM (experts/cuda/sm90/epilogue.cuh): the
// host reference's numbers (quant/quantize.h), bit for bit.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "core/cuda/elem_type.h"

namespace moekit::cuda {

inline constexpr float kAmaxFloor = 1e-10f;  // quant::kAmaxFloor

// The code of x / divisor: e4m3 round-to-nearest-even saturating to +-448, or int8
// round-to-nearest-even of the value clamped to [-128, 127] (NaN -> 0). IEEE division, as the
// host reference: a multiplication by the reciprocal rounds some codes differently.
__device__ __forceinline__ uint8_t encode_code(float x, float divisor, ElemType q) {
  const float y = x / divisor;
  if (q == ElemType::kE4M3) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
  }
  if (isnan(y)) return 0;
  return static_cast<uint8_t>(
      static_cast<int8_t>(__float2int_rn(fminf(fmaxf(y, -128.0f), 127.0f))));
}

// The largest code's magnitude: a dynamic scale is max(amax, kAmaxFloor) / code_max.
__device__ __forceinline__ float code_max(ElemType q) {
  return q == ElemType::kE4M3 ? 448.0f : 127.0f;
}

}  // namespace moekit::cuda
