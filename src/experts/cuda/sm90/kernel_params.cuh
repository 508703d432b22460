// The parameter block every grouped-GEMM kernel of the kit takes (built on the host from the
// caller's GroupedGemmArgs). Sizes in bytes where the element size matters.
#pragma once

#include <cstdint>

#include "experts/cuda/sm90_grouped_gemm.h"

namespace moekit::cuda::sm90 {

struct KernelParams {
  const uint8_t* a;  // (rows, k) row stride lda_bytes
  int64_t lda_bytes;
  const int32_t* gather_rows;  // (num_rows,) or null
  const uint8_t* w;            // (E, n, k)
  const void* bias;            // (E, n) or null
  uint8_t* c;                  // (num_rows, n) row stride ldc_bytes
  int64_t ldc_bytes;
  bool c_rows_16b;                // c and ldc_bytes multiples of 16: whole 16-byte chunks of C rows
  const int32_t* expert_offsets;  // (E + 1,)
  const int32_t* expert_counts;   // (E,) batched form, or null
  int batched_stride;
  int num_experts;
  int n;
  int k;
  int n_tiles;
  int k_tiles;
  bool bias_is_fp32;
  // Fused gated activation (kNone: plain store of n columns).
  FusedActivation act;
  bool has_clamp;
  float limit;
  float alpha;
  // fp8 operands (sm90_grouped_gemm.h, GroupedGemmArgs): the scales of A and W.
  AScale a_scale_kind;
  const float* a_scale;
  int64_t a_scale_ld;
  WScale w_scale_kind;
  const float* w_scale;
  int w_scale_row_blocks;  // ceil(n / 32): kBlock32x128's blocks of 32 rows per expert
  // W4A16 (packed e2m1 / fp6 W): the e8m0 code of each 32-element K group (MXFP4, MXFP6), (E,
  // n, k / 32); or NVFP4's kernel scale code of each 16-element group (sm90/mxfp4_layout.h), (E,
  // n, k / 16), with the expert's global scale x 2^8 as WScale::kExpert.
  const uint8_t* w_group_scale;
  int k_groups;      // scale codes per row: k / 32, or k / 16 (NVFP4)
  WPacking packing;  // the host launches the kernels' variant of this format (their kPacking)
  // Stream-K (swapab_kernel; GroupedGemmParams::stream_k), or null: work items round-robin.
  int32_t* sk_counters;  // (kStreamKMaxItems,) K steps done per item: zero at launch, left zero
  float* sk_partials;    // two slots of 64 * bm floats per CTA: a split item's partial sums
};

}  // namespace moekit::cuda::sm90
