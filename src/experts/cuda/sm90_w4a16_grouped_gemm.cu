// The W4A16 family of the Hopper grouped GEMM (sm90_grouped_gemm.h): MXFP4-packed W (e2m1 codes in
// the kernel nibble order + one e8m0 scale per 32 of K), NVFP4-packed W (the same codes, a ue4m3
// scale per 16 of K as kernel scale codes, a global scale per expert in the epilogue) or
// MXFP6-packed W (e2m3 / e3m2 codes as a low nibble plane in the MXFP4 order + a plane of their
// top two bits, an e8m0 scale per 32) with bf16 A and C, fp32 accumulation on the bf16 wgmma (or
// the CUDA cores' FMA on the decode row). The packed weights stream from memory at 4.25 (6.25)
// bits per element and are converted to bf16 each K step, into registers (the swap-AB and
// CUDA-core decode rows) or into shared memory (w4a16_kernel), over the kW4A16 rows of the tile
// table; and the in-place reorders of standard MXFP4 codes and MXFP6 rows into the kernel layouts.
#include <cuda_bf16.h>

#include <algorithm>
#include <string>

#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda {
namespace detail {

using namespace sm90;  // NOLINT: the kit

// Supported and compiled: bf16 A and C (f16 activations would need another conversion); W
// packed as MXFP4 or MXFP6 with its e8m0 group scales, or as NVFP4 with its kernel scale codes and
// the experts' global scales; k a multiple of 32 (whole 16-byte packed chunks; MXFP6: of 64, rows
// of whole 16-byte chunks); no A scales; every kW4A16 row of the tile table.
std::string can_implement_w4a16(const GroupedGemmArgs& args) {
  using std::to_string;
  const bool nvfp4 = args.w_packing == WPacking::kNvfp4;
  const bool mxfp6 =
      args.w_packing == WPacking::kMxfp6E2M3 || args.w_packing == WPacking::kMxfp6E3M2;
  if (args.w_packing != WPacking::kMxfp4 && !nvfp4 && !mxfp6) {
    return "W is not MXFP4-, NVFP4- or MXFP6-packed";
  }
  const char* format = nvfp4 ? "NVFP4"
                       : mxfp6
                           ? (args.w_packing == WPacking::kMxfp6E2M3 ? "MXFP6 e2m3" : "MXFP6 e3m2")
                           : "MXFP4";
  if (args.dtype != ElemType::kBF16) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not bf16 (" + format +
           " weights run with bf16 activations)";
  }
  if (args.k % 32 != 0) {
    return "k=" + to_string(args.k) + " is not a multiple of 32 (" +
           (nvfp4 ? "NVFP4 rows in whole 16-byte groups of 32"
                  : std::string(format) + " groups of 32") +
           ")";
  }
  if (mxfp6 && args.k % 64 != 0) {
    return "k=" + to_string(args.k) + " is not a multiple of 64 (" + format +
           " rows of 3k / 4 bytes in whole 16-byte chunks)";
  }
  if (args.w_group_scale == nullptr) {
    return nvfp4 ? "NVFP4 W needs its ue4m3 group scale codes (w_group_scale)"
                 : std::string(format) + " W needs its e8m0 group scales (w_group_scale)";
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
    return std::string(format) +
           " W takes no scale beside its group scales but one per expert (kExpert)";
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

// Rows r = blockIdx.x, + gridDim.x, ...: the row copied whole into shared memory, then each
// thread rewrites groups of it from the copy (a group's bytes in either layout belong to it alone).
__global__ void repack_mxfp6_kernel(uint8_t* w, int64_t rows, int64_t k, bool to_kernel) {
  extern __shared__ uint4 row_copy[];
  const int64_t row_bytes = 3 * k / 4, chunks = row_bytes / 16, groups = k / 32;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    uint8_t* row = w + r * row_bytes;
    __syncthreads();  // the previous row's copy is no longer read
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x)
      row_copy[c] = reinterpret_cast<const uint4*>(row)[c];
    __syncthreads();
    for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
      uint8_t codes[sm90::kMxfp6GroupElems] = {};
      sm90::mxfp6_read_group(reinterpret_cast<const uint8_t*>(row_copy), k, g, !to_kernel, codes);
      sm90::mxfp6_write_group(row, k, g, to_kernel, codes);
    }
  }
}

}  // namespace

cudaError_t repack_mxfp6_rows(void* w, int64_t rows, int64_t k, bool to_kernel,
                              cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  constexpr int64_t kMaxK = int64_t{1} << 18;  // 192 KB of shared memory per row
  if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0 || k <= 0 || k % 64 != 0 ||
      k > kMaxK) {
    return cudaErrorInvalidValue;
  }
  const int smem = static_cast<int>(3 * k / 4);
  MOEKIT_CUDA_TRY(
      cudaFuncSetAttribute(repack_mxfp6_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int64_t blocks = std::min<int64_t>(rows, 4096);
  repack_mxfp6_kernel<<<static_cast<unsigned>(blocks), 128, smem, stream>>>(
      static_cast<uint8_t*>(w), rows, k, to_kernel);
  return cudaGetLastError();
}

cudaError_t reorder_mxfp4_groups(void* w, int64_t groups, bool to_kernel, cudaStream_t stream) {
  if (groups <= 0) return cudaSuccess;
  if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t blocks = std::min<int64_t>((groups + 255) / 256, 4096);
  reorder_mxfp4_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<uint4*>(w),
                                                                          groups, to_kernel);
  return cudaGetLastError();
}

}  // namespace moekit::cuda
