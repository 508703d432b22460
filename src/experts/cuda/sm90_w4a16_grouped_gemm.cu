// The W4A16 family of the Hopper grouped GEMM (sm90_grouped_gemm.h): MXFP4-packed W (e2m1 codes in
// the kernel nibble order + one e8m0 scale per 32 of K) or NVFP4-packed W (the same codes, a ue4m3
// scale per 16 of K as kernel scale codes, a global scale per expert in the epilogue) with bf16 A
// and C, fp32 accumulation on the bf16 wgmma. The packed weights stream from memory at 4.25 bits
// per element and are converted to bf16 each K step, into registers (the swap-AB decode row,
// w4a16_swapab_kernel) or into shared memory (w4a16_kernel), over the kW4A16 rows of the tile
// table; and the in-place reorder of standard MXFP4 codes into the kernel order.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda {
namespace detail {

using namespace sm90;  // NOLINT: the kit

// Supported and compiled: bf16 A and C (f16 activations would need another conversion); W
// packed as MXFP4 with its e8m0 group scales, or as NVFP4 with its kernel scale codes and the
// experts' global scales; k a multiple of 32 (whole 16-byte packed chunks); no A scales; every
// kW4A16 row of the tile table.
std::string can_implement_w4a16(const GroupedGemmArgs& args) {
  using std::to_string;
  const bool nvfp4 = args.w_packing == WPacking::kNvfp4;
  if (args.w_packing != WPacking::kMxfp4 && !nvfp4) return "W is not MXFP4- or NVFP4-packed";
  const char* format = nvfp4 ? "NVFP4" : "MXFP4";
  if (args.dtype != ElemType::kBF16) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not bf16 (" + format +
           " weights run with bf16 activations)";
  }
  if (args.k % 32 != 0) {
    return "k=" + to_string(args.k) + " is not a multiple of 32 (" +
           (nvfp4 ? "NVFP4 rows in whole 16-byte groups of 32" : "MXFP4 groups of 32") + ")";
  }
  if (args.w_group_scale == nullptr) {
    return nvfp4 ? "NVFP4 W needs its ue4m3 group scale codes (w_group_scale)"
                 : "MXFP4 W needs its e8m0 group scales (w_group_scale)";
  }
  if (args.a_scale_kind != AScale::kNone) {
    return std::string("A scales are given for ") + format + " W with bf16 A";
  }
  if (nvfp4) {
    if (args.w_scale_kind != WScale::kExpert || args.w_scale == nullptr) {
      return "NVFP4 W needs its experts' global scales (w_scale_kind kExpert, w_scale)";
    }
    if (reinterpret_cast<uintptr_t>(args.w_group_scale) % 2 != 0) {
      return "NVFP4 w_group_scale is not 2-byte aligned";
    }
  } else if (args.w_scale_kind != WScale::kNone &&
             (args.w_scale_kind != WScale::kExpert || args.w_scale == nullptr)) {
    // kExpert: a scale per expert in the epilogue (fp8 activations' codes on the bf16 operands)
    return "MXFP4 W takes no scale beside its group scales but one per expert (kExpert)";
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

namespace {

// One 16-byte group per thread, in place (the permutation stays inside the group).
__global__ void reorder_mxfp4_kernel(uint4* w, int64_t groups, bool to_kernel) {
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = w[g];
    const uint32_t src[4] = {v.x, v.y, v.z, v.w};
    uint32_t dst[4] = {0, 0, 0, 0};
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      const int e = sm90::mxfp4_kernel_element(n);
      const int from = to_kernel ? e : n, to = to_kernel ? n : e;
      dst[to / 8] |= ((src[from / 8] >> (4 * (from % 8))) & 0xFu) << (4 * (to % 8));
    }
    w[g] = make_uint4(dst[0], dst[1], dst[2], dst[3]);
  }
}

}  // namespace

cudaError_t reorder_mxfp4_groups(void* w, int64_t groups, bool to_kernel, cudaStream_t stream) {
  if (groups <= 0) return cudaSuccess;
  if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((groups + 255) / 256, 4096);
  reorder_mxfp4_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<uint4*>(w),
                                                                          groups, to_kernel);
  return cudaGetLastError();
}

}  // namespace moekit::cuda
