// Internal: mappings from library enums to the CUDA kernels' enums, and checked launch helpers
// shared by the Hopper experts and the device hooks.
#pragma once

#include "experts/cuda/moe_activation.h"
#include "experts/cuda/sm90_grouped_gemm.h"
#include "moekit/config/activation.h"
#include "moekit/core/tensor.h"

namespace moekit {

// The GEMM's element type of dtype (bf16 or f16); throws moekit::Error naming the dtype otherwise.
cuda::ElemType gemm_dtype_of(DType dtype);
cuda::ActKind act_kind_of(Activation activation);
// Throws moekit::Error with the GEMM's can_implement reason or the failing CUDA call.
void run_gemm(const cuda::GroupedGemmArgs& args, Stream stream, const char* what);
// Rows of (rows, n) -> (rows, activation_output_dim(n)); optional device row masks.
void run_activation(Activation act, const ActivationParams& params, const void* in, void* out,
                    DType dtype, int64_t rows, int64_t n, const int32_t* valid_rows,
                    const int32_t* permuted_rows, Stream stream);

}  // namespace moekit
