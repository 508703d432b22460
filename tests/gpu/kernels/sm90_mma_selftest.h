// Test-only device entry point (sm90_mma_selftest.cu, compiled only with CUDA): one warpgroup runs
// the kit's wgmma wrappers (experts/cuda/sm90/ptx.cuh) on operands staged in shared memory.
// Plain types only: tests reach it through the seam of core/cuda_seam.h.
#pragma once

#include <string>

#include "core/cuda/elem_type.h"

namespace moekit::testing {

// Shared-memory layout of the staged operands.
enum class MmaLayout {
  kSwizzle128,  // the GEMM mainloops' ring: 128-byte rows, 16-byte chunk c of row r at c ^ (r % 8)
  kNoSwizzle,   // the probes': per 32 bytes of K, 8x16-byte core matrices, LBO 128 B, SBO 256 B
};

// d (64 x n) = a (64 x 128 bytes of K) @ b (n x 128 bytes of K)^T on the tensor cores: four wgmma
// of 32 bytes of K each (type: kBF16, kF16, kE4M3, kE5M2 or kS8; n: 8, 64, 128 or 256). a, b and
// d are host buffers: a and b row-major raw element bytes (K-major), d row-major 64 x n fp32 (int32
// for kS8). Returns "" or what went wrong.
std::string run_wgmma_selftest(cuda::ElemType type, int n, MmaLayout layout, const void* a,
                               const void* b, void* d);

}  // namespace moekit::testing
