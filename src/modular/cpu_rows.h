// Internal: converting rows of bf16 / f16 / f32 CPU tensors to and from float buffers, with the
// dtype switch outside the element loop.
#pragma once

#include <cstdint>

#include "moekit/core/dtype.h"
#include "moekit/core/error.h"
#include "moekit/core/half.h"

namespace moekit::detail {

inline bool is_cpu_float_dtype(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

// dst[i] = base[offset + i] as float, i < n.
inline void load_row(const void* base, DType dtype, int64_t offset, int64_t n, float* dst) {
  switch (dtype) {
    case DType::kF32: {
      const float* src = static_cast<const float*>(base) + offset;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = src[i];
      return;
    }
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = bf16_bits_to_float(src[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = f16_bits_to_float(src[i]);
      return;
    }
    default:
      throw Error(fmt::format("load_row: dtype {} is not bf16/f16/f32", dtype_name(dtype)));
  }
}

// base[offset + i] = src[i] rounded to dtype (nearest even), i < n.
inline void store_row(void* base, DType dtype, int64_t offset, int64_t n, const float* src) {
  switch (dtype) {
    case DType::kF32: {
      float* dst = static_cast<float*>(base) + offset;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = src[i];
      return;
    }
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = float_to_bf16_bits(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < n; ++i)
        dst[i] = float_to_f16_bits(src[i]);
      return;
    }
    default:
      throw Error(fmt::format("store_row: dtype {} is not bf16/f16/f32", dtype_name(dtype)));
  }
}

// Rounds every value of a float buffer to the precision of dtype (identity for f32).
inline void round_row(float* values, int64_t n, DType dtype) {
  if (dtype == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i)
      values[i] = round_to_bf16(values[i]);
  } else if (dtype == DType::kF16) {
    for (int64_t i = 0; i < n; ++i)
      values[i] = round_to_f16(values[i]);
  }
}

}  // namespace moekit::detail
