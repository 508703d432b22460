// The mainloops of the grouped GEMMs, one template per MainloopKind, instantiated by each operand
// family's translation unit (sm90_bf16_grouped_gemm.cu: bf16 / f16; sm90_fp8_grouped_gemm.cu:
// e4m3 with its scales; sm90_int8_grouped_gemm.cu: int8 with its scales). T is the operand type,
// OutT the type of C.
//
// This kernel does:
//   1. Each CTA of a persistent grid reads the schedule (expert_offsets or expert_counts) and
//      builds, in shared memory, the prefix sum of m-tiles per expert (one warp, shuffle scan).
//   2. It walks work items (m-tile, n-tile) round-robin over the grid, rasterised in groups of
//      kRasterGroup m-tiles so that CTAs running together share W n-tiles and A m-tiles in L2;
//      a binary search over the prefix gives the expert of an m-tile (scheduler.cuh).
//   3. Mainloop, by the table row's kind:
//      kWarpSpecializedTma (ws_tma_kernel; prefill): the last warpgroup is the producer. It fills
//      a kStages-deep ring of BMx(128 bytes) A and BNx(128 bytes) W tiles (K-major, 128-byte
//      swizzle): W by one bulk tensor copy (TMA, 3-D map {k, n, E}, zeros past N and K), the
//      gathered A rows by cp.async (16 B per thread per row, zero-filled past the expert's last
//      row, past K and for gather rows < 0). Both complete on the stage's "full" mbarrier
//      (expect_tx + cp.async.mbarrier.arrive.noinc). The consumer warpgroups (64 rows each) wait
//      on "full", issue 4 wgmma (32 bytes of K each) per stage and release the stage on its
//      "empty" mbarrier. No block-wide barrier after the prefix: the producer runs ahead into the
//      next work item while the consumers run the epilogue. The kW4A8 rows (this kernel and
//      ws_swapab_kernel) load packed int4 W by cp.async instead and convert it to e4m3 in the
//      producer (Int4Converter, Rings: the tokens, the packed W and the converted W in three
//      rings).
//      kSingleRole (single_role_kernel; decode): every thread loads with cp.async into the ring
//      (a stage refilled two K steps after it was consumed, one __syncthreads per K step) and the
//      warpgroups compute; faster at few rows per expert.
//      kSimt (simt_kernel; one or two tokens per expert, 16-bit and W4A16): no tensor cores and
//      no ring; each warp takes 8 weight rows of an item, its lanes stream K in 16-byte chunks and
//      multiply them with the tokens on the CUDA cores, a butterfly sums the lanes, and the warp
//      stores its outputs itself. simt_pair_kernel runs a layer's GEMM1 and GEMM2 on the 16-bit
//      row in one launch (the decode pair; GEMM2's work waits on per-expert counters).
//   The K step of a family (KStep below): 16-bit operands keep one wgmma group in flight and
//   accumulate straight into acc. fp8 operands with block scales (kFp8 rows) write each 128-byte
//   K block (= 128 elements, one scale block) into a temporary, wait for it, and add it to acc
//   times the block's A and W scales (promotion): the other consumer warpgroup's wgmma keeps the
//   tensor cores busy meanwhile. fp8 with K-invariant scales (kFp8Direct rows) accumulates in the
//   tensor cores like the 16-bit operands, and int8 exactly in int32 (no scale inside the K loop).
//   4. Epilogue (epilogue.cuh): the accumulator as fp32 (int8: converted), the per-tensor /
//      per-row / per-channel scales of fp8 or int8 multiplied in; then
//      + bias, rounded to OutT, stored straight from the accumulator fragment with row (expert
//      range) and column (N) predicates; or the fused gated activation on gate/up column pairs,
//      n / 2 columns stored.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/cuda/cuda_check.cuh"
#include "core/cuda/pdl.cuh"
#include "experts/cuda/sm90/epilogue.cuh"
#include "experts/cuda/sm90/host.h"
#include "experts/cuda/sm90/int4_layout.h"
#include "experts/cuda/sm90/mainloop.cuh"
#include "experts/cuda/sm90/mx_e4m3.h"
#include "experts/cuda/sm90/mxfp6_layout.h"
#include "experts/cuda/sm90_grouped_gemm.h"

namespace moekit::cuda::sm90 {

template <typename T>
inline constexpr bool kIsFp8 = std::is_same_v<T, __nv_fp8_e4m3> || std::is_same_v<T, __nv_fp8_e5m2>;
// Operands that carry scales (AScale / WScale): fp8 and int8.
template <typename T>
inline constexpr bool kIsScaled = kIsFp8<T> || std::is_same_v<T, int8_t>;

template <typename T, int kTile>
using ShapeOf = TileShape<kTile, static_cast<int>(sizeof(T))>;

// The rows this consumer thread holds in the accumulator fragment (row0 and row0 + 8 of the
// item), their source rows in A (-1: padding or past the expert's rows), for the A scales.
struct FragmentRows {
  int src[2];
};

template <int kBN>
__device__ __forceinline__ FragmentRows fragment_rows(const KernelParams& p, const WorkItem& w,
                                                      int warpgroup, int tid) {
  const int lane = tid & 31;
  const int row0 = w.m0 + warpgroup * 64 + ((tid & 127) >> 5) * 16 + (lane >> 2);
  FragmentRows f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    int s = -1;
    if (row < w.row_end) s = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
    f.src[h] = s;
  }
  return f;
}

// The K step of one warpgroup on the stage at (sa, sb): acc += A_kt . W_kt^T, or with block scales
// acc += sa(kt) sw(kt) (A_kt . W_kt^T) through a temporary (Promotion above). run<parity> is
// called with the parity of kt (kOverlapped picks its temporary by it at compile time: ptxas
// serializes wgmma whose accumulator registers are chosen at run time); end() once after the last
// step. A stage may be released release_lag steps after its run: then its wgmma are done.
// kColumnScales (W4A8 groups of 128, kChunked only): W's scale varies per column and K step; the
// kernel points col_scales at the step's kBN scales in shared memory before each run, and the
// promotion multiplies each column by its own (the A scales, constant along K, wait for finish).
template <typename T, int kBN, Promotion kPromotion, bool kColumnScales = false>
struct KStep {
  static_assert(kPromotion == Promotion::kNone || kIsFp8<T>, "only fp8 promotes K blocks");
  static_assert(kPromotion != Promotion::kOverlapped || kBN <= 128, "3 * bn / 2 registers");
  static_assert(kPromotion != Promotion::kChunked || kBN % 128 == 0, "128-column chunks");
  static_assert(!kColumnScales || kPromotion == Promotion::kChunked, "column scales: chunked");
  static constexpr int kAcc = kBN / 2;
  using Acc = typename MmaOperand<T>::Acc;  // float, or int32 for int8
  static constexpr int release_lag = kPromotion == Promotion::kChunked ? 0 : 1;

  static constexpr int kScaleBlocks = kBN / 32;  // weight-scale row blocks of a tile
  static constexpr int kChunkCols = kPromotion == Promotion::kChunked ? 128 : kBN;
  static constexpr int kTmps = kPromotion == Promotion::kOverlapped ? 2 : 1;

  float tmp[kTmps][kPromotion == Promotion::kNone ? 1 : kChunkCols / 2];
  // Block scales (A: this thread's two rows; W: the tile's row blocks), loaded one step before
  // they are used so that their latency hides behind a step of wgmma. kOverlapped: those of the
  // step whose temporary is in flight; kChunked: those of the next step.
  static constexpr int kScaleRegs = kPromotion == Promotion::kNone ? 1 : 2;
  float fa[kScaleRegs];
  float fw[kPromotion == Promotion::kNone ? 1 : kScaleBlocks];
  // Where they come from, set once per work item (begin): this thread's two A rows' scales (null:
  // a_fill instead, 1 without 1x128 A scales, 0 for padding rows), the tile's first W row block
  // and how many of its kScaleBlocks exist (fw 0 past them; 1 without block W scales).
  const float* a_row[kScaleRegs];
  float a_fill[kScaleRegs];
  const float* w_blocks;
  int w_valid;
  float w_fill;
  uint32_t col_scales = 0;  // kColumnScales: the step's kBN W scales (shared memory)

  __device__ __forceinline__ void load_block_scales(const KernelParams& p, int kt) {
    if constexpr (kPromotion != Promotion::kNone) {
      if (kt >= p.k_tiles) return;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        fa[h] = a_row[h] != nullptr ? __ldg(a_row[h] + kt) : a_fill[h];
#pragma unroll
      for (int b = 0; b < kScaleBlocks; ++b) {
        fw[b] = b < w_valid ? __ldg(w_blocks + static_cast<int64_t>(b) * p.k_tiles + kt) : w_fill;
      }
    }
  }

  // acc[first, first + kCount) += t * (the block scales in a, b): the fragment of column groups
  // first / 4 onwards, 8 columns each, one W scale per 32 columns (first is a constant once the
  // callers' loops are unrolled).
  template <int kCount>
  static __device__ __forceinline__ void promote(Acc (&acc)[kAcc], int first,
                                                 const float (&t)[kCount], const float (&a)[2],
                                                 const float (&b)[kScaleBlocks]) {
#pragma unroll
    for (int j = 0; j < kCount / 4; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float f = a[h] * b[(first / 4 + j) / 4];
        acc[first + 4 * j + 2 * h] += t[4 * j + 2 * h] * f;
        acc[first + 4 * j + 2 * h + 1] += t[4 * j + 2 * h + 1] * f;
      }
    }
  }

  // acc[first, first + kCount) += t * a (this thread's rows) * (each column's W scale at `scales`,
  // the chunk's first column's; kColumnScales): columns 8 j + 2 (lane % 4) + {0, 1} of the chunk.
  template <int kCount>
  static __device__ __forceinline__ void promote_columns(Acc (&acc)[kAcc], int first,
                                                         const float (&t)[kCount],
                                                         const float (&a)[2], uint32_t scales) {
    const uint32_t mine = scales + static_cast<uint32_t>((threadIdx.x & 3) * 2 * sizeof(float));
#pragma unroll
    for (int j = 0; j < kCount / 4; ++j) {
      const float2 s = ld_shared_f32x2(mine + static_cast<uint32_t>(j * 8 * sizeof(float)));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        acc[first + 4 * j + 2 * h] += t[4 * j + 2 * h] * (a[h] * s.x);
        acc[first + 4 * j + 2 * h + 1] += t[4 * j + 2 * h + 1] * (a[h] * s.y);
      }
    }
  }

  // Before the first K step of a work item.
  __device__ __forceinline__ void begin(const KernelParams& p, const WorkItem& w,
                                        const FragmentRows& rows) {
    if constexpr (kPromotion != Promotion::kNone) {
      const bool a_blocks = p.a_scale_kind == AScale::kRowBlock128;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a_row[h] = a_blocks && rows.src[h] >= 0 ? p.a_scale + rows.src[h] * p.a_scale_ld : nullptr;
        a_fill[h] = a_blocks ? 0.0f : 1.0f;
      }
      const bool w_block_scales = !kColumnScales && p.w_scale_kind == WScale::kBlock32x128;
      const int first = w.n0 / 32;
      w_blocks = w_block_scales
                     ? p.w_scale + (static_cast<int64_t>(w.expert) * p.w_scale_row_blocks + first) *
                                       p.k_tiles
                     : p.w_scale;
      w_valid = w_block_scales ? min(kScaleBlocks, p.w_scale_row_blocks - first) : 0;
      w_fill = w_block_scales ? 0.0f : 1.0f;
      if constexpr (kPromotion == Promotion::kChunked) load_block_scales(p, 0);
    }
  }

  template <int kParity>
  __device__ __forceinline__ void run(Acc (&acc)[kAcc], uint32_t sa, uint32_t sb,
                                      const KernelParams& p, const WorkItem& w,
                                      const FragmentRows& rows, int kt) {
    if constexpr (kPromotion == Promotion::kNone) {
      mma_stage<T, kBN>(acc, sa, sb);
      wgmma_wait<1>();
      fence_registers(acc);
    } else if constexpr (kPromotion == Promotion::kOverlapped) {
      // NOTE: step kt - 1's group is waited for before step kt is issued, on every path: reading
      // a temporary after wgmma_wait<1>, or after a wait under `kt > 0`, makes ptxas serialize
      // every wgmma of the kernel (C7514). The tensor cores pause between the two steps' groups;
      // the promotion of step kt - 1 runs while step kt's wgmma compute.
      wgmma_wait<0>();
      fence_registers(tmp[kParity ^ 1]);
      mma_stage<T, kBN, /*kOverwrite=*/true>(tmp[kParity], sa, sb);
      if (kt > 0) promote(acc, 0, tmp[kParity ^ 1], fa, fw);  // step kt - 1, its scales
      load_block_scales(p, kt);
    } else {
      const float a[2] = {fa[0], fa[1]};
      float b[kScaleBlocks];
#pragma unroll
      for (int i = 0; i < kScaleBlocks; ++i)
        b[i] = fw[i];
      load_block_scales(p, kt + 1);
#pragma unroll
      for (int c = 0; c < kBN / kChunkCols; ++c) {  // chunk c into the temporary, then promoted
        mma_stage<T, kChunkCols, /*kOverwrite=*/true>(
            tmp[0], sa, sb + static_cast<uint32_t>(c * kChunkCols * kRowBytes));
        wgmma_wait<0>();
        fence_registers(tmp[0]);
        if constexpr (kColumnScales) {
          promote_columns(acc, c * kChunkCols / 2, tmp[0], a,
                          col_scales + static_cast<uint32_t>(c * kChunkCols * sizeof(float)));
        } else {
          promote(acc, c * kChunkCols / 2, tmp[0], a, b);
        }
      }
    }
  }

  // After the last K step: every wgmma complete, and (kOverlapped) the last temporary promoted.
  __device__ __forceinline__ void end(Acc (&acc)[kAcc], const KernelParams& p) {
    if constexpr (kPromotion == Promotion::kNone) {
      wgmma_wait<0>();
      fence_registers(acc);
    } else if constexpr (kPromotion == Promotion::kOverlapped) {
      wgmma_wait<0>();
      if (p.k_tiles > 0 && ((p.k_tiles - 1) & 1) != 0) {
        fence_registers(tmp[1]);
        promote(acc, 0, tmp[1], fa, fw);
      } else if (p.k_tiles > 0) {
        fence_registers(tmp[0]);
        promote(acc, 0, tmp[0], fa, fw);
      }
    }
  }

  // The accumulator as fp32 in out, with the scales applied once per tile (fp8 / int8
  // per-tensor / per-row A, per-expert / per-channel W; NVFP4's per-expert global scale).
  __device__ __forceinline__ void finish(const Acc (&acc)[kAcc], float (&out)[kAcc],
                                         const KernelParams& p, const WorkItem& w,
                                         const FragmentRows& rows, int lane) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i)
      out[i] = static_cast<float>(acc[i]);
    if constexpr (kIsScaled<T>) {
      float fa[2] = {1.0f, 1.0f};
      if (p.a_scale_kind == AScale::kTensor) {
        fa[0] = fa[1] = __ldg(p.a_scale);
      } else if (p.a_scale_kind == AScale::kRow) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          fa[h] = rows.src[h] >= 0 ? __ldg(&p.a_scale[rows.src[h]]) : 0.0f;
      }
      float fe = 1.0f;
      if (p.w_scale_kind == WScale::kExpert) fe = __ldg(&p.w_scale[w.expert]);
      const bool channel = p.w_scale_kind == WScale::kChannel;
      if (!channel && p.a_scale_kind == AScale::kRowBlock128) return;  // all in the K loop
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        const int col = w.n0 + j * 8 + (lane & 3) * 2;
        float2 fc = make_float2(fe, fe);
        if (channel) {
          const float* ws = p.w_scale + static_cast<int64_t>(w.expert) * p.n;
          fc.x = col < p.n ? __ldg(ws + col) : 0.0f;
          fc.y = col + 1 < p.n ? __ldg(ws + col + 1) : 0.0f;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          out[4 * j + 2 * h] *= fa[h] * fc.x;
          out[4 * j + 2 * h + 1] *= fa[h] * fc.y;
        }
      }
    } else if (p.w_scale_kind == WScale::kExpert) {
      // bf16 operands converted from packed W with a global scale (NVFP4): the expert's.
      const float fe = __ldg(&p.w_scale[w.expert]);
#pragma unroll
      for (int i = 0; i < kAcc; ++i)
        out[i] *= fe;
    }
  }
};

// ---- the rings of the producer kernels ----------------------------------------------------------

// Where a K step's operands lie and which barriers it uses, for the kernels with a producer
// warpgroup. Most rows: one ring of kStages stages, A then W, "full" and "empty" per stage. kW4A8:
// the tokens in the ring of kStages stages, "empty" per stage; the packed W in the producer's
// packed ring (kPackedStages, no barriers); the converted W in the converted ring of
// kConvertedTiles tiles (in front of the others), "full" and "w_empty" per tile. A step `it`
// (counted over the CTA's items) uses stage it % kStages, packed slot it % kPackedStages and W
// tile it % kWSlots.
template <typename Shape>
struct Rings {
  static constexpr int kWSlots = Shape::kPackedInt4 ? Shape::kConvertedTiles : Shape::kStages;
  uint32_t converted;  // kW4A8: the converted ring
  uint32_t load;       // the ring
  uint32_t packed;     // kW4A8: the packed ring
  uint32_t epilogue;   // kStagedEpilogue: the consumers' staging tiles
  uint32_t scales;     // kGroupScales: the packed slots' weight scales, then the W tiles'

  __device__ __forceinline__ explicit Rings(const void* smem_dynamic)
      : converted(ring_base(smem_dynamic)),
        load(converted + Shape::kConvertedBytes),
        packed(load + Shape::kStages * Shape::kStageBytes),
        epilogue(packed + Shape::kPackedStages * Shape::kStageBBytes),
        scales(epilogue + Shape::kEpilogueBytes) {}
  __device__ __forceinline__ uint32_t stage(int it) const {
    return load + static_cast<uint32_t>((it % Shape::kStages) * Shape::kStageBytes);
  }
  __device__ __forceinline__ uint32_t packed_slot(int it) const {
    return packed + static_cast<uint32_t>((it % Shape::kPackedStages) * Shape::kStageBBytes);
  }
  // kGroupScales: step it's kBN weight scales as copied (packed slot) and beside its W tile.
  __device__ __forceinline__ uint32_t packed_scales(int it) const {
    return scales + static_cast<uint32_t>((it % Shape::kPackedStages) * Shape::kScaleSlotBytes);
  }
  __device__ __forceinline__ uint32_t w_scales(int it) const {
    return scales +
           static_cast<uint32_t>((Shape::kPackedStages + it % kWSlots) * Shape::kScaleSlotBytes);
  }
  __device__ __forceinline__ uint32_t w_tile(int it) const {
    if constexpr (Shape::kPackedInt4) {
      return converted + static_cast<uint32_t>((it % kWSlots) * Shape::kBN * kRowBytes);
    } else {
      return stage(it) + Shape::kStageABytes;
    }
  }
};

