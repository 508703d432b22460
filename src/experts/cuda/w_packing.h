// How the Hopper grouped GEMM (sm90_grouped_gemm.h) finds W stored when it is not in the operand
// type. Plain data, no CUDA headers: the experts' launch state (sm90_experts.h) keeps one.
#pragma once

#include <cstdint>

namespace moekit::cuda {

// How W is stored when it is not in the operand type:
enum class WPacking : uint8_t {
  kNone,       // W in dtype (bf16 / f16 / e4m3 / int8)
  kMxfp4,      // OCP MXFP4: w (num_experts, n, k / 2) bytes of e2m1 codes, each 32-element group's
               // 16 bytes in the kernel nibble order (sm90/mxfp4_layout.h; reorder_mxfp4_groups
               // converts the standard order, element 2i in the low nibble of byte i),
               // w_group_scale (num_experts, n, k / 32) e8m0 codes; dtype (A and C) bf16. Each
               // 32-element group is converted exactly to bf16 (e2m1 x 2^(s - 127)).
  kNvfp4,      // NVFP4: w as for kMxfp4 (the same nibble order), w_group_scale (num_experts, n,
               // k / 16) kernel scale codes of the ue4m3 scales (nvfp4_kernel_scale), w_scale_kind
               // kExpert with w_scale (num_experts,) = each expert's global scale x 2^8
               // (kNvfp4PairExponentScale); dtype bf16. Each element converts exactly to the bf16
               // e2m1 x s x 2^-8; the epilogue applies the rest in fp32.
  kMxfp6E2M3,  // OCP MXFP6 (e2m3 / e3m2 codes, one e8m0 scale per 32 of K): w (num_experts, n,
  kMxfp6E3M2,  // 3k / 4) bytes, each row in the kernel layout of sm90/mxfp6_layout.h (the codes'
               // low four bits as an MXFP4 row in the kernel nibble order, then their top two
               // bits, 8 bytes per group; mxfp6_repack_rows converts the standard layout),
               // w_group_scale as for kMxfp4; dtype bf16; k a multiple of 64 (16-byte rows).
               // Each element is converted exactly to bf16 (fp6 x 2^(s - 127)).
  kInt4,  // int4 (W4A8): w (num_experts, n, k / 2) bytes of split codes: uint4b8 nibbles (value =
          // nibble - 8, element 2i in the low nibble of byte i) with bits 2 and 3 swapped
          // (int4_split_word, sm90/int4_layout.h; the layer's sm90_w4a8 weight layout stores
          // them so), dtype (A) kE4M3 with its scales, W scales kExpert or kChannel (f32, the
          // int4 code's unit); k a multiple of 32. Each element converts exactly to e4m3; the
          // tensor cores accumulate over all of K (as kFp8Direct) and the epilogue applies the
          // scales.
  kMxfp4Fp8,  // OCP MXFP4 with e4m3 A (and its scales): w (num_experts, n, k / 2) bytes of e2m1
              // codes in the standard order (element 2i in the low nibble of byte i),
              // w_group_scale (num_experts, ceil(k / 128), n) words of a row's four e8m0 codes per
              // 128 of K (byte q: group 4 kt + q; K-major, zeros past K; 16-byte aligned), no
              // w_scale; k a multiple of 32. Each group converts exactly to e4m3 with its scale
              // folded in relative to its row and step's reference (sm90/mx_e4m3.h); the
              // consumers promote every step with the reference scale.
};

}  // namespace moekit::cuda
