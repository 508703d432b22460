#include "experts/cuda/sm90/host.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstring>

namespace moekit::cuda::sm90 {
namespace {

// cuTensorMapEncodeTiled from the driver, looked up once.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess) {
      ptr = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

CUtensorMapDataType tma_type(ElemType t) {
  switch (t) {
    case ElemType::kBF16:
      return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case ElemType::kF16:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case ElemType::kF32:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    default:  // fp8 / int8: the copy is bytes
      return CU_TENSOR_MAP_DATA_TYPE_UINT8;
  }
}

}  // namespace

static_assert(sizeof(CUtensorMap) == sizeof(TmaDescriptor) &&
              alignof(CUtensorMap) <= alignof(TmaDescriptor));

cudaError_t current_device_sms(int* sms) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  return cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
}

cudaError_t encode_w_map(const void* w, int64_t n, int64_t k, int64_t experts, ElemType dtype,
                         int box_k, int box_n, TmaDescriptor* out) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t es = static_cast<cuuint64_t>(elem_bytes(dtype));
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n),
                              static_cast<cuuint64_t>(experts)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(k) * es,
                                 static_cast<cuuint64_t>(n) * static_cast<cuuint64_t>(k) * es};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_k), static_cast<cuuint32_t>(box_n), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r =
      encode(&map, tma_type(dtype), 3, const_cast<void*>(w), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  std::memcpy(out->bytes.data(), &map, sizeof(map));
  return cudaSuccess;
}

int64_t items_upper_bound(const GroupedGemmArgs& args, const TileConfig& tile, int n_tiles) {
  const int64_t rows_ub =
      args.expert_counts != nullptr
          ? std::min<int64_t>(args.num_rows_upper_bound, args.batched_stride * args.num_experts)
          : args.num_rows_upper_bound;
  return (rows_ub / tile.bm + std::min<int64_t>(args.num_experts, rows_ub)) * n_tiles;
}

int stream_k_grid(const GroupedGemmArgs& args, const TileConfig& tile, int n_tiles, int sms,
                  const GroupedGemmParams& params, const void* workspace) {
  if (workspace == nullptr || params.stream_k == StreamK::kOff || !stream_k_capable(tile) ||
      sms > kStreamKMaxSms) {
    return 0;
  }
  const int64_t items = items_upper_bound(args, tile, n_tiles);
  if (items > kStreamKMaxItems || items == 0) return 0;
  if (params.stream_k == StreamK::kBalance && !stream_k_pays(items, sms)) return 0;
  int64_t grid = static_cast<int64_t>(sms) * tile.min_blocks;
  if (params.max_ctas > 0) grid = std::min<int64_t>(grid, params.max_ctas);
  return static_cast<int>(grid);
}

int grid_size(const GroupedGemmArgs& args, const TileConfig& tile, int n_tiles, int sms,
              int max_ctas) {
  const int64_t items_ub = items_upper_bound(args, tile, n_tiles);
  int64_t grid = static_cast<int64_t>(sms) * tile.min_blocks;
  if (max_ctas > 0) grid = std::min<int64_t>(grid, max_ctas);
  return static_cast<int>(std::max<int64_t>(1, std::min(grid, items_ub)));
}

}  // namespace moekit::cuda::sm90
