// Mainloop building blocks of the grouped GEMMs: the tile shape a table row and an element size
// give, the shared-memory ring addressing (128-byte swizzled K-major rows), the A-row gather, and
// the wgmma K block. The mainloops themselves (e.g. experts/cuda/sm90_bf16_grouped_gemm.cu) are
// written from these pieces, the scheduler (scheduler.cuh) and the epilogues (epilogue.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "experts/cuda/sm90/ptx.cuh"
#include "experts/cuda/sm90/scheduler.cuh"
#include "experts/cuda/sm90/tiles.h"

namespace moekit::cuda::sm90 {

inline constexpr int kRowBytes = 128;    // bytes of one tile row in shared memory (one K stage)
inline constexpr int kSmemAlign = 1024;  // the 128-byte swizzle pattern repeats every 8 rows
inline constexpr int kChunkBytes = 16;   // one cp.async / one swizzle unit

// How a K step treats the tensor cores' accumulator (TileShape::kPromotion).
//   kNone: acc accumulates in the tensor cores over all of K (16-bit, int8, the kFp8Direct rows);
//     one wgmma group stays in flight across steps.
//   kOverlapped (fp8 block scales, bn <= 128): each K block goes into one of two temporaries, by
//     the step's parity; step kt's wgmma run while the temporary of step kt - 1 is promoted,
//     acc += sa(kt - 1) sw(kt - 1) tmp, so one wgmma group stays in flight as with kNone. acc and
//     the two temporaries take 3 * bn / 2 registers.
//   kChunked (fp8 block scales, bn = 256, where two full temporaries do not fit): one temporary of
//     128 columns; the K block is computed and promoted 128 columns at a time, the wgmma drained
//     before each promotion (the other consumer warpgroup's wgmma keep the tensor cores busy).
enum class Promotion : uint8_t { kNone, kOverlapped, kChunked };

// Row kTile of the table for elements of kElemBytes bytes. Every row of the shared-memory tiles is
// 128 bytes = kBK elements of K; a loading thread copies one 16-byte chunk column of kAPasses
// (kBPasses) rows, kRowsPerPass rows apart.
template <int kTile, int kElemBytes>
struct TileShape {
  static constexpr TileConfig kConfig = kTileTable[kTile];
  // A producer warpgroup loads (the kernel takes W's tensor map, used where kTma).
  static constexpr bool kProducer = kConfig.kind == MainloopKind::kWarpSpecializedTma ||
                                    kConfig.kind == MainloopKind::kWarpSpecializedEpilogue ||
                                    kConfig.kind == MainloopKind::kSwapABTma;
  // The producer warpgroup's last two warps run the epilogue from the handoff tile, the first two
  // load (kWarpSpecializedEpilogue).
  static constexpr bool kEpilogueWarps = kConfig.kind == MainloopKind::kWarpSpecializedEpilogue;
  static constexpr int kEpilogueThreads = kEpilogueWarps ? 64 : 0;
  // W4A8: the producer streams packed int4 W with the tokens and converts it (kConvertedTiles).
  // MXFP4 with e4m3 A (kMxfp4A8): the same rings, e2m1 codes converted with their group scales.
  static constexpr bool kPackedInt4 = kConfig.family == TileFamily::kW4A8 ||
                                      kConfig.family == TileFamily::kW4A8Group ||
                                      kConfig.family == TileFamily::kMxfp4A8;
  // W4A8 with groups of 128 along K: the producer copies each K step's kBN weight scales (f32)
  // beside the packed and the converted tiles (kScaleSlotBytes per slot, behind everything else),
  // and the consumers promote every step with them. kMxfp4A8: it copies each row's four e8m0
  // codes of the step (a word) and writes the row's reference scale (f32) beside the W tile.
  static constexpr bool kGroupScales =
      kConfig.family == TileFamily::kW4A8Group || kConfig.family == TileFamily::kMxfp4A8;
  static constexpr bool kMxScales = kConfig.family == TileFamily::kMxfp4A8;
  // W by TMA from the producer warpgroup.
  static constexpr bool kTma = kProducer && !kPackedInt4;
  // CTAs per cluster (TileConfig::cluster): each loads kTmaBoxN rows of every W tile, multicast.
  static constexpr int kCluster = kConfig.cluster;
  static constexpr int kTmaBoxN = kConfig.bn / kConfig.cluster;
  static constexpr int kBM = kConfig.bm;
  static constexpr int kBN = kConfig.bn;
  static constexpr int kStages = kConfig.stages;
  static constexpr int kMinBlocks = kConfig.min_blocks;
  static constexpr int kConsumers = kConfig.consumers;
  // Ping-pong consumers (TileConfig::pingpong): each warpgroup a whole item of its own, the two
  // taking the CTA's items in turn, their mainloops ordered one after the other.
  static constexpr bool kPingPong = kConfig.pingpong;
  // 64-row blocks of A per consumer warpgroup: 1, or 2 in the W4A8 row 256x128 and the ping-pong
  // rows (each step two wgmma groups on one W tile, an accumulator per block).
  static constexpr int kMBlocks = kPingPong                ? kBM / 64
                                  : kBM >= 64 * kConsumers ? kBM / (64 * kConsumers)
                                                           : 1;
  // Consumer warps reading each stage (its "empty" arrivals): one warpgroup's in the ping-pong
  // rows, every consumer warpgroup's otherwise.
  static constexpr int kStageReaderWarps = kPingPong ? 4 : kConsumers * 4;
  // fp8 block scales: each K stage promoted out of the tensor cores (KStep), overlapped with the
  // next stage's wgmma where two temporaries fit.
  // W4A8 groups: chunked (no room for two temporaries beside a converting producer).
  static constexpr Promotion kPromotion = kGroupScales                         ? Promotion::kChunked
                                          : kConfig.family != TileFamily::kFp8 ? Promotion::kNone
                                          : kBN <= 128 ? Promotion::kOverlapped
                                                       : Promotion::kChunked;
  static constexpr int kBK = kRowBytes / kElemBytes;            // K elements per stage
  static constexpr int kChunkElems = kChunkBytes / kElemBytes;  // K elements per 16-byte chunk
  static constexpr int kConsumerThreads = 128 * kConsumers;
  // Threads issuing cp.async.
  static constexpr int kLoaderThreads = kProducer ? 128 - kEpilogueThreads : kConsumerThreads;
  static constexpr int kThreads = kConsumerThreads + (kProducer ? 128 : 0);  // + the producer
  // W4A16: the ring holds W packed (32 bytes of e2m1 pairs per row and stage); single-role rows
  // convert each stage into one of three bf16 W tiles (kConvertedBytes) in front of the ring,
  // swap-AB rows into registers (A holds the item's tokens, bm rows of 128 bytes per stage).
  static constexpr bool kPackedW4 = kConfig.family == TileFamily::kW4A16;
  // The weights as the wgmma's M, the tokens as its N (W4A16: converted into registers).
  static constexpr bool kSwapAB =
      kConfig.kind == MainloopKind::kSwapAB || kConfig.kind == MainloopKind::kSwapABTma;
  // W4A8: three rings. A stage of the ring (kStages) holds only the tokens; the packed ring
  // (kPackedStages, private to the producer) 64 bytes of packed int4 per W row (128 elements of
  // K, kStageBBytes); the producer converts each packed step into one of kConvertedTiles e4m3 W
  // tiles (the converted ring, in front of the others) that the consumers read.
  static constexpr int kPackedRowBytes = kPackedInt4 ? kRowBytes / 2 : kRowBytes / 4;
  static constexpr int kConvertedTiles = kPackedInt4 ? (kSwapAB ? 4 : w4a8_converted_tiles(kConfig))
                                         : kSwapAB   ? 0
                                                     : 3;
  static constexpr int kPackedStages =
      kPackedInt4 ? (kSwapAB ? 9 : w4a8_packed_stages(kConfig)) : 0;
  static constexpr int kStageABytes = kBM * kRowBytes;
  static constexpr int kStageBBytes =
      kBN * (kPackedW4 || kPackedInt4 ? kPackedRowBytes : kRowBytes);
  static constexpr int kStageBytes = kPackedInt4 ? kStageABytes : kStageABytes + kStageBBytes;
  static constexpr int kConvertedBytes =
      kPackedW4 || kPackedInt4 ? kConvertedTiles * kBN * kRowBytes : 0;
  // The consumers' staging tiles of the staged epilogue, or the handoff tile of the epilogue
  // warpgroup, behind the rings.
  static constexpr bool kStagedEpilogue = stages_epilogue(kConfig);
  static constexpr int kEpilogueBytes = kEpilogueWarps    ? kHandoffBytes
                                        : kStagedEpilogue ? kConsumers * kStagedBytes
                                                          : 0;
  // CUDA-core rows: no ring, no shared memory beyond the scheduler's prefix (and L1 for A).
  static constexpr bool kSimt = kConfig.kind == MainloopKind::kSimt;
  static constexpr int kScaleSlotBytes = kGroupScales ? kBN * 4 : 0;
  static constexpr int kScaleBytes = (kConvertedTiles + kPackedStages) * kScaleSlotBytes;
  static constexpr int kDynamicSmem = kSimt ? 0
                                            : kConvertedBytes + kStages * kStageBytes +
                                                  kPackedStages * kStageBBytes + kEpilogueBytes +
                                                  kScaleBytes + kSmemAlign;
  static constexpr int kRowsPerPass = kLoaderThreads / (kRowBytes / kChunkBytes);
  static constexpr int kAPasses = kBM / kRowsPerPass;
  static constexpr int kBPasses = kBN / kRowsPerPass;  // single-role: W by cp.async too
  // One CTA per SM with 3 warpgroups: move registers from the producer to the consumers (not
  // where the producer converts W: its conversion keeps more registers live, and the consumers of
  // the direct K step fit the even split, 168 each, without spilling). A producer warpgroup
  // with epilogue warps keeps more: their activation and 16-byte chunks.
  // NOTE: a fourth warpgroup for the epilogue does not compile: with 512 threads ptxas gives
  // every instruction at most 128 registers whatever setmaxnreg raises, fewer than an m64n256
  // wgmma's 128 accumulators and descriptors need (C7602).
  static constexpr bool kRebalanceRegisters =
      kProducer && !kPackedInt4 && kMinBlocks == 1 && kConsumers == 2;
  // The CTA's warps start with the registers of the launch bound (65536 / 384, rounded down to 8:
  // 168) and only trade among themselves: setmaxnreg.inc waits until the decrements have freed
  // what it asks for, so the two counts must add up to exactly the launch's registers (with more,
  // the consumers wait forever).
  static constexpr int kLaunchRegisters = (65536 / kThreads) & ~7;
  static constexpr int kProducerRegisters = kEpilogueWarps ? 88 : 56;
  static constexpr int kConsumerRegisters = kEpilogueWarps ? 208 : 224;
  static_assert(kSimt || kAPasses * kRowsPerPass == kBM);
  static_assert(kDynamicSmem <= kRingBudgetBytes, "the rings fit the CTA's shared memory");
  static_assert(kSimt || (kStageBytes % kSmemAlign == 0 && kConvertedBytes % kSmemAlign == 0),
                "every stage starts on the swizzle period");
  static_assert(kSimt || !kPackedW4 || kConsumerThreads == 2 * kBN,
                "one thread per 32-value W group");
  static_assert(kSimt || kProducer || kBPasses * kRowsPerPass == kBN);
  static_assert(!kSimt || kThreads == 8 * 32 || kThreads == 16 * 32,
                "CUDA-core rows: 8 warps of 8 weight rows or 16 of 4");
  static_assert(!kPackedInt4 || (kBN * 4) % 128 == 0, "whole 16-byte packed chunks per thread");
  static_assert(!kRebalanceRegisters ||
                128 * kProducerRegisters + kConsumerThreads * kConsumerRegisters ==
                    kThreads * kLaunchRegisters);
  static_assert(!kEpilogueWarps || (kBM == 128 && kBN == 256 && kRebalanceRegisters),
                "the handoff tile is 128 x 256");
  static_assert(kSimt || kRowsPerPass % 8 == 0, "a loader's swizzle is the same in every pass");
};

// The ring's base: dynamic shared memory rounded up to the swizzle period.
__device__ __forceinline__ uint32_t ring_base(const void* smem_dynamic) {
  return (smem_u32(smem_dynamic) + (kSmemAlign - 1)) & ~static_cast<uint32_t>(kSmemAlign - 1);
}

// Swizzled byte offset of (row, chunk) in a tile of 128-byte rows: chunk ^= row % 8.
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes) + (static_cast<uint32_t>(chunk ^ (row & 7)) << 4);
}

// One K stage of the ring for one warpgroup: 4 wgmma of 32 bytes of K each, A rows
// [64 * warpgroup, +64) at sa, the kBN W rows at sb, committed as one wgmma group. With
// kOverwrite the stage's product replaces acc (the temporary of a block-scaled K block) instead of
// adding to it. Acc is T's accumulator type (float, or int32 for int8).
template <typename T, int kBN, bool kOverwrite = false>
__device__ __forceinline__ void mma_stage(typename MmaOperand<T>::Acc (&acc)[kBN / 2], uint32_t sa,
                                          uint32_t sb) {
  const uint64_t da = sw128_desc(sa);
  const uint64_t db = sw128_desc(sb);
  fence_registers(acc);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kRowBytes / kMmaKBytes; ++ks) {
    Wgmma<T, kBN>::run(acc, desc_advance(da, ks * kMmaKBytes), desc_advance(db, ks * kMmaKBytes),
                       kOverwrite && ks == 0 ? 0u : 1u);
  }
  wgmma_commit();
}

// for (kt = kt_begin; kt < kt_end; ++kt) body(kt, parity), the parity of kt - kt_begin a
// compile-time constant (std::integral_constant<int, 0 or 1>): the loop unrolled by two, so that a
// K step can keep state in one of two register sets by parity (KStep, Promotion::kOverlapped).
template <typename Body>
__device__ __forceinline__ void for_each_k_step_in(int kt_begin, int kt_end, Body&& body) {
  for (int kt = kt_begin; kt < kt_end; kt += 2) {
    body(kt, std::integral_constant<int, 0>{});
    if (kt + 1 < kt_end) body(kt + 1, std::integral_constant<int, 1>{});
  }
}
template <typename Body>
__device__ __forceinline__ void for_each_k_step(int k_tiles, Body&& body) {
  for_each_k_step_in(0, k_tiles, static_cast<Body&&>(body));
}

template <typename Acc, int kCount>
__device__ __forceinline__ void zero_accumulators(Acc (&acc)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    acc[i] = Acc{0};
}

}  // namespace moekit::cuda::sm90
