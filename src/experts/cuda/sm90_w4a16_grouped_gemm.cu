// The W4A16 family of the Hopper grouped GEMM (sm90_grouped_gemm.h): MXFP4-packed W (e2m1 pairs
// + one e8m0 scale per 32 of K) with bf16 A and C, fp32 accumulation on the bf16 wgmma. The packed
// weights stream from memory at 4.25 bits per element and are converted to bf16 in shared memory
// each K step (sm90/grouped_kernels.cuh, w4a16_kernel), over the kW4A16 rows of the tile table.
#include <cuda_bf16.h>

#include <string>

#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda {
namespace detail {

using namespace sm90;  // NOLINT: the kit

// Supported and compiled: bf16 A and C (f16 activations would need another conversion); W
// packed as MXFP4 with its e8m0 group scales; k a multiple of 32 (whole MX groups, 16-byte
// packed chunks); no fp8 / int8 scales; every kW4A16 row of the tile table.
std::string can_implement_w4a16(const GroupedGemmArgs& args) {
  using std::to_string;
  if (args.w_packing != WPacking::kMxfp4) return "W is not MXFP4-packed";
  if (args.dtype != ElemType::kBF16) {
    return std::string("dtype ") + elem_type_name(args.dtype) +
           " is not bf16 (MXFP4 weights run with bf16 activations)";
  }
  if (args.k % 32 != 0) {
    return "k=" + to_string(args.k) + " is not a multiple of 32 (MXFP4 groups of 32)";
  }
  if (args.w_group_scale == nullptr) return "MXFP4 W needs its e8m0 group scales (w_group_scale)";
  if (args.a_scale_kind != AScale::kNone || args.w_scale_kind != WScale::kNone) {
    return "fp8 / int8 scales are given for MXFP4 W with bf16 A";
  }
  return "";
}

cudaError_t prepare_w4a16(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache) {
  return prepare_rows<__nv_bfloat16, __nv_bfloat16, TileFamily::kW4A16>(args, cache);
}

cudaError_t run_w4a16(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                      cudaStream_t stream) {
  return with_tile<TileFamily::kW4A16>(row, [&](auto tile) {
    return launch<__nv_bfloat16, __nv_bfloat16, decltype(tile)::value>(args, params, stream);
  });
}

}  // namespace detail
}  // namespace moekit::cuda
