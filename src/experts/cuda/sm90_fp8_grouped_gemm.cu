// The fp8 family of the Hopper grouped GEMM (sm90_grouped_gemm.h): e4m3 operands with per-tensor,
// per-row / per-channel or 1x128 / 128x128 block scales, bf16 / f16 output, fp32 accumulation with
// each 128-element K block promoted out of the tensor cores (sm90/grouped_kernels.cuh, KStep),
// over the kFp8 rows of the tile table.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda {
namespace detail {

using namespace sm90;  // NOLINT: the kit

// Supported and compiled: e4m3 operands; bf16 or f16 out; A scales kTensor / kRow / kRowBlock128,
// W scales kExpert / kChannel / kBlock32x128 (any pairing); k a multiple of 16 (16-byte rows of
// A for cp.async), every kFp8 row of the tile table.
std::string can_implement_fp8(const GroupedGemmArgs& args) {
  using std::to_string;
  if (args.dtype != ElemType::kE4M3) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not e4m3";
  }
  if (std::string why = check_8bit_operands(args, "fp8"); !why.empty()) return why;
  if (args.a_scale_kind == AScale::kRowBlock128 && args.a_scale_ld < (args.k + 127) / 128) {
    return "a_scale_ld=" + to_string(args.a_scale_ld) +
           " is less than ceil(k / 128)=" + to_string((args.k + 127) / 128);
  }
  return "";
}

cudaError_t prepare_fp8(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    return prepare_rows<__nv_fp8_e4m3, OutT, TileFamily::kFp8>(args, cache);
  });
}

cudaError_t run_fp8(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                    cudaStream_t stream) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    return with_tile<TileFamily::kFp8>(row, [&](auto tile) {
      return launch<__nv_fp8_e4m3, OutT, decltype(tile)::value>(args, params, stream);
    });
  });
}

}  // namespace detail
}  // namespace moekit::cuda
