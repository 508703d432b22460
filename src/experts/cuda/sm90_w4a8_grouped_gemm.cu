// The W4A8 family of the Hopper grouped GEMM (sm90_grouped_gemm.h): int4-packed W (uint4b8
// nibbles, per-expert or per-channel f32 scales) with e4m3 A and per-tensor or per-row A scales,
// bf16 / f16 output. The producer warpgroup streams the packed weights (half the bytes of fp8)
// with the tokens and converts each K step exactly to e4m3 (sm90/int4_layout.h) for the consumers'
// e4m3 wgmma, which accumulate over all of K like the kFp8Direct rows; the scales are applied once
// in the epilogue. With a scale per channel and 128 of K (WScale::kGroup128: int4 groups of 128)
// the kW4A8Group rows promote every K step instead, each weight row times its group's scale.
// MXFP4 W with e4m3 A (WPacking::kMxfp4Fp8, the kMxfp4A8 rows) runs the group rows' kernels: the
// producer converts each 32-element group with its e8m0 scale folded in, relative to a reference
// per row and K step (sm90/mx_e4m3.h), whose scale the consumers promote. The mainloops of
// sm90/grouped_kernels.cuh over the kW4A8, kW4A8Group and kMxfp4A8 rows of the tile table.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda {
namespace detail {

using namespace sm90;  // NOLINT: the kit

// Supported and compiled: e4m3 A with kTensor / kRow scales; W int4-packed with kExpert /
// kChannel scales, or kGroup128 (16-byte aligned: the producer copies them in 16-byte chunks);
// bf16 or f16 out; k a multiple of 32 (whole 16-byte packed chunks); every kW4A8 and kW4A8Group
// row.
// MXFP4: W's scales are its e8m0 words (w_group_scale, 16-byte aligned), no w_scale.
std::string can_implement_w4a8(const GroupedGemmArgs& args) {
  using std::to_string;
  const bool mx = args.w_packing == WPacking::kMxfp4Fp8;
  if (args.w_packing != WPacking::kInt4 && !mx) return "W is not int4- or MXFP4-packed";
  if (args.dtype != ElemType::kE4M3) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not e4m3 (" +
           (mx ? "MXFP4 W of this packing" : "int4 W") + " runs with fp8 activations)";
  }
  if (mx) {
    if (args.w_scale_kind != WScale::kNone || args.w_scale != nullptr) {
      return "MXFP4 W takes no w_scale beside its e8m0 words (w_group_scale)";
    }
    if (args.w_group_scale == nullptr ||
        reinterpret_cast<uintptr_t>(args.w_group_scale) % 16 != 0) {
      return "MXFP4 W needs its e8m0 words (w_group_scale), 16-byte aligned";
    }
    if (args.out_dtype != ElemType::kBF16 && args.out_dtype != ElemType::kF16) {
      return std::string("out_dtype ") + elem_type_name(args.out_dtype) + " is not bf16 or f16";
    }
    if (args.k % 32 != 0)
      return "k=" + to_string(args.k) + " is not a multiple of 32 (MXFP4 groups)";
    if (args.a_scale_kind != AScale::kTensor && args.a_scale_kind != AScale::kRow) {
      return "MXFP4 x fp8 A takes a per-tensor or per-row scale";
    }
    if (args.a_scale == nullptr || reinterpret_cast<uintptr_t>(args.a_scale) % 4 != 0) {
      return "A needs its scales (a_scale), 4-byte aligned";
    }
    if (args.lda % 16 != 0) return "lda=" + to_string(args.lda) + " is not a multiple of 16";
    return "";
  }
  if (std::string why = check_8bit_operands(args, "W4A8"); !why.empty()) return why;
  if (args.k % 32 != 0) {
    return "k=" + to_string(args.k) + " is not a multiple of 32 (whole 16-byte chunks of int4)";
  }
  if (args.a_scale_kind != AScale::kTensor && args.a_scale_kind != AScale::kRow) {
    return "W4A8 A takes a per-tensor or per-row scale (no 1x128 groups)";
  }
  if (args.w_scale_kind != WScale::kExpert && args.w_scale_kind != WScale::kChannel &&
      args.w_scale_kind != WScale::kGroup128) {
    return "W4A8 W takes a per-expert or per-channel scale, or one per channel and 128 of K";
  }
  if (args.w_scale_kind == WScale::kGroup128 &&
      reinterpret_cast<uintptr_t>(args.w_scale) % 16 != 0) {
    return "W4A8 group scales (w_scale) must be 16-byte aligned";
  }
  return "";
}

// Both families' rows: the weights are prepared (Experts::bind_weights) before their scales are
// bound, so args may not say how the scales group.
cudaError_t prepare_w4a8(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    if (args.w_packing == WPacking::kMxfp4Fp8) {
      return prepare_rows<__nv_fp8_e4m3, OutT, TileFamily::kMxfp4A8>(args, cache);
    }
    MOEKIT_CUDA_TRY((prepare_rows<__nv_fp8_e4m3, OutT, TileFamily::kW4A8>(args, cache)));
    return prepare_rows<__nv_fp8_e4m3, OutT, TileFamily::kW4A8Group>(args, cache);
  });
}

cudaError_t run_w4a8(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                     cudaStream_t stream) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    auto run_row = [&](auto tile) {
      return launch<__nv_fp8_e4m3, OutT, decltype(tile)::value>(args, params, stream);
    };
    if (args.w_packing == WPacking::kMxfp4Fp8) return with_tile<TileFamily::kMxfp4A8>(row, run_row);
    return args.w_scale_kind == WScale::kGroup128 ? with_tile<TileFamily::kW4A8Group>(row, run_row)
                                                  : with_tile<TileFamily::kW4A8>(row, run_row);
  });
}

}  // namespace detail

namespace {

__global__ void split_int4_kernel(uint4* w, int64_t chunks) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = w[c];
    w[c] = make_uint4(sm90::int4_split_word(v.x), sm90::int4_split_word(v.y),
                      sm90::int4_split_word(v.z), sm90::int4_split_word(v.w));
  }
}

}  // namespace

cudaError_t split_int4_codes(void* w, int64_t bytes, cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0 || bytes % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t chunks = bytes / 16;
  const int64_t blocks = std::min<int64_t>((chunks + 255) / 256, 4096);
  split_int4_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<uint4*>(w),
                                                                       chunks);
  return cudaGetLastError();
}

}  // namespace moekit::cuda
