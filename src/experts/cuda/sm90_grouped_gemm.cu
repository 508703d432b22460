// Grouped expert GEMM on Hopper tensor cores: C[r, :] = A[src_row(r), :] @ W[e]^T (+ bias[e, :]).
//
// This kernel does:
//   1. Each CTA of a persistent grid reads the schedule (expert_offsets or expert_counts) and
//      builds, in shared memory, the prefix sum of m-tiles per expert (one warp, shuffle scan).
//   2. It walks work items (m-tile, n-tile) round-robin over the grid, rasterised in groups of
//      kRasterGroup m-tiles so that CTAs running together share W n-tiles and A m-tiles in L2;
//      a binary search over the prefix gives the expert of an m-tile.
//   3. Prefill tile (128x256, grouped_gemm_kernel), warp-specialised: the last warpgroup is the
//      producer. It fills a kStages-deep ring of BMx64 A and BNx64 W tiles (K-major, 128-byte
//      swizzle): W by one bulk tensor copy (TMA, 3-D map {k, n, E}, zeros past N and K), the
//      gathered A rows by cp.async (16 B per thread per row, zero-filled past the expert's last
//      row, past K and for gather rows < 0). Both complete on the stage's "full" mbarrier
//      (expect_tx + cp.async.mbarrier.arrive.noinc). The 2 consumer warpgroups (64 rows each)
//      wait on "full", issue 4 wgmma m64nBNk16 per stage keeping one wgmma group in flight, and
//      release the stage of the previous K step on its "empty" mbarrier. No block-wide barrier
//      after the prefix: the producer runs ahead into the next work item while the consumers
//      run the epilogue.
//      Decode tile (64x64, grouped_gemm_sync_kernel): the previous single-role loop (every
//      thread loads with cp.async, one __syncthreads per K step), faster at few rows per expert.
//   4. Epilogue: fp32 accumulators + bias, rounded to bf16/fp16, stored straight from the
//      accumulator fragment with row (expert range) and column (N) predicates. With a fused
//      gated activation (W rows gate/up interleaved in blocks of 32), each thread pairs its gate
//      and up accumulators (column groups j and j + 4), applies the activation in fp32 and stores
//      n / 2 columns; the kind is a runtime switch (no extra instantiations).
#include "experts/cuda/sm90_grouped_gemm.h"

