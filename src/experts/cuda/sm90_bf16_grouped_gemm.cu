// Grouped expert GEMM on Hopper tensor cores, bf16 / f16 operands, fp32 accumulation:
// C[r, :] = A[src_row(r), :] @ W[e]^T (+ bias[e, :]) (see sm90_grouped_gemm.h). The mainloops of
// the kit's tile table (sm90/tiles.h), written from the kit's pieces (sm90/).
//
// This kernel does:
//   1. Each CTA of a persistent grid reads the schedule (expert_offsets or expert_counts) and
//      builds, in shared memory, the prefix sum of m-tiles per expert (one warp, shuffle scan).
//   2. It walks work items (m-tile, n-tile) round-robin over the grid, rasterised in groups of
//      kRasterGroup m-tiles so that CTAs running together share W n-tiles and A m-tiles in L2;
//      a binary search over the prefix gives the expert of an m-tile (sm90/scheduler.cuh).
//   3. Mainloop, by the table row's kind:
//      kWarpSpecializedTma (ws_tma_kernel; prefill, 128x256): the last warpgroup is the producer.
//      It fills a kStages-deep ring of BMx(128 bytes) A and BNx(128 bytes) W tiles (K-major,
//      128-byte swizzle): W by one bulk tensor copy (TMA, 3-D map {k, n, E}, zeros past N and K),
//      the gathered A rows by cp.async (16 B per thread per row, zero-filled past the expert's
//      last row, past K and for gather rows < 0). Both complete on the stage's "full" mbarrier
//      (expect_tx + cp.async.mbarrier.arrive.noinc). The consumer warpgroups (64 rows each) wait
//      on "full", issue 4 wgmma (32 bytes of K each) per stage keeping one wgmma group in flight,
//      and release the stage of the previous K step on its "empty" mbarrier. No block-wide
//      barrier after the prefix: the producer runs ahead into the next work item while the
//      consumers run the epilogue.
//      kSingleRole (single_role_kernel; decode, 64x64): every thread loads with cp.async into the
//      ring (a stage refilled two K steps after it was consumed, one __syncthreads per K step)
//      and the warpgroups compute; faster at few rows per expert.
//   4. Epilogue (sm90/epilogue.cuh): fp32 accumulators + bias, rounded to bf16/fp16, stored
//      straight from the accumulator fragment with row (expert range) and column (N) predicates;
//      or the fused gated activation on gate/up column pairs, n / 2 columns stored.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "core/cuda/cuda_check.cuh"
#include "experts/cuda/sm90/epilogue.cuh"
#include "experts/cuda/sm90/host.h"
#include "experts/cuda/sm90/mainloop.cuh"
#include "experts/cuda/sm90_grouped_gemm.h"

namespace moekit::cuda {
namespace {

using namespace sm90;  // NOLINT: the kit

template <typename T, int kTile>
using Shape16 = TileShape<kTile, static_cast<int>(sizeof(T))>;

// ---- kWarpSpecializedTma ------------------------------------------------------------------------

template <typename T, int kTile>
__global__ void __launch_bounds__(Shape16<T, kTile>::kThreads, Shape16<T, kTile>::kMinBlocks)
    ws_tma_kernel(const KernelParams p, const __grid_constant__ CUtensorMap w_map) {
  using Shape = Shape16<T, kTile>;
  constexpr int kBM = Shape::kBM;
  constexpr int kBN = Shape::kBN;
  constexpr int kStages = Shape::kStages;
  constexpr int kAcc = kBN / 2;

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];    // m-tiles of experts [0, e)
  __shared__ alignas(8) uint64_t s_full[kStages];   // stage landed (producer -> consumers)
  __shared__ alignas(8) uint64_t s_empty[kStages];  // stage consumed (consumers -> producer)
  __shared__ int64_t s_a_offset[2][kBM];  // producer: byte offset of each A row, -1 = zeros
  const uint32_t smem_base = ring_base(smem_dynamic);

  const int tid = static_cast<int>(threadIdx.x);
  const int num_experts = p.num_experts;