// The consumers are done with step `it` (its wgmma completed): one arrival per consumer warp on
// the stage's "empty" barrier, and on the W tile's (kW4A8). Cluster rows: on the stage's barrier
// of every CTA of the cluster, whose producers all write into this stage (W multicast).
template <typename Shape>
__device__ __forceinline__ void release_step(uint64_t* s_empty, uint64_t* s_w_empty, int it,
                                             int lane) {
  if (lane != 0) return;
  const uint32_t empty = smem_u32(&s_empty[it % Shape::kStages]);
  if constexpr (Shape::kCluster > 1) {
#pragma unroll
    for (uint32_t rank = 0; rank < Shape::kCluster; ++rank)
      mbar_arrive_cluster(cluster_map(empty, rank));
  } else {
    mbar_arrive(empty);
  }
  if constexpr (Shape::kPackedInt4) {
    mbar_arrive(smem_u32(&s_w_empty[it % Rings<Shape>::kWSlots]));
  }
}

// The barriers of the rings (one thread, before the CTA's first __syncthreads): "full" takes
// kLoaderThreads + 1 arrivals where W comes by TMA (each loading thread's cp.async and the TMA's
// expect-tx), 128 for kW4A8 (each producer thread after its conversion); "empty" and "w_empty"
// one per consumer warp that reads the stage (of every CTA of the cluster for "empty"; ping-pong
// rows: one warpgroup reads each stage).
template <typename Shape>
__device__ __forceinline__ void init_ring_barriers(uint64_t* s_full, uint64_t* s_empty,
                                                   uint64_t* s_w_empty) {
  constexpr int kReaders = Shape::kStageReaderWarps;
#pragma unroll
  for (int s = 0; s < Rings<Shape>::kWSlots; ++s) {
    mbar_init(smem_u32(&s_full[s]), Shape::kPackedInt4 ? 128 : Shape::kLoaderThreads + 1);
    if constexpr (Shape::kPackedInt4) mbar_init(smem_u32(&s_w_empty[s]), kReaders);
  }
#pragma unroll
  for (int s = 0; s < Shape::kStages; ++s)
    mbar_init(smem_u32(&s_empty[s]), kReaders * Shape::kCluster);
  fence_proxy_async();
  if constexpr (Shape::kCluster > 1) fence_mbarrier_init_cluster();
}

// ---- kW4A8: the converting producer -------------------------------------------------------------

// kMxfp4A8: the table of the e2m1 -> e4m3 conversion (sm90/mx_e4m3.h), read for the shifts below
// mx_normal_shift's range only (groups under 2^-11 of their step's largest: rare).
static __constant__ MxE4m3Table c_mx_e4m3_table = kMxE4m3Table;

// The entry's words of group code s under the reference r: arithmetic in the normal range, else
// the table.
__device__ __forceinline__ void mx_entry_words(uint32_t s, uint32_t r, uint32_t& lo, uint32_t& hi) {
  const int d = static_cast<int>(s) - static_cast<int>(r);
  if (mx_normal_shift(d)) {
    lo = mx_normal_word(d, 0);
    hi = mx_normal_word(d, 1);
  } else {
    const int e = mx_entry(s, r);
    lo = c_mx_e4m3_table.words[2 * e];
    hi = c_mx_e4m3_table.words[2 * e + 1];
  }
}

// The packed W of the kW4A8 rows, one producer thread's part (sm90/int4_layout.h): the thread
// copies the 16-byte chunks q = ptid + 128 j of each K step's packed tile (row q / 4, quarter
// q % 4: 32 elements of K) into the packed ring, with the step's tokens into the ring, one
// cp.async group per step, and kLag = kPackedStages - 1 steps later converts exactly those chunks
// (its own copies, so it waits only for its own group, which holds the tokens too; int4: split
// codes, int4x4_split_to_e4m3) to e4m3 into a W tile of the converted ring, 128-byte swizzled as
// the wgmma reads it. It then arrives on the tile's "full" barrier (128 arrivals: every producer
// thread's conversion and tokens). The packed slot of step it is refilled at step it +
// kPackedStages, after the same thread converted it; the tokens' stage of step it is refilled at
// step it + kStages, once the consumers released it (kStages >= kLag + 3: they need only steps
// converted two or more iterations earlier, so the producer never waits on the step it has just
// converted). Rows past N and K past k are zero-filled codes, which read as -8: their products meet
// zero tokens (past K) or columns that are never stored (past N). kGroupScales: the first kBN / 4
// threads also copy 16 bytes each of the step's kBN weight scales (WScale::kGroup128: K-major,
// zeros past N) with the packed chunks, and move them beside the converted tile before they arrive.
// kMxScales: the first quarter of each row (ptid % 4 == 0) copies the row's e8m0 word of the step
// (4 bytes per chunk) into the packed scale slot; after its wait a __syncwarp shows it to the row's
// other quarters (all four in one warp: ptid / 4 is the row), each converts its group with it, and
// the first quarter writes the row's reference scale beside the converted tile (another __syncwarp
// before a slot is refilled).
template <typename Shape>
struct Int4Converter {
  static constexpr int kChunks = Shape::kBN * 4 / 128;  // per thread and step
  static constexpr int kLag = Shape::kPackedStages - 1;
  static_assert(!Shape::kPackedInt4 || (kLag >= 1 && Shape::kStages >= kLag + 3),
                "steps converted while the next ones load; token stages beyond the lag");
  static constexpr int kPackedRow = Shape::kPackedRowBytes;  // 64 bytes: 128 elements of K
  static constexpr int kScaleCopiers = Shape::kGroupScales ? Shape::kBN / 4 : 0;
  const uint8_t* w_first;    // this thread's first row (row ptid / 4) of the item, its quarter
  int rows_left;             // W rows of the item from that row on (n - n0 - ptid / 4)
  const float* scale_first;  // kGroupScales: step 0's scales of columns n0 + 4 ptid .. + 3
  bool scale_ok;             // ... which exist (n is a multiple of 8)
  const uint32_t* mx_first;  // kMxScales: step 0's e8m0 word of this thread's first row
  uint32_t t0, t1, s0, s1;   // int4: the split tables' words, held in registers

  __device__ __forceinline__ void begin(const KernelParams& p, const WorkItem& w, int ptid) {
    if constexpr (!Shape::kMxScales) {
      t0 = opaque_u32(kInt4SplitT0), t1 = opaque_u32(kInt4SplitT1);
      s0 = opaque_u32(kInt4SplitS0), s1 = opaque_u32(kInt4SplitS1);
    }
    const int row = w.n0 + ptid / 4;
    rows_left = p.n - row;
    w_first = p.w + (static_cast<int64_t>(w.expert) * p.n + row) * (p.k / 2) + (ptid & 3) * 16;
    if constexpr (Shape::kMxScales) {  // the words of e8m0 codes, K-major as the f32 scales
      mx_first = reinterpret_cast<const uint32_t*>(p.w_group_scale) +
                 static_cast<int64_t>(w.expert) * p.k_tiles * p.n + row;
    } else if constexpr (Shape::kGroupScales) {
      scale_ok = ptid < kScaleCopiers && w.n0 + 4 * ptid < p.n;
      scale_first = p.w_scale + static_cast<int64_t>(w.expert) * p.k_tiles * p.n + w.n0 + 4 * ptid;
    }
  }
  // The packed chunks of K step kt of the item into the packed slot at `slot` (kGroupScales: its
  // scales into `scale_slot`).
  __device__ __forceinline__ void load(const KernelParams& p, int kt, uint32_t slot,
                                       uint32_t scale_slot, int ptid) const {
    if constexpr (Shape::kMxScales) {
      // The slot held step kt - kPackedStages's words, which the row's other quarters read in
      // their last conversion: done by now.
      __syncwarp();
      if ((ptid & 3) == 0) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const bool ok = 32 * j < rows_left;
          const uint32_t* src = mx_first + static_cast<int64_t>(kt) * p.n + 32 * j;
          cp_async_4(scale_slot + 4 * (ptid / 4 + 32 * j), ok ? static_cast<const void*>(src) : p.w,
                     ok);
        }
      }
    } else if constexpr (Shape::kGroupScales) {
      if (ptid < kScaleCopiers) {
        cp_async_16(scale_slot + 16 * ptid,
                    scale_ok ? scale_first + static_cast<int64_t>(kt) * p.n : p.w_scale, scale_ok);
      }
    }
    const bool k_ok = kt * Shape::kBK + (ptid & 3) * 32 < p.k;
    const uint32_t dst = slot + (ptid / 4) * kPackedRow + (ptid & 3) * 16;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const bool ok = k_ok && 32 * j < rows_left;
      const uint8_t* src = w_first + (static_cast<int64_t>(32 * j) * (p.k / 2) + kt * kPackedRow);
      cp_async_16(dst + 32 * j * kPackedRow, ok ? src : p.w, ok);
    }
  }
  // Step c (its copies landed) from its stage into its W tile, then "full".
  __device__ __forceinline__ void convert(const Rings<Shape>& rings, uint64_t* s_full,
                                          uint64_t* s_w_empty, int c, int ptid) const {
    constexpr int kW = Rings<Shape>::kWSlots;
    mbar_wait(smem_u32(&s_w_empty[c % kW]), ((c / kW) & 1) ^ 1);
    const uint32_t src = rings.packed_slot(c) + (ptid / 4) * kPackedRow + (ptid & 3) * 16;
    const uint32_t tile = rings.w_tile(c);
    auto perm = [](uint32_t lo, uint32_t hi, uint32_t sel) { return __byte_perm(lo, hi, sel); };
    if constexpr (Shape::kMxScales) {
      __syncwarp();  // each row's e8m0 words, copied by its first quarter (waited for), seen by all
    }
    // Every chunk's loads first: their latencies overlap, and the conversions that follow are
    // independent work for the scheduler (one producer warp per scheduler issues them all).
    uint4 chunks[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j)
      chunks[j] = ld_shared_v4(src + 32 * j * kPackedRow);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const uint4 q = chunks[j];
      const int row = ptid / 4 + 32 * j;
      uint32_t lo[4], hi[4];
      if constexpr (Shape::kMxScales) {
        // The row's four e8m0 codes of the step; this thread's chunk is group ptid % 4 of them.
        const uint32_t codes = ld_shared_u32(rings.packed_scales(c) + 4 * row);
        const uint32_t top = __vmaxu4(codes, codes >> 16);
        const uint32_t r = mx_reference_of_max(max(top & 0xFFu, (top >> 8) & 0xFFu));
        uint32_t tlo, thi;
        mx_entry_words((codes >> (8 * (ptid & 3))) & 0xFFu, r, tlo, thi);
        auto cvt = [&](uint32_t nibbles) { return e2m1x4_to_e4m3(nibbles, tlo, thi, perm); };
        lo[0] = cvt(q.x), lo[1] = cvt(q.x >> 16), lo[2] = cvt(q.y), lo[3] = cvt(q.y >> 16);
        hi[0] = cvt(q.z), hi[1] = cvt(q.z >> 16), hi[2] = cvt(q.w), hi[3] = cvt(q.w >> 16);
        if ((ptid & 3) == 0) {  // the row's reference scale 2^(r - 127) for the consumers
          st_shared_u32(rings.w_scales(c) + 4 * row, r << 23);
        }
      } else {  // split codes (sm90/int4_layout.h): one mask per word serves both halves
        auto sign = [](uint32_t lo, uint32_t hi, uint32_t sel) { return prmt_sign(lo, hi, sel); };
        auto cvt = [&](uint32_t word, uint32_t(&out)[4], int i) {
          const uint32_t index = word & 0x77777777u;
          out[i] = int4x4_split_to_e4m3(word, index, perm, sign, t0, t1, s0, s1);
          out[i + 1] = int4x4_split_to_e4m3(word >> 16, index >> 16, perm, sign, t0, t1, s0, s1);
        };
        cvt(q.x, lo, 0), cvt(q.y, lo, 2), cvt(q.z, hi, 0), cvt(q.w, hi, 2);
      }
      st_shared_v4(tile + swizzled_offset(row, 2 * (ptid & 3)), lo);
      st_shared_v4(tile + swizzled_offset(row, 2 * (ptid & 3) + 1), hi);
    }
    if constexpr (Shape::kGroupScales && !Shape::kMxScales) {
      if (ptid < kScaleCopiers) {
        const uint4 v = ld_shared_v4(rings.packed_scales(c) + 16 * ptid);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        st_shared_v4(rings.w_scales(c) + 16 * ptid, words);
      }
    }
    fence_proxy_async();  // the converted tile, seen by the tensor cores
    mbar_arrive(smem_u32(&s_full[c % kW]));
  }
  // After the copies of step `it` (committed as one group): convert step it - kLag.
  __device__ __forceinline__ void after_step(const Rings<Shape>& rings, uint64_t* s_full,
                                             uint64_t* s_w_empty, int it, int ptid) const {
    if (it < kLag) return;
    cp_async_wait<kLag>();  // this thread's copies of step it - kLag have landed
    convert(rings, s_full, s_w_empty, it - kLag, ptid);
  }
  // After the last step (`steps` issued): convert the steps still waiting.
  __device__ __forceinline__ void drain(const Rings<Shape>& rings, uint64_t* s_full,
                                        uint64_t* s_w_empty, int steps, int ptid) const {
    cp_async_wait<0>();
    for (int c = steps > kLag ? steps - kLag : 0; c < steps; ++c)
      convert(rings, s_full, s_w_empty, c, ptid);
  }
};

// The A loaders (every producer and single-role thread): the sources of the A rows a thread
// copies, 16-byte chunk `chunk` of the item's rows row_in_pass + i * kRowsPerPass, resolved once
// per item and kept in registers (a step is then an add and a cp.async per row: reading the
// offsets from shared memory each step put a load's latency and a reload of `p.a` in front of
// every copy, bench/results/2026-12-07-h100-fp8-producer); and the copy of those chunks of K stage
// k_bytes into the stage at dst, zeros for rows without a source (padding, past the expert's rows,
// gather row < 0) and past K.
template <int kPasses>
struct ARowSources {
  const uint8_t* src[kPasses];  // the chunk in K step 0; p.a where the row has no source
  uint32_t valid;               // bit i: row i has a source
};
template <typename Shape>
__device__ __forceinline__ ARowSources<Shape::kAPasses> gathered_a_sources(const KernelParams& p,
                                                                           const WorkItem& w,
                                                                           int row_in_pass,
                                                                           int chunk) {
  ARowSources<Shape::kAPasses> rows;
  rows.valid = 0;
#pragma unroll
  for (int i = 0; i < Shape::kAPasses; ++i) {
    const int row = w.m0 + row_in_pass + i * Shape::kRowsPerPass;
    int s = -1;
    if (row < w.row_end) s = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
    rows.src[i] = p.a + (s >= 0 ? static_cast<int64_t>(s) * p.lda_bytes + chunk * kChunkBytes : 0);
    rows.valid |= (s >= 0 ? 1u : 0u) << i;
  }
  return rows;
}
template <typename Shape>
__device__ __forceinline__ void copy_a_stage(const ARowSources<Shape::kAPasses>& rows, uint32_t dst,
                                             bool k_ok, int64_t k_bytes) {
#pragma unroll
  for (int i = 0; i < Shape::kAPasses; ++i) {
    cp_async_16(dst + i * Shape::kRowsPerPass * kRowBytes, rows.src[i] + k_bytes,
                k_ok && ((rows.valid >> i) & 1u) != 0);
  }
}

// ---- kWarpSpecializedTma ------------------------------------------------------------------------

// One work item of a consumer warpgroup holding two 64-row blocks of A (TileShape::kMBlocks = 2:
// the W4A8 row 256x128, whose W tile serves 256 tokens; rows 128 * warpgroup + 64 b of the item
// for b = 0, 1). Each K step issues a wgmma group per block on the one W tile, waits for both and
// releases the step at once (K-invariant scales only: Promotion::kNone). Released after the next
// step's issue instead (two steps in flight per warpgroup), the release waited for the next step's
// "full" and coupled the producer to the consumers: 2% slower (bench/results/
// 2026-12-07-h100-w4a8-rows). Each block's epilogue is the plain or fused one of a 64-row
// warpgroup. `it` counts the CTA's K steps.
template <typename T, typename OutT, typename Shape>
__device__ __forceinline__ void two_block_item(const KernelParams& p, const WorkItem& w,
                                               const Rings<Shape>& rings, uint64_t* s_full,
                                               uint64_t* s_empty, uint64_t* s_w_empty, int& it,
                                               int warpgroup, int tid) {
  static_assert(Shape::kMBlocks == 2 && Shape::kPromotion == Promotion::kNone &&
                !Shape::kEpilogueWarps && !Shape::kStagedEpilogue);
  constexpr int kBN = Shape::kBN;
  constexpr int kAcc = kBN / 2;
  constexpr int kWSlots = Rings<Shape>::kWSlots;
  using Step = KStep<T, kBN, Promotion::kNone>;
  const int lane = tid & 31;
  typename Step::Acc acc[2][kAcc];
  zero_accumulators(acc[0]);
  zero_accumulators(acc[1]);
  const uint32_t a_first = static_cast<uint32_t>(warpgroup * 2 * 64 * kRowBytes);
  for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
    mbar_wait(smem_u32(&s_full[it % kWSlots]), (it / kWSlots) & 1);
    fence_proxy_async();  // the producers' cp.async data, seen by the tensor cores
    const uint32_t sa = rings.stage(it) + a_first;
    mma_stage<T, kBN>(acc[0], sa, rings.w_tile(it));
    mma_stage<T, kBN>(acc[1], sa + 64 * kRowBytes, rings.w_tile(it));
    wgmma_wait<0>();  // this step's groups are done (the other warpgroup's keep the cores busy)
    fence_registers(acc[0]);
    fence_registers(acc[1]);
    release_step<Shape>(s_empty, s_w_empty, it, lane);
  }
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    FragmentRows rows{{-1, -1}};
    if constexpr (kIsScaled<T>) rows = fragment_rows<kBN>(p, w, 2 * warpgroup + b, tid);
    Step step;
    float out[kAcc];
    step.finish(acc[b], out, p, w, rows, lane);
    store_warpgroup_tile<OutT, kBN>(p, out, w, 2 * warpgroup + b, tid);
  }
}

