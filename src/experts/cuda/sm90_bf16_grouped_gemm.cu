// The 16-bit family of the Hopper grouped GEMM (sm90_grouped_gemm.h): bf16 / f16 operands and
// output, fp32 accumulation, the mainloops of sm90/grouped_kernels.cuh over the k16Bit rows of the
// tile table.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "experts/cuda/sm90/grouped_kernels.cuh"

namespace moekit::cuda {
namespace {

using namespace sm90;  // NOLINT: the kit

// f(T{}) for the 16-bit element type of the problem.
template <typename F>
cudaError_t with_type(ElemType dtype, F&& f) {
  if (dtype == ElemType::kBF16) return f(__nv_bfloat16{});
  return f(__half{});
}

}  // namespace

namespace detail {

// Supported and compiled (house rule: the predicate beside the instantiations): bf16 and f16, every
// k16Bit row of the tile table, output in the operand type.
std::string can_implement_16bit(const GroupedGemmArgs& args) {
  if (args.dtype != ElemType::kBF16 && args.dtype != ElemType::kF16) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not bf16 or f16";
  }
  if (args.a_scale_kind != AScale::kNone || args.w_scale_kind != WScale::kNone) {
    return "scales are given for 16-bit operands";
  }
  return "";
}

cudaError_t prepare_16bit(const GroupedGemmArgs& args, sm90::WeightLaunchCache* cache) {
  return with_type(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    return prepare_rows<T, T, TileFamily::k16Bit>(args, cache);
  });
}

cudaError_t run_16bit(const GroupedGemmArgs& args, int row, const GroupedGemmParams& params,
                      cudaStream_t stream, void* workspace) {
  return with_type(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    return with_tile<TileFamily::k16Bit>(row, [&](auto tile) {
      return launch<T, T, decltype(tile)::value>(args, params, stream, workspace);
    });
  });
}

cudaError_t run_16bit_pair(const GroupedGemmArgs& g1, const GroupedGemmArgs& g2, int row,
                           int32_t* expert_done, const sm90::WeightLaunchCache* cache,
                           cudaStream_t stream) {
  return with_type(g1.dtype, [&](auto tag) {
    using T = decltype(tag);
    return with_tile<TileFamily::k16Bit>(row, [&](auto tile) {
      constexpr int kRow = decltype(tile)::value;
      if constexpr (ShapeOf<T, kRow>::kSimt) {
        return launch_pair<T, T, kRow, WPacking::kMxfp4>(g1, g2, expert_done, cache, stream);
      } else {
        return cudaErrorInvalidValue;
      }
    });
  });
}

}  // namespace detail
}  // namespace moekit::cuda