  // 1. m-tile prefix over experts; barrier initialisation.
  if (tid < 32) {
    tile_prefix_by_warp<kBM>(p, s_tile_prefix, tid);
  } else if (tid == 32) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&s_full[s]), 128 + 1);  // each producer thread's cp.async + the TMA
      mbar_init(smem_u32(&s_empty[s]), Shape::kConsumerThreads / 32);  // one per consumer warp
    }
    fence_proxy_async();
  }
  __syncthreads();

  const int total_m_tiles = s_tile_prefix[num_experts];
  const int total_items = total_m_tiles * p.n_tiles;
  const int warpgroup = tid / 128;

  if (warpgroup == Shape::kConsumers) {
    // ---- producer warpgroup -----------------------------------------------------------------
    if constexpr (Shape::kRebalanceRegisters) setmaxnreg_dec<Shape::kProducerRegisters>();
    const int ptid = tid - Shape::kConsumerThreads;
    const int chunk = ptid & 7;         // 16-byte column of the tile row this thread loads
    const int row_in_pass = ptid >> 3;  // tile row (mod 16) this thread loads
    const uint32_t swizzled = swizzled_offset(row_in_pass, chunk);
    int it = 0;   // K steps issued so far by this CTA (all items)
    int buf = 0;  // s_a_offset buffer of this item
    for (int item = static_cast<int>(blockIdx.x); item < total_items;
         item += static_cast<int>(gridDim.x)) {
      // 2. Work item -> (expert, m-tile, n-tile).
      const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
      for (int r = ptid; r < kBM; r += 128) {
        const int row = w.m0 + r;
        int64_t off = -1;
        if (row < w.row_end) {
          const int s = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
          if (s >= 0) off = static_cast<int64_t>(s) * p.lda_bytes;
        }
        s_a_offset[buf][r] = off;
      }
      named_barrier_sync(1, 128);  // the offsets of this item are visible to every producer
      for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
        const int s = it % kStages;
        mbar_wait(smem_u32(&s_empty[s]), ((it / kStages) & 1) ^ 1);
        const uint32_t sa = smem_base + static_cast<uint32_t>(s * Shape::kStageBytes);
        const uint32_t sb = sa + Shape::kStageABytes;
        const bool k_ok = kt * Shape::kBK + chunk * Shape::kChunkElems < p.k;
        const int64_t k_bytes = static_cast<int64_t>(kt) * kRowBytes + chunk * kChunkBytes;
#pragma unroll
        for (int i = 0; i < Shape::kAPasses; ++i) {
          const int64_t off = s_a_offset[buf][row_in_pass + i * Shape::kRowsPerPass];
          const bool ok = k_ok && off >= 0;
          cp_async_16(sa + swizzled + i * Shape::kRowsPerPass * kRowBytes,
                      ok ? p.a + off + k_bytes : p.a, ok);
        }
        if (ptid == 0) {  // W tile: one bulk tensor copy (zeros past N and K)
          const uint32_t full = smem_u32(&s_full[s]);
          mbar_arrive_expect_tx(full, Shape::kStageBBytes);
          tma_load_3d(sb, &w_map, full, kt * Shape::kBK, w.n0, w.expert);
        }
        cp_async_mbar_arrive(smem_u32(&s_full[s]));
      }
      buf ^= 1;
    }
    cp_async_wait<0>();
    return;
  }

  // ---- consumer warpgroups ----------------------------------------------------------------------
  if constexpr (Shape::kRebalanceRegisters) setmaxnreg_inc<Shape::kConsumerRegisters>();
  const int lane = tid & 31;
  int it = 0;  // K steps consumed so far by this CTA (all items)
  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
    float acc[kAcc];
    zero_accumulators(acc);

    // 3. Main loop.
    for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      mbar_wait(smem_u32(&s_full[s]), (it / kStages) & 1);
      fence_proxy_async();  // the producers' cp.async data, seen by the tensor cores
      const uint32_t stage = smem_base + static_cast<uint32_t>(s * Shape::kStageBytes);
      mma_stage<T, kBN>(acc, stage + static_cast<uint32_t>(warpgroup * 64 * kRowBytes),
                        stage + Shape::kStageABytes);
      wgmma_wait<1>();  // this warpgroup's wgmma of the previous K step is done
      fence_registers(acc);
      if (kt > 0 && lane == 0) mbar_arrive(smem_u32(&s_empty[(it + kStages - 1) % kStages]));
    }
    wgmma_wait<0>();
    fence_registers(acc);
    if (lane == 0) mbar_arrive(smem_u32(&s_empty[(it + kStages - 1) % kStages]));

    // 4. Epilogue.
    store_warpgroup_tile<T, kBN>(p, acc, w, warpgroup, tid);
  }
}

// ---- kSingleRole --------------------------------------------------------------------------------

template <typename T, int kTile>
__global__ void __launch_bounds__(Shape16<T, kTile>::kThreads, Shape16<T, kTile>::kMinBlocks)
    single_role_kernel(const KernelParams p) {
  using Shape = Shape16<T, kTile>;
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

  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    // 2. Work item -> (expert, m-tile, n-tile).
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);

    const uint8_t* a_src[Shape::kAPasses];