// The consumer warpgroups of the ping-pong rows (Shape::kPingPong): warpgroup g computes the
// CTA's items g, g + 2, ... whole (two 64-row blocks on the item's W tile, as two_block_item). The
// producer fills the ring with the CTA's items in order, so its j-th item takes ring positions
// [j k_tiles, (j + 1) k_tiles). s_turn[g] gives the tensor cores to warpgroup g: its n-th item
// waits for phase n (the other warpgroup arrives once it has issued its item's last K step;
// phase 0 of s_turn[0] completes at initialisation), so the mainloops run one after the other and
// each warpgroup's epilogue runs under the other's mainloop. The order also keeps the parity waits
// on "full" sound: every ring position before an item's first was waited for before its turn
// (otherwise a stage's barrier could be two phases behind, where the parity wanted is that of a
// phase long complete). One wgmma step stays in flight: each step is released once the next
// step's two groups are issued.
template <typename T, typename OutT, typename Shape, typename ItemAt>
__device__ __forceinline__ void pingpong_items(const KernelParams& p, const Rings<Shape>& rings,
                                               uint64_t* s_full, uint64_t* s_empty,
                                               uint64_t* s_turn, int first_item, int total_items,
                                               int item_stride, ItemAt&& item_at, int warpgroup,
                                               int tid) {
  static_assert(Shape::kPingPong && Shape::kMBlocks == 2 && Shape::kConsumers == 2 &&
                Shape::kPromotion == Promotion::kNone && Shape::kCluster == 1 &&
                !Shape::kPackedInt4 && !Shape::kStagedEpilogue && !Shape::kEpilogueWarps);
  constexpr int kBN = Shape::kBN;
  constexpr int kAcc = kBN / 2;
  using Step = KStep<T, kBN, Promotion::kNone>;
  const int lane = tid & 31;
  int turn = 0;
  for (int item = first_item + warpgroup * item_stride, j = warpgroup; item < total_items;
       item += 2 * item_stride, j += 2, ++turn) {
    const WorkItem w = item_at(item);
    typename Step::Acc acc[2][kAcc];
    zero_accumulators(acc[0]);
    zero_accumulators(acc[1]);
    mbar_wait(smem_u32(&s_turn[warpgroup]), turn & 1);
    int it = j * p.k_tiles;  // ring position of this item's first K step
    for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
      mbar_wait(smem_u32(&s_full[it % Shape::kStages]), (it / Shape::kStages) & 1);
      fence_proxy_async();  // the producers' cp.async data, seen by the tensor cores
      const uint32_t sa = rings.stage(it);
      mma_stage<T, kBN>(acc[0], sa, rings.w_tile(it));
      mma_stage<T, kBN>(acc[1], sa + 64 * kRowBytes, rings.w_tile(it));
      wgmma_wait<2>();  // step kt - 1's two groups are done
      fence_registers(acc[0]);
      fence_registers(acc[1]);
      if (kt > 0) release_step<Shape>(s_empty, nullptr, it - 1, lane);
    }
    if ((tid & 127) == 0) mbar_arrive(smem_u32(&s_turn[warpgroup ^ 1]));
    wgmma_wait<0>();
    fence_registers(acc[0]);
    fence_registers(acc[1]);
    if (p.k_tiles > 0) release_step<Shape>(s_empty, nullptr, it - 1, lane);
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      FragmentRows rows{{-1, -1}};
      if constexpr (kIsScaled<T>) rows = fragment_rows<kBN>(p, w, b, tid);
      Step step;
      float out[kAcc];
      step.finish(acc[b], out, p, w, rows, lane);
      store_warpgroup_tile<OutT, kBN>(p, out, w, b, tid);
    }
  }
}

template <typename T, typename OutT, int kTile>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    ws_tma_kernel(const KernelParams p, const __grid_constant__ CUtensorMap w_map) {
  pdl_wait();  // before any global memory access (core/cuda/pdl.cuh)
  using Shape = ShapeOf<T, kTile>;
  constexpr int kBM = Shape::kBM;
  constexpr int kBN = Shape::kBN;
  constexpr int kStages = Shape::kStages;
  constexpr int kAcc = kBN / 2;

  using RingsT = Rings<Shape>;
  constexpr int kWSlots = RingsT::kWSlots;

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];    // m-tiles of experts [0, e)
  __shared__ alignas(8) uint64_t s_full[kWSlots];   // step landed (producer -> consumers)
  __shared__ alignas(8) uint64_t s_empty[kStages];  // stage consumed (consumers -> producer)
  // kW4A8: W tile consumed (consumers -> producer)
  __shared__ alignas(8) uint64_t s_w_empty[Shape::kPackedInt4 ? kWSlots : 1];
  // The handoff tile of the epilogue warps: [0] written (consumers -> epilogue warps), [1] read
  // out (epilogue warps -> consumers); one phase per item.
  __shared__ alignas(8) uint64_t s_handoff[2];
  // Ping-pong rows: s_turn[g] gives the tensor cores to consumer warpgroup g (pingpong_items).
  __shared__ alignas(8) uint64_t s_turn[2];
  const RingsT rings(smem_dynamic);

  const int tid = static_cast<int>(threadIdx.x);
  const int num_experts = p.num_experts;
  // Cluster rows (Shape::kCluster = 2): the cluster walks items of kCluster m-tiles (the prefix
  // counts those), each CTA computing its own m-tile of the item; W comes half from each CTA's
  // producer, multicast into both.
  constexpr int kCluster = Shape::kCluster;
  const int rank = kCluster > 1 ? static_cast<int>(cluster_ctarank()) : 0;
  const int first_item = static_cast<int>(blockIdx.x) / kCluster;
  const int item_stride = static_cast<int>(gridDim.x) / kCluster;

  // 1. m-tile prefix over experts; barrier initialisation.
  if (tid < 32) {
    tile_prefix_by_warp<kBM * kCluster>(p, s_tile_prefix, tid);
  } else if (tid == 32) {
    init_ring_barriers<Shape>(s_full, s_empty, s_w_empty);
    if constexpr (Shape::kEpilogueWarps) {
      mbar_init(smem_u32(&s_handoff[0]), Shape::kConsumerThreads);
      mbar_init(smem_u32(&s_handoff[1]), Shape::kEpilogueThreads);
    }
    if constexpr (Shape::kPingPong) {
      mbar_init(smem_u32(&s_turn[0]), 1);
      mbar_init(smem_u32(&s_turn[1]), 1);
      mbar_arrive(smem_u32(&s_turn[0]));  // warpgroup 0 takes the CTA's first item
    }
  }
  __syncthreads();
  if constexpr (kCluster > 1) cluster_sync();  // every CTA's barriers initialised

  const int total_m_tiles = s_tile_prefix[num_experts];
  const int total_items = total_m_tiles * p.n_tiles;
  const int warpgroup = tid / 128;
  auto item_at = [&](int item) {
    WorkItem w = resolve_item<kBM * kCluster, kBN>(p, s_tile_prefix, total_m_tiles, item);
    w.m0 += rank * kBM;
    return w;
  };

  if (warpgroup == Shape::kConsumers) {
    // ---- producer warpgroup -----------------------------------------------------------------
    if constexpr (Shape::kRebalanceRegisters) setmaxnreg_dec<Shape::kProducerRegisters>();
    const int ptid = tid - Shape::kConsumerThreads;
    if constexpr (Shape::kEpilogueWarps) {
      if (ptid >= Shape::kLoaderThreads) {
        // ---- epilogue warps: each item's tile from the handoff tile to C ------------------------
        int taken = 0;  // items taken over so far
        for (int item = first_item; item < total_items; item += item_stride, ++taken) {
          const WorkItem w = item_at(item);
          mbar_wait(smem_u32(&s_handoff[0]), taken & 1);
          store_handoff<OutT, Shape::kEpilogueThreads>(p, w, rings.epilogue,
                                                       ptid - Shape::kLoaderThreads);
          mbar_arrive(smem_u32(&s_handoff[1]));
        }
        return;
      }
    }
    const int chunk = ptid & 7;         // 16-byte column of the tile row this thread loads
    const int row_in_pass = ptid >> 3;  // tile row (mod 16) this thread loads
    const uint32_t swizzled = swizzled_offset(row_in_pass, chunk);
    int it = 0;  // K steps issued so far by this CTA (all items)
    [[maybe_unused]] Int4Converter<Shape> int4;
    for (int item = first_item; item < total_items; item += item_stride) {
      // 2. Work item -> (expert, m-tile, n-tile).
      const WorkItem w = item_at(item);
      const ARowSources<Shape::kAPasses> a_rows =
          gathered_a_sources<Shape>(p, w, row_in_pass, chunk);
      if constexpr (Shape::kPackedInt4) int4.begin(p, w, ptid);
      for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        // (cluster rows: released by the consumers of every CTA of the cluster)
        mbar_wait(smem_u32(&s_empty[s]), ((it / kStages) & 1) ^ 1);
        const uint32_t sa = rings.stage(it);
        const bool k_ok = kt * Shape::kBK + chunk * Shape::kChunkElems < p.k;
        copy_a_stage<Shape>(a_rows, sa + swizzled, k_ok, static_cast<int64_t>(kt) * kRowBytes);
        if constexpr (Shape::kPackedInt4) {
          int4.load(p, kt, rings.packed_slot(it), rings.packed_scales(it), ptid);
          cp_async_commit();
          int4.after_step(rings, s_full, s_w_empty, it, ptid);
        } else {
          if (ptid == 0) {  // W tile: one bulk tensor copy (zeros past N and K)
            const uint32_t full = smem_u32(&s_full[s]);
            mbar_arrive_expect_tx(full, Shape::kStageBBytes);  // both halves (cluster rows)
            if constexpr (kCluster > 1) {  // this CTA's rows of the tile, into every CTA's stage
              constexpr int kHalf = Shape::kTmaBoxN;
              tma_load_3d_multicast(rings.w_tile(it) + rank * kHalf * kRowBytes, &w_map, full,
                                    kt * Shape::kBK, w.n0 + rank * kHalf, w.expert,
                                    static_cast<uint16_t>((1u << kCluster) - 1));
            } else {
              tma_load_3d(rings.w_tile(it), &w_map, full, kt * Shape::kBK, w.n0, w.expert);
            }
          }
          cp_async_mbar_arrive(smem_u32(&s_full[s]));
        }
      }
    }
    if constexpr (Shape::kPackedInt4) int4.drain(rings, s_full, s_w_empty, it, ptid);
    cp_async_wait<0>();
    // Cluster rows: no CTA exits while another may still arrive on its barriers.
    if constexpr (kCluster > 1) cluster_sync();
    return;
  }

  // ---- consumer warpgroups ----------------------------------------------------------------------
  if constexpr (Shape::kRebalanceRegisters) setmaxnreg_inc<Shape::kConsumerRegisters>();
  const int lane = tid & 31;
  using Step = KStep<T, kBN, Shape::kPromotion, Shape::kGroupScales>;
  constexpr int kLag = Step::release_lag;
  if constexpr (Shape::kPingPong) {
    pingpong_items<T, OutT, Shape>(p, rings, s_full, s_empty, s_turn, first_item, total_items,
                                   item_stride, item_at, warpgroup, tid);
    return;
  }
  Step step;
  int it = 0;                       // K steps consumed so far by this CTA (all items)
  [[maybe_unused]] int handed = 0;  // items handed to the epilogue warps
  for (int item = first_item; item < total_items; item += item_stride) {
    const WorkItem w = item_at(item);
    if constexpr (Shape::kMBlocks > 1) {
      two_block_item<T, OutT, Shape>(p, w, rings, s_full, s_empty, s_w_empty, it, warpgroup, tid);
      continue;
    }
    FragmentRows rows{{-1, -1}};
    if constexpr (kIsScaled<T>) rows = fragment_rows<kBN>(p, w, warpgroup, tid);
    typename Step::Acc acc[kAcc];
    zero_accumulators(acc);
    step.begin(p, w, rows);

    // 3. Main loop.
    for_each_k_step(p.k_tiles, [&](int kt, auto parity) {
      mbar_wait(smem_u32(&s_full[it % kWSlots]), (it / kWSlots) & 1);
      fence_proxy_async();  // the producers' cp.async data, seen by the tensor cores
      if constexpr (Shape::kGroupScales) step.col_scales = rings.w_scales(it);
      step.template run<decltype(parity)::value>(
          acc, rings.stage(it) + static_cast<uint32_t>(warpgroup * 64 * kRowBytes),
          rings.w_tile(it), p, w, rows, kt);
      if (kt >= kLag) release_step<Shape>(s_empty, s_w_empty, it - kLag, lane);
      ++it;
    });
    step.end(acc, p);
    if constexpr (kLag > 0) release_step<Shape>(s_empty, s_w_empty, it - 1, lane);

    // 4. Epilogue.
    float out[kAcc];
    step.finish(acc, out, p, w, rows, lane);
    if constexpr (Shape::kEpilogueWarps) {
      // The values C would hold before any activation (+ bias, rounded to OutT) into the handoff
      // tile once the epilogue warps have read out the previous item, then on to the next item
      // while they store this one.
      mbar_wait(smem_u32(&s_handoff[1]), (handed & 1) ^ 1);
      const int row0 = w.m0 + warpgroup * 64 + ((tid & 127) >> 5) * 16 + (lane >> 2);
      store_plain_groups<OutT, kBN, 0, kBN / 8>(p, out, w.expert, row0, w.row_end, w.n0, lane,
                                                HandoffPairs<OutT>{rings.epilogue, w.m0, w.n0});
      mbar_arrive(smem_u32(&s_handoff[0]));
      ++handed;
      continue;
    }
    if constexpr (Shape::kStagedEpilogue) {
      if (p.act == FusedActivation::kNone) {  // GEMM2: through shared memory
        store_warpgroup_tile_staged<OutT, kBN>(
            p, out, w, warpgroup, tid,
            rings.epilogue + static_cast<uint32_t>(warpgroup * kStagedBytes));
        continue;
      }
    }
    store_warpgroup_tile<OutT, kBN>(p, out, w, warpgroup, tid);
  }
  if constexpr (kCluster > 1) cluster_sync();  // the other CTA's last arrivals landed here
}

// ---- kSingleRole --------------------------------------------------------------------------------

// The copies of one work item into a single-role ring stage: every thread copies the 16-byte
// chunk column `chunk` of kAPasses A rows (the stage's first kStageABytes) and kBPasses W rows
// (after them), row_in_pass + i * kRowsPerPass; zeros past K, past N and for rows without a
// source. One cp.async per chunk; the caller commits the group.
template <typename T, typename Shape>
struct StageCopies {
  ARowSources<Shape::kAPasses> a_rows;
  const uint8_t* w_src[Shape::kBPasses];

  StageCopies() = default;
  __device__ __forceinline__ StageCopies(const KernelParams& p, const WorkItem& w, int row_in_pass,
                                         int chunk) {
    a_rows = gathered_a_sources<Shape>(p, w, row_in_pass, chunk);
    const int64_t w_row_bytes = static_cast<int64_t>(p.k) * static_cast<int>(sizeof(T));
#pragma unroll
    for (int i = 0; i < Shape::kBPasses; ++i) {
      const int n = w.n0 + row_in_pass + i * Shape::kRowsPerPass;
      w_src[i] = n < p.n ? p.w + (static_cast<int64_t>(w.expert) * p.n + n) * w_row_bytes +
                               chunk * kChunkBytes
                         : nullptr;
    }
  }

  // K step kt into a ring stage; dst: the stage's address plus this thread's swizzled offset.
  __device__ __forceinline__ void copy(const KernelParams& p, int kt, uint32_t dst,
                                       int chunk) const {
    const bool k_ok = kt * Shape::kBK + chunk * Shape::kChunkElems < p.k;
    const int64_t k_bytes = static_cast<int64_t>(kt) * kRowBytes;
    copy_a_stage<Shape>(a_rows, dst, k_ok, k_bytes);
#pragma unroll
    for (int i = 0; i < Shape::kBPasses; ++i) {
      const bool ok = k_ok && w_src[i] != nullptr;
      cp_async_16(dst + Shape::kStageABytes + i * Shape::kRowsPerPass * kRowBytes,
                  ok ? w_src[i] + k_bytes : p.w, ok);
    }
  }
};

// A run of one work item's K steps [kt_begin, kt_end) that one CTA computes.
struct Segment {
  int item;
  int kt_begin;
  int kt_end;
};

// The first (item, K step) unit of CTA `cta`'s stream-K share of `units`.
__device__ __forceinline__ int64_t stream_k_start(int64_t units, int cta) {
  return units * cta / static_cast<int64_t>(gridDim.x);
}

// The work of a CTA as segments: whole work items round-robin (blockIdx.x, then every
// gridDim.x-th), or under stream-K (kStreamK and sk) its contiguous share of the total_items x
// k_tiles (item, K step) units, whose first and last segments may begin or end inside an item.
// The round-robin kernels instantiate it without kStreamK: none of stream-K's code (64-bit
// divisions, inlined at every call) then sits in their instruction stream.
template <bool kStreamK>
struct SegmentWalk {
  int64_t u = 0, u_end = 0;  // stream-K: the units left
  int item = 0;              // round-robin: the next item
  bool stream_k = false;

  __device__ __forceinline__ SegmentWalk(int total_items, int k_tiles, bool sk)
      : stream_k(kStreamK && sk) {
    if (stream_k) {
      const int64_t units = static_cast<int64_t>(total_items) * k_tiles;
      u = stream_k_start(units, static_cast<int>(blockIdx.x));
      u_end = stream_k_start(units, static_cast<int>(blockIdx.x) + 1);
    } else {
      item = static_cast<int>(blockIdx.x);
    }
  }

  __device__ __forceinline__ bool next(int total_items, int k_tiles, Segment& s) {
    if (k_tiles <= 0) return false;
    if (kStreamK && stream_k) {
      if (u >= u_end) return false;
      s.item = static_cast<int>(u / k_tiles);
      s.kt_begin = static_cast<int>(u - static_cast<int64_t>(s.item) * k_tiles);
      s.kt_end = static_cast<int>(min(static_cast<int64_t>(k_tiles), s.kt_begin + (u_end - u)));
      u += s.kt_end - s.kt_begin;
      return true;
    }
    if (item >= total_items) return false;
    s = {item, 0, k_tiles};
    item += static_cast<int>(gridDim.x);
    return true;
  }
};

// The load cursor of the rows whose every thread loads (single-role, swap-AB): it walks the CTA's
// segments (a SegmentWalk) and their K steps and copies one stage per next() into the next ring
// slot, so the copies run ahead of the compute across work items: a work item of a few K steps
// (GEMM2 of a small expert) does not restart the pipeline, and the epilogue of one item overlaps
// the loads of the next. One cp.async group per call (empty past the CTA's last segment: the wait
// counts stay uniform). The caller refills a slot only once every wgmma reading it has completed.
template <typename T, typename Shape, bool kStreamK = false>
struct RingLoadCursor {
  SegmentWalk<kStreamK> walk;
  Segment seg{};
  bool more;
  int kt = 0;
  int slot = 0;
  StageCopies<T, Shape> copies;

  __device__ __forceinline__ RingLoadCursor(const SegmentWalk<kStreamK>& w, int total_items,
                                            int k_tiles)
      : walk(w) {
    more = walk.next(total_items, k_tiles, seg);
    kt = seg.kt_begin;
  }

  __device__ __forceinline__ void next(const KernelParams& p, const int* tile_prefix,
                                       int total_m_tiles, int total_items, uint32_t ring,
                                       uint32_t swizzled, int row_in_pass, int chunk) {
    if (more) {
      if (kt == seg.kt_begin) {
        copies = StageCopies<T, Shape>(
            p, resolve_item<Shape::kBM, Shape::kBN>(p, tile_prefix, total_m_tiles, seg.item),
            row_in_pass, chunk);
      }
      copies.copy(p, kt, ring + static_cast<uint32_t>(slot * Shape::kStageBytes) + swizzled, chunk);
      if (++kt == seg.kt_end) {
        more = walk.next(total_items, p.k_tiles, seg);
        kt = seg.kt_begin;
      }
    }
    cp_async_commit();
    slot = slot + 1 == Shape::kStages ? 0 : slot + 1;
  }
};

// Stream-K: the end of a segment that is not its whole item. The CTA writes its partial sums acc
// (kF floats per thread of the 128) into its slot (0 for its first segment, 1 for its last: only
// those can be partial) and adds its K steps to the item's counter. The CTA that completes the
// count sums every contributor's slot in CTA order (the same sum whichever CTA finishes last),
// resets the counter and returns true with the sum in acc (it then stores the item); the others
// return false.
template <int kF>
__device__ __forceinline__ bool stream_k_fixup(const KernelParams& p, float (&acc)[kF],
                                               const Segment& s, bool first_segment,
                                               int total_items, int tid, int* s_done) {
  constexpr int kThreads = 128;
  auto slot_of = [&](int cta, int which) {
    return p.sk_partials + (2 * static_cast<int64_t>(cta) + which) * (kF * kThreads) + tid;
  };
  float* mine = slot_of(static_cast<int>(blockIdx.x), first_segment ? 0 : 1);
#pragma unroll
  for (int j = 0; j < kF; ++j)
    __stcg(mine + j * kThreads, acc[j]);
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int steps = s.kt_end - s.kt_begin;
    *s_done = atomicAdd(&p.sk_counters[s.item], steps) + steps == p.k_tiles ? 1 : 0;
  }
  __syncthreads();
  if (*s_done == 0) return false;
  __threadfence();
  const int grid = static_cast<int>(gridDim.x);
  const int64_t units = static_cast<int64_t>(total_items) * p.k_tiles;
  const int64_t first_unit = static_cast<int64_t>(s.item) * p.k_tiles;
  const int64_t end_unit = first_unit + p.k_tiles;
  // The CTA holding the item's first K step: the last whose share starts at or before it.
  int cta = static_cast<int>(first_unit * grid / units);
  while (cta + 1 < grid && stream_k_start(units, cta + 1) <= first_unit)
    ++cta;
#pragma unroll
  for (int j = 0; j < kF; ++j)
    acc[j] = 0.0f;
  for (; cta < grid && stream_k_start(units, cta) < end_unit; ++cta) {
    const int64_t start = stream_k_start(units, cta);
    if (stream_k_start(units, cta + 1) == start) continue;  // an empty share
    // The item is this CTA's first segment when its share starts inside it, else its last.
    const float* part = slot_of(cta, start >= first_unit ? 0 : 1);
#pragma unroll
    for (int j = 0; j < kF; ++j)
      acc[j] += __ldcg(part + j * kThreads);
  }
  if (tid == 0) p.sk_counters[s.item] = 0;
  return true;
}

template <typename T, typename OutT, int kTile>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    single_role_kernel(const KernelParams p) {
  pdl_wait();  // before any global memory access (core/cuda/pdl.cuh)
  using Shape = ShapeOf<T, kTile>;
  constexpr int kBM = Shape::kBM;
  constexpr int kBN = Shape::kBN;
  constexpr int kStages = Shape::kStages;
  constexpr int kAcc = kBN / 2;

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // m-tiles of experts [0, e)
  const uint32_t smem_base = ring_base(smem_dynamic);

  const int tid = static_cast<int>(threadIdx.x);
  const int num_experts = p.num_experts;

  // 1. m-tile prefix over experts.
  if (tid < 32) {
    tile_prefix_by_warp<kBM>(p, s_tile_prefix, tid);
  }
  __syncthreads();

  const int total_m_tiles = s_tile_prefix[num_experts];
  const int total_items = total_m_tiles * p.n_tiles;
  const int chunk = tid & 7;         // 16-byte column of the tile row this thread loads
  const int row_in_pass = tid >> 3;  // tile row (mod kRowsPerPass) this thread loads
  const uint32_t swizzled = swizzled_offset(row_in_pass, chunk);
  const int warpgroup = tid / 128;
  using Step = KStep<T, kBN, Shape::kPromotion>;
  static_assert(Step::release_lag <= 1, "the refill of stage kt - 2 after the barrier of step kt");
  Step step;

  // The copies run kStages - 2 steps ahead of the compute, across work items (RingLoadCursor).
  RingLoadCursor<T, Shape> loads(SegmentWalk<false>(total_items, p.k_tiles, false), total_items,
                                 p.k_tiles);
  auto load_next = [&] {
    loads.next(p, s_tile_prefix, total_m_tiles, total_items, smem_base, swizzled, row_in_pass,
               chunk);
  };
#pragma unroll 1  // one copy of the cursor's code (cold instruction fetch: the notes, 2026-12-06)
  for (int s = 0; s < kStages - 2; ++s)
    load_next();

  int slot = 0;  // the ring slot of the compute's K step
  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    // 2. Work item -> (expert, m-tile, n-tile).
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
    FragmentRows rows{{-1, -1}};
    if constexpr (kIsScaled<T>) rows = fragment_rows<kBN>(p, w, warpgroup, tid);

    typename Step::Acc acc[kAcc];
    zero_accumulators(acc);
    step.begin(p, w, rows);

    // 3. Main loop: the CTA's K step g reads slot g % kStages.
    for_each_k_step(p.k_tiles, [&](int kt, auto parity) {
      cp_async_wait<kStages - 3>();  // this thread's copies of step g have landed
      fence_proxy_async();           // make them visible to the tensor cores (async proxy)
      __syncthreads();
      // Refill the slot of step g - 2 before computing: every warpgroup's wgmma on it completed
      // before this barrier (release_lag is 1 here: wgmma_wait<1> in step g - 1, or the previous
      // item's end()), and issuing the copies first keeps kStages - 2 steps in flight during the
      // wgmma.
      load_next();
      const uint32_t stage = smem_base + static_cast<uint32_t>(slot * Shape::kStageBytes);
      slot = slot + 1 == kStages ? 0 : slot + 1;
      step.template run<decltype(parity)::value>(
          acc, stage + static_cast<uint32_t>(warpgroup * 64 * kRowBytes),
          stage + Shape::kStageABytes, p, w, rows, kt);
    });
    step.end(acc, p);

    // 4. Epilogue (registers to global memory: the ring keeps filling with the next item).
    float out[kAcc];
    step.finish(acc, out, p, w, rows, tid & 31);
    store_warpgroup_tile<OutT, kBN>(p, out, w, warpgroup, tid);
  }
  cp_async_wait<0>();
}

// ---- kW4A16: packed MXFP4 W converted in shared memory ------------------------------------------

// MXFP4 codes to bf16: e2m1_pair_bits, w4_first_factor and w4_second_factor (sm90/mxfp4_layout.h,
// plain functions tested on the host) and the bf16 pair multiply.
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// The packed formats of the kW4A16 rows (WPacking kMxfp4, kNvfp4, kMxfp6E2M3, kMxfp6E3M2): how
// long a row is, how a kernel-order word becomes bf16 pairs (sm90/mxfp4_layout.h and
// sm90/mxfp6_layout.h, plain functions tested on the host) and the bf16x2 factors of a group's
// scale code(s). MXFP6 words come with their high bits: `high` is the group's high-plane word
// H[q / 2] shifted right by 8 (q % 2) for low word q (ignored by the 4-bit formats).
template <WPacking kPacking>
struct Packed {
  static constexpr bool kNvfp4 = kPacking == WPacking::kNvfp4;
  static constexpr bool kMxfp6 =
      kPacking == WPacking::kMxfp6E2M3 || kPacking == WPacking::kMxfp6E3M2;
  static constexpr bool kE3M2 = kPacking == WPacking::kMxfp6E3M2;
  // e8m0 codes above this need the second multiply (MXFP4 and e2m3: scales above 2; e3m2, whose
  // pairs carry 2^-124, above 8); NaN (255) among them.
  static constexpr uint32_t kOneStepMax = kE3M2 ? 130u : 128u;
  static constexpr int64_t row_bytes(int k) {
    return kMxfp6 ? static_cast<int64_t>(k) * 3 / 4 : k / 2;
  }
  template <int kP>
  static constexpr uint32_t pair_bits(uint32_t word, uint32_t high) {
    if constexpr (kMxfp6) return fp6_pair_bits<kP, kE3M2>(word, high);
    return e2m1_pair_bits<kP>(word);
  }
  // The high-plane word of low word q, given the group's two (h0, h1).
  static constexpr uint32_t high_of(uint32_t h0, uint32_t h1, int q) {
    return (q < 2 ? h0 : h1) >> (8 * (q % 2));
  }
  static constexpr uint32_t first_factor(uint32_t s) {
    return kE3M2 ? mxfp6_first_factor(s, true) : w4_first_factor(s);
  }
  static constexpr uint32_t second_factor(uint32_t s) {
    return kE3M2 ? mxfp6_second_factor(s, true) : w4_second_factor(s);
  }
};

// The bf16x2 factors of one 32-element group: `lo` for pairs 0, 1 of its words (elements 0..15),
// `hi` for pairs 2, 3 (16..31), then f2 when two_steps. MXFP4 / MXFP6 (`codes` its e8m0 code): lo
// = hi = the first factor, f2 above kOneStepMax. NVFP4 (`codes` the kernel scale codes of its two
// 16-element groups, bytes 0 and 1): one multiply each.
struct W4Factors {
  uint32_t lo, hi, f2;
  bool two_steps;
};
template <WPacking kPacking>
__device__ __forceinline__ W4Factors w4_factors(uint32_t codes) {
  using Fmt = Packed<kPacking>;
  if constexpr (Fmt::kNvfp4) {
    return {nvfp4_factor(codes & 0xFFu), nvfp4_factor((codes >> 8) & 0xFFu), 0u, false};
  }
  const uint32_t f1 = Fmt::first_factor(codes);
  return {f1, f1, Fmt::second_factor(codes), codes > Fmt::kOneStepMax};
}

// Single-role mainloop of the kW4A16 rows. Every thread copies its part of a stage (gathered A
// rows and packed W rows by cp.async into the ring); thread t converts the 32-element group
// (row t / 2, half t % 2) of each packed stage into one of kConvertedTiles bf16 W tiles (128-byte
// swizzled, the layout the 16-bit wgmma reads) one K step ahead: while the tensor cores run step
// kt on tile kt % 3, the threads convert step kt + 1 into the tile step kt - 2 read. One block
// barrier per K step. MXFP6: the thread also reads its group's 8 high-plane bytes (one 8-byte
// load, a K step ahead like the scale code).
template <typename T, typename OutT, int kTile, WPacking kPacking>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    w4a16_kernel(const KernelParams p) {
  pdl_wait();  // before any global memory access (core/cuda/pdl.cuh)
  using Shape = ShapeOf<T, kTile>;
  using Fmt = Packed<kPacking>;
  static_assert(Shape::kPackedW4 && std::is_same_v<T, __nv_bfloat16>);
  constexpr int kBM = Shape::kBM;
  constexpr int kBN = Shape::kBN;
  constexpr int kStages = Shape::kStages;
  constexpr int kAcc = kBN / 2;
  constexpr int kPackedRow = Shape::kPackedRowBytes;  // 32 bytes = 64 elements of K
  constexpr int kConvertedTiles = Shape::kConvertedTiles;
  static_assert(kStages >= 4, "tile kt + 1 lands while kStages - 4 later tiles stay in flight");

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // m-tiles of experts [0, e)
  const uint32_t converted_base = ring_base(smem_dynamic);
  const uint32_t smem_base = converted_base + Shape::kConvertedBytes;
  const uint8_t* smem_generic = smem_dynamic + (converted_base - smem_u32(smem_dynamic));

  const int tid = static_cast<int>(threadIdx.x);
  if (tid < 32) tile_prefix_by_warp<kBM>(p, s_tile_prefix, tid);
  __syncthreads();

  const int total_m_tiles = s_tile_prefix[p.num_experts];
  const int total_items = total_m_tiles * p.n_tiles;
  const int chunk = tid & 7;         // A: 16-byte column of the tile row this thread loads
  const int row_in_pass = tid >> 3;  // A: tile row (mod kRowsPerPass) this thread loads
  const uint32_t swizzled = swizzled_offset(row_in_pass, chunk);
  const int w_row = tid >> 1;  // W: the packed row this thread loads and converts
  const int w_half = tid & 1;  // W: its 32-element group of the stage
  const int warpgroup = tid / 128;
  const int64_t w_row_bytes = Fmt::row_bytes(p.k);
  using Step = KStep<T, kBN, Shape::kPromotion>;
  Step step;

  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
    const ARowSources<Shape::kAPasses> a_rows = gathered_a_sources<Shape>(p, w, row_in_pass, chunk);
    const int n = w.n0 + w_row;
    const int64_t w_index = static_cast<int64_t>(w.expert) * p.n + n;
    const uint8_t* w_src = n < p.n ? p.w + w_index * w_row_bytes + w_half * kChunkBytes : nullptr;
    // The scale code(s) of this thread's group: one e8m0 (MXFP4, MXFP6), two kernel codes
    // (NVFP4).
    constexpr int codes_per_group = Fmt::kNvfp4 ? 2 : 1;
    const uint8_t* scale_src =
        n < p.n ? p.w_group_scale + w_index * p.k_groups + w_half * codes_per_group : nullptr;
    // MXFP6: the high-plane bytes of this thread's group in K step 0 (16 per step and row).
    const uint8_t* high_src =
        Fmt::kMxfp6 && n < p.n ? p.w + w_index * w_row_bytes + p.k / 2 + w_half * 8 : nullptr;

    auto load_stage = [&](int kt) {
      if (kt < p.k_tiles) {
        const uint32_t sa = smem_base + static_cast<uint32_t>((kt % kStages) * Shape::kStageBytes);
        const uint32_t sb = sa + Shape::kStageABytes;
        const bool k_ok = kt * Shape::kBK + chunk * Shape::kChunkElems < p.k;
        const int64_t k_bytes = static_cast<int64_t>(kt) * kRowBytes;
        copy_a_stage<Shape>(a_rows, sa + swizzled, k_ok, k_bytes);
        const bool w_ok = w_src != nullptr && kt * Shape::kBK + w_half * 32 < p.k;
        cp_async_16(sb + w_row * kPackedRow + w_half * kChunkBytes,
                    w_ok ? w_src + static_cast<int64_t>(kt) * kPackedRow : p.w, w_ok);
      }
      cp_async_commit();  // NOTE: empty groups keep the wait counts uniform
    };
    // The scale code(s) of this thread's group in K step kt (past k or n, where the codes are 0:
    // 127 = 1.0 for MXFP4, 0 for NVFP4). NVFP4's two codes are one aligned 2-byte load (k_groups
    // is even: k % 32 == 0).
    auto load_scale = [&](int kt) -> uint32_t {
      const int first = (kt * 2 + w_half) * codes_per_group;
      const bool ok = scale_src != nullptr && kt < p.k_tiles && first < p.k_groups;
      if (!ok) return Fmt::kNvfp4 ? 0u : 127u;
      const uint8_t* codes = scale_src + 2 * codes_per_group * kt;
      if constexpr (Fmt::kNvfp4) return __ldg(reinterpret_cast<const uint16_t*>(codes));
      return __ldg(codes);
    };
    // MXFP6: the group's high-plane words H0, H1 in K step kt (zeros past k or n).
    auto load_high = [&](int kt) -> uint2 {
      if constexpr (!Fmt::kMxfp6) return make_uint2(0u, 0u);
      const bool ok = high_src != nullptr && kt < p.k_tiles && kt * Shape::kBK + w_half * 32 < p.k;
      return ok ? __ldg(reinterpret_cast<const uint2*>(high_src + 16 * static_cast<int64_t>(kt)))
                : make_uint2(0u, 0u);
    };

    typename Step::Acc acc[kAcc];
    zero_accumulators(acc);

    // This thread's 32-element group of K step kt, converted with its scale code into converted
    // tile kt % kConvertedTiles: pair p of the group's four words is elements 8p .. 8p + 7 of the
    // group, one 16-byte chunk of the bf16 row.
    auto convert = [&](int kt, uint32_t scale, uint2 high) {
      const uint4 q = *reinterpret_cast<const uint4*>(
          smem_generic + Shape::kConvertedBytes + (kt % kStages) * Shape::kStageBytes +
          Shape::kStageABytes + w_row * kPackedRow + w_half * kChunkBytes);
      const W4Factors f = w4_factors<kPacking>(scale);
      const uint32_t tile = static_cast<uint32_t>((kt % kConvertedTiles) * kBN * kRowBytes);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      uint32_t v[4][4];
      [&]<int... kP>(std::integer_sequence<int, kP...>) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          ((v[kP][q] =
                mul_bf16x2(Fmt::template pair_bits<kP>(words[q], Fmt::high_of(high.x, high.y, q)),
                           kP < 2 ? f.lo : f.hi)),
           ...);
        }
      }
      (std::make_integer_sequence<int, 4>{});
      if (f.two_steps) {  // MX scales above kOneStepMax: one branch per group
#pragma unroll
        for (int c = 0; c < 4; ++c) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            v[c][i] = mul_bf16x2(v[c][i], f.f2);
        }
      }
#pragma unroll
      for (int c = 0; c < 4; ++c)
        st_shared_v4(converted_base + tile + swizzled_offset(w_row, 4 * w_half + c), v[c]);
    };

    __syncthreads();  // every warpgroup is done with the ring and the converted tiles