#include "core/cuda/elem_io.cuh"
#include "core/elementwise.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace moekit::cuda {
namespace {

constexpr int kBK = 64;           // K elements per stage: 64 x 2 bytes = one 128-byte swizzle row
constexpr int kRowBytes = 128;    // bytes of one tile row in shared memory
constexpr int kRasterGroup = 8;   // m-tiles per raster group
constexpr int kSmemAlign = 1024;  // the 128-byte swizzle pattern repeats every 8 rows = 1024 bytes

// Kernel-side view of GroupedGemmArgs, with derived sizes.
struct KernelParams {
  const uint8_t* a;  // (rows, k) row stride lda_bytes
  int64_t lda_bytes;
  const int32_t* gather_rows;  // (num_rows,) or null
  const uint8_t* w;            // (E, n, k)
  const void* bias;            // (E, n) or null
  uint8_t* c;                  // (num_rows, n) row stride ldc_bytes
  int64_t ldc_bytes;
  const int32_t* expert_offsets;  // (E + 1,)
  const int32_t* expert_counts;   // (E,) batched form, or null
  int batched_stride;
  int num_experts;
  int n;
  int k;
  int n_tiles;
  int k_tiles;
  bool bias_is_fp32;
  // Fused gated activation (kNone: plain store of n columns).
  FusedActivation act;
  bool has_clamp;
  float limit;
  float alpha;
};

// Tile shapes. kConsumers warpgroups of 64 rows each compute; one more warpgroup loads. Every
// row of the shared-memory tiles is 128 bytes (kBK halves); a producer thread loads one 16-byte
// chunk column of kAPasses (kBPasses) rows, 16 rows apart.
template <int kConsumers_, int kBN_, int kStages_, int kMinBlocks_>
struct TileShape {
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBM = 64 * kConsumers_;
  static constexpr int kBN = kBN_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kConsumerThreads = 128 * kConsumers_;
  static constexpr int kThreads = kConsumerThreads + 128;
  static constexpr int kStageABytes = kBM * kRowBytes;
  static constexpr int kStageBBytes = kBN * kRowBytes;
  static constexpr int kStageBytes = kStageABytes + kStageBBytes;
  static constexpr int kDynamicSmem = kStages * kStageBytes + kSmemAlign;
  static constexpr int kRowsPerPass = 128 / 8;
  static constexpr int kAPasses = kBM / kRowsPerPass;
  static_assert(kBN <= 256, "one bulk tensor copy box per W stage");
  // One CTA per SM with 3 warpgroups: move registers from the producer to the consumers.
  static constexpr bool kRebalanceRegisters = kMinBlocks_ == 1 && kConsumers_ == 2;
  static constexpr int kProducerRegisters = 56;
  static constexpr int kConsumerRegisters = 224;
  static_assert(kAPasses * kRowsPerPass == kBM);
  static_assert(kStages >= 2);
  static_assert(!kRebalanceRegisters ||
                128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters <= 65536);
};
// Tile table (selection is data: select_grouped_gemm_tile picks by rows per expert).
// Decode tile: the single-role kernel (grouped_gemm_sync_kernel); every thread loads.
template <int kWarpgroups_, int kBN_, int kStages_, int kMinBlocks_>
struct SyncTileShape {
  static constexpr int kBM = 64 * kWarpgroups_;
  static constexpr int kBN = kBN_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kThreads = 128 * kWarpgroups_;
  static constexpr int kStageABytes = kBM * kRowBytes;
  static constexpr int kStageBBytes = kBN * kRowBytes;
  static constexpr int kStageBytes = kStageABytes + kStageBBytes;
  static constexpr int kDynamicSmem = kStages * kStageBytes + kSmemAlign;
  static constexpr int kRowsPerPass = kThreads / 8;
  static constexpr int kAPasses = kBM / kRowsPerPass;
  static constexpr int kBPasses = kBN / kRowsPerPass;
  static_assert(kAPasses * kRowsPerPass == kBM && kBPasses * kRowsPerPass == kBN);
  static_assert(kStages >= 3, "a stage is refilled two K steps after it is consumed");
};
using Tile64x64 = SyncTileShape<1, 64, 6, 2>;  // 96 KiB ring, 2 CTAs per SM
// Prefill tile: the warp-specialised kernel (grouped_gemm_kernel), W by TMA.
using Tile128x256 = TileShape<2, 256, 4, 1>;  // 192 KiB ring, 4 stages in flight

// ---- PTX wrappers --------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;  // 0 = zero-fill the 16 bytes, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Waits until the phase of parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred P;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\n"
        "selp.u32 %0, 1, 0, P;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// Arrives and adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
      "r"(bytes)
      : "memory");
}
// Bulk tensor copy of the box at (c0, c1, c2) of a 3-D tensor map into shared memory; completes
// its bytes on the barrier. Out-of-bounds elements are written as zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// Arrives on the barrier once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins accumulator registers in program order around asynchronous wgmma.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, K-major, 128-byte swizzle: rows of 128 bytes, 8-row groups
// 1024 bytes apart (stride byte offset); the leading byte offset is unused for this layout.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;
  d |= static_cast<uint64_t>(1024 >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

#define MOEKIT_D8(i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define MOEKIT_R32                                                                        \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MOEKIT_R64_HI                                                                     \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

#define MOEKIT_R128_HI                                                                           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// d (64 x kN fp32 fragment) += A (64x16 from desc_a) * B^T (kN x 16 from desc_b).
template <bool kBF16, int kN>
__device__ __forceinline__ void wgmma_k16(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (kN == 64) {
    if constexpr (kBF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MOEKIT_R32
          "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
          : MOEKIT_D8(0), MOEKIT_D8(8), MOEKIT_D8(16), MOEKIT_D8(24)
          : "l"(desc_a), "l"(desc_b));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" MOEKIT_R32
          "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
          : MOEKIT_D8(0), MOEKIT_D8(8), MOEKIT_D8(16), MOEKIT_D8(24)
          : "l"(desc_a), "l"(desc_b));
    }
  } else {
    static_assert(kN == 256);
    if constexpr (kBF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MOEKIT_R32 ", " MOEKIT_R64_HI
          ", " MOEKIT_R128_HI "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
          : MOEKIT_D8(0), MOEKIT_D8(8), MOEKIT_D8(16), MOEKIT_D8(24), MOEKIT_D8(32), MOEKIT_D8(40),
            MOEKIT_D8(48), MOEKIT_D8(56), MOEKIT_D8(64), MOEKIT_D8(72), MOEKIT_D8(80),
            MOEKIT_D8(88), MOEKIT_D8(96), MOEKIT_D8(104), MOEKIT_D8(112), MOEKIT_D8(120)
          : "l"(desc_a), "l"(desc_b));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" MOEKIT_R32 ", " MOEKIT_R64_HI
          ", " MOEKIT_R128_HI "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
          : MOEKIT_D8(0), MOEKIT_D8(8), MOEKIT_D8(16), MOEKIT_D8(24), MOEKIT_D8(32), MOEKIT_D8(40),
            MOEKIT_D8(48), MOEKIT_D8(56), MOEKIT_D8(64), MOEKIT_D8(72), MOEKIT_D8(80),
            MOEKIT_D8(88), MOEKIT_D8(96), MOEKIT_D8(104), MOEKIT_D8(112), MOEKIT_D8(120)
          : "l"(desc_a), "l"(desc_b));
    }
  }
}
#undef MOEKIT_D8
#undef MOEKIT_R32
#undef MOEKIT_R64_HI
#undef MOEKIT_R128_HI

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