#pragma unroll
    for (int i = 0; i < Shape::kAPasses; ++i) {
      const int row = w.m0 + row_in_pass + i * Shape::kRowsPerPass;
      const uint8_t* src = nullptr;
      if (row < w.row_end) {
        const int s = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
        if (s >= 0) src = p.a + static_cast<int64_t>(s) * p.lda_bytes + chunk * kChunkBytes;
      }
      a_src[i] = src;
    }
    const uint8_t* w_src[Shape::kBPasses];
#pragma unroll
    for (int i = 0; i < Shape::kBPasses; ++i) {
      const int n = w.n0 + row_in_pass + i * Shape::kRowsPerPass;
      w_src[i] = n < p.n ? p.w + (static_cast<int64_t>(w.expert) * p.n + n) * p.k * sizeof(T) +
                               chunk * kChunkBytes
                         : nullptr;
    }

    auto load_stage = [&](int kt) {
      if (kt < p.k_tiles) {
        const uint32_t sa = smem_base + static_cast<uint32_t>((kt % kStages) * Shape::kStageBytes);
        const uint32_t sb = sa + Shape::kStageABytes;
        const bool k_ok = kt * Shape::kBK + chunk * Shape::kChunkElems < p.k;
        const int64_t k_bytes = static_cast<int64_t>(kt) * kRowBytes;
#pragma unroll
        for (int i = 0; i < Shape::kAPasses; ++i) {
          const bool ok = k_ok && a_src[i] != nullptr;
          cp_async_16(sa + swizzled + i * Shape::kRowsPerPass * kRowBytes,
                      ok ? a_src[i] + k_bytes : p.a, ok);
        }
#pragma unroll
        for (int i = 0; i < Shape::kBPasses; ++i) {
          const bool ok = k_ok && w_src[i] != nullptr;
          cp_async_16(sb + swizzled + i * Shape::kRowsPerPass * kRowBytes,
                      ok ? w_src[i] + k_bytes : p.w, ok);
        }
      }
      cp_async_commit();  // NOTE: empty groups keep the wait counts uniform
    };

    float acc[kAcc];
    zero_accumulators(acc);

    __syncthreads();  // every warpgroup is done reading the ring of the previous item
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s)
      load_stage(s);

    // 3. Main loop.
    for (int kt = 0; kt < p.k_tiles; ++kt) {
      cp_async_wait<kStages - 3>();  // this thread's copies of tile kt have landed
      fence_proxy_async();           // make them visible to the tensor cores (async proxy)
      __syncthreads();
      const uint32_t stage = smem_base + static_cast<uint32_t>((kt % kStages) * Shape::kStageBytes);
      mma_stage<T, kBN>(acc, stage + static_cast<uint32_t>(warpgroup * 64 * kRowBytes),
                        stage + Shape::kStageABytes);
      wgmma_wait<1>();  // this warpgroup's wgmma of tile kt - 1 is done
      fence_registers(acc);
      // Refill the stage of tile kt - 2: every warpgroup finished it before this K step's barrier.
      load_stage(kt + kStages - 2);
    }
    wgmma_wait<0>();
    fence_registers(acc);

    // 4. Epilogue.
    store_warpgroup_tile<T, kBN>(p, acc, w, warpgroup, tid);
  }
}

// ---- host side ----------------------------------------------------------------------------------

// The kernel of table row kTile for element type T.
template <typename T, int kTile>
constexpr auto kernel_of() {
  if constexpr (Shape16<T, kTile>::kTma) {
    return &ws_tma_kernel<T, kTile>;
  } else {
    return &single_role_kernel<T, kTile>;
  }
}

// f(std::integral_constant<int, row>) for the table row `row`.
template <typename F>
cudaError_t with_tile(int row, F&& f) {
  cudaError_t result = cudaErrorInvalidValue;
  [&]<int... kRows>(std::integer_sequence<int, kRows...>) {
    ((row == kRows ? (result = f(std::integral_constant<int, kRows>{}), 0) : 0), ...);
  }
  (std::make_integer_sequence<int, kNumTiles>{});
  return result;
}

// f(T{}) for the 16-bit element type of the problem.
template <typename F>
cudaError_t with_type(ElemType dtype, F&& f) {
  if (dtype == ElemType::kBF16) return f(__nv_bfloat16{});
  return f(__half{});
}