#pragma unroll 1  // one copy of load_stage's code (cold instruction fetch: the notes, 2026-12-06)
    for (int s = 0; s < kStages - 2; ++s)
      load_stage(s);
    const uint32_t first_scale = load_scale(0);
    const uint2 first_high = load_high(0);
    uint32_t next_scale = load_scale(1);
    uint2 next_high = load_high(1);
    cp_async_wait<kStages - 3>();  // tile 0 has landed (this thread's copies)
    __syncthreads();               // ... every thread's
    convert(0, first_scale, first_high);

    for (int kt = 0; kt < p.k_tiles; ++kt) {
      cp_async_wait<kStages - 4>();  // this thread's copies of tile kt + 1 have landed
      fence_proxy_async();           // its conversion of tile kt, seen by the tensor cores
      // Every thread's: tile kt converted, tile kt + 1 landed, the wgmma of step kt - 2 done
      // (wgmma_wait<1> after issuing step kt - 1).
      __syncthreads();
      // Refill the stage of tile kt - 2 (its wgmma is done; its W was converted at step kt - 3).
      load_stage(kt + kStages - 2);
      mma_stage<T, kBN>(
          acc,
          smem_base + static_cast<uint32_t>((kt % kStages) * Shape::kStageBytes +
                                            warpgroup * 64 * kRowBytes),
          converted_base + static_cast<uint32_t>((kt % kConvertedTiles) * kBN * kRowBytes));
      // While the tensor cores run step kt: convert tile kt + 1 into the tile the wgmma of step
      // kt - 2 read.
      if (kt + 1 < p.k_tiles) {
        const uint32_t scale = next_scale;
        const uint2 high = next_high;
        next_scale = load_scale(kt + 2);
        next_high = load_high(kt + 2);
        convert(kt + 1, scale, high);
      }
      wgmma_wait<1>();
      fence_registers(acc);
    }
    wgmma_wait<0>();
    fence_registers(acc);

    float out[kAcc];
    step.finish(acc, out, p, w, FragmentRows{{-1, -1}}, tid & 31);
    store_warpgroup_tile<OutT, kBN>(p, out, w, warpgroup, tid);
  }
}

// ---- kSwapAB ------------------------------------------------------------------------------------

// The epilogue of the swap-AB rows (one warpgroup): acc[4j + 2h + v] is (weight row r0 + 8h, token
// 8j + 2 (lane % 4) + v) of the item, r0 = 16 * warp + lane / 4. It is transposed through s_out
// (kSwappedTileFloats; the ring where the caller's copies into it have landed and its wgmma
// completed). The 128 threads store the item's valid tokens from there (store_transposed_tile: a
// rolled loop, all threads; the unrolled per-warp fragment epilogue was mostly cold instruction
// fetch at a few tokens per item, bench/grouped_gemm_notes.md), scaled as every kernel's
// accumulator is (KStep::finish: 1 or NVFP4's global scale for 16-bit operands, the K-invariant
// A x W scales for 8-bit ones: scale_of_8bit). The warpgroup meets at sync() (the whole CTA, or a
// named barrier of its 128 threads where a producer runs beside it).

// The scales KStep::finish applies to 8-bit operands, for columns col and col + 1 of token t of
// the item (row w.m0 + t, a valid row): A's (per tensor / per row) times W's (per expert / per
// channel); 1 where block-128 scales were applied in the K loop.
__device__ __forceinline__ float2 scale_of_8bit(const KernelParams& p, const WorkItem& w, int t,
                                                int col) {
  const bool channel = p.w_scale_kind == WScale::kChannel;
  if (!channel && p.a_scale_kind == AScale::kRowBlock128) return make_float2(1.0f, 1.0f);
  float fa = 1.0f;
  if (p.a_scale_kind == AScale::kTensor) {
    fa = __ldg(p.a_scale);
  } else if (p.a_scale_kind == AScale::kRow) {
    const int row = w.m0 + t;
    fa = __ldg(&p.a_scale[p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row]);
  }
  float2 fc;
  if (channel) {
    const float* ws = p.w_scale + static_cast<int64_t>(w.expert) * p.n;
    fc.x = col < p.n ? __ldg(ws + col) : 0.0f;
    fc.y = col + 1 < p.n ? __ldg(ws + col + 1) : 0.0f;
  } else {
    fc.x = fc.y = p.w_scale_kind == WScale::kExpert ? __ldg(&p.w_scale[w.expert]) : 1.0f;
  }
  return make_float2(fa * fc.x, fa * fc.y);
}

template <int kBM, int kBN>
inline constexpr int kSwappedTileFloats = kBM*(kBN + 4);  // the transposed tile, padded rows

template <typename T, typename OutT, int kBM, int kBN, typename Sync>
__device__ __forceinline__ void store_swapped_tile(const KernelParams& p,
                                                   const float (&acc)[kBM / 2], const WorkItem& w,
                                                   float* s_out, int tid, Sync&& sync) {
  static_assert((kBM == 16 || kBM == 32) && kBN == 64,
                "one warpgroup: 64 weight rows x 16 or 32 tokens");
  constexpr int kOutLd = kBN + 4;  // floats per token of the transposed tile
  const int lane = tid & 31;
  const int r0 = (tid >> 5) * 16 + (lane >> 2);
  const int q2 = (lane & 3) * 2;
  sync();  // every thread is done with s_out (the previous item) or the ring
#pragma unroll
  for (int j = 0; j < kBM / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int v = 0; v < 2; ++v)
        s_out[(8 * j + q2 + v) * kOutLd + r0 + 8 * h] = acc[4 * j + 2 * h + v];
    }
  }
  sync();
  const int tokens = min(w.row_end - w.m0, kBM);
  if constexpr (!kIsScaled<T>) {
    const float fe = p.w_scale_kind == WScale::kExpert ? __ldg(&p.w_scale[w.expert]) : 1.0f;
    store_transposed_tile<OutT, kBN, 128>(
        p, s_out, kOutLd, w, tokens, [fe](int, int) { return make_float2(fe, fe); }, tid);
  } else {
    store_transposed_tile<OutT, kBN, 128>(
        p, s_out, kOutLd, w, tokens, [&](int t, int col) { return scale_of_8bit(p, w, t, col); },
        tid);
  }
}

// ---- kSwapAB: W4A16 with the weights as the wgmma's A operand ---------------------------------

// Swap-AB mainloop of the kW4A16 decode row: one warpgroup computes D^T = W_tile . A_tile^T for a
// work item of kBM (16) tokens x kBN (64) weight rows, so that a few tokens per expert still fill
// the wgmma's M with weights. Each K step (64 elements) every thread copies one 16-byte chunk of
// the tokens (128-byte swizzled rows, the wgmma's B), one of the packed W rows and, for 64 threads,
// the 4-byte word holding a W row's two e8m0 codes into a kStages ring (one cp.async group per
// step, kStages - 3 steps ahead; one 128-thread barrier per pair of steps). The consumer side
// reads its two fragment rows (a word of each 16-byte group, in the kernel nibble order) from the
// ring, converts them straight into the A fragment registers (two sets, so that step kt's
// conversion overlaps step kt - 1's wgmma) and issues 4 m64n16k16 wgmma. The epilogue
// transposes the accumulator through shared memory into the 16-bit kernels' fragment layout, and
// warp 0 stores it with store_tile (bias, fused activation). Needs k % 64 == 0 (whole K steps; the
// two codes of a step in one aligned word) and a 4-byte aligned w_group_scale. MXFP6: the 64
// threads that copy the codes words also copy their row's 16 high-plane bytes of the step (both
// groups) into s_high.
template <typename T, typename OutT, int kTile, WPacking kPacking>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    w4a16_swapab_kernel(const KernelParams p) {
  pdl_wait();  // before any global memory access (core/cuda/pdl.cuh)
  using Shape = ShapeOf<T, kTile>;
  using Fmt = Packed<kPacking>;
  static_assert(Shape::kSwapAB && std::is_same_v<T, __nv_bfloat16>);
  constexpr int kBM = Shape::kBM;  // tokens of an item: the wgmma's N
  constexpr int kBN = Shape::kBN;  // weight rows of an item: the wgmma's M
  static_assert(kBM == 16 && kBN == 64 && Shape::kThreads == 128);
  constexpr int kStages = Shape::kStages;
  static_assert(kStages >= 5 && kStages % 2 == 0,
                "a pair of steps lands while the refills of the previous pair stay in flight");
  constexpr int kPackedRow = Shape::kPackedRowBytes;  // 32 bytes = 64 elements of K
  constexpr int kSteps = kRowBytes / kMmaKBytes;      // wgmma (16 elements of K) per K step

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // token blocks of experts [0, e)
  __shared__ uint32_t s_scale_words[kStages][kBN];
  __shared__ uint4 s_high[Fmt::kMxfp6 ? kStages : 1][Fmt::kMxfp6 ? kBN : 1];
  const uint32_t ring = ring_base(smem_dynamic);
  uint8_t* ring_generic = smem_dynamic + (ring - smem_u32(smem_dynamic));

  const int tid = static_cast<int>(threadIdx.x);
  if (tid < 32) tile_prefix_by_warp<kBM>(p, s_tile_prefix, tid);
  __syncthreads();
  const int total_m_tiles = s_tile_prefix[p.num_experts];
  const int total_items = total_m_tiles * p.n_tiles;

  // Loading roles: token row tid / 8, chunk tid % 8; packed W row tid / 2, half tid % 2; the codes
  // word of W row tid (tid < kBN).
  const int tok_row = tid >> 3;
  const uint32_t tok_dst = swizzled_offset(tok_row, tid & 7);
  const int w_row = tid >> 1;
  const uint32_t w_dst = Shape::kStageABytes + w_row * kPackedRow + (tid & 1) * kChunkBytes;
  // Fragment roles: rows r0 and r0 + 8 of the item's weight rows; word q = lane % 4 of each
  // 16-byte group holds this thread's codes (sm90/mxfp4_layout.h).
  const int lane = tid & 31;
  const int r0 = (tid >> 5) * 16 + (lane >> 2);
  const int word_offset = (lane & 3) * 4;
  const int64_t w_row_bytes = Fmt::row_bytes(p.k);

  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
    const uint8_t* tok_src = nullptr;
    if (const int row = w.m0 + tok_row; row < w.row_end) {
      const int s = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
      if (s >= 0) tok_src = p.a + static_cast<int64_t>(s) * p.lda_bytes + (tid & 7) * kChunkBytes;
    }
    const int64_t w_first = static_cast<int64_t>(w.expert) * p.n + w.n0;  // W row of item row 0
    const uint8_t* w_src = w.n0 + w_row < p.n
                               ? p.w + (w_first + w_row) * w_row_bytes + (tid & 1) * kChunkBytes
                               : nullptr;
    const uint8_t* scale_src =
        tid < kBN && w.n0 + tid < p.n ? p.w_group_scale + (w_first + tid) * p.k_groups : nullptr;

    auto load_stage = [&](int kt) {
      if (kt < p.k_tiles) {
        const int s = kt % kStages;
        const uint32_t stage = ring + static_cast<uint32_t>(s * Shape::kStageBytes);
        cp_async_16(stage + tok_dst,
                    tok_src != nullptr ? tok_src + static_cast<int64_t>(kt) * kRowBytes : p.a,
                    tok_src != nullptr);
        cp_async_16(stage + w_dst,
                    w_src != nullptr ? w_src + static_cast<int64_t>(kt) * kPackedRow : p.w,
                    w_src != nullptr);
        if (tid < kBN) {
          // MXFP4: codes 2kt and 2kt + 1 of the row, bytes 0-1 or 2-3 of their aligned word;
          // NVFP4: codes 4kt .. 4kt + 3, one aligned word (k_groups = k / 16 is a multiple of 4).
          const uint8_t* word = p.w_group_scale;
          if (scale_src != nullptr) {
            const uint8_t* codes = scale_src + (Fmt::kNvfp4 ? 4 : 2) * kt;
            word = codes - (reinterpret_cast<uintptr_t>(codes) & 3u);
          }
          cp_async_4(smem_u32(&s_scale_words[s][tid]), word, scale_src != nullptr);
          if constexpr (Fmt::kMxfp6) {
            const uint8_t* high = p.w;
            if (scale_src != nullptr) {
              high = p.w + (w_first + tid) * w_row_bytes + p.k / 2 + 16 * static_cast<int64_t>(kt);
            }
            cp_async_16(smem_u32(&s_high[s][tid]), high, scale_src != nullptr);
          }
        }
      }
      cp_async_commit();  // NOTE: empty groups keep the wait counts uniform
    };

    float acc[kBM / 2];
    zero_accumulators(acc);
    uint32_t frag[2][kSteps][4];  // two sets of A fragments (K steps kt and kt - 1)
    // MXFP4: byte offset parity (0 or 2 within the word) of the codes of rows r0, r0 + 8 at K
    // step 0; each step adds 2 bytes. NVFP4: a step's four codes are the whole word.
    const uint32_t par0 = static_cast<uint32_t>(((w_first + r0) * p.k_groups) & 2);
    const uint32_t par1 = static_cast<uint32_t>(((w_first + r0 + 8) * p.k_groups) & 2);

    // The byte offset (0 or 16 bits) of a step's codes in their word, by step parity (the loop
    // below runs even steps with fragment set 0 and odd ones with set 1), and their mask.
    constexpr bool kNvfp4 = Fmt::kNvfp4;
    const uint32_t code_shift[2][2] = {
        {kNvfp4 ? 0u : (par0 & 2) * 8, kNvfp4 ? 0u : ((par0 + 2) & 2) * 8},
        {kNvfp4 ? 0u : (par1 & 2) * 8, kNvfp4 ? 0u : ((par1 + 2) & 2) * 8}};
    constexpr uint32_t code_mask = kNvfp4 ? 0xFFFFFFFFu : 0xFFFFu;

    // K step kt into fragment set kSet (= kt % 2). Even steps open a pair of steps: they wait
    // for both steps' copies, pass the one barrier of the pair and refill the stages of steps
    // kt - 3 and kt - 2 (their wgmma are done: each step waits for its predecessor's).
    auto step = [&](int kt, auto set_tag) {
      constexpr int kSet = decltype(set_tag)::value;
      if constexpr (kSet == 0) {
        cp_async_wait<kStages - 5>();  // this thread's copies of steps kt and kt + 1 have landed
        fence_proxy_async();           // the tokens, seen by the tensor cores
        __syncthreads();
        load_stage(kt + kStages - 3);
        load_stage(kt + kStages - 2);
      }
      const int s = kt % kStages;
      const uint8_t* packed = ring_generic + s * Shape::kStageBytes + Shape::kStageABytes;
      // word[r][g]: this thread's word of group g (2kt + g) of fragment row r0 + 8r.
      uint32_t word[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int g = 0; g < 2; ++g)
          word[r][g] = *reinterpret_cast<const uint32_t*>(packed + (r0 + 8 * r) * kPackedRow +
                                                          g * kMxfp4GroupBytes + word_offset);
      }
      // MXFP6: high[r][g], the high-plane word of this thread's word of group g of row r0 + 8r.
      uint32_t high[2][2] = {};
      if constexpr (Fmt::kMxfp6) {
        const int q = lane & 3;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint4 h = s_high[s][r0 + 8 * r];
          high[r][0] = Fmt::high_of(h.x, h.y, q);
          high[r][1] = Fmt::high_of(h.z, h.w, q);
        }
      }
      // codes[r] of row r0 + 8r: the e8m0 codes (MXFP4, MXFP6) of groups 2kt (byte 0) and 2kt + 1
      // (byte 1); NVFP4's kernel codes of its 16-element groups 4kt .. 4kt + 3 (bytes 0..3).
      const uint32_t codes[2] = {(s_scale_words[s][r0] >> code_shift[0][kSet]) & code_mask,
                                 (s_scale_words[s][r0 + 8] >> code_shift[1][kSet]) & code_mask};
      // f[g][r][h]: the factor of elements 16h .. 16h + 15 of 32-element group g of row r0 + 8r.
      uint32_t f[2][2][2];
#pragma unroll
      for (int g = 0; g < 2; ++g) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if constexpr (kNvfp4) {
            f[g][r][0] = nvfp4_factor((codes[r] >> (16 * g)) & 0xFFu);
            f[g][r][1] = nvfp4_factor((codes[r] >> (16 * g + 8)) & 0xFFu);
          } else {
            f[g][r][0] = f[g][r][1] = Fmt::first_factor((codes[r] >> (8 * g)) & 0xFFu);
          }
        }
      }
      // Pair p of group g's word is K elements 16 (2g + p / 2) + 8 (p % 2) + 2q (+1): wgmma
      // 2g + p / 2, register 2 (p % 2) + r of the A fragment.
      uint32_t(&a)[kSteps][4] = frag[kSet];
      [&]<int... kP>(std::integer_sequence<int, kP...>) {
#pragma unroll
        for (int g = 0; g < 2; ++g) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            ((a[2 * g + kP / 2][2 * (kP % 2) + r] =
                  mul_bf16x2(Fmt::template pair_bits<kP>(word[r][g], high[r][g]), f[g][r][kP / 2])),
             ...);
          }
        }
      }
      (std::make_integer_sequence<int, 4>{});
      // MX codes above kOneStepMax (MXFP4: scales above 2, and NaN) need the second multiply:
      // one warp-uniform branch, rarely taken.
      constexpr uint32_t kMax2 = Fmt::kOneStepMax * 0x0101u;
      const uint32_t above = __vcmpgtu4(codes[0], kMax2) | __vcmpgtu4(codes[1], kMax2);
      if (!kNvfp4 && __any_sync(0xFFFFFFFFu, above != 0)) {
#pragma unroll
        for (int j = 0; j < kSteps; ++j) {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            a[j][i] =
                mul_bf16x2(a[j][i], Fmt::second_factor((codes[i % 2] >> (8 * (j / 2))) & 0xFFu));
        }
      }
      const uint32_t tokens = ring + static_cast<uint32_t>(s * Shape::kStageBytes);
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kSteps; ++j)
        wgmma_bf16_m64n16_rs(acc, a[j], sw128_desc(tokens + j * kMmaKBytes));
      wgmma_commit();
      wgmma_wait<1>();  // step kt - 1's wgmma are done: its fragment set may be rewritten
      fence_registers(acc);
      fence_registers(frag[kSet ^ 1]);
    };

    __syncthreads();  // every thread is done with the ring of the previous item
#pragma unroll 1  // one copy of load_stage's code (cold instruction fetch: the notes, 2026-12-06)
    for (int s = 0; s < kStages - 3; ++s)
      load_stage(s);
    for (int kt = 0; kt < p.k_tiles; kt += 2) {
      step(kt, std::integral_constant<int, 0>{});
      if (kt + 1 < p.k_tiles) step(kt + 1, std::integral_constant<int, 1>{});
    }
    wgmma_wait<0>();
    fence_registers(acc);
    fence_registers(frag[0]);
    fence_registers(frag[1]);

    // Every copy into the ring has landed (the last real step was waited for).
    store_swapped_tile<T, OutT, kBM, kBN>(p, acc, w, reinterpret_cast<float*>(ring_generic), tid,
                                          [] { __syncthreads(); });
  }
}

