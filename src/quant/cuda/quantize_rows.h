// Activation quantization on the GPU: rows of a bf16 / f16 / f32 matrix into fp8 e4m3 or int8
// codes with fp32 scales, the same numbers as the host reference (quant/quantize.h: scale =
// max(amax, 1e-10) / qmax or the static scale, code = round-to-nearest-even(x / scale),
// saturating), bit for bit. Used by prepare (a1) and by the experts between the GEMMs (a2); the
// scales are written in the layout the grouped GEMM loads (sm90_grouped_gemm.h, AScale).
// Graph-capturable: no allocation, no synchronisation, no host reads of device data. Each thread
// takes 16 or 8 consecutive elements of a row (vector loads and stores where cols, the strides,
// the group and the pointers allow; else one element): per row, one warp (the whole block for
// long rows); per group, 8 or 32 lanes; per tensor, a flat walk.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/cuda/elem_type.h"

namespace moekit::cuda {

enum class RowQuant : uint8_t {
  kTensorStatic,   // one given scale: *static_scale (device)
  kTensorDynamic,  // one scale over every (valid) row: scale[0] = amax / qmax; two passes
  kRow,            // a scale per row: scale[r]
  kGroup,          // a scale per (row, group of `group` columns): scale[r * scale_ld + g]
};

struct QuantizeRowsArgs {
  const void* x = nullptr;            // (rows, cols) row stride x_ld elements
  ElemType x_type = ElemType::kBF16;  // kBF16, kF16 or kF32
  int64_t rows = 0, cols = 0, x_ld = 0;
  // Optional (device): only rows < *num_rows are quantized; the others are left untouched (and
  // left out of a dynamic per-tensor amax).
  const int32_t* num_rows = nullptr;
  // Optional (device), the batched format: the rows in blocks of batch_rows (rows a multiple of
  // it), block b's first batch_counts[b] valid (clamped to [0, batch_rows]); the others are left
  // untouched and out of a dynamic per-tensor amax, as num_rows leaves them.
  const int32_t* batch_counts = nullptr;
  int64_t batch_rows = 0;
  void* q = nullptr;                  // (rows, cols) codes, row stride q_ld bytes
  ElemType q_type = ElemType::kE4M3;  // kE4M3 or kS8
  int64_t q_ld = 0;
  RowQuant kind = RowQuant::kGroup;
  int group = 128;                         // kGroup: columns per scale
  const float* static_scale = nullptr;     // kTensorStatic: (1,) on the device
  float* scale = nullptr;                  // the scales written (kTensorStatic: none)
  int64_t scale_ld = 0;                    // kGroup: floats between rows (>= ceil(cols / group))
  unsigned int* amax_workspace = nullptr;  // kTensorDynamic: one word of device memory
  // e4m3 per-tensor only: each code stored as its value in bf16 (exact: 4 significant bits), q
  // (rows, cols) bf16 with row stride q_ld elements, for GEMMs on bf16 operands (the Hopper MXFP4
  // kernels, the scale applied in their epilogue). q may be x (in place, same strides).
  bool codes_as_bf16 = false;
};

// nullptr when the launch can run, else why not.
const char* quantize_rows_unsupported_reason(const QuantizeRowsArgs& args);

// Enqueues the quantization on stream.
cudaError_t launch_quantize_rows(const QuantizeRowsArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda
