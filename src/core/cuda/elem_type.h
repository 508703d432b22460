// The one element-type enum of the CUDA kernels: every kernel parameter block names the storage
// type of a tensor with it (activations, logits, GEMM operands). Plain data, no CUDA headers.
#pragma once

#include <cstdint>

#include "moekit/core/dtype.h"
#include "moekit/core/error.h"

namespace moekit::cuda {

enum class ElemType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kE4M3,  // fp8 e4m3fn
  kE5M2,  // fp8 e5m2
  kS8,    // int8
};

constexpr int elem_bytes(ElemType t) {
  return t == ElemType::kF32 ? 4 : (t == ElemType::kBF16 || t == ElemType::kF16) ? 2 : 1;
}

constexpr const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return "f32";
    case ElemType::kBF16:
      return "bf16";
    case ElemType::kF16:
      return "f16";
    case ElemType::kE4M3:
      return "fp8_e4m3";
    case ElemType::kE5M2:
      return "fp8_e5m2";
    case ElemType::kS8:
      return "int8";
  }
  return "?";
}

// Whether t is one of the float storage types the elementwise kernels read and write (f32, bf16,
// f16: core/cuda/elem_io.cuh).
constexpr bool is_float_storage(ElemType t) {
  return t == ElemType::kF32 || t == ElemType::kBF16 || t == ElemType::kF16;
}
inline bool is_float_storage(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

// The kernels' element type of a library dtype; throws moekit::Error for dtypes without one.
inline ElemType elem_type_of(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ElemType::kF32;
    case DType::kBF16:
      return ElemType::kBF16;
    case DType::kF16:
      return ElemType::kF16;
    case DType::kFp8E4M3:
      return ElemType::kE4M3;
    case DType::kFp8E5M2:
      return ElemType::kE5M2;
    case DType::kInt8:
      return ElemType::kS8;
    default:
      MOEKIT_CHECK(false, "dtype {} has no CUDA kernel element type", dtype_name(dtype));
  }
  return ElemType::kF32;
}

// elem_type_of for the float storage types only (what the activation, reduce and unpermute kernels
// read and write); throws moekit::Error for any other dtype.
inline ElemType float_storage_of(DType dtype) {
  MOEKIT_CHECK(is_float_storage(dtype), "dtype {} is not f32, bf16 or f16", dtype_name(dtype));
  return elem_type_of(dtype);
}

}  // namespace moekit::cuda