template <typename T, int kTile>
cudaError_t launch(const GroupedGemmArgs& args, const GroupedGemmParams& params,
                   cudaStream_t stream) {
  using Shape = Shape16<T, kTile>;
  constexpr int kEs = static_cast<int>(sizeof(T));
  KernelParams p{};
  p.a = static_cast<const uint8_t*>(args.a);
  p.lda_bytes = args.lda * kEs;
  p.gather_rows = args.gather_rows;
  p.w = static_cast<const uint8_t*>(args.w);
  p.bias = args.bias;
  p.c = static_cast<uint8_t*>(args.c);
  p.ldc_bytes = args.ldc * kEs;
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

  // Per-weight launch state: from the cache prepared once, or prepared now.
  const WeightLaunchCache* cache = params.cache;
  if (cache != nullptr && !cache->matches(args.w, args.n, args.k, args.num_experts, args.dtype)) {
    cache = nullptr;
  }
  constexpr auto kernel = kernel_of<T, kTile>();
  int sms = 0;
  if (cache != nullptr) {
    sms = cache->sms;
  } else {
    MOEKIT_CUDA_TRY(current_device_sms(&sms));
    MOEKIT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Shape::kDynamicSmem));
  }
  const int grid = grid_size(args, Shape::kConfig, p.n_tiles, sms, params.max_ctas);
  if constexpr (Shape::kTma) {
    CUtensorMap w_map;
    if (cache != nullptr) {
      static_assert(sizeof(CUtensorMap) == sizeof(TmaDescriptor));
      std::memcpy(&w_map, cache->tma[kTile].bytes.data(), sizeof(w_map));
    } else {
      TmaDescriptor d;
      MOEKIT_CUDA_TRY(encode_w_map(args.w, args.n, args.k, args.num_experts, args.dtype, Shape::kBK,
                                   Shape::kBN, &d));
      std::memcpy(&w_map, d.bytes.data(), sizeof(w_map));
    }
    kernel<<<static_cast<unsigned>(grid), Shape::kThreads, Shape::kDynamicSmem, stream>>>(p, w_map);
  } else {
    kernel<<<static_cast<unsigned>(grid), Shape::kThreads, Shape::kDynamicSmem, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

// Supported and compiled (house rule: the predicate beside the instantiations): bf16 and f16, every
// row of the tile table (kernel_of<T, row> for T in {__nv_bfloat16, __half}).
std::string can_implement(const GroupedGemmArgs& args, const GroupedGemmParams& params) {
  if (args.dtype != ElemType::kBF16 && args.dtype != ElemType::kF16) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not bf16 or f16";
  }
  return detail::check_grouped_gemm_args(args, params);
}

cudaError_t prepare_grouped_gemm_weights(const GroupedGemmArgs& args, WeightLaunchCache* cache) {
  *cache = WeightLaunchCache{};
  if (args.dtype != ElemType::kBF16 && args.dtype != ElemType::kF16) return cudaErrorInvalidValue;
  WeightLaunchCache c;
  MOEKIT_CUDA_TRY(current_device_sms(&c.sms));
  for (int row = 0; row < kNumTiles; ++row) {
    MOEKIT_CUDA_TRY(with_type(args.dtype, [&](auto tag) {
      using T = decltype(tag);
      return with_tile(row, [&](auto tile) {
        using Shape = Shape16<T, decltype(tile)::value>;
        MOEKIT_CUDA_TRY(cudaFuncSetAttribute(kernel_of<T, decltype(tile)::value>(),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             Shape::kDynamicSmem));
        if constexpr (Shape::kTma) {
          return encode_w_map(args.w, args.n, args.k, args.num_experts, args.dtype, Shape::kBK,
                              Shape::kBN, &c.tma[row]);
        }
        return cudaSuccess;
      });
    }));
  }
  c.w = args.w;
  c.n = args.n;
  c.k = args.k;
  c.num_experts = args.num_experts;
  c.dtype = args.dtype;
  *cache = c;
  return cudaSuccess;
}

cudaError_t run_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream,
                             const GroupedGemmParams& params, void* /*workspace*/) {
  if (!can_implement(args, params).empty()) return cudaErrorInvalidValue;
  const int row = params.tile >= 0 ? params.tile : select_grouped_gemm_tile(args);
  return with_type(args.dtype, [&](auto tag) {
    using T = decltype(tag);
    return with_tile(
        row, [&](auto tile) { return launch<T, decltype(tile)::value>(args, params, stream); });
  });
}

}  // namespace moekit::cuda
