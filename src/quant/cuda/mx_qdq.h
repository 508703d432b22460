// OCP MX quantize-dequantize of activation rows on the GPU: each group of 32 columns gets the
// e8m0 scale 2^e, e = floor(log2(amax)) - emax of the element format (clamped to [-127, 127];
// -127 for an all-zero group), each value the element code nearest x / 2^e (round to nearest
// even on the format's grid, subnormals included, saturating; NaN to +max), and the value is
// written back as code x 2^e — the numbers of the host's quant_dequant_rows (quant/quantize.h,
// QuantScheme::mx with kFloor) bit for bit. Every such value is a bf16 (e2m1 / e3m2 / e2m3 carry
// at most 4 significant bits), so the output is exact in bf16: the Hopper MXFP4 experts run
// MXFP4 / MXFP6 activations this way on their bf16 wgmma (Hopper has no fp4 / fp6 tensor cores).
// Graph-capturable: no allocation, no synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::cuda {

enum class MxElement : uint8_t { kE2M1, kE3M2, kE2M3 };

struct MxQdqArgs {
  const void* x = nullptr;  // (rows, cols) bf16, row stride x_ld elements
  void* y = nullptr;        // (rows, cols) bf16, row stride y_ld elements; may be x
  int64_t rows = 0, cols = 0, x_ld = 0, y_ld = 0;
  // Optional (device): only rows < *num_rows are written.
  const int32_t* num_rows = nullptr;
  MxElement element = MxElement::kE2M1;
};

// nullptr when the launch can run, else why not (cols a multiple of 32, strides >= cols, ...).
const char* mx_qdq_unsupported_reason(const MxQdqArgs& args);

// Enqueues the quantize-dequantize on stream.
cudaError_t launch_mx_qdq(const MxQdqArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda
