// Hopper (sm_90a) PTX wrappers of the kernel kit: shared-memory addresses, cp.async, mbarrier, TMA,
// fences, named barriers, setmaxnreg, and wgmma for bf16, f16, fp8 (e4m3, e5m2) and int8 operands.
//
// Shared-memory matrix layouts (K-major, both operands):
//   * 128-byte swizzle (the GEMM mainloops): rows of 128 bytes, 16-byte chunk c of row r stored at
//     chunk c ^ (r % 8); 8-row groups 1024 bytes apart. sw128_desc(row 0 of the tile + k bytes).
//   * no swizzle (the probes of ../shared/probes): core matrices of 8 rows x 16 bytes stored
//     contiguously; leading byte offset = the next core matrix along K, stride byte offset = the
//     next 8-row group. interleave_desc(tile, lbo, sbo).
// Every wgmma here consumes 32 bytes of K: k16 for the 2-byte types, k32 for the 1-byte ones.
// Accumulator fragment of m64nN (per thread, N / 2 values): warp w of the warpgroup owns rows
// 16w .. 16w + 15; acc[4j + 2h + {0, 1}] is (row 16w + lane / 4 + 8h, column 8j + (lane % 4) * 2 +
// {0, 1}).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

namespace moekit::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes of registers to shared memory at a shared-window address.
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint32_t (&v)[4]) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v[0]), "r"(v[1]),
               "r"(v[2]), "r"(v[3])
               : "memory");
}

// A pair of 16-bit values (any 4-byte type) to shared memory.
template <typename Pair2>
__device__ __forceinline__ void st_shared_pair(uint32_t addr, const Pair2& v) {
  static_assert(sizeof(Pair2) == 4);
  uint32_t bits;
  memcpy(&bits, &v, 4);
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(bits) : "memory");
}

// 16 bytes of shared memory at a shared-window address to registers.
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// prmt.b32 in its default mode with the selector nibbles' bit 3 honoured: where it is set, the
// selected byte's sign bit spread over the result byte (__byte_perm's documented selectors are
// 0..7). Not volatile: the compiler may schedule it.
__device__ __forceinline__ uint32_t prmt_sign(uint32_t lo, uint32_t hi, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(lo), "r"(hi), "r"(selector));
  return d;
}

// A value the compiler must keep in a register (it cannot fold or rematerialize it as an
// immediate): table words that byte permutes read in a loop.
__device__ __forceinline__ uint32_t opaque_u32(uint32_t v) {
  asm volatile("" : "+r"(v));
  return v;
}

// One 32-bit word of shared memory at a shared-window address, and its store.
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// One / two f32 of shared memory at a shared-window address (8-byte aligned for the pair).
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

// ---- cp.async -----------------------------------------------------------------------------------

// 16 bytes global -> shared; pred false zero-fills the 16 bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
// 4 bytes global -> shared (through L1), zero-filled when pred is false.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool pred) {
  const int src_bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Arrives on the barrier once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// ---- fences and barriers ------------------------------------------------------------------------

// Generic-proxy writes to shared memory (st.shared, cp.async) become visible to the async proxy
// (wgmma, TMA).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- mbarrier -----------------------------------------------------------------------------------

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

// ---- 2-CTA clusters (TileConfig::cluster) -------------------------------------------------------

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// The shared::cluster address of `bar` (this CTA's shared::cta address) in CTA `rank`'s memory.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(addr), "r"(rank));
  return mapped;
}
// Arrives on a barrier of any CTA of the cluster (a shared::cluster address from cluster_map),
// with the default semantics (.release at CTA scope): the consumers release a stage after
// wgmma_wait completed their reads of it, and the barrier alone orders the other CTA's refill
// after that. Release / acquire at cluster scope on every K step measured 1.7x slower
// (bench/results/2026-12-07-h100-clusters).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// The barriers' initialisation, visible to the cluster's other CTAs (before cluster_sync).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Every thread of every CTA of the cluster (a thread-level barrier: warps may diverge).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// ---- TMA ----------------------------------------------------------------------------------------

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

// tma_load_3d into the same offset of every CTA in cta_mask, completing its bytes on the barrier
// at the same offset in each.
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map,
                                                      uint32_t bar, int c0, int c1, int c2,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
}

// ---- register reallocation ----------------------------------------------------------------------

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- wgmma --------------------------------------------------------------------------------------

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
template <int kCount>
__device__ __forceinline__ void fence_registers(int32_t (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    asm volatile("" : "+r"(d[i])::"memory");
}
// The registers of a wgmma's A operand (register form), kept live and unmoved until here.
template <int kSteps>
__device__ __forceinline__ void fence_registers(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      asm volatile("" : "+r"(a[s][i])::"memory");
  }
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
// The descriptor of the matrix `bytes` further along K (a multiple of 16) than `desc`'s: its
// start-address field (bits 0-13, address / 16) advanced. Shared-memory addresses stay below 228
// KB, so the field of any address in the tile plus the offset cannot carry into bit 14.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}
// Shared-memory matrix descriptor without swizzle: core matrices of 8 rows x 16 bytes, `lbo` bytes
// to the next one along K, `sbo` bytes to the next 8-row group (the probes: lbo 128, sbo 256).
__device__ __forceinline__ uint64_t interleave_desc(uint32_t smem_addr, uint32_t lbo,
                                                    uint32_t sbo) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16;
  d |= static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32;
  return d;
}

// The operand types of wgmma and their accumulators: Acc is float (bf16, f16, e4m3, e5m2) or int32
// (int8); kK elements of K per instruction = 32 bytes.
template <typename T>
struct MmaOperand;
template <>
struct MmaOperand<__nv_bfloat16> {
  using Acc = float;
  static constexpr int kK = 16;
};
template <>
struct MmaOperand<__half> {
  using Acc = float;
  static constexpr int kK = 16;
};
template <>
struct MmaOperand<__nv_fp8_e4m3> {
  using Acc = float;
  static constexpr int kK = 32;
};
template <>
struct MmaOperand<__nv_fp8_e5m2> {
  using Acc = float;
  static constexpr int kK = 32;
};
template <>
struct MmaOperand<int8_t> {
  using Acc = int32_t;
  static constexpr int kK = 32;
};
inline constexpr int kMmaKBytes = 32;  // bytes of K one wgmma consumes, every operand type

// Wgmma<T, N>::run(d, desc_a, desc_b[, accumulate]): d (64 x N fragment) += A (64 x 32 bytes) *
// B^T (N x 32 bytes), both K-major in shared memory; with accumulate = 0, d = A * B^T (the old d is
// not read: the first wgmma of a block-scaled K block needs no zeroing). N is 8, 16, 32, 64, 128
// or 256 (16 and 32: the swap-AB rows' token tiles).
template <typename T, int N>
struct Wgmma;

#define MOEKIT_WGMMA_F8(i)                                                                    \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define MOEKIT_WGMMA_I8(i)                                                                    \
  "+r"(d[i]), "+r"(d[i + 1]), "+r"(d[i + 2]), "+r"(d[i + 3]), "+r"(d[i + 4]), "+r"(d[i + 5]), \
      "+r"(d[i + 6]), "+r"(d[i + 7])
#define MOEKIT_WGMMA_OUT8(R) R(0)
#define MOEKIT_WGMMA_OUT16(R) R(0), R(8)
#define MOEKIT_WGMMA_OUT32(R) R(0), R(8), R(16), R(24)
#define MOEKIT_WGMMA_OUT64(R) MOEKIT_WGMMA_OUT32(R), R(32), R(40), R(48), R(56)
#define MOEKIT_WGMMA_OUT128(R) \
  MOEKIT_WGMMA_OUT64(R), R(64), R(72), R(80), R(88), R(96), R(104), R(112), R(120)
#define MOEKIT_WGMMA_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define MOEKIT_WGMMA_R32                                                                  \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
  "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MOEKIT_WGMMA_R64_HI                                                               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MOEKIT_WGMMA_R128_HI                                                                     \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "             \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "             \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// Registers and the two descriptor operands of each N.
#define MOEKIT_WGMMA_ARGS8 "{%0, %1, %2, %3}, %4, %5"
#define MOEKIT_WGMMA_ARGS16 "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9"
#define MOEKIT_WGMMA_ARGS32 "{" MOEKIT_WGMMA_R16 "}, %16, %17"
#define MOEKIT_WGMMA_ARGS64 "{" MOEKIT_WGMMA_R32 "}, %32, %33"
#define MOEKIT_WGMMA_ARGS128 "{" MOEKIT_WGMMA_R32 ", " MOEKIT_WGMMA_R64_HI "}, %64, %65"
#define MOEKIT_WGMMA_ARGS256 \
  "{" MOEKIT_WGMMA_R32 ", " MOEKIT_WGMMA_R64_HI ", " MOEKIT_WGMMA_R128_HI "}, %128, %129"
#define MOEKIT_WGMMA_OUTS8(R) MOEKIT_WGMMA_OUT4_##R
#define MOEKIT_WGMMA_OUT4_F "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define MOEKIT_WGMMA_OUT4_I "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])

// One specialization: T, N, the PTX shape.types, the operand trailer after the scale-d predicate
// (imm-scale-a, imm-scale-b[, tnsp-a, tnsp-b]), the register/descriptor list, the operand number
// of `accumulate` (after the N/2 outputs and the two descriptors), the outputs.
#define MOEKIT_WGMMA_SPEC(T, N, SHAPE_TYPES, TRAILER, ARGS, SCALE_D, OUTS)                        \
  template <>                                                                                     \
  struct Wgmma<T, N> {                                                                            \
    using Acc = MmaOperand<T>::Acc;                                                               \
    static __device__ __forceinline__ void run(Acc (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, \
                                               uint32_t accumulate = 1) {                         \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE_D                                    \
                   ", 0;\n"                                                                       \
                   "wgmma.mma_async.sync.aligned." SHAPE_TYPES " " ARGS ", p" TRAILER ";\n}\n"    \
                   : OUTS                                                                         \
                   : "l"(desc_a), "l"(desc_b), "r"(accumulate));                                  \
    }                                                                                             \
  };
#define MOEKIT_WGMMA_ALL_N(T, K, TYPES, TRAILER, R)                                       \
  MOEKIT_WGMMA_SPEC(T, 8, "m64n8" K "." TYPES, TRAILER, MOEKIT_WGMMA_ARGS8, "%6",         \
                    MOEKIT_WGMMA_OUTS8(R))                                                \
  MOEKIT_WGMMA_SPEC(T, 16, "m64n16" K "." TYPES, TRAILER, MOEKIT_WGMMA_ARGS16, "%10",     \
                    MOEKIT_WGMMA_OUT8(MOEKIT_WGMMA_##R##8))                               \
  MOEKIT_WGMMA_SPEC(T, 32, "m64n32" K "." TYPES, TRAILER, MOEKIT_WGMMA_ARGS32, "%18",     \
                    MOEKIT_WGMMA_OUT16(MOEKIT_WGMMA_##R##8))                              \
  MOEKIT_WGMMA_SPEC(T, 64, "m64n64" K "." TYPES, TRAILER, MOEKIT_WGMMA_ARGS64, "%34",     \
                    MOEKIT_WGMMA_OUT32(MOEKIT_WGMMA_##R##8))                              \
  MOEKIT_WGMMA_SPEC(T, 128, "m64n128" K "." TYPES, TRAILER, MOEKIT_WGMMA_ARGS128, "%66",  \
                    MOEKIT_WGMMA_OUT64(MOEKIT_WGMMA_##R##8))                              \
  MOEKIT_WGMMA_SPEC(T, 256, "m64n256" K "." TYPES, TRAILER, MOEKIT_WGMMA_ARGS256, "%130", \
                    MOEKIT_WGMMA_OUT128(MOEKIT_WGMMA_##R##8))

MOEKIT_WGMMA_ALL_N(__nv_bfloat16, "k16", "f32.bf16.bf16", ", 1, 1, 0, 0", F)
MOEKIT_WGMMA_ALL_N(__half, "k16", "f32.f16.f16", ", 1, 1, 0, 0", F)
MOEKIT_WGMMA_ALL_N(__nv_fp8_e4m3, "k32", "f32.e4m3.e4m3", ", 1, 1", F)
MOEKIT_WGMMA_ALL_N(__nv_fp8_e5m2, "k32", "f32.e5m2.e5m2", ", 1, 1", F)
MOEKIT_WGMMA_ALL_N(int8_t, "k32", "s32.s8.s8", "", I)

// d (64 x 16 fragment) += A (64 x 16 bf16, registers: the m64k16 A fragment, a[0] = (row, k..k+1),
// a[1] = (row + 8, k..k+1), a[2] = (row, k+8..k+9), a[3] = (row + 8, k+8..k+9) with row = 16 *
// warp + lane / 4 and k = 2 * (lane % 4)) * B^T (16 x 16 bf16, K-major in shared memory). A's
// registers must not change until the wgmma group has completed.
__device__ __forceinline__ void wgmma_bf16_m64n16_rs(float (&d)[8], const uint32_t (&a)[4],
                                                     uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

#undef MOEKIT_WGMMA_ALL_N
#undef MOEKIT_WGMMA_SPEC
#undef MOEKIT_WGMMA_OUT4_I
#undef MOEKIT_WGMMA_OUT4_F
#undef MOEKIT_WGMMA_OUTS8
#undef MOEKIT_WGMMA_ARGS256
#undef MOEKIT_WGMMA_ARGS128
#undef MOEKIT_WGMMA_ARGS64
#undef MOEKIT_WGMMA_ARGS16
#undef MOEKIT_WGMMA_ARGS8
#undef MOEKIT_WGMMA_R128_HI
#undef MOEKIT_WGMMA_R64_HI
#undef MOEKIT_WGMMA_R32
#undef MOEKIT_WGMMA_OUT128
#undef MOEKIT_WGMMA_OUT64
#undef MOEKIT_WGMMA_OUT32
#undef MOEKIT_WGMMA_OUT8
#undef MOEKIT_WGMMA_I8
#undef MOEKIT_WGMMA_F8

}  // namespace moekit::cuda::sm90
