// The tile scheduler of the grouped GEMMs: the schedule (offsets or batched counts) -> the prefix
// of m-tiles over experts (built by one warp per CTA) -> work items (m-tile, n-tile) walked
// round-robin by a persistent grid, rasterised in groups of kRasterGroup m-tiles so that CTAs
// running together share W n-tiles and A m-tiles in L2.
#pragma once

#include "experts/cuda/sm90/kernel_params.cuh"

namespace moekit::cuda::sm90 {

inline constexpr int kRasterGroup = 8;  // m-tiles per raster group

// Rows [begin, end) of expert e in either schedule form.
__device__ __forceinline__ void expert_rows(const KernelParams& p, int e, int& begin, int& end) {
  if (p.expert_counts != nullptr) {
    begin = e * p.batched_stride;
    end = begin + min(max(__ldg(&p.expert_counts[e]), 0), p.batched_stride);
  } else {
    begin = __ldg(&p.expert_offsets[e]);
    end = max(begin, __ldg(&p.expert_offsets[e + 1]));
  }
}

// The exclusive prefix over items [0, n) of value(i), by one warp (every lane calls it): each lane
// sums a run of items, then one warp scan; write(i, sum of value over [0, i)) for every item.
// Returns the total on every lane.
template <typename Value, typename Write>
__device__ __forceinline__ int warp_exclusive_prefix(int n, int lane, Value&& value,
                                                     Write&& write) {
  const int per_lane = (n + 31) / 32;
  const int first = min(n, lane * per_lane);
  const int last = min(n, first + per_lane);
  int local = 0;
  for (int i = first; i < last; ++i)
    local += value(i);
  int inclusive = local;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  int running = inclusive - local;
  for (int i = first; i < last; ++i) {
    write(i, running);
    running += value(i);
  }
  return __shfl_sync(0xffffffffu, inclusive, 31);
}

// Warp 0 writes tile_prefix[e] = m-tiles of experts [0, e) for e = 0..E.
template <int kBM>
__device__ __forceinline__ void tile_prefix_by_warp(const KernelParams& p, int* tile_prefix,
                                                    int lane) {
  const int total = warp_exclusive_prefix(
      p.num_experts, lane,
      [&](int e) {
        int b, en;
        expert_rows(p, e, b, en);
        return (en - b + kBM - 1) / kBM;
      },
      [&](int e, int prefix) { tile_prefix[e] = prefix; });
  if (lane == 0) tile_prefix[p.num_experts] = total;
}

// A work item resolved against the schedule.
struct WorkItem {
  int expert;
  int m0;       // first row of the m-tile
  int row_end;  // end of the expert's rows
  int n0;       // first column of the n-tile
};

// Work item `item` of total_m_tiles * n_tiles; a binary search over the prefix gives the expert.
// kGroup m-tiles per raster group (1: m-tile-major, every n-tile of an m-tile before the next
// m-tile, so that consecutive items finish one expert's rows first).
template <int kBM, int kBN, int kGroup = kRasterGroup>
__device__ __forceinline__ WorkItem resolve_item(const KernelParams& p, const int* tile_prefix,
                                                 int total_m_tiles, int item) {
  const int group = item / (kGroup * p.n_tiles);
  const int first_mt = group * kGroup;
  const int group_size = min(kGroup, total_m_tiles - first_mt);
  const int in_group = item - group * kGroup * p.n_tiles;
  const int mt = first_mt + in_group % group_size;
  const int nt = in_group / group_size;
  int lo = 0, hi = p.num_experts - 1;  // last e with prefix[e] <= mt (that expert has rows)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_prefix[mid] <= mt) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  WorkItem w;
  w.expert = lo;
  int row_begin;
  expert_rows(p, lo, row_begin, w.row_end);
  w.m0 = row_begin + (mt - tile_prefix[lo]) * kBM;
  w.n0 = nt * kBN;
  return w;
}

}  // namespace moekit::cuda::sm90