// Warp 0 writes tile_prefix[e] = m-tiles of experts [0, e) (each lane sums a run of experts, then
// one warp scan).
template <int kBM>
__device__ __forceinline__ void tile_prefix_by_warp(const KernelParams& p, int* tile_prefix,
                                                    int lane) {
  const int num_experts = p.num_experts;
  const int per_lane = (num_experts + 31) / 32;
  const int first = min(num_experts, lane * per_lane);
  const int last = min(num_experts, first + per_lane);
  int local = 0;
  for (int e = first; e < last; ++e) {
    int b, en;
    expert_rows(p, e, b, en);
    local += (en - b + kBM - 1) / kBM;
  }
  int inclusive = local;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  int running = inclusive - local;
  if (lane == 0) tile_prefix[0] = 0;
  for (int e = first; e < last; ++e) {
    int b, en;
    expert_rows(p, e, b, en);
    running += (en - b + kBM - 1) / kBM;
    tile_prefix[e + 1] = running;
  }
}

// ---- epilogue ---------------------------------------------------------------------------------

// Activation math: the gated kinds of moe_activation.cu, written the same way (keep in sync).
__device__ __forceinline__ float act_sigmoidf(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float act_siluf(float x) {
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float act_gelu_erf(float x) {
  return 0.5f * x * erfcf(-x * 0.70710678118654752f);
}
__device__ __forceinline__ float act_gelu_tanh(float x) {
  const float z = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return x / (1.0f + expf(-2.0f * z));
}
__device__ __forceinline__ float act_clampf(float v, float lim) {
  return fminf(fmaxf(v, -lim), lim);
}
// The kind is resolved once per tile (store_tile's switch) and each kind's epilogue is its own
// straight-line unrolled copy: a per-element switch measured ~20 us per 128x256 item slower
// (branchy, instruction-cache-missing code; bench/grouped_gemm_notes.md).
enum class ActImpl { kSilu, kSiluClamp, kGelu, kGeluTanh, kSwigluOai, kSwigluStep, kRelu2 };
template <ActImpl kA>
__device__ __forceinline__ float gated_act(const KernelParams& p, float g, float u) {
  if constexpr (kA == ActImpl::kSilu) {
    return act_siluf(g) * u;
  } else if constexpr (kA == ActImpl::kSiluClamp) {
    return act_siluf(fminf(g, p.limit)) * act_clampf(u, p.limit);
  } else if constexpr (kA == ActImpl::kGelu) {
    return act_gelu_erf(g) * u;
  } else if constexpr (kA == ActImpl::kGeluTanh) {
    return act_gelu_tanh(g) * u;
  } else if constexpr (kA == ActImpl::kSwigluOai) {
    const float gc = fminf(g, p.limit);
    const float uc = act_clampf(u, p.limit);
    return (uc + 1.0f) * gc * act_sigmoidf(p.alpha * gc);
  } else if constexpr (kA == ActImpl::kSwigluStep) {
    return fminf(act_siluf(g), p.limit) * act_clampf(u, p.limit);
  } else {
    const float r = fmaxf(g, 0.0f);
    return r * r * u;
  }
}

// Bias of columns (col, col + 1) of expert e, or zeros.
template <typename T>
__device__ __forceinline__ float2 bias_pair(const KernelParams& p, int expert, int col) {
  float2 b = make_float2(0.0f, 0.0f);
  if (p.bias != nullptr) {
    const int64_t bi = static_cast<int64_t>(expert) * p.n + col;
    if (p.bias_is_fp32) {
      b = *reinterpret_cast<const float2*>(static_cast<const float*>(p.bias) + bi);
    } else {
      const T* bt = static_cast<const T*>(p.bias) + bi;
      b.x = to_f32(bt[0]);
      b.y = to_f32(bt[1]);
    }
  }
  return b;
}

// Fused epilogue of one activation kind (see store_tile).
template <typename T, int kBN, ActImpl kA>
__device__ __forceinline__ void store_tile_fused(const KernelParams& p, const float (&acc)[kBN / 2],
                                                 int expert, int row0, int row_end, int n0,
                                                 int lane) {
  using P = Pair<T>;
  static_assert(kBN % 64 == 0, "the fused epilogue pairs columns within 64-column blocks");
#pragma unroll
  for (int jb = 0; jb < kBN / 64; ++jb) {
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
      const int j = 8 * jb + jj;  // gate group; up group is j + 4
      const int gcol = n0 + j * 8 + (lane & 3) * 2;
      if (gcol >= p.n) continue;
      const float2 bg = bias_pair<T>(p, expert, gcol);
      const float2 bu = bias_pair<T>(p, expert, gcol + kFusedGateUpBlock);
      const int ocol = (n0 + 64 * jb) / 2 + jj * 8 + (lane & 3) * 2;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + h * 8;
        if (row < row_end) {
          const float o0 =
              gated_act<kA>(p, acc[4 * j + 2 * h] + bg.x, acc[4 * (j + 4) + 2 * h] + bu.x);
          const float o1 =
              gated_act<kA>(p, acc[4 * j + 2 * h + 1] + bg.y, acc[4 * (j + 4) + 2 * h + 1] + bu.y);
          auto* dst = reinterpret_cast<typename P::type*>(
              p.c + static_cast<int64_t>(row) * p.ldc_bytes + static_cast<int64_t>(ocol) * 2);
          *dst = P::make(o0, o1);
        }
      }
    }
  }
}

// Stores one warpgroup's 64 x kBN accumulator fragment. The m64nN wgmma fragment gives this
// thread rows row0 and row0 + 8 and, for every 8-column group j, columns j*8 + (lane%4)*2 + {0,1}:
// acc[4j + 2h + {0,1}] is (row0 + 8h, n0 + 8j + (lane%4)*2 + {0,1}).
// Fused: each 64-column block jb of the tile holds gate columns [64jb, 64jb + 32) and the up
// columns 32 further on, i.e. groups j and j + 4 of the same thread; output column
// (n0 + 64jb) / 2 + 8(j%8) + (lane%4)*2. n is a multiple of 64, so the gate column's predicate
// covers its up column.
template <typename T, int kBN>
__device__ __forceinline__ void store_tile(const KernelParams& p, const float (&acc)[kBN / 2],
                                           int expert, int row0, int row_end, int n0, int lane) {
  using P = Pair<T>;
  if (p.act == FusedActivation::kNone) {
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int col = n0 + j * 8 + (lane & 3) * 2;
      if (col >= p.n) continue;
      const float2 b = bias_pair<T>(p, expert, col);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + h * 8;
        if (row < row_end) {
          auto* dst = reinterpret_cast<typename P::type*>(
              p.c + static_cast<int64_t>(row) * p.ldc_bytes + static_cast<int64_t>(col) * 2);
          *dst = P::make(acc[4 * j + 2 * h] + b.x, acc[4 * j + 2 * h + 1] + b.y);
        }
      }
    }
    return;
  }
  switch (p.act) {
    case FusedActivation::kSiluMul:
      if (p.has_clamp) {
        store_tile_fused<T, kBN, ActImpl::kSiluClamp>(p, acc, expert, row0, row_end, n0, lane);
      } else {
        store_tile_fused<T, kBN, ActImpl::kSilu>(p, acc, expert, row0, row_end, n0, lane);
      }
      break;
    case FusedActivation::kGeluMul:
      store_tile_fused<T, kBN, ActImpl::kGelu>(p, acc, expert, row0, row_end, n0, lane);
      break;
    case FusedActivation::kGeluTanhMul:
      store_tile_fused<T, kBN, ActImpl::kGeluTanh>(p, acc, expert, row0, row_end, n0, lane);
      break;
    case FusedActivation::kSwigluOai:
      store_tile_fused<T, kBN, ActImpl::kSwigluOai>(p, acc, expert, row0, row_end, n0, lane);
      break;
    case FusedActivation::kSwigluStep:
      store_tile_fused<T, kBN, ActImpl::kSwigluStep>(p, acc, expert, row0, row_end, n0, lane);
      break;
    default:
      store_tile_fused<T, kBN, ActImpl::kRelu2>(p, acc, expert, row0, row_end, n0, lane);
      break;
  }
}

// ---- the kernel ------------------------------------------------------------------------------

// A work item resolved against the schedule.
struct WorkItem {
  int expert;
  int m0;       // first row of the m-tile
  int row_end;  // end of the expert's rows
  int n0;       // first column of the n-tile
};