// ---- kSwapAB: 16-bit and fp8 with the weights as the wgmma's A operand ------------------------

// The block scales of a swap-AB thread (kFp8 rows): its two weight rows r0, r0 + 8 lie in one
// 32-row W scale block, its kBM / 4 tokens 8j + 2 (lane % 4) + v (i = 2j + v) have one 1x128 A
// scale each per K step. Set per work item (begin); load(kt) fetches step kt's, which promote uses
// one step later (the loads' latency hides behind a step of wgmma). W4A8 groups of 128 (kW4A8Group
// rows): load_rows takes the two rows' own scales from beside the step's converted W tile (the
// tokens' scales, constant along K, are the epilogue's).
template <int kBM>
struct SwapBlockScales {
  static constexpr int kTokens = kBM / 4;
  const float* a_row[kTokens];  // null: a_fill (1 without 1x128 A scales, 0 for padding tokens)
  float a_fill[kTokens];
  const float* w_block;  // null: w_fill (1 without block W scales, 0 past N)
  float w_fill;
  float fa[kTokens];
  float fw[2];  // rows r0 and r0 + 8

  __device__ __forceinline__ void begin(const KernelParams& p, const WorkItem& w, int tid) {
    const int lane = tid & 31;
    const bool a_blocks = p.a_scale_kind == AScale::kRowBlock128;
#pragma unroll
    for (int i = 0; i < kTokens; ++i) {
      const int row = w.m0 + 8 * (i / 2) + 2 * (lane & 3) + i % 2;
      int src = -1;
      if (row < w.row_end) src = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
      a_row[i] =
          a_blocks && src >= 0 ? p.a_scale + static_cast<int64_t>(src) * p.a_scale_ld : nullptr;
      a_fill[i] = a_blocks ? 0.0f : 1.0f;
    }
    const bool w_blocks = p.w_scale_kind == WScale::kBlock32x128;
    const int block = (w.n0 + 16 * (tid >> 5)) / 32;
    w_block = w_blocks && block < p.w_scale_row_blocks
                  ? p.w_scale +
                        (static_cast<int64_t>(w.expert) * p.w_scale_row_blocks + block) * p.k_tiles
                  : nullptr;
    w_fill = w_blocks ? 0.0f : 1.0f;
  }

  __device__ __forceinline__ void load(int kt) {
#pragma unroll
    for (int i = 0; i < kTokens; ++i)
      fa[i] = a_row[i] != nullptr ? __ldg(a_row[i] + kt) : a_fill[i];
    fw[0] = fw[1] = w_block != nullptr ? __ldg(w_block + kt) : w_fill;
  }
  // kW4A8Group: the step's scales of this thread's rows, from `scales` (kBN f32 beside its W tile).
  __device__ __forceinline__ void load_rows(uint32_t scales, int tid) {
#pragma unroll
    for (int i = 0; i < kTokens; ++i)
      fa[i] = a_fill[i];
    const int r0 = 16 * (tid >> 5) + ((tid & 31) >> 2);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      fw[h] = ld_shared_f32(scales + static_cast<uint32_t>((r0 + 8 * h) * sizeof(float)));
  }

  // acc += t * (the scales of the step last loaded).
  __device__ __forceinline__ void promote(float (&acc)[kBM / 2], const float (&t)[kBM / 2]) const {
#pragma unroll
    for (int i = 0; i < kTokens; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        acc[4 * (i / 2) + 2 * h + i % 2] += t[4 * (i / 2) + 2 * h + i % 2] * (fw[h] * fa[i]);
    }
  }
};

// Swap-AB mainloop of the 16-bit and fp8 decode rows: one warpgroup computes D^T = W_tile .
// A_tile^T for a work item of kBM (16 or 32) tokens x kBN (64) weight rows, both
// operands read from the ring by descriptor (4 wgmma per 128-byte K step: m64n16k16 / m64n32k16
// for bf16 / f16, m64n16k32 for e4m3), so that a few tokens per expert still fill the wgmma's M
// with weights and every CTA streams weights. Every thread copies its chunks of a stage as the
// single-role rows do (StageCopies: kBM / 16 token rows, four W rows). The copies run kStages - 2
// steps ahead of the compute across work items (RingLoadCursor), so that a work item of a few K
// steps (GEMM2 of a small expert: 6 steps) does not restart the pipeline; one 128-thread barrier
// per K step. kFp8
// (block scales): each K step goes into one of two 8-register temporaries by the step's parity, and
// step kt - 1's is promoted with its scales while step kt's wgmma run (as KStep's kOverlapped:
// wgmma_wait<0> before each issue); 16-bit and kFp8Direct: the tensor cores accumulate over all of
// K. Epilogue: store_swapped_tile, through a buffer of its own (the ring is filling with the next
// item). Stream-K (the kStreamK instantiation, launched with p.sk_counters set;
// GroupedGemmParams::stream_k): the CTA walks its contiguous share of the (item, K step) units
// instead of whole items (SegmentWalk), and an item split between CTAs is stored by the last to
// finish it (stream_k_fixup).
template <typename T, typename OutT, int kTile, bool kStreamK>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    swapab_kernel(const KernelParams p) {
  pdl_wait();  // before any global memory access (core/cuda/pdl.cuh)
  using Shape = ShapeOf<T, kTile>;
  static_assert(Shape::kSwapAB && !Shape::kPackedW4 && !std::is_same_v<T, int8_t>);
  constexpr int kBM = Shape::kBM;  // tokens of an item: the wgmma's N
  constexpr int kBN = Shape::kBN;  // weight rows of an item: the wgmma's M
  static_assert((kBM == 16 || kBM == 32) && kBN == 64 && Shape::kThreads == 128 &&
                Shape::kAPasses == kBM / 16);
  constexpr int kStages = Shape::kStages;
  static_assert(kStages >= 4, "kStages - 2 steps in flight while two are read");
  constexpr bool kPromote = Shape::kConfig.family == TileFamily::kFp8;

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // token blocks of experts [0, e)
  __shared__ float s_out[kSwappedTileFloats<kBM, kBN>];
  [[maybe_unused]] __shared__ int s_done;  // stream-K: this CTA completed the item
  const uint32_t ring = ring_base(smem_dynamic);

  const int tid = static_cast<int>(threadIdx.x);
  if (tid < 32) tile_prefix_by_warp<kBM>(p, s_tile_prefix, tid);
  __syncthreads();
  const int total_m_tiles = s_tile_prefix[p.num_experts];
  const int total_items = total_m_tiles * p.n_tiles;
  const int chunk = tid & 7;         // 16-byte column of the rows this thread loads
  const int row_in_pass = tid >> 3;  // token row; W rows row_in_pass + 16 i
  const uint32_t swizzled = swizzled_offset(row_in_pass, chunk);

  // Stream-K when the host gave the workspace and the schedule's items fit its counters.
  const SegmentWalk<kStreamK> walk_start(
      total_items, p.k_tiles, p.sk_counters != nullptr && total_items <= kStreamKMaxItems);
  RingLoadCursor<T, Shape, kStreamK> loads(walk_start, total_items, p.k_tiles);
  auto load_next = [&] {
    loads.next(p, s_tile_prefix, total_m_tiles, total_items, ring, swizzled, row_in_pass, chunk);
  };
#pragma unroll 1  // one copy of the cursor's code (cold instruction fetch: the notes, 2026-12-06)
  for (int s = 0; s < kStages - 2; ++s)
    load_next();

  SwapBlockScales<kBM> scales;
  int slot = 0;  // the ring slot of the compute's K step
  SegmentWalk<kStreamK> walk = walk_start;
  Segment seg;
  for ([[maybe_unused]] bool first = true; walk.next(total_items, p.k_tiles, seg); first = false) {
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, seg.item);
    if constexpr (kPromote) scales.begin(p, w, tid);
    float acc[kBM / 2];
    float tmp[2][kBM / 2];
    zero_accumulators(acc);

    // K step kt (the CTA's g-th): its copies landed (kStages - 2 groups were committed after
    // them), the barrier, then the refill of the slot of step g - 2, whose wgmma every thread has
    // waited for (kPromote: before issuing step g - 1; else after it, wgmma_wait<1>; an item's
    // last steps: its epilogue's wgmma_wait<0>).
    for_each_k_step_in(seg.kt_begin, seg.kt_end, [&](int kt, auto parity) {
      [[maybe_unused]] constexpr int kParity = decltype(parity)::value;
      cp_async_wait<kStages - 3>();
      fence_proxy_async();  // the copies, seen by the tensor cores
      __syncthreads();
      load_next();
      const uint32_t tokens = ring + static_cast<uint32_t>(slot * Shape::kStageBytes);
      const uint32_t weights = tokens + Shape::kStageABytes;
      slot = slot + 1 == kStages ? 0 : slot + 1;
      if constexpr (kPromote) {
        // NOTE: an unconditional wait before the issue (KStep, Promotion::kOverlapped: ptxas
        // serializes every wgmma otherwise).
        wgmma_wait<0>();
        fence_registers(tmp[kParity ^ 1]);
        mma_stage<T, kBM, /*kOverwrite=*/true>(tmp[kParity], weights, tokens);
        if (kt > seg.kt_begin) scales.promote(acc, tmp[kParity ^ 1]);  // step kt - 1's
        scales.load(kt);
      } else {
        mma_stage<T, kBM>(acc, weights, tokens);
        wgmma_wait<1>();
        fence_registers(acc);
      }
    });
    wgmma_wait<0>();
    if constexpr (kPromote) {  // the segment's last step (its parity: steps - 1)
      if (((seg.kt_end - seg.kt_begin - 1) & 1) != 0) {
        fence_registers(tmp[1]);
        scales.promote(acc, tmp[1]);
      } else {
        fence_registers(tmp[0]);
        scales.promote(acc, tmp[0]);
      }
    }
    fence_registers(acc);
    bool store = true;
    if constexpr (kStreamK) {
      if (seg.kt_begin != 0 || seg.kt_end != p.k_tiles)
        store = stream_k_fixup<kBM / 2>(p, acc, seg, first, total_items, tid, &s_done);
    }
    if (store) {
      store_swapped_tile<T, OutT, kBM, kBN>(p, acc, w, s_out, tid, [] { __syncthreads(); });
    }
  }
  cp_async_wait<0>();
}

// Swap-AB mainloop of the kSwapABTma rows (16-bit and fp8): swapab_kernel's computation with the
// loads moved to a producer warpgroup. Per K step the producer waits for the stage's "empty"
// mbarrier, thread 0 loads the 64 weight rows x 128 bytes by one bulk tensor copy (TMA, 3-D map
// {k, n, E}, zeros past N and K) and every producer thread copies one 16-byte chunk of the 16
// gathered token rows by cp.async (zeros past the expert's rows, past K and for gather rows < 0),
// all completing on the stage's "full" mbarrier; it walks the CTA's work items without waiting
// for the consumers except on a full ring (kStages steps ahead). The consumer warpgroup waits on
// "full", issues the stage's 4 wgmma and releases the stage on "empty" once they completed (one
// step later), promotes fp8 block scales as swapab_kernel does, and stores each item through
// store_swapped_tile with a named barrier of its own 128 threads.
template <typename T, typename OutT, int kTile>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    ws_swapab_kernel(const KernelParams p, const __grid_constant__ CUtensorMap w_map) {
  pdl_wait();  // before any global memory access (core/cuda/pdl.cuh)
  using Shape = ShapeOf<T, kTile>;
  static_assert(Shape::kSwapAB && Shape::kProducer && !Shape::kPackedW4 &&
                !std::is_same_v<T, int8_t>);
  constexpr int kBM = Shape::kBM;  // tokens of an item: the wgmma's N
  constexpr int kBN = Shape::kBN;  // weight rows of an item: the wgmma's M
  static_assert(kBM == 16 && kBN == 64 && Shape::kThreads == 256 && Shape::kAPasses == 1);
  constexpr int kStages = Shape::kStages;
  constexpr bool kPromote = Shape::kConfig.family == TileFamily::kFp8 || Shape::kGroupScales;
  using RingsT = Rings<Shape>;
  constexpr int kWSlots = RingsT::kWSlots;

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // token blocks of experts [0, e)
  __shared__ float s_out[kSwappedTileFloats<kBM, kBN>];
  __shared__ alignas(8) uint64_t s_full[kWSlots];   // step landed (producer -> consumers)
  __shared__ alignas(8) uint64_t s_empty[kStages];  // stage consumed (consumers -> producer)
  // kW4A8: W tile consumed (consumers -> producer)
  __shared__ alignas(8) uint64_t s_w_empty[Shape::kPackedInt4 ? kWSlots : 1];
  const RingsT rings(smem_dynamic);

  const int tid = static_cast<int>(threadIdx.x);
  if (tid < 32) {
    tile_prefix_by_warp<kBM>(p, s_tile_prefix, tid);
  } else if (tid == 32) {
    init_ring_barriers<Shape>(s_full, s_empty, s_w_empty);
  }
  __syncthreads();
  const int total_m_tiles = s_tile_prefix[p.num_experts];
  const int total_items = total_m_tiles * p.n_tiles;

  if (tid >= 128) {
    // ---- producer warpgroup: token row ptid / 8, 16-byte chunk ptid % 8 of each stage -----------
    const int ptid = tid - 128;
    const int chunk = ptid & 7;
    const int row_in_item = ptid >> 3;
    const uint32_t dst = swizzled_offset(row_in_item, chunk);
    int it = 0;  // K steps issued so far by this CTA (all items)
    [[maybe_unused]] Int4Converter<Shape> int4;
    for (int item = static_cast<int>(blockIdx.x); item < total_items;
         item += static_cast<int>(gridDim.x)) {
      const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
      const ARowSources<Shape::kAPasses> a_rows =
          gathered_a_sources<Shape>(p, w, row_in_item, chunk);
      if constexpr (Shape::kPackedInt4) int4.begin(p, w, ptid);
      for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        mbar_wait(smem_u32(&s_empty[s]), ((it / kStages) & 1) ^ 1);
        const uint32_t stage = rings.stage(it);
        const uint32_t full = smem_u32(&s_full[Shape::kPackedInt4 ? 0 : s]);  // kW4A8: unused
        if constexpr (!Shape::kPackedInt4) {
          if (ptid == 0) {  // W tile: one bulk tensor copy (zeros past N and K)
            mbar_arrive_expect_tx(full, Shape::kStageBBytes);
            tma_load_3d(rings.w_tile(it), &w_map, full, kt * Shape::kBK, w.n0, w.expert);
          }
        }
        const bool k_ok = kt * Shape::kBK + chunk * Shape::kChunkElems < p.k;
        copy_a_stage<Shape>(a_rows, stage + dst, k_ok, static_cast<int64_t>(kt) * kRowBytes);
        if constexpr (Shape::kPackedInt4) {
          int4.load(p, kt, rings.packed_slot(it), rings.packed_scales(it), ptid);
          cp_async_commit();
          int4.after_step(rings, s_full, s_w_empty, it, ptid);
        } else {
          cp_async_mbar_arrive(full);
        }
      }
    }
    if constexpr (Shape::kPackedInt4) int4.drain(rings, s_full, s_w_empty, it, ptid);
    cp_async_wait<0>();
    return;
  }

  // ---- consumer warpgroup ---------------------------------------------------------------------
  const int lane = tid & 31;
  SwapBlockScales<kBM> scales;
  int it = 0;                     // K steps consumed so far by this CTA (all items)
  auto release = [&](int step) {  // the CTA's step `step`: its wgmma completed
    release_step<Shape>(s_empty, s_w_empty, step, lane);
  };
  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
    if constexpr (kPromote) scales.begin(p, w, tid);
    float acc[kBM / 2];
    float tmp[2][kBM / 2];
    zero_accumulators(acc);

    for_each_k_step(p.k_tiles, [&](int kt, auto parity) {
      [[maybe_unused]] constexpr int kParity = decltype(parity)::value;
      mbar_wait(smem_u32(&s_full[it % kWSlots]), (it / kWSlots) & 1);
      fence_proxy_async();  // the producers' cp.async data, seen by the tensor cores
      const uint32_t tokens = rings.stage(it);
      const uint32_t weights = rings.w_tile(it);
      if constexpr (kPromote) {
        // NOTE: an unconditional wait before the issue (as swapab_kernel: ptxas serializes every
        // wgmma otherwise); step kt - 1's wgmma are then done and its stage may be refilled.
        wgmma_wait<0>();
        if (kt > 0) release(it - 1);
        fence_registers(tmp[kParity ^ 1]);
        mma_stage<T, kBM, /*kOverwrite=*/true>(tmp[kParity], weights, tokens);
        if (kt > 0) scales.promote(acc, tmp[kParity ^ 1]);  // step kt - 1, its scales
        if constexpr (Shape::kGroupScales) {
          scales.load_rows(rings.w_scales(it), tid);  // step kt's tile is held until kt + 1
        } else {
          scales.load(kt);
        }
      } else {
        mma_stage<T, kBM>(acc, weights, tokens);
        wgmma_wait<1>();  // step kt - 1's wgmma are done
        fence_registers(acc);
        if (kt > 0) release(it - 1);
      }
      ++it;
    });
    wgmma_wait<0>();
    if (p.k_tiles > 0) release(it - 1);
    if constexpr (kPromote) {
      if (p.k_tiles > 0) {
        if (((p.k_tiles - 1) & 1) != 0) {
          fence_registers(tmp[1]);
          scales.promote(acc, tmp[1]);
        } else {
          fence_registers(tmp[0]);
          scales.promote(acc, tmp[0]);
        }
      }
    }
    fence_registers(acc);
    store_swapped_tile<T, OutT, kBM, kBN>(p, acc, w, s_out, tid,
                                          [] { named_barrier_sync(1, 128); });
  }
}

// ---- kSimt: dot products on the CUDA cores ------------------------------------------------------

// Row slot j (0 .. kRows - 1) of warp slice s of a 64-row block, h = kRows / 2: rows hs .. hs +
// h - 1 and 32 + hs .. 32 + hs + h - 1, so that in the fused layout one warp holds the gate rows
// and the up rows of output columns hs .. hs + h - 1 of the block.
template <int kRows>
__device__ __forceinline__ int simt_row(int slice, int j) {
  static_assert(kFusedGateUpBlock == 32, "gate rows and their up rows 32 apart");
  constexpr int kHalf = kRows / 2;
  return kHalf * slice + (j < kHalf ? j : kFusedGateUpBlock - kHalf + j);
}

// Sums each of the kV values v over the warp's 32 lanes (kV a power of two <= 32) with kV - 1
// shuffles: at each step a lane keeps one half of its values and adds its partner's copy of that
// half, so that lane l ends with the total of value l >> (5 - log2 kV) (the lanes that differ
// only below that bit then hold the same total).
template <int kV>
__device__ __forceinline__ float warp_reduce_scatter(float (&v)[kV], int lane) {
  static_assert(kV >= 1 && kV <= 32 && (kV & (kV - 1)) == 0);
  int offset = 16;
#pragma unroll
  for (int c = kV; c > 1; c /= 2) {
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < c / 2; ++i) {
      const float keep = upper ? v[i + c / 2] : v[i];
      const float send = upper ? v[i] : v[i + c / 2];
      v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, offset);
    }
    offset /= 2;
  }
  float total = v[0];
  for (; offset > 0; offset /= 2)
    total += __shfl_xor_sync(0xFFFFFFFFu, total, offset);
  return total;
}

// 16 bytes of weights, read once: not kept in L1.
__device__ __forceinline__ uint4 ld_stream_16(const void* src) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(src));
  return v;
}
// 8 bytes, likewise.
__device__ __forceinline__ uint2 ld_stream_8(const void* src) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(src));
  return v;
}

// 16 bytes of tokens, cached in L1 (every warp of an item reads them, and a lane's next chunk
// waits on them): through the non-coherent path (read-only during the launch), or (kWritten:
// written by other CTAs of this launch, read after an acquire) by a plain weak load, which the
// acquire orders (the non-coherent path is outside the memory model's guarantees; a load through
// L2 alone measured the decode pair's GEMM2 slower).
template <bool kWritten>
__device__ __forceinline__ uint4 load_tokens_16(const uint4* src) {
  if constexpr (kWritten) {
    return *src;
  } else {
    return __ldg(src);
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The gated activation of the kernel parameters, per element (one output per lane and item here,
// so the switch costs nothing measurable).
__device__ __forceinline__ float simt_gated(const KernelParams& p, float g, float u) {
  float out = 0.0f;
  with_gated_kind(
      p, [&](auto kind) { out = act::gated<decltype(kind)::value>(g, u, p.limit, p.alpha); });
  return out;
}

// Bias of column col of expert e, or 0.
template <typename T>
__device__ __forceinline__ float bias_at(const KernelParams& p, int expert, int col) {
  if (p.bias == nullptr) return 0.0f;
  const int64_t i = static_cast<int64_t>(expert) * p.n + col;
  return p.bias_is_fp32 ? __ldg(static_cast<const float*>(p.bias) + i)
                        : to_f32(static_cast<const T*>(p.bias)[i]);
}

// CUDA-core mainloop (MainloopKind::kSimt) of the 16-bit and W4A16 rows. Work items are those of
// the other kernels (kBM tokens x 64 weight rows of one expert); each of a CTA's 8 (16) warps takes
// one slice of an item: 8 (4) weight rows (simt_row) x kBM tokens, walked without block barriers
// after the prefix. Lane l reads K chunks l, l + 32, ... of each row (16 bytes: 8 elements, or one
// packed 32-element group with its scale code), the next chunk's weights in flight while it
// multiplies the current one with the tokens' elements (read through L1: every warp of the item
// reads the same tokens) into fp32 accumulators, one per row and token. A reduce-scatter butterfly
// sums the lanes; the lane holding a total scales it (W4A16's per-expert scale), adds the bias and
// stores it, or, fused, pairs the gate row's total with the up row's 16 lanes away and stores the
// activation (gate and up rounded to OutT first, as every epilogue of the kit does). MXFP6 rows add
// the group's 8 high-plane bytes to each chunk.
//
// simt_task is one warp's slice of one item. `before_tokens()` runs once the first chunk of
// weights is in flight and before any token is read: the decode pair (simt_pair_kernel) waits
// there for the tokens its own GEMM1 writes; kTokensWritten reads the tokens with coherent loads
// (they were written during this launch).
template <typename T, typename OutT, int kTile, WPacking kPacking, bool kTokensWritten = false,
          typename BeforeTokens>
__device__ __forceinline__ void simt_task(const KernelParams& p, const WorkItem& w, int slice,
                                          int lane, BeforeTokens&& before_tokens) {
  using Shape = ShapeOf<T, kTile>;
  using Fmt = Packed<kPacking>;
  constexpr bool kNvfp4 = Fmt::kNvfp4;
  constexpr bool kMxfp6 = Fmt::kMxfp6;
  static_assert(Shape::kSimt && Shape::kBN == 64);
  constexpr int kBM = Shape::kBM;
  constexpr int kWarps = Shape::kThreads / 32;  // 8 or 16
  constexpr int kRows = Shape::kBN / kWarps;    // weight rows per warp: 8 or 4
  constexpr int kV = kRows * kBM;               // accumulators per lane: v[j * kBM + t]
  constexpr int kDup = 32 / kV;                 // lanes holding each total after the butterfly
  constexpr bool kW4 = Shape::kPackedW4;
  static_assert(!kW4 || std::is_same_v<T, __nv_bfloat16>);
  const int chunks = kW4 ? p.k / 32 : p.k / 8;  // 16-byte chunks of a weight row
  const int64_t w_row_bytes = kW4 ? Fmt::row_bytes(p.k) : static_cast<int64_t>(p.k) * 2;
  const uint8_t* a_row[kBM];
#pragma unroll
  for (int t = 0; t < kBM; ++t) {
    a_row[t] = nullptr;
    if (const int row = w.m0 + t; row < w.row_end) {
      const int s = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
      if (s >= 0) a_row[t] = p.a + static_cast<int64_t>(s) * p.lda_bytes;
    }
  }
  // Row slot j is W row first + simt_row(slice, j) of the expert; `valid` bit j when < n.
  const int64_t first = static_cast<int64_t>(w.expert) * p.n + w.n0;
  const uint8_t* w_base = p.w + first * w_row_bytes;
  uint32_t valid = 0;
#pragma unroll
  for (int j = 0; j < kRows; ++j)
    valid |= (w.n0 + simt_row<kRows>(slice, j) < p.n ? 1u : 0u) << j;

  // Chunk c of every row slot (zeros past K or n) and, W4A16, its scale codes (MXFP6: and its
  // high-plane words).
  struct Chunk {
    uint4 w[kRows];
    uint32_t code[kRows];
    uint2 high[kMxfp6 ? kRows : 1];
  };
  // Slot j's rows relative to slot 0's, in 32-bit offsets (a few registers: this kernel is
  // limited by them, and 64-bit row pointers per slot would take 32).
  const int slice_row = simt_row<kRows>(slice, 0);
  const uint8_t* w_slice = w_base + static_cast<int64_t>(slice_row) * w_row_bytes;
  const uint8_t* codes_slice = kW4 ? p.w_group_scale + (first + slice_row) * p.k_groups : nullptr;
  const uint32_t row_bytes32 = static_cast<uint32_t>(w_row_bytes);
  const uint32_t codes_per_row = static_cast<uint32_t>(p.k_groups);
  auto load = [&](int c, Chunk& d) {
    const uint8_t* w_c = w_slice + static_cast<int64_t>(c) * 16;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool ok = c < chunks && ((valid >> j) & 1u) != 0;
      const uint32_t slot = static_cast<uint32_t>(simt_row<kRows>(0, j));
      d.w[j] = ok ? ld_stream_16(w_c + slot * row_bytes32) : make_uint4(0, 0, 0, 0);
      if constexpr (kMxfp6) {
        const uint8_t* h = w_slice + p.k / 2 + static_cast<int64_t>(c) * 8 + slot * row_bytes32;
        d.high[j] = ok ? ld_stream_8(h) : make_uint2(0u, 0u);
      }
      if constexpr (kW4) {
        const uint8_t* codes = codes_slice + slot * codes_per_row;
        if constexpr (kNvfp4) {  // the two 16-element groups' kernel codes, one aligned pair
          d.code[j] = ok ? __ldg(reinterpret_cast<const uint16_t*>(codes) + c) : 0u;
        } else {
          d.code[j] = ok ? __ldg(codes + c) : 0u;
        }
      }
    }
  };

  float acc[kV];
  zero_accumulators(acc);
  // One chunk: acc[j * kBM + t] += W row j's chunk . token t's elements.
  auto accumulate_16bit = [&](int c, const Chunk& cur) {
    float2 a[kBM][4];
#pragma unroll
    for (int t = 0; t < kBM; ++t) {
      const uint4 raw =
          a_row[t] != nullptr && c < chunks
              ? load_tokens_16<kTokensWritten>(reinterpret_cast<const uint4*>(a_row[t]) + c)
              : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int q = 0; q < 4; ++q)
        a[t][q] = unpack_pair<T>(word_of(raw, q));
    }
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 wv = unpack_pair<T>(word_of(cur.w[j], q));
#pragma unroll
        for (int t = 0; t < kBM; ++t)
          acc[j * kBM + t] = fmaf(wv.y, a[t][q].y, fmaf(wv.x, a[t][q].x, acc[j * kBM + t]));
      }
    }
  };
  // W4A16: word q of a group holds pairs p = 0..3, elements 16 (p / 2) + 8 (p % 2) + 2q (+1)
  // (sm90/mxfp4_layout.h): the tokens' bf16 pair 4p + q, i.e. word q of their 16-byte piece p.
  auto accumulate_w4 = [&](int c, const Chunk& cur, auto two_steps_tag) {
    constexpr bool kTwoSteps = decltype(two_steps_tag)::value;
    uint4 a[kBM][4];
#pragma unroll
    for (int t = 0; t < kBM; ++t) {
#pragma unroll
      for (int u = 0; u < 4; ++u)
        a[t][u] = a_row[t] != nullptr && c < chunks
                      ? load_tokens_16<kTokensWritten>(reinterpret_cast<const uint4*>(a_row[t]) +
                                                       4 * c + u)
                      : make_uint4(0, 0, 0, 0);
    }
    // The factors of elements 0..15 and 16..31 (one for MXFP4, whose f2 is derived only on the
    // rare two-step path: registers are what limits this kernel).
    uint32_t f_lo[kRows], f_hi[kNvfp4 ? kRows : 1];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if constexpr (kNvfp4) {
        f_lo[j] = nvfp4_factor(cur.code[j] & 0xFFu);
        f_hi[j] = nvfp4_factor(cur.code[j] >> 8);
      } else {
        f_lo[j] = Fmt::first_factor(cur.code[j]);
      }
    }
    [&]<int... kP>(std::integer_sequence<int, kP...>) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        (
            [&] {
              float2 av[kBM];
#pragma unroll
              for (int t = 0; t < kBM; ++t)
                av[t] = unpack_pair<T>(word_of(a[t][kP], q));
#pragma unroll
              for (int j = 0; j < kRows; ++j) {
                uint32_t high = 0;
                if constexpr (kMxfp6) {
                  high = Fmt::high_of(cur.high[j].x, cur.high[j].y, q);
                }
                uint32_t bits = mul_bf16x2(Fmt::template pair_bits<kP>(word_of(cur.w[j], q), high),
                                           kP < 2 || !kNvfp4 ? f_lo[j] : f_hi[j % kRows]);
                if constexpr (kTwoSteps) bits = mul_bf16x2(bits, Fmt::second_factor(cur.code[j]));
                const float2 wv = unpack_pair<T>(bits);
#pragma unroll
                for (int t = 0; t < kBM; ++t)
                  acc[j * kBM + t] = fmaf(wv.y, av[t].y, fmaf(wv.x, av[t].x, acc[j * kBM + t]));
              }
            }(),
            ...);
      }
    }
    (std::make_integer_sequence<int, 4>{});
  };

  // Warp-uniform trip count (the W4A16 step votes): lanes past the last chunk multiply zeros.
  Chunk cur, next;
  load(lane, cur);
  before_tokens();
  for (int c0 = 0; c0 < chunks; c0 += 32) {
    const int c = c0 + lane;
    load(c + 32, next);  // in flight while this chunk is multiplied
    if constexpr (kW4) {
      // MX codes above kOneStepMax (MXFP4: scales above 2, and NaN) need the second multiply:
      // one warp-uniform branch, rarely taken.
      bool above = false;
#pragma unroll
      for (int j = 0; j < kRows; ++j)
        above = above || (!kNvfp4 && cur.code[j] > Fmt::kOneStepMax);
      if (__any_sync(0xFFFFFFFFu, above)) {
        accumulate_w4(c, cur, std::true_type{});
      } else {
        accumulate_w4(c, cur, std::false_type{});
      }
    } else {
      accumulate_16bit(c, cur);
    }
    cur = next;
  }

  float total = warp_reduce_scatter<kV>(acc, lane);
  const int j = (lane / kDup) / kBM, t = (lane / kDup) % kBM;
  if constexpr (!kIsScaled<T>) {
    if (p.w_scale_kind == WScale::kExpert) total *= __ldg(&p.w_scale[w.expert]);
  }
  const int row = w.m0 + t;
  const int col = w.n0 + simt_row<kRows>(slice, j);
  const bool mine = lane % kDup == 0 && row < w.row_end;
  uint8_t* c_row = p.c + static_cast<int64_t>(row) * p.ldc_bytes;
  if (p.act == FusedActivation::kNone) {
    if (mine && col < p.n) {
      reinterpret_cast<OutT*>(c_row)[col] = from_f32<OutT>(total + bias_at<OutT>(p, w.expert, col));
    }
  } else {
    // The up row of slot j < kRows / 2 is slot j + kRows / 2: value index + kRows kBM / 2, 16
    // lanes further on.
    const float up = __shfl_down_sync(0xFFFFFFFFu, total, 16);
    if (mine && lane < 16) {
      const float g = rounded<OutT>(total + bias_at<OutT>(p, w.expert, col));
      const float u = rounded<OutT>(up + bias_at<OutT>(p, w.expert, col + kFusedGateUpBlock));
      reinterpret_cast<OutT*>(c_row)[w.n0 / 2 + slice_row + j] =
          from_f32<OutT>(simt_gated(p, g, u));
    }
  }
}

template <typename T, typename OutT, int kTile, WPacking kPacking>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    simt_kernel(const KernelParams p) {
  pdl_wait();  // before any global memory access (core/cuda/pdl.cuh)
  using Shape = ShapeOf<T, kTile>;
  constexpr int kBM = Shape::kBM;
  constexpr int kWarps = Shape::kThreads / 32;
  __shared__ int s_tile_prefix[kMaxExperts + 1];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  if (tid < 32) tile_prefix_by_warp<kBM>(p, s_tile_prefix, lane);
  __syncthreads();
  const int total_m_tiles = s_tile_prefix[p.num_experts];
  const int total = total_m_tiles * p.n_tiles * kWarps;
  // Warp-major task order: task wi runs on CTA wi % grid, so a launch with fewer tasks than warp
  // slots spreads them evenly over the CTAs (and SMs) instead of filling the first CTAs.
  for (int wi = warp * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x); wi < total;
       wi += static_cast<int>(gridDim.x) * kWarps) {
    const WorkItem w = resolve_item<kBM, Shape::kBN>(p, s_tile_prefix, total_m_tiles, wi / kWarps);
    simt_task<T, OutT, kTile, kPacking>(p, w, wi % kWarps, lane, [] {});
  }
}

// ---- the decode pair: GEMM1 (+ activation) and GEMM2 of a layer in one CUDA-core launch --------
//
// At one or two tokens per expert each grouped GEMM is one wave of short work items whose ramp
// (launch, prefix, first loads) and tail (the last items) are a large share of its time, paid
// twice per layer. simt_pair_kernel runs both on one persistent grid: the task space is GEMM1's
// tasks (p1, fused gated activation, writing the activation rows) followed by GEMM2's (p2, reading
// them), walked warp-major like simt_kernel, each GEMM's items m-tile-major (an expert's work
// together, so that early experts finish GEMM1 while later ones run). Each GEMM1 task adds 1 to
// its expert's counter (expert_done, zeroed by the align launch before) once its stores are
// visible (release); a GEMM2 task of expert e first puts its weight loads in flight, then waits
// until the counter reaches e's GEMM1 task count (acquire).
// Deadlock-free: every warp runs and counts all its GEMM1 tasks (which never wait) before it
// waits on any, and the host launches at most as many CTAs as are resident at once
// (pair_residency), so every GEMM1 task is owned by a running warp.

// The counter at `counter` (raised by other CTAs during this launch), relaxed: no ordering and,
// unlike an acquire load, no invalidation of this SM's L1 (which the other warps' tokens live in).
__device__ __forceinline__ int load_relaxed_gpu(const int32_t* counter) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

// The pair's tasks on the calling CTA (every thread of it; its grid all resident): the schedule's
// prefix into s_tile_prefix (kMaxExperts + 1 ints of shared memory), then GEMM1's tasks and
// GEMM2's. kTokens1Written: GEMM1's tokens were written during this launch too (the
// expert-parallel one-launch forward, whose GEMM1 reads the rows the ranks dispatched), read
// with coherent loads.
template <typename T, typename OutT, int kTile, WPacking kPacking, bool kTokens1Written = false>
__device__ __forceinline__ void simt_pair_tasks(const KernelParams& p1, const KernelParams& p2,
                                                int32_t* expert_done, int* s_tile_prefix) {
  using Shape = ShapeOf<T, kTile>;
  constexpr int kBM = Shape::kBM;
  constexpr int kWarps = Shape::kThreads / 32;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  if (tid < 32) tile_prefix_by_warp<kBM>(p1, s_tile_prefix, lane);  // the same rows for both
  __syncthreads();
  const int total_m_tiles = s_tile_prefix[p1.num_experts];
  const int tasks1 = total_m_tiles * p1.n_tiles * kWarps;
  const int total = tasks1 + total_m_tiles * p2.n_tiles * kWarps;
  // A GEMM1 task is counted (release: a fence, which waits for the warp's memory operations to
  // land, then the add) once the warp's next task has put its first loads in flight, where the
  // warp waits for memory anyway; the warp's last GEMM1 task as it turns to GEMM2 or ends.
  int uncounted = -1;  // expert of the warp's finished, uncounted GEMM1 task (warp-uniform)
  auto count_task = [&] {
    if (uncounted < 0) return;
    __syncwarp();  // every lane's stores before lane 0's release
    if (lane == 0) {
      __threadfence();
      atomicAdd(&expert_done[uncounted], 1);
    }
    uncounted = -1;
  };
  for (int wi = warp * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x); wi < total;
       wi += static_cast<int>(gridDim.x) * kWarps) {
    if (wi < tasks1) {
      const WorkItem w =
          resolve_item<kBM, Shape::kBN, 1>(p1, s_tile_prefix, total_m_tiles, wi / kWarps);
      simt_task<T, OutT, kTile, kPacking, kTokens1Written>(p1, w, wi % kWarps, lane,
                                                           [&] { count_task(); });
      uncounted = w.expert;
      continue;
    }
    count_task();
    const int wj = wi - tasks1;
    const WorkItem w =
        resolve_item<kBM, Shape::kBN, 1>(p2, s_tile_prefix, total_m_tiles, wj / kWarps);
    const int need = (s_tile_prefix[w.expert + 1] - s_tile_prefix[w.expert]) * p1.n_tiles * kWarps;
    simt_task<T, OutT, kTile, kPacking, true>(p2, w, wj % kWarps, lane, [&] {
      if (lane == 0) {
        const int32_t* counter = &expert_done[w.expert];
        while (load_relaxed_gpu(counter) < need)
          __nanosleep(128);
      }
      // Acquire (fence after the observing load): GEMM1's stores of this expert's rows are
      // visible to the token loads that follow.
      if (lane == 0) asm volatile("fence.acq_rel.gpu;" ::: "memory");
      __syncwarp();
    });
  }
  count_task();
}

