// The int8 family of the Hopper grouped GEMM (sm90_grouped_gemm.h): int8 operands (s8 wgmma),
// exact int32 accumulation, per-tensor or per-row (per-token) A scales with per-expert or
// per-channel W scales applied once in the epilogue, bf16 / f16 output; the mainloops of
// sm90/grouped_kernels.cuh over the kInt8 rows of the tile table.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda {
namespace detail {

using namespace sm90;  // NOLINT: the kit

// Supported and compiled: int8 operands; bf16 or f16 out; A scales kTensor / kRow, W scales
// kExpert / kChannel (any pairing; int8 has no block-scaled format here); every kInt8 row.
std::string can_implement_int8(const GroupedGemmArgs& args) {
  if (args.dtype != ElemType::kS8) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not int8";
  }
  if (std::string why = check_8bit_operands(args, "int8"); !why.empty()) return why;
  if (args.a_scale_kind != AScale::kTensor && args.a_scale_kind != AScale::kRow) {
    return "int8 A takes a per-tensor or per-row scale (no 1x128 groups)";
  }
  if (args.w_scale_kind != WScale::kExpert && args.w_scale_kind != WScale::kChannel) {
    return "int8 W takes a per-expert or per-channel scale (no blocks)";
  }
  return "";
}

cudaError_t prepare_int8(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    return prepare_rows<int8_t, OutT, TileFamily::kInt8>(args, cache);
  });
}

cudaError_t run_int8(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                     cudaStream_t stream) {
  return with_out_type(args.out_dtype, [&](auto tag) {
    using OutT = decltype(tag);
    return with_tile<TileFamily::kInt8>(row, [&](auto tile) {
      return launch<int8_t, OutT, decltype(tile)::value>(args, params, stream);
    });
  });
}

}  // namespace detail
}  // namespace moekit::cuda
