// Host-side pieces of the kit every grouped-GEMM variant launches with: the device's SM count, W's
// TMA descriptor, the persistent grid size.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "experts/cuda/sm90/launch_cache.h"
#include "experts/cuda/sm90_grouped_gemm.h"

namespace moekit::cuda::sm90 {

inline int div_up(int64_t a, int64_t b) {
  return static_cast<int>((a + b - 1) / b);
}

// Multiprocessors of the current device.
cudaError_t current_device_sms(int* sms);

// W (experts, n, k) as a 3-D tensor map {k, n, experts}; box {box_k, box_n, 1}, 128-byte swizzle,
// zeros out of bounds.
cudaError_t encode_w_map(const void* w, int64_t n, int64_t k, int64_t experts, ElemType dtype,
                         int box_k, int box_n, TmaDescriptor* out);

// Upper bound on the work items of row `tile` (n_tiles of its bn): every expert may end in a
// partial tile.
int64_t items_upper_bound(const GroupedGemmArgs& args, const TileConfig& tile, int n_tiles);

// CTAs of the persistent grid: occupancy (min_blocks per SM) x multiprocessors, capped by max_ctas
// (> 0) and by the largest number of work items the schedule can hold (every expert may end in a
// partial tile); at least 1.
int grid_size(const GroupedGemmArgs& args, const TileConfig& tile, int n_tiles, int sms,
              int max_ctas);

// The grid of a stream-K launch of row `tile` (min_blocks x multiprocessors, capped by max_ctas),
// or 0 where the launch walks its items round-robin: no workspace, params.stream_k kOff, more
// than kStreamKMaxItems items or kStreamKMaxSms multiprocessors, or (kBalance) !stream_k_pays.
int stream_k_grid(const GroupedGemmArgs& args, const TileConfig& tile, int n_tiles, int sms,
                  const GroupedGemmParams& params, const void* workspace);

}  // namespace moekit::cuda::sm90
