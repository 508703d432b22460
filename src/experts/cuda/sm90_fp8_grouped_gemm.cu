// The fp8 families of the Hopper grouped GEMM (sm90_grouped_gemm.h): e4m3 operands with per-tensor,
// per-row / per-channel or 1x128 / 128x128 block scales, bf16 / f16 output. Block scales run the
// kFp8 rows (each 128-element K block promoted out of the tensor cores, sm90/grouped_kernels.cuh
// KStep); scales that do not vary along K run the kFp8Direct rows (accumulated in the tensor cores
// over all of K, the scales applied in the epilogue).
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

namespace {

// f(std::integral_constant<TileFamily, family>) for the fp8 family of `args`.
template <typename F>
cudaError_t with_fp8_family(const GroupedGemmArgs& args, F&& f) {
  if (tile_family_of(args) == TileFamily::kFp8) {
    return f(std::integral_constant<TileFamily, TileFamily::kFp8>{});
  }
  return f(std::integral_constant<TileFamily, TileFamily::kFp8Direct>{});
}

}  // namespace

// Both families' rows: W's launch state is prepared before the scales of a problem are known.
cudaError_t prepare_fp8(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    MOEKIT_CUDA_TRY((prepare_rows<__nv_fp8_e4m3, OutT, TileFamily::kFp8>(args, cache)));
    return prepare_rows<__nv_fp8_e4m3, OutT, TileFamily::kFp8Direct>(args, cache);
  });
}

cudaError_t run_fp8(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                    cudaStream_t stream, void* workspace) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    return with_fp8_family(args, [&](auto family) {
      return with_tile<decltype(family)::value>(row, [&](auto tile) {
        return launch<__nv_fp8_e4m3, OutT, decltype(tile)::value>(args, params, stream, workspace);
      });
    });
  });
}

}  // namespace detail
}  // namespace moekit::cuda