template <int kBM, int kBN>
__device__ __forceinline__ WorkItem resolve_item(const KernelParams& p, const int* tile_prefix,
                                                 int total_m_tiles, int item) {
  const int group = item / (kRasterGroup * p.n_tiles);
  const int first_mt = group * kRasterGroup;
  const int group_size = min(kRasterGroup, total_m_tiles - first_mt);
  const int in_group = item - group * kRasterGroup * p.n_tiles;
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

template <typename T, typename Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    grouped_gemm_kernel(const KernelParams p, const __grid_constant__ CUtensorMap w_map) {
  constexpr int kBM = Shape::kBM;
  constexpr int kBN = Shape::kBN;
  constexpr int kStages = Shape::kStages;
  constexpr int kAcc = kBN / 2;
  constexpr bool kBF16 = std::is_same_v<T, __nv_bfloat16>;

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];    // m-tiles of experts [0, e)
  __shared__ alignas(8) uint64_t s_full[kStages];   // stage landed (producer -> consumers)
  __shared__ alignas(8) uint64_t s_empty[kStages];  // stage consumed (consumers -> producer)
  __shared__ int64_t s_a_offset[2][kBM];  // producer: byte offset of each A row, -1 = zeros
  const uint32_t smem_base =
      (smem_u32(smem_dynamic) + (kSmemAlign - 1)) & ~static_cast<uint32_t>(kSmemAlign - 1);

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
    // Swizzled byte offset of (row, chunk): chunk ^= row % 8.
    const uint32_t swizzled = static_cast<uint32_t>(row_in_pass * kRowBytes) +
                              (static_cast<uint32_t>(chunk ^ (row_in_pass & 7)) << 4);
    int it = 0;   // K steps issued so far by this CTA (all items)
    int buf = 0;  // s_a_offset buffer of this item
    for (int item = static_cast<int>(blockIdx.x); item < total_items;
         item += static_cast<int>(gridDim.x)) {
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
        const bool k_ok = kt * kBK + chunk * 8 < p.k;
        const int64_t k_bytes = static_cast<int64_t>(kt) * kRowBytes + chunk * 16;
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
          tma_load_3d(sb, &w_map, full, kt * kBK, w.n0, w.expert);
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
  const int warp_in_group = (tid & 127) >> 5;
  int it = 0;  // K steps consumed so far by this CTA (all items)
  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    const WorkItem w = resolve_item<kBM, kBN>(p, s_tile_prefix, total_m_tiles, item);
    const int n0 = w.n0;

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i)
      acc[i] = 0.0f;

    // 3. Main loop.
    for (int kt = 0; kt < p.k_tiles; ++kt, ++it) {
      const int s = it % kStages;
      mbar_wait(smem_u32(&s_full[s]), (it / kStages) & 1);
      fence_proxy_async();  // the producers' cp.async data, seen by the tensor cores
      const uint32_t sa = smem_base + static_cast<uint32_t>(s * Shape::kStageBytes) +
                          static_cast<uint32_t>(warpgroup * 64 * kRowBytes);
      const uint32_t sb =
          smem_base + static_cast<uint32_t>(s * Shape::kStageBytes) + Shape::kStageABytes;
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        wgmma_k16<kBF16, kBN>(acc, sw128_desc(sa + ks * 32), sw128_desc(sb + ks * 32));
      }
      wgmma_commit();
      wgmma_wait<1>();  // this warpgroup's wgmma of the previous K step is done
      fence_registers(acc);
      if (kt > 0 && lane == 0) mbar_arrive(smem_u32(&s_empty[(it + kStages - 1) % kStages]));
    }
    wgmma_wait<0>();
    fence_registers(acc);
    if (lane == 0) mbar_arrive(smem_u32(&s_empty[(it + kStages - 1) % kStages]));

    // 4. Epilogue.
    const int row0 = w.m0 + warpgroup * 64 + warp_in_group * 16 + (lane >> 2);
    store_tile<T, kBN>(p, acc, w.expert, row0, w.row_end, n0, lane);
  }
}