template <typename T, typename OutT, int kTile, WPacking kPacking>
__global__ void __launch_bounds__(ShapeOf<T, kTile>::kThreads, ShapeOf<T, kTile>::kMinBlocks)
    simt_pair_kernel(const KernelParams p1, const KernelParams p2, int32_t* expert_done) {
  pdl_wait();  // the align launch zeroed expert_done
  __shared__ int s_tile_prefix[kMaxExperts + 1];
  simt_pair_tasks<T, OutT, kTile, kPacking>(p1, p2, expert_done, s_tile_prefix);
}

// ---- host side ----------------------------------------------------------------------------------

// f(OutT{}) for the output type of a scaled (fp8 / int8) problem: bf16 or f16.
template <typename F>
cudaError_t with_out_type(ElemType out, F&& f) {
  if (out == ElemType::kBF16) return f(__nv_bfloat16{});
  return f(__half{});
}

// A kernel's dynamic shared memory, and the whole unified L1 / shared memory as shared memory, so
// that min_blocks CTAs fit on an SM (the driver's default split may hold fewer: the swap-AB row's
// four CTAs of ~48 KB need it); kernels without dynamic shared memory (the CUDA-core rows, which
// read the tokens through L1) prefer L1.
template <typename Kernel>
cudaError_t set_kernel_attributes(Kernel kernel, int dynamic_smem) {
  MOEKIT_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_smem));
  return cudaFuncSetAttribute(
      kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
      dynamic_smem == 0 ? cudaSharedmemCarveoutMaxL1 : cudaSharedmemCarveoutMaxShared);
}

// The kernel of table row kTile for operand T and output OutT; the packed-W4 rows' variant of
// format kPacking (a compile-time choice: each format's mainloop keeps only its instructions;
// the other rows ignore it); kStreamK: the stream-K instantiation of the rows that have one
// (stream_k_capable), the round-robin kernel otherwise.
template <typename T, typename OutT, int kTile, WPacking kPacking = WPacking::kMxfp4,
          bool kStreamK = false>
constexpr auto kernel_of() {
  if constexpr (ShapeOf<T, kTile>::kSimt) {
    return &simt_kernel<T, OutT, kTile, kPacking>;
  } else if constexpr (ShapeOf<T, kTile>::kSwapAB && ShapeOf<T, kTile>::kPackedW4) {
    return &w4a16_swapab_kernel<T, OutT, kTile, kPacking>;
  } else if constexpr (ShapeOf<T, kTile>::kSwapAB && ShapeOf<T, kTile>::kProducer) {
    return &ws_swapab_kernel<T, OutT, kTile>;
  } else if constexpr (ShapeOf<T, kTile>::kSwapAB) {
    return &swapab_kernel<T, OutT, kTile, kStreamK>;
  } else if constexpr (ShapeOf<T, kTile>::kPackedW4) {
    return &w4a16_kernel<T, OutT, kTile, kPacking>;
  } else if constexpr (ShapeOf<T, kTile>::kProducer) {
    return &ws_tma_kernel<T, OutT, kTile>;
  } else {
    return &single_role_kernel<T, OutT, kTile>;
  }
}

// f(std::integral_constant<WPacking, packing>) for a packed-W4 format (kMxfp4 for any other).
template <typename F>
cudaError_t with_packing(WPacking packing, F&& f) {
  switch (packing) {
    case WPacking::kNvfp4:
      return f(std::integral_constant<WPacking, WPacking::kNvfp4>{});
    case WPacking::kMxfp6E2M3:
      return f(std::integral_constant<WPacking, WPacking::kMxfp6E2M3>{});
    case WPacking::kMxfp6E3M2:
      return f(std::integral_constant<WPacking, WPacking::kMxfp6E3M2>{});
    default:
      return f(std::integral_constant<WPacking, WPacking::kMxfp4>{});
  }
}

// f(std::integral_constant<int, row>) for the table row `row`, over the rows of `kFamily`.
template <TileFamily kFamily, typename F>
cudaError_t with_tile(int row, F&& f) {
  cudaError_t result = cudaErrorInvalidValue;
  [&]<int... kRows>(std::integer_sequence<int, kRows...>) {
    (
        [&] {
          if constexpr (kTileTable[kRows].family == kFamily) {
            if (row == kRows) result = f(std::integral_constant<int, kRows>{});
          }
        }(),
        ...);
  }
  (std::make_integer_sequence<int, kNumTiles>{});
  return result;
}

// The type of C: the operand type for 16-bit operands, out_dtype for fp8 and int8.
inline ElemType output_type(const GroupedGemmArgs& args) {
  return elem_bytes(args.dtype) == 1 ? args.out_dtype : args.dtype;
}

// The kernel parameters of a launch of row kTile.
template <typename T, int kTile>
KernelParams kernel_params(const GroupedGemmArgs& args) {
  using Shape = ShapeOf<T, kTile>;
  constexpr int kEs = static_cast<int>(sizeof(T));
  const int out_es = elem_bytes(output_type(args));
  KernelParams p{};
  p.a = static_cast<const uint8_t*>(args.a);
  p.lda_bytes = args.lda * kEs;
  p.gather_rows = args.gather_rows;
  p.w = static_cast<const uint8_t*>(args.w);
  p.bias = args.bias;
  p.c = static_cast<uint8_t*>(args.c);
  p.ldc_bytes = args.ldc * out_es;
  p.c_rows_16b = p.ldc_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(args.c) % 16 == 0;
  p.expert_offsets = args.expert_offsets;
  p.expert_counts = args.expert_counts;
  p.batched_stride = static_cast<int>(args.batched_stride);
  p.num_experts = args.num_experts;
  p.n = args.n;
  p.k = args.k;
  p.n_tiles = div_up(args.n, Shape::kBN);
  p.k_tiles = div_up(args.k, Shape::kBK);
  p.bias_is_fp32 = args.bias_is_fp32;
  p.act = args.fused_act;
  p.has_clamp = args.has_clamp_limit;
  p.limit = args.clamp_limit;
  p.alpha = args.alpha;
  p.a_scale_kind = args.a_scale_kind;
  p.a_scale = args.a_scale;
  p.a_scale_ld = args.a_scale_ld;
  p.w_scale_kind = args.w_scale_kind;
  p.w_scale = args.w_scale;
  p.w_scale_row_blocks = div_up(args.n, 32);
  p.w_group_scale = args.w_group_scale;
  p.packing = args.w_packing;
  p.k_groups = args.k / (p.packing == WPacking::kNvfp4 ? kNvfp4GroupElems : 32);
  return p;
}

// The clusters of row kTile's `kernel` (a cluster row, its shared-memory attribute set) that the
// device holds at once.
template <typename T, int kTile, typename Kernel>
cudaError_t resident_clusters(Kernel kernel, int* clusters) {
  using Shape = ShapeOf<T, kTile>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(Shape::kCluster);
  cfg.blockDim = dim3(Shape::kThreads);
  cfg.dynamicSmemBytes = Shape::kDynamicSmem;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = Shape::kCluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MOEKIT_CUDA_TRY(cudaOccupancyMaxActiveClusters(clusters, kernel, &cfg));
  return *clusters > 0 ? cudaSuccess : cudaErrorInvalidConfiguration;
}

// The launch of `kernel` (row kTile's) with the parameter block p; `stream_k_kernel` (the row's
// stream-K instantiation, or null) instead where stream_k_grid says so, with its counters and
// partial sums in `workspace`.
template <typename T, int kTile, typename Kernel>
cudaError_t launch_kernel(Kernel kernel, const GroupedGemmArgs& args, KernelParams p,
                          const WeightLaunchCache* cache, const GroupedGemmParams& params,
                          cudaStream_t stream, void* workspace = nullptr,
                          Kernel stream_k_kernel = nullptr) {
  using Shape = ShapeOf<T, kTile>;
  int sms = 0;
  if (cache != nullptr) {
    sms = cache->sms;
  } else {
    MOEKIT_CUDA_TRY(current_device_sms(&sms));
  }
  int grid = grid_size(args, Shape::kConfig, p.n_tiles, sms, params.max_ctas);
  if (const int sk = stream_k_kernel != nullptr
                         ? stream_k_grid(args, Shape::kConfig, p.n_tiles, sms, params, workspace)
                         : 0;
      sk > 0) {
    grid = sk;
    kernel = stream_k_kernel;
    p.sk_counters = static_cast<int32_t*>(workspace);
    p.sk_partials = reinterpret_cast<float*>(p.sk_counters + stream_k_counter_words());
  }
  if (cache == nullptr) MOEKIT_CUDA_TRY(set_kernel_attributes(kernel, Shape::kDynamicSmem));
  if constexpr (Shape::kCluster > 1) {
    // The grid in clusters: at most those resident, no more than the items of kCluster m-tiles
    // (max_ctas: rounded down to whole clusters, at least one).
    int clusters = cache != nullptr ? cache->clusters[kTile] : 0;
    if (clusters == 0) MOEKIT_CUDA_TRY((resident_clusters<T, kTile>(kernel, &clusters)));
    TileConfig cluster_items = Shape::kConfig;
    cluster_items.bm *= Shape::kCluster;
    const int max_clusters =
        params.max_ctas > 0 ? std::max(1, params.max_ctas / Shape::kCluster) : 0;
    grid = Shape::kCluster * grid_size(args, cluster_items, p.n_tiles, clusters, max_clusters);
  }
  if constexpr (Shape::kProducer) {
    CUtensorMap w_map;
    std::memset(&w_map, 0, sizeof(w_map));  // kW4A8 rows: unused (the producer copies packed W)
    if constexpr (Shape::kTma) {
      if (cache != nullptr) {
        static_assert(sizeof(CUtensorMap) == sizeof(TmaDescriptor));
        std::memcpy(&w_map, cache->tma[kTile].bytes.data(), sizeof(w_map));
      } else {
        TmaDescriptor d;
        MOEKIT_CUDA_TRY(encode_w_map(args.w, args.n, args.k, args.num_experts, args.dtype,
                                     Shape::kBK, Shape::kTmaBoxN, &d));
        std::memcpy(&w_map, d.bytes.data(), sizeof(w_map));
      }
    }
    return launch_pdl_clustered(kernel, dim3(static_cast<unsigned>(grid)), dim3(Shape::kThreads),
                                Shape::kDynamicSmem, stream, Shape::kCluster, p, w_map);
  } else {
    return launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), dim3(Shape::kThreads),
                      Shape::kDynamicSmem, stream, p);
  }
}

// Whether row kTile of operand T has a stream-K instantiation (swapab_kernel's rows).
template <typename T, int kTile>
inline constexpr bool kHasStreamK = stream_k_capable(ShapeOf<T, kTile>::kConfig);

// Launches row kTile for operand T / output OutT with W's prepared state when `cache` describes
// args.w, else preparing it now.
template <typename T, typename OutT, int kTile>
cudaError_t launch(const GroupedGemmArgs& args, const GroupedGemmParams& params,
                   cudaStream_t stream, void* workspace = nullptr) {
  using Shape = ShapeOf<T, kTile>;
  const KernelParams p = kernel_params<T, kTile>(args);
  const WeightLaunchCache* cache = params.cache;
  if (cache != nullptr &&
      !cache->matches(args.w, args.n, args.k, args.num_experts, args.dtype, output_type(args))) {
    cache = nullptr;
  }
  if constexpr (Shape::kPackedW4) {
    return with_packing(p.packing, [&](auto packing) {
      return launch_kernel<T, kTile>(kernel_of<T, OutT, kTile, decltype(packing)::value>(), args, p,
                                     cache, params, stream);
    });
  }
  if constexpr (kHasStreamK<T, kTile>) {
    return launch_kernel<T, kTile>(kernel_of<T, OutT, kTile>(), args, p, cache, params, stream,
                                   workspace, kernel_of<T, OutT, kTile, WPacking::kMxfp4, true>());
  }
  return launch_kernel<T, kTile>(kernel_of<T, OutT, kTile>(), args, p, cache, params, stream,
                                 workspace);
}

// ---- the decode pair's launch ---------------------------------------------------------------

// CTAs of the decode pair's `kernel` resident at once per multiprocessor (at most kMinBlocks):
// its GEMM2 tasks wait on GEMM1 tasks of other CTAs, so its grid must never exceed what is
// resident. The shared-memory carveout is set to hold that many CTAs' static shared memory (the
// rest stays L1, which the tokens are read through) and the count read back from the occupancy
// calculator rather than assumed.
template <typename T, int kTile, typename Kernel>
cudaError_t pair_residency(Kernel kernel, int* blocks) {
  using Shape = ShapeOf<T, kTile>;
  cudaFuncAttributes attr{};
  MOEKIT_CUDA_TRY(cudaFuncGetAttributes(&attr, kernel));
  int max_smem = 0, device = 0;
  MOEKIT_CUDA_TRY(cudaGetDevice(&device));
  MOEKIT_CUDA_TRY(
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  constexpr size_t kReservedPerBlock = 1024;  // the system's shared memory per CTA on sm_90
  const size_t need = Shape::kMinBlocks * (attr.sharedSizeBytes + kReservedPerBlock);
  const int percent =
      static_cast<int>(std::min<size_t>(100, (100 * need + max_smem - 1) / max_smem));
  MOEKIT_CUDA_TRY(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, percent));
  int occupancy = 0;
  MOEKIT_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, kernel, Shape::kThreads, 0));
  if (occupancy < 1) return cudaErrorInvalidConfiguration;
  *blocks = std::min(occupancy, Shape::kMinBlocks);
  return cudaSuccess;
}

// Launches the decode pair (simt_pair_kernel) of CUDA-core row kTile: a1 = GEMM1 with its fused
// activation, a2 = GEMM2 reading a1's output (checked by can_run_grouped_gemm_pair), expert_done
// (a1.num_experts,) zeroed before on the stream. The grid: the resident CTAs (cached with W1's
// launch state, else queried now), capped by the tasks the schedule can hold.
template <typename T, typename OutT, int kTile, WPacking kPacking>
cudaError_t launch_pair(const GroupedGemmArgs& a1, const GroupedGemmArgs& a2, int32_t* expert_done,
                        const WeightLaunchCache* cache, cudaStream_t stream) {
  using Shape = ShapeOf<T, kTile>;
  static_assert(Shape::kSimt && !Shape::kPackedW4, "16-bit rows: W4A16 ran slower as a pair");
  const auto kernel = &simt_pair_kernel<T, OutT, kTile, kPacking>;
  const KernelParams p1 = kernel_params<T, kTile>(a1);
  const KernelParams p2 = kernel_params<T, kTile>(a2);
  int sms = 0, blocks = 0;
  if (cache != nullptr &&
      cache->matches(a1.w, a1.n, a1.k, a1.num_experts, a1.dtype, output_type(a1)) &&
      cache->pair_blocks[kTile] > 0) {
    sms = cache->sms;
    blocks = cache->pair_blocks[kTile];
  } else {
    MOEKIT_CUDA_TRY(current_device_sms(&sms));
    MOEKIT_CUDA_TRY((pair_residency<T, kTile>(kernel, &blocks)));
  }
  const int64_t rows_ub = a1.num_rows_upper_bound;
  const int64_t items_ub = (rows_ub / Shape::kBM + std::min<int64_t>(a1.num_experts, rows_ub)) *
                           (p1.n_tiles + p2.n_tiles);
  const int64_t tasks_ub = items_ub * (Shape::kThreads / 32);  // warp-major: a CTA each at most
  const int grid = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(sms) * blocks, tasks_ub)));
  return launch_pdl(kernel, dim3(static_cast<unsigned>(grid)), dim3(Shape::kThreads), 0, stream, p1,
                    p2, expert_done);
}

// The launch state of W for every row of kFamily, with the kernels of output OutT (T operands).
template <typename T, typename OutT, TileFamily kFamily>
cudaError_t prepare_rows(const GroupedGemmArgs& args, WeightLaunchCache* c) {
  for (int row = 0; row < kNumTiles; ++row) {
    if (kTileTable[row].family != kFamily) continue;
    MOEKIT_CUDA_TRY(with_tile<kFamily>(row, [&](auto tile) {
      constexpr int kRow = decltype(tile)::value;
      using Shape = ShapeOf<T, kRow>;
      if constexpr (Shape::kPackedW4) {
        MOEKIT_CUDA_TRY(with_packing(args.w_packing, [&](auto packing) {
          return set_kernel_attributes(kernel_of<T, OutT, kRow, decltype(packing)::value>(),
                                       Shape::kDynamicSmem);
        }));
      } else {
        MOEKIT_CUDA_TRY(set_kernel_attributes(kernel_of<T, OutT, kRow>(), Shape::kDynamicSmem));
      }
      if constexpr (kHasStreamK<T, kRow>) {
        MOEKIT_CUDA_TRY(set_kernel_attributes(kernel_of<T, OutT, kRow, WPacking::kMxfp4, true>(),
                                              Shape::kDynamicSmem));
      }
      if constexpr (Shape::kSimt && !Shape::kPackedW4) {  // and the row's decode pair
        MOEKIT_CUDA_TRY((pair_residency<T, kRow>(&simt_pair_kernel<T, OutT, kRow, WPacking::kMxfp4>,
                                                 &c->pair_blocks[kRow])));
      }
      if constexpr (Shape::kCluster > 1) {
        MOEKIT_CUDA_TRY(
            (resident_clusters<T, kRow>(kernel_of<T, OutT, kRow>(), &c->clusters[kRow])));
      }
      if constexpr (Shape::kTma) {
        return encode_w_map(args.w, args.n, args.k, args.num_experts, args.dtype, Shape::kBK,
                            Shape::kTmaBoxN, &c->tma[kRow]);
      }
      return cudaSuccess;
    }));
  }
  return cudaSuccess;
}

}  // namespace moekit::cuda::sm90
