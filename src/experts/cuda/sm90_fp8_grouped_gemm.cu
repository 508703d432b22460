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
namespace {

using namespace sm90;  // NOLINT: the kit

// f(OutT{}) for the output type of the problem.
template <typename F>
cudaError_t with_out_type(ElemType out, F&& f) {
  if (out == ElemType::kBF16) return f(__nv_bfloat16{});
  return f(__half{});
}

}  // namespace

namespace detail {

// Supported and compiled: e4m3 operands; bf16 or f16 out; A scales kTensor / kRow / kRowBlock128,
// W scales kExpert / kChannel / kBlock32x128 (any pairing); k a multiple of 16 (16-byte rows of
// A for cp.async), every kFp8 row of the tile table.
std::string can_implement_fp8(const GroupedGemmArgs& args) {
  using std::to_string;
  if (args.dtype != ElemType::kE4M3) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not e4m3";
  }
  if (args.out_dtype != ElemType::kBF16 && args.out_dtype != ElemType::kF16) {
    return std::string("out_dtype ") + elem_type_name(args.out_dtype) + " is not bf16 or f16";
  }
  if (args.k % 16 != 0) return "k=" + to_string(args.k) + " is not a multiple of 16 (fp8 rows)";
  if (args.lda % 16 != 0) return "lda=" + to_string(args.lda) + " is not a multiple of 16";
  if (args.a_scale_kind == AScale::kNone || args.a_scale == nullptr) {
    return "fp8 A needs its scales (a_scale_kind and a_scale)";
  }
  if (args.w_scale_kind == WScale::kNone || args.w_scale == nullptr) {
    return "fp8 W needs its scales (w_scale_kind and w_scale)";
  }
  if (args.a_scale_kind == AScale::kRowBlock128 && args.a_scale_ld < (args.k + 127) / 128) {
    return "a_scale_ld=" + to_string(args.a_scale_ld) +
           " is less than ceil(k / 128)=" + to_string((args.k + 127) / 128);
  }
  if (reinterpret_cast<uintptr_t>(args.a_scale) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(args.w_scale) % 4 != 0) {
    return "a_scale and w_scale must be 4-byte aligned";
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