// Decode kernel (64x64): no warp specialisation. Every thread loads (cp.async ring, a stage
// refilled two K steps after it was consumed, one __syncthreads per K step) and the one warpgroup
// computes. Measured faster than the warp-specialised kernel at 1-64 rows per expert
// (bench/grouped_gemm_notes.md, 2026-11-30 section).
template <typename T, typename Shape>
__global__ void __launch_bounds__(Shape::kThreads, Shape::kMinBlocks)
    grouped_gemm_sync_kernel(const KernelParams p) {
  constexpr int kBM = Shape::kBM;
  constexpr int kBN = Shape::kBN;
  constexpr int kStages = Shape::kStages;
  constexpr int kAcc = kBN / 2;
  constexpr bool kBF16 = std::is_same_v<T, __nv_bfloat16>;

  extern __shared__ uint8_t smem_dynamic[];
  __shared__ int s_tile_prefix[kMaxExperts + 1];  // m-tiles of experts [0, e)
  const uint32_t smem_base =
      (smem_u32(smem_dynamic) + (kSmemAlign - 1)) & ~static_cast<uint32_t>(kSmemAlign - 1);

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
  // Swizzled byte offset of (row, chunk): chunk ^= row % 8 (kRowsPerPass is a multiple of 8).
  const uint32_t swizzled = static_cast<uint32_t>(row_in_pass * kRowBytes) +
                            (static_cast<uint32_t>(chunk ^ (row_in_pass & 7)) << 4);
  const int warpgroup = tid / 128;

  for (int item = static_cast<int>(blockIdx.x); item < total_items;
       item += static_cast<int>(gridDim.x)) {
    // 2. Work item -> (expert, m-tile, n-tile).
    const int group = item / (kRasterGroup * p.n_tiles);
    const int first_mt = group * kRasterGroup;
    const int group_size = min(kRasterGroup, total_m_tiles - first_mt);
    const int in_group = item - group * kRasterGroup * p.n_tiles;
    const int mt = first_mt + in_group % group_size;
    const int nt = in_group / group_size;
    int lo = 0, hi = num_experts - 1;  // last e with prefix[e] <= mt (that expert has rows)
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_tile_prefix[mid] <= mt) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int expert = lo;
    int row_begin, row_end;
    expert_rows(p, expert, row_begin, row_end);
    const int m0 = row_begin + (mt - s_tile_prefix[expert]) * kBM;
    const int n0 = nt * kBN;

    const uint8_t* a_src[Shape::kAPasses];
#pragma unroll
    for (int i = 0; i < Shape::kAPasses; ++i) {
      const int row = m0 + row_in_pass + i * Shape::kRowsPerPass;
      const uint8_t* src = nullptr;
      if (row < row_end) {
        const int s = p.gather_rows != nullptr ? __ldg(&p.gather_rows[row]) : row;
        if (s >= 0) src = p.a + static_cast<int64_t>(s) * p.lda_bytes + chunk * 16;
      }
      a_src[i] = src;
    }
    const uint8_t* w_src[Shape::kBPasses];
#pragma unroll
    for (int i = 0; i < Shape::kBPasses; ++i) {
      const int n = n0 + row_in_pass + i * Shape::kRowsPerPass;
      w_src[i] =
          n < p.n ? p.w + (static_cast<int64_t>(expert) * p.n + n) * p.k * 2 + chunk * 16 : nullptr;
    }

    auto load_stage = [&](int kt) {
      if (kt < p.k_tiles) {
        const uint32_t sa = smem_base + static_cast<uint32_t>((kt % kStages) * Shape::kStageBytes);
        const uint32_t sb = sa + Shape::kStageABytes;
        const bool k_ok = kt * kBK + chunk * 8 < p.k;
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
#pragma unroll
    for (int i = 0; i < kAcc; ++i)
      acc[i] = 0.0f;

    __syncthreads();  // every warpgroup is done reading the ring of the previous item
#pragma unroll
    for (int s = 0; s < kStages - 2; ++s)
      load_stage(s);

    // 3. Main loop.
    for (int kt = 0; kt < p.k_tiles; ++kt) {
      cp_async_wait<kStages - 3>();  // this thread's copies of tile kt have landed
      fence_proxy_async();           // make them visible to the tensor cores (async proxy)
      __syncthreads();
      const uint32_t sa = smem_base + static_cast<uint32_t>((kt % kStages) * Shape::kStageBytes) +
                          static_cast<uint32_t>(warpgroup * 64 * kRowBytes);
      const uint32_t sb = smem_base + static_cast<uint32_t>((kt % kStages) * Shape::kStageBytes) +
                          Shape::kStageABytes;
      fence_registers(acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        wgmma_k16<kBF16, kBN>(acc, sw128_desc(sa + ks * 32), sw128_desc(sb + ks * 32));
      }
      wgmma_commit();
      wgmma_wait<1>();  // this warpgroup's wgmma of tile kt - 1 is done
      fence_registers(acc);
      // Refill the stage of tile kt - 2: every warpgroup finished it before this K step's barrier.
      load_stage(kt + kStages - 2);
    }
    wgmma_wait<0>();
    fence_registers(acc);

    // 4. Epilogue.
    const int lane = tid & 31;
    const int warp_in_group = (tid & 127) >> 5;
    const int row0 = m0 + warpgroup * 64 + warp_in_group * 16 + (lane >> 2);
    store_tile<T, kBN>(p, acc, expert, row0, row_end, n0, lane);
  }
}

// ---- host side -------------------------------------------------------------------------------

int div_up(int64_t a, int64_t b) {
  return static_cast<int>((a + b - 1) / b);
}

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

// W (E, n, k) as a 3-D tensor {k, n, E}; box {64, BN, 1}, 128-byte swizzle, zeros out of bounds.
template <typename T, typename Shape>
cudaError_t make_w_map(const GroupedGemmArgs& args, CUtensorMap* map) {
  const auto encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(args.k), static_cast<cuuint64_t>(args.n),
                              static_cast<cuuint64_t>(args.num_experts)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(args.k) * 2,
                                 static_cast<cuuint64_t>(args.n) * args.k * 2};
  const cuuint32_t box[3] = {kBK, Shape::kBN, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType dtype = std::is_same_v<T, __nv_bfloat16>
                                        ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult r =
      encode(map, dtype, 3, const_cast<void*>(args.w), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, typename Shape>
cudaError_t launch(const GroupedGemmArgs& args, const GroupedGemmParams& params,
                   cudaStream_t stream) {
  KernelParams p{};
  p.a = static_cast<const uint8_t*>(args.a);
  p.lda_bytes = args.lda * 2;
  p.gather_rows = args.gather_rows;
  p.w = static_cast<const uint8_t*>(args.w);
  p.bias = args.bias;
  p.c = static_cast<uint8_t*>(args.c);
  p.ldc_bytes = args.ldc * 2;
  p.expert_offsets = args.expert_offsets;
  p.expert_counts = args.expert_counts;
  p.batched_stride = static_cast<int>(args.batched_stride);
  p.num_experts = args.num_experts;
  p.n = args.n;
  p.k = args.k;
  p.n_tiles = div_up(args.n, Shape::kBN);
  p.k_tiles = div_up(args.k, kBK);
  p.bias_is_fp32 = args.bias_is_fp32;
  p.act = args.fused_act;
  p.has_clamp = args.has_clamp_limit;
  p.limit = args.clamp_limit;
  p.alpha = args.alpha;

  int device = 0;
  int sms = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess) {
    return e;
  }
  constexpr bool kSync = std::is_same_v<Shape, Tile64x64>;
  auto* kernel = [] {
    if constexpr (kSync) {
      return &grouped_gemm_sync_kernel<T, Shape>;
    } else {
      return &grouped_gemm_kernel<T, Shape>;
    }
  }();
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           Shape::kDynamicSmem);
      e != cudaSuccess) {
    return e;
  }
  // Upper bound on work items: every expert may end in a partial tile.
  const int64_t rows_ub =
      args.expert_counts != nullptr
          ? std::min<int64_t>(args.num_rows_upper_bound, args.batched_stride * args.num_experts)
          : args.num_rows_upper_bound;
  const int64_t items_ub =
      (rows_ub / Shape::kBM + std::min<int64_t>(args.num_experts, rows_ub)) * p.n_tiles;
  int64_t grid = static_cast<int64_t>(sms) * Shape::kMinBlocks;
  if (params.max_ctas > 0) grid = std::min<int64_t>(grid, params.max_ctas);
  grid = std::max<int64_t>(1, std::min(grid, items_ub));
  if constexpr (kSync) {
    kernel<<<static_cast<unsigned>(grid), Shape::kThreads, Shape::kDynamicSmem, stream>>>(p);
  } else {
    CUtensorMap w_map;
    if (cudaError_t e = make_w_map<T, Shape>(args, &w_map); e != cudaSuccess) return e;
    kernel<<<static_cast<unsigned>(grid), Shape::kThreads, Shape::kDynamicSmem, stream>>>(p, w_map);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_tile(const GroupedGemmArgs& args, const GroupedGemmParams& params,
                        GroupedGemmTile tile, cudaStream_t stream) {
  if (tile == GroupedGemmTile::k64x64) return launch<T, Tile64x64>(args, params, stream);
  return launch<T, Tile128x256>(args, params, stream);
}

std::string misaligned(const char* name, const void* ptr, int bytes) {
  if (reinterpret_cast<uintptr_t>(ptr) % bytes == 0) return "";
  return std::string(name) + " is not " + std::to_string(bytes) + "-byte aligned";
}

}  // namespace

std::string can_implement(const GroupedGemmArgs& args, const GroupedGemmParams& params) {
  using std::to_string;
  if (args.dtype != ElemType::kBF16 && args.dtype != ElemType::kF16) {
    return std::string("dtype ") + elem_type_name(args.dtype) + " is not bf16 or f16";
  }
  if (args.a == nullptr || args.w == nullptr || args.c == nullptr) return "a, w and c are required";
  if (args.num_experts < 1 || args.num_experts > kMaxExperts) {
    return "num_experts=" + to_string(args.num_experts) + " is not in [1, " +
           to_string(kMaxExperts) + "]";
  }
  if (args.n <= 0 || args.n % 8 != 0)
    return "n=" + to_string(args.n) + " is not a positive multiple of 8";
  if (args.k <= 0 || args.k % 8 != 0)
    return "k=" + to_string(args.k) + " is not a positive multiple of 8";
  if (args.lda < args.k || args.lda % 8 != 0) {
    return "lda=" + to_string(args.lda) +
           " is not a multiple of 8 that is >= k=" + to_string(args.k);
  }
  const bool fused = args.fused_act != FusedActivation::kNone;
  if (static_cast<int>(args.fused_act) < 0 ||
      static_cast<int>(args.fused_act) > static_cast<int>(FusedActivation::kRelu2Mul)) {
    return "fused_act is unknown";
  }
  if (fused && args.n % (2 * kFusedGateUpBlock) != 0) {
    return "n=" + to_string(args.n) +
           " is not a multiple of 64 (a fused activation needs whole 64-row gate/up blocks)";
  }
  if (fused) {
    const bool uses_limit = args.fused_act == FusedActivation::kSwigluOai ||
                            args.fused_act == FusedActivation::kSwigluStep ||
                            (args.fused_act == FusedActivation::kSiluMul && args.has_clamp_limit);
    if (uses_limit && !(args.clamp_limit > 0.0f)) return "clamp_limit must be > 0";
  }
  const int n_out = fused ? args.n / 2 : args.n;
  if (args.ldc < n_out || args.ldc % 2 != 0) {
    return "ldc=" + to_string(args.ldc) + " is not an even number >= " + (fused ? "n/2=" : "n=") +
           to_string(n_out);
  }
  if (auto why = misaligned("a", args.a, 16); !why.empty()) return why;
  if (auto why = misaligned("w", args.w, 16); !why.empty()) return why;
  if (auto why = misaligned("c", args.c, 4); !why.empty()) return why;
  if (args.bias != nullptr) {
    if (auto why = misaligned("bias", args.bias, args.bias_is_fp32 ? 8 : 2); !why.empty()) {
      return why;
    }
  }
  if (args.num_rows_upper_bound < 0 || args.num_rows_upper_bound > INT32_MAX) {
    return "num_rows_upper_bound=" + to_string(args.num_rows_upper_bound) + " is not in [0, 2^31)";
  }
  if (args.expert_counts != nullptr) {
    if (args.batched_stride <= 0 ||
        args.batched_stride * args.num_experts > static_cast<int64_t>(INT32_MAX)) {
      return "batched_stride=" + to_string(args.batched_stride) +
             " must be positive with num_experts * batched_stride < 2^31";
    }
  } else if (args.expert_offsets == nullptr) {
    return "expert_offsets (or expert_counts with batched_stride) is required";
  }
  if (params.max_ctas < 0) return "max_ctas=" + to_string(params.max_ctas) + " is negative";
  return "";
}

size_t get_workspace_size(const GroupedGemmArgs&, const GroupedGemmParams&) {
  return 0;
}

GroupedGemmTile select_grouped_gemm_tile(const GroupedGemmArgs& args, std::string* why) {
  const int64_t experts = std::max(1, args.num_experts);
  const int64_t rows_per_expert = (args.num_rows_upper_bound + experts - 1) / experts;
  // Measured on an H200 (bench/grouped_gemm_notes.md): 64x64 streams weights faster up to ~32
  // rows per expert; at 64 rows per expert 128x256 is already ~9% faster.
  const bool small = rows_per_expert < Tile64x64::kBM;
  if (why != nullptr) {
    *why = "rows per expert <= " + std::to_string(rows_per_expert) +
           (small ? " < 64: 64x64 (more CTAs, 2 per SM, less wasted MMA; weight streaming)"
                  : " >= 64: 128x256 (4x the reuse of each W and A tile)");
  }
  return small ? GroupedGemmTile::k64x64 : GroupedGemmTile::k128x256;
}

const char* grouped_gemm_tile_name(GroupedGemmTile tile) {
  switch (tile) {
    case GroupedGemmTile::k64x64:
      return "64x64";
    case GroupedGemmTile::k128x256:
      return "128x256";
    case GroupedGemmTile::kAuto:
      break;
  }
  return "auto";
}

void interleave_gate_up_rows(const void* src, void* dst, int64_t experts, int64_t n, int64_t k,
                             int elem_bytes, bool source_is_pairwise_interleaved) {
  static_assert(kFusedGateUpBlock == 32, "moekit::interleave_gate_up_blocks uses blocks of 32");
  if (src == nullptr || dst == nullptr || src == dst || experts < 0 || k <= 0 || elem_bytes <= 0 ||
      n <= 0 || n % (2 * kFusedGateUpBlock) != 0) {
    return;
  }
  // Rows as bytes: the library's one implementation of the layout does the reordering.
  const Shape shape = {experts, n, k * elem_bytes};
  const Tensor s = Tensor::from_blob(const_cast<void*>(src), shape, DType::kUInt8, Device::cpu());
  Tensor d = Tensor::from_blob(dst, shape, DType::kUInt8, Device::cpu());
  interleave_gate_up_blocks(d, s, source_is_pairwise_interleaved, Stream{});
}

void interleave_gate_up_bias(const void* src, void* dst, int64_t experts, int64_t n, int elem_bytes,
                             bool source_is_pairwise_interleaved) {
  interleave_gate_up_rows(src, dst, experts, n, 1, elem_bytes, source_is_pairwise_interleaved);
}

cudaError_t run_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream,
                             const GroupedGemmParams& params, void* /*workspace*/) {
  if (!can_implement(args, params).empty()) return cudaErrorInvalidValue;
  const GroupedGemmTile tile =
      params.tile == GroupedGemmTile::kAuto ? select_grouped_gemm_tile(args) : params.tile;
  if (args.dtype == ElemType::kBF16) return launch_tile<__nv_bfloat16>(args, params, tile, stream);
  return launch_tile<__half>(args, params, tile, stream);
}

}  // namespace moekit::cuda
