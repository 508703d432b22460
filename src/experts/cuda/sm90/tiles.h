// The tile table of the Hopper grouped GEMMs: every tile configuration the kernels are compiled
// for, as data. Each row belongs to one mainloop family (16-bit operands, fp8 with block-scale
// promotion, fp8 / int8 accumulated over all of K, packed MXFP4 W) and is instantiated once per
// element type of its family; auto-selection walks the rows of the problem's family in order and
// takes the first whose rows-per-expert bound holds (and whose shape constraints the problem
// meets, detail::tile_fits); MoEConfig::tile_config forces a row by name (names are unique within
// a family). Plain data, no CUDA headers.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <string_view>

namespace moekit::cuda::sm90 {

// The mainloop a tile runs.
enum class MainloopKind : uint8_t {
  // Every thread loads A and W with cp.async into the ring; one block barrier per K step; the
  // warpgroups compute 64 rows each. Faster at few rows per expert (decode).
  kSingleRole,
  // A producer warpgroup fills the ring (W by TMA, gathered A rows by cp.async) and signals
  // mbarriers; the consumer warpgroups compute and run the epilogue while it loads ahead.
  kWarpSpecializedTma,
  // kWarpSpecializedTma whose producer warpgroup also runs the epilogue (prefill): two of its
  // warps load, the other two take each finished tile from the consumers (scaled, + bias, rounded
  // to C's type; for the fused activation its gate and up columns) through a 64 KB handoff tile
  // in shared memory, apply the activation and store C while the consumers run the next item's
  // mainloop, so the tensor cores no longer wait for the epilogue. The ring gives up a stage to
  // make room.
  kWarpSpecializedEpilogue,
  // Swap-AB for a few rows per expert: the item's bn weight rows are the wgmma's M (W4A16:
  // converted from the packed ring into registers, k % 64 == 0; 16-bit and fp8: read from the
  // ring by descriptor, fp8 block scales promoted per weight row block and token), its bm tokens
  // the wgmma's N. One warpgroup per CTA, every thread loads.
  kSwapAB,
  // Swap-AB (16-bit and fp8) with a producer warpgroup: W by TMA (one 8 KB copy per K step), the
  // tokens by cp.async, both on the stage's mbarriers; the consumer warpgroup only computes, so
  // its stalls (barriers, epilogue, the next item's lookups) never stop the loads.
  kSwapABTma,
  // Dot products on the CUDA cores, no tensor cores (decode: one or two tokens per expert, where a
  // wgmma tile would be mostly padding and a work item a long serial chain of K steps): each warp
  // owns 8 weight rows of a 64-row block (the gate and up rows of 4 output columns in the fused
  // layout) for the item's bm tokens, its lanes stream the rows' K in 16-byte chunks (W4A16: one
  // 32-element group, converted in registers), a butterfly sums the lanes, and the warp stores
  // its outputs (bias, scales, fused activation) without a block barrier. Warps walk the work
  // items independently, 8 per item, so every SM streams weights even when few experts are hit.
  kSimt,
};

// The mainloop family a row serves.
enum class TileFamily : uint8_t {
  k16Bit,  // bf16 / f16 operands: one accumulator, one wgmma group kept in flight
  kFp8,    // e4m3 operands with block scales (1x128 A and / or 128x128 W): each 128-byte K block
           // into a temporary accumulator, then promoted into the fp32 accumulator with its block
           // scales (2x the accumulator registers, the wgmma drained every K block)
  kFp8Direct,  // e4m3 operands whose scales do not vary along K (per-tensor / per-row A,
               // per-expert / per-channel W): accumulated by the tensor cores over all of K like
               // the 16-bit rows, one wgmma group kept in flight, the scales applied once in the
               // epilogue (the fast accumulation of CUTLASS's FP8FastAccum kernels and of Triton's
               // fp8 dot on Hopper; its error is measured by GroupedGemmFp8 in
               // tests/gpu/test_grouped_gemm.cpp)
  kInt8,       // int8 operands: an exact int32 accumulator, one wgmma group kept in flight; the
               // per-tensor / per-row / per-channel scales applied once, in the epilogue
  kW4A16,      // MXFP4 weights (e2m1 + e8m0 per 32 of K, codes in the kernel nibble order) with
               // bf16 activations: the packed weights stream into the ring and are converted to
               // bf16 each K step, into registers (swap-AB) or shared memory (single-role)
  kW4A8,       // int4 weights (uint4b8 nibbles, per-channel / per-expert scales) with e4m3
               // activations: the producer warpgroup streams the packed weights (64 bytes per row
               // and K step) with the tokens into a load ring and converts each step exactly to
               // e4m3 into a ring of W tiles; the consumers run the kFp8Direct K step (the tensor
               // cores accumulate over all of K, the scales applied in the epilogue)
  kW4A8Group,  // int4 weights with a scale per output channel and 128 of K (WScale::kGroup128)
               // with e4m3 activations: kW4A8's converting producer, which also copies each K
               // step's weight scales beside the converted tile; the consumers promote every K
               // step (one scale group) out of the tensor cores with the scale of each weight row
               // (as kFp8's blocks, per row), the activations' scales in the epilogue
  kMxfp4A8,    // MXFP4 weights (e2m1 + e8m0 per 32 of K, the standard code order) with e4m3
               // activations: kW4A8Group's producer and consumers, the producer converting each
               // group to e4m3 with its scale relative to the row's step reference
               // (sm90/mx_e4m3.h) and writing the reference scales beside the converted tile
};

struct TileConfig {
  const char* name;  // table name: MoEConfig::tile_config, `moekit bench-kernels --tile`
  TileFamily family;
  int bm;          // rows of a work item: 64 per consumer warpgroup
  int bn;          // columns of a work item (the wgmma N)
  int stages;      // depth of the shared-memory ring; a stage holds 128 bytes of K
  int consumers;   // warpgroups computing (bm = 64 * consumers)
  int min_blocks;  // CTAs per SM the kernel is compiled for (__launch_bounds__)
  MainloopKind kind;
  int64_t max_rows_per_expert;  // auto-selection: chosen while rows per expert <= this
  const char* why;              // auto-selection's reason for this row
  // The warp-specialized kW4A8 rows' own rings (0: 2 converted W tiles, 3 packed stages): the
  // converted tiles let the producer run converted_tiles - 1 steps ahead of the consumers.
  int converted_tiles = 0;
  int packed_stages = 0;
  // CTAs per cluster along M (1 or 2): a cluster's CTAs take the m-tiles 2j and 2j + 1 of one
  // expert and n-tile together, each loading half of every W tile by TMA multicast into both, so
  // each SM reads half the weight bytes per K step from L2.
  int cluster = 1;
  // Ping-pong consumers (kWarpSpecializedTma, bm = bn = 128): each consumer warpgroup computes a
  // whole work item of its own (two 64-row blocks on the item's W tile), the two taking the CTA's
  // items in turn; their mainloops run one after the other (an order barrier passes the tensor
  // cores from one to the other), so one warpgroup's epilogue runs under the other's mainloop.
  bool pingpong = false;
};

// Measured on an H200 (bench/grouped_gemm_notes.md): 64x64 streams weights faster up to ~32 rows
// per expert; at 64 rows per expert 128x256 is already ~9% faster.
// fp8 block scales: 128x256 (one 128-column temporary, the wgmma drained before each chunk's
// promotion) measured 7-13% faster than 128x128 (whose accumulator and two temporaries, 192
// registers per consumer thread, let each K block's promotion overlap the next block's wgmma)
// at 64 to 2048 rows per expert (bench/results/2026-12-02-h200-fp8-block-promotion); 128x128 stays
// forceable by name, never auto-selected (64x64 comes first with its bound). Decode: the 64x128 TMA
// row (one CTA per SM, the producer loading across work items) measured no faster than 64x64
// (qwen3-30b-a3b fp8 block-128 M=64: 287 vs 275 us, bench/results/2026-12-01-h200-fp8); it stays
// forceable by name (never auto-selected: 64x64 comes first with the same bound).
// fp8 swap-AB (16 tokens x 64 weight rows): faster than 64x64 up to 8 rows per expert (deepseek-v3
// M=64 block-128 2413 vs 2710 us routed, qwen3-30b-a3b M=64 per-tensor 204 vs 231 us), slower at
// 16 (qwen3-30b-a3b M=256 block-128 332 vs 286 us, mixtral-8x7b M=64 486 vs 438 us: experts with
// more than 16 rows read their weights once per token block), bench/results/
// 2026-12-02-h200-fp8-swapab.
// 16-bit swap-AB: the fp8 row's kernel on bf16 / f16 (a stage is 64 elements of K, the same 8 KB
// of weights per step): faster than 64x64 up to 8 rows per expert (qwen3-30b-a3b M=64 308-311 vs
// 345 us, gpt-oss-120b M=64 1313-1317 vs 1409, deepseek-v3 M=64 4090-4101 vs 4253, mixtral-8x7b
// M=1 183 vs 206), split at 16 (qwen3-30b-a3b M=256 356-360 vs 365, mixtral-8x7b M=64 736-741 vs
// 694), bench/results/2026-12-03-h200-bf16-swapab.
// The TMA-producer swap-AB rows (16x64tma): for fp8 faster than 16x64 where work items are short
// (qwen3-30b-a3b block-128 M=16..256 5-12%, per-tensor 5-7%; deepseek-v3 block-128 2-5%), 1-2.5%
// slower on mixtral-8x7b per-tensor's long items: first in the fp8 families. For bf16 no faster
// (within +-2%, gpt-oss-120b M=1 80.0 vs 75.2 us): after 16x64, forceable and tuned by name.
// CUDA-core rows (1x64simt, one token per item; bench/results/2026-12-03-h200-simt): for W4A16 at
// one token per expert faster than swap-AB, whose items are long serial chains of converting K
// steps (gpt-oss-120b M=1 GEMM1 27.8 vs 34.4 us, GEMM2 19.2 vs 28.1; at M=16 16x64 wins, 310 vs
// 287): first in its family, and select_grouped_gemm_tile passes it by above E / 16 rows (where
// experts often get two rows, whose weights it reads twice). For bf16 level with 16x64 at M=1
// (gpt-oss-120b GEMM1 43.5 vs 44.0 us, qwen3-30b-a3b 22.3 vs 20.1) and slower at 16: after the
// swap-AB rows, tuned by name. The 8-warp form (8 weight rows per warp, 2 tokens) measured 30-45%
// slower than 16 warps of 4 rows: fewer warps in flight per SM.
// 32-token swap-AB (32x64, 16-bit and fp8; bench/results/
// 2026-12-04-h200-cursor-align, each tile forced): at 16 rows per expert, where 16x64 reads an
// expert's weights once per 16 tokens and 64x64's A half of each stage is mostly padding, faster
// than both (bf16 qwen3-30b-a3b M=256 328.5 vs 351.0 / 356.8 us, gpt-oss-120b M=512 1552 vs 1781
// / 1648, mixtral-8x7b M=64 680 vs 734 / 698; fp8 per-tensor qwen3-30b-a3b M=256 242.0 vs 254.1
// (16x64tma) / 255.2, mixtral-8x7b M=64 373.3 vs 398.3 / 384.3); level with 16x64 up to 8 rows;
// slower than 64x64 at 32 (qwen3-30b-a3b 376.3 vs 363.9, gpt-oss-120b 1831 vs 1697): chosen up
// to 16 rows per expert. With block scales (the promotion holds 8 tokens' scales per thread)
// level with 64x64 at 16 rows (qwen3-30b-a3b M=256 284.6 vs 284.3 us) and far slower than
// 16x64tma at 8 (269.6 vs 220.8): forceable and tuned by name, never auto-selected (64x64 comes
// first with a larger bound).
// Epilogue warps (128x256epi; bench/results/2026-12-04-h200-epilogue-warps): bitwise 128x256's
// output but slower at every prefill size (bf16 mixtral-8x7b M=16384 GEMM2 6255 vs 8820 us,
// qwen3-30b-a3b GEMM1 1671 vs 2037): the 64 threads left to gather A by cp.async cannot keep the
// ring full (128x256 with only 64 loaders: 20-37% slower), the lost stage costs 2-8%, and the
// overlap itself gains 2-6% on top of that. Forceable by name, never auto-selected (after
// 128x256). With the loaders' A sources in registers (2026-12-07, H100, bench/results/
// 2026-12-07-h100-fp8-producer) still no faster: fp8 per tensor level with 128x256 (median 0.996),
// bf16 5-12% slower.
// W4A8 prefill (bench/results/2026-12-07-h100-w4a8-rows, H100): 256x128 (two 64-row blocks per
// consumer warpgroup: each converted W tile serves 256 tokens) against 128x256 at M = 16384:
// mixtral-8x7b 16269 vs 17779 us, qwen3-30b-a3b 3353 vs 3549; level at 256 rows per expert
// (qwen3-30b-a3b M = 4096: 1156 vs 1155). Three converted tiles or the staged epilogue on 128x256
// gained at most 2.7% (rows not kept). Its consumers release each stage as soon as its wgmma
// complete: 2% faster than releasing it after the next step's issue (call3 there).
// 2-CTA cluster rows (128x256mc: W multicast into both CTAs' stages; bench/results/
// 2026-12-07-h100-clusters, H100): level with 128x256 at 8 or more m-tiles per expert (fp8 per
// tensor mixtral-8x7b M=16384 GEMM1 8144 vs 7930 us, bf16 layer 18940 vs 19078), 4-13% slower
// with fewer (qwen3-30b-a3b M=4096); the L2 measured 57% busy under 128x256, not its limit.
// Forceable by name, never auto-selected (after 128x256).
// 128x128 (cooperative) and 128x128pp (ping-pong: each consumer warpgroup a whole item, one's
// epilogue under the other's mainloop), 16-bit and K-invariant fp8 (bench/results/
// 2026-12-07-h100-pingpong, H100, mixtral-8x7b / qwen3-30b-a3b M = 4096 / 16384): both slower
// than 128x256, 128x128 by 11-22% (fp8 per tensor) / 16-34% (bf16), 128x128pp by 9-13% / 8-26%.
// The overlap buys GEMM1 3-11% over 128x128; 1.33x the L2 reads per FLOP cost GEMM2 14-30%.
// Forceable by name, never auto-selected (after 128x256).
inline constexpr TileConfig kTileTable[] = {
    {"16x64", TileFamily::k16Bit, 16, 64, 10, 1, 2, MainloopKind::kSwapAB, 8,
     "swap-AB: 64 weight rows x 16 tokens per item, every SM streaming weights"},
    {"16x64tma", TileFamily::k16Bit, 16, 64, 10, 1, 2, MainloopKind::kSwapABTma, 8,
     "swap-AB with a TMA producer warpgroup: the loads never wait for the consumers"},
    {"1x64simt", TileFamily::k16Bit, 1, 64, 1, 4, 2, MainloopKind::kSimt, 1,
     "CUDA-core dot products: 16 warps of 4 weight rows per item, one token"},
    {"32x64", TileFamily::k16Bit, 32, 64, 8, 1, 2, MainloopKind::kSwapAB, 16,
     "swap-AB: 64 weight rows x 32 tokens per item, each expert's weights read once"},
    {"64x64", TileFamily::k16Bit, 64, 64, 6, 1, 2, MainloopKind::kSingleRole, 63,
     "more CTAs, 2 per SM, less wasted MMA; weight streaming"},
    {"128x256", TileFamily::k16Bit, 128, 256, 4, 2, 1, MainloopKind::kWarpSpecializedTma, INT64_MAX,
     "4x the reuse of each W and A tile"},
    {"128x256epi", TileFamily::k16Bit, 128, 256, 3, 2, 1, MainloopKind::kWarpSpecializedEpilogue,
     INT64_MAX, "epilogue warps store each tile while the next one computes"},
    {"128x256mc", TileFamily::k16Bit, 128, 256, 4, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "2-CTA clusters: each W tile multicast to two m-tiles, half the L2 reads", 0, 0, 2},
    {"128x128", TileFamily::k16Bit, 128, 128, 6, 2, 1, MainloopKind::kWarpSpecializedTma, INT64_MAX,
     "6 stages of 32 KB; 1.33x the L2 reads per FLOP of 128x256"},
    {"128x128pp", TileFamily::k16Bit, 128, 128, 6, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "ping-pong: one warpgroup's epilogue under the other's mainloop", 0, 0, 1, true},
    {"16x64tma", TileFamily::kFp8, 16, 64, 10, 1, 2, MainloopKind::kSwapABTma, 8,
     "swap-AB with a TMA producer warpgroup: the loads never wait for the consumers"},
    {"16x64", TileFamily::kFp8, 16, 64, 10, 1, 2, MainloopKind::kSwapAB, 8,
     "swap-AB: 64 weight rows x 16 tokens per item, 8 weight rows promoted per thread and step"},
    {"64x64", TileFamily::kFp8, 64, 64, 6, 1, 2, MainloopKind::kSingleRole, 63,
     "more CTAs, 2 per SM; weight streaming"},
    {"32x64", TileFamily::kFp8, 32, 64, 8, 1, 2, MainloopKind::kSwapAB, 16,
     "swap-AB: 64 weight rows x 32 tokens per item, each expert's weights read once"},
    {"64x128", TileFamily::kFp8, 64, 128, 8, 1, 1, MainloopKind::kWarpSpecializedTma, 63,
     "weights by TMA, 8 stages, the producer running ahead across work items"},
    {"128x128", TileFamily::kFp8, 128, 128, 6, 2, 1, MainloopKind::kWarpSpecializedTma, 63,
     "each K block's promotion overlapped with the next block's wgmma"},
    {"128x256", TileFamily::kFp8, 128, 256, 4, 2, 1, MainloopKind::kWarpSpecializedTma, INT64_MAX,
     "2x the reuse of each A tile; each K block promoted 128 columns at a time"},
    {"128x256mc", TileFamily::kFp8, 128, 256, 4, 2, 1, MainloopKind::kWarpSpecializedTma, INT64_MAX,
     "2-CTA clusters: each W tile multicast to two m-tiles, half the L2 reads", 0, 0, 2},
    // fp8 with K-invariant scales: the int8 rows' shapes (no temporary accumulator, so 128x256
    // fits); a stage holds 128 elements of K.
    {"16x64tma", TileFamily::kFp8Direct, 16, 64, 10, 1, 2, MainloopKind::kSwapABTma, 8,
     "swap-AB with a TMA producer warpgroup: the loads never wait for the consumers"},
    {"16x64", TileFamily::kFp8Direct, 16, 64, 10, 1, 2, MainloopKind::kSwapAB, 8,
     "swap-AB: 64 weight rows x 16 tokens per item, every SM streaming weights"},
    {"32x64", TileFamily::kFp8Direct, 32, 64, 8, 1, 2, MainloopKind::kSwapAB, 16,
     "swap-AB: 64 weight rows x 32 tokens per item, each expert's weights read once"},
    {"64x64", TileFamily::kFp8Direct, 64, 64, 6, 1, 2, MainloopKind::kSingleRole, 63,
     "more CTAs, 2 per SM; weight streaming"},
    {"128x256", TileFamily::kFp8Direct, 128, 256, 4, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "4x the reuse of each W and A tile"},
    {"128x256epi", TileFamily::kFp8Direct, 128, 256, 3, 2, 1,
     MainloopKind::kWarpSpecializedEpilogue, INT64_MAX,
     "epilogue warps store each tile while the next one computes"},
    {"128x256mc", TileFamily::kFp8Direct, 128, 256, 4, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "2-CTA clusters: each W tile multicast to two m-tiles, half the L2 reads", 0, 0, 2},
    {"128x128", TileFamily::kFp8Direct, 128, 128, 6, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "6 stages of 32 KB; 1.33x the L2 reads per FLOP of 128x256"},
    {"128x128pp", TileFamily::kFp8Direct, 128, 128, 6, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "ping-pong: one warpgroup's epilogue under the other's mainloop", 0, 0, 1, true},
    // int8: the 16-bit rows' shapes (the int32 accumulator takes the registers of the fp32 one);
    // a stage holds 128 elements of K.
    {"64x64", TileFamily::kInt8, 64, 64, 6, 1, 2, MainloopKind::kSingleRole, 63,
     "more CTAs, 2 per SM; weight streaming"},
    {"128x256", TileFamily::kInt8, 128, 256, 4, 2, 1, MainloopKind::kWarpSpecializedTma, INT64_MAX,
     "4x the reuse of each W and A tile"},
    {"128x256epi", TileFamily::kInt8, 128, 256, 3, 2, 1, MainloopKind::kWarpSpecializedEpilogue,
     INT64_MAX, "epilogue warps store each tile while the next one computes"},
    // W4A16: swap-AB at a few rows per expert (16 tokens x 64 weight rows per item), then
    // single-role (every thread loads, converts its 32-value group and computes); a stage holds 64
    // elements of K: 128 bytes of A per row, 32 bytes of packed W per row.
    {"1x64simt", TileFamily::kW4A16, 1, 64, 1, 4, 1, MainloopKind::kSimt, 1,
     "CUDA-core dot products: 16 warps of 4 weight rows per item, each lane converting one "
     "32-value group per row and step"},
    {"16x64", TileFamily::kW4A16, 16, 64, 10, 1, 4, MainloopKind::kSwapAB, 16,
     "swap-AB: weights converted in registers, 4 CTAs per SM, 7 K steps in flight"},
    {"64x64", TileFamily::kW4A16, 64, 64, 8, 1, 2, MainloopKind::kSingleRole, 63,
     "more CTAs, 2 per SM, 6 K steps of packed weights in flight"},
    {"128x128", TileFamily::kW4A16, 128, 128, 8, 2, 1, MainloopKind::kSingleRole, INT64_MAX,
     "4x the reuse of each converted W tile"},
    // W4A8: the kFp8Direct rows' consumers behind a converting producer; `stages` is the depth of
    // the tokens' ring; the packed W ring (TileShape::kPackedStages: 9 and 3 steps, all but one in
    // flight) and the converted W ring (kConvertedTiles: 4 and 2) have their own depths.
    {"16x64tma", TileFamily::kW4A8, 16, 64, 14, 1, 2, MainloopKind::kSwapABTma, 8,
     "swap-AB: 64 weight rows x 16 tokens per item, 8 K steps of packed weights in flight"},
    {"128x256", TileFamily::kW4A8, 128, 256, 6, 2, 1, MainloopKind::kWarpSpecializedTma, 255,
     "4x the reuse of each converted W and A tile"},
    {"256x128", TileFamily::kW4A8, 256, 128, 4, 2, 1, MainloopKind::kWarpSpecializedTma, INT64_MAX,
     "256 tokens per converted W tile: half the conversions of 128x256 per token", 3, 2},
    // W4A8 with groups of 128: the kW4A8 rows' shapes, promoting each K step; the prefill row is
    // 128 wide (an accumulator and a 128-column temporary fit the 168 registers of a consumer
    // thread of a CTA whose producer converts: no register rebalancing).
    {"16x64tma", TileFamily::kW4A8Group, 16, 64, 14, 1, 2, MainloopKind::kSwapABTma, 8,
     "swap-AB: 64 weight rows x 16 tokens per item, each step promoted with its rows' scales"},
    {"128x128", TileFamily::kW4A8Group, 128, 128, 6, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "each K step promoted with its 128 columns' group scales"},
    // MXFP4 with e4m3 activations: the W4A8 group rows (each K step promoted with its rows'
    // reference scales).
    {"16x64tma", TileFamily::kMxfp4A8, 16, 64, 14, 1, 2, MainloopKind::kSwapABTma, 8,
     "swap-AB: 64 weight rows x 16 tokens per item, each step promoted with its rows' scales"},
    {"128x128", TileFamily::kMxfp4A8, 128, 128, 6, 2, 1, MainloopKind::kWarpSpecializedTma,
     INT64_MAX, "each K step promoted with its 128 columns' reference scales"},
};
inline constexpr int kNumTiles = static_cast<int>(sizeof(kTileTable) / sizeof(kTileTable[0]));

// NOTE: the rows the kernels assume of every table row; CUDA-core rows (kSimt) are 16-bit or W4A16,
// 1, 2 or 4 tokens x 64 weight rows, 8 or 16 warps (consumers = 2 or 4; stages unused); fp8 rows
// promote per 128 columns of K (one K stage) with one weight scale per 32 rows, and their bn is 64,
// 128 or 256; W4A8 rows have a producer warpgroup (swap-AB TMA or warp-specialized kinds); W4A16
// rows are single-role with one thread per 32-value weight group of a stage (2 bn threads); swap-AB
// rows (W4A16, 16-bit, fp8) are one warpgroup, 16 tokens (one cp.async per thread and stage; 32
// for the 16-bit and fp8 single-role swap-AB rows, two) x 64 weight rows, at least 6 stages (W4A16:
// an even number, two K steps per barrier); epilogue-warp rows are 128x256 with two consumer
// warpgroups and one CTA per SM (16-bit, fp8 without block scales, int8); 2-CTA cluster rows are
// warp-specialized TMA rows of a TMA family, bn a multiple of 128 (each CTA's half of W a whole
// number of swizzle periods), one CTA per SM.
constexpr bool valid_tile(const TileConfig& t) {
  if (t.pingpong) {  // each consumer warpgroup two 64-row blocks of its own item, no promotion
    return t.kind == MainloopKind::kWarpSpecializedTma && t.cluster == 1 &&
           (t.family == TileFamily::k16Bit || t.family == TileFamily::kFp8Direct ||
            t.family == TileFamily::kInt8) &&
           t.bm == 128 && t.bn == 128 && t.consumers == 2 && t.min_blocks == 1 && t.stages >= 3;
  }
  if (t.cluster != 1) {  // W multicast: warp-specialized rows that load W by TMA
    return t.cluster == 2 && t.kind == MainloopKind::kWarpSpecializedTma &&
           (t.family == TileFamily::k16Bit || t.family == TileFamily::kFp8 ||
            t.family == TileFamily::kFp8Direct || t.family == TileFamily::kInt8) &&
           t.bm == 64 * t.consumers && t.bn % 128 == 0 && t.min_blocks == 1 && t.stages >= 2;
  }
  if (t.kind == MainloopKind::kSimt) {
    return (t.family == TileFamily::k16Bit || t.family == TileFamily::kW4A16) &&
           (t.bm == 1 || t.bm == 2 || t.bm == 4) && t.bn == 64 &&
           (t.consumers == 2 || t.consumers == 4);
  }
  if ((t.family == TileFamily::kW4A8 || t.family == TileFamily::kW4A8Group ||
       t.family == TileFamily::kMxfp4A8) &&
      t.kind != MainloopKind::kSwapABTma && t.kind != MainloopKind::kWarpSpecializedTma) {
    return false;  // only the producer kinds convert
  }
  if (t.kind == MainloopKind::kWarpSpecializedEpilogue) {  // the handoff tile is 128 x 256
    return (t.family == TileFamily::k16Bit || t.family == TileFamily::kFp8Direct ||
            t.family == TileFamily::kInt8) &&
           t.bm == 128 && t.bn == 256 && t.consumers == 2 && t.min_blocks == 1 && t.stages >= 2;
  }
  if (t.kind == MainloopKind::kSwapABTma) {
    return t.family != TileFamily::kW4A16 && t.family != TileFamily::kInt8 && t.bm == 16 &&
           t.bn == 64 && t.consumers == 1 && t.stages >= 2;
  }
  if (t.kind == MainloopKind::kSwapAB) {
    return (t.family == TileFamily::kW4A16 || t.family == TileFamily::kFp8 ||
            t.family == TileFamily::kFp8Direct || t.family == TileFamily::k16Bit) &&
           (t.bm == 16 || (t.bm == 32 && t.family != TileFamily::kW4A16)) && t.bn == 64 &&
           t.consumers == 1 && t.stages >= 6 &&
           (t.family != TileFamily::kW4A16 || t.stages % 2 == 0);
  }
  if (t.family == TileFamily::kW4A8 && t.bm == 128 * t.consumers) {
    // Two 64-row blocks per consumer warpgroup (TileShape::kMBlocks): half the converted columns
    // per token of 128x256, the same 128 accumulators per thread.
    return t.kind == MainloopKind::kWarpSpecializedTma && t.consumers == 2 && t.bn == 128 &&
           t.min_blocks == 1 && t.stages >= 4;
  }
  return t.bm == 64 * t.consumers && t.stages >= 2 && t.bn % 64 == 0 && t.bn <= 256 &&
         (t.kind == MainloopKind::kWarpSpecializedTma || t.stages >= 3) &&
         (t.family != TileFamily::kFp8 || t.bn != 192) &&
         (t.family != TileFamily::kW4A16 ||
          (t.kind == MainloopKind::kSingleRole && t.bn == 64 * t.consumers));
}
constexpr bool valid_table() {
  for (int i = 0; i < kNumTiles; ++i) {
    if (!valid_tile(kTileTable[i])) return false;
    bool last_of_family = true;
    for (int j = i + 1; j < kNumTiles; ++j)
      last_of_family = last_of_family && kTileTable[j].family != kTileTable[i].family;
    if (last_of_family && kTileTable[i].max_rows_per_expert != INT64_MAX) return false;
  }
  return true;
}
static_assert(valid_table(),
              "every row: bm = 64 * consumers (W4A8 256x128: 128), bn a multiple of 64 up to 256 "
              "(64, 128 or 256 for fp8, 64 * consumers for W4A16), stages >= 3 for single-role "
              "rows (swap-AB: 16x64 or "
              "16-bit / fp8 32x64, one warpgroup, >= 6 stages, even for W4A16; epilogue "
              "warps: 128x256, 16-bit, fp8 direct or int8); the last row of a family takes "
              "any size");

inline constexpr int kStagedCols = 64;                     // columns per round
inline constexpr int kStagedPitch = kStagedCols * 2 + 16;  // bytes per staged row (16-bit C)
inline constexpr int kStagedBytes = 64 * kStagedPitch;     // one warpgroup's staging tile
// The dynamic shared memory a CTA may hold (227 KB on sm_90), less what the kernels keep static
// (the scheduler's prefix, the producer's row offsets, barriers: 4.1 KB in the W4A8 rows): 5 KB.
inline constexpr int kRingBudgetBytes = 227 * 1024 - 5 * 1024;

// The kW4A8 warp-specialized rows' three rings (tiles of 128 bytes per row: the tokens' stages,
// the converted W tiles, the packed stages at 64 bytes per row), with the defaults of TileConfig.
constexpr int w4a8_converted_tiles(const TileConfig& t) {
  return t.converted_tiles != 0 ? t.converted_tiles : 2;
}
constexpr int w4a8_packed_stages(const TileConfig& t) {
  return t.packed_stages != 0 ? t.packed_stages : 3;
}
constexpr int w4a8_ring_bytes(const TileConfig& t) {
  return (t.stages * t.bm + w4a8_converted_tiles(t) * t.bn) * 128 +
         w4a8_packed_stages(t) * t.bn * 64;
}

// Rows whose plain epilogue (no fused activation) goes through shared memory (sm90/epilogue.cuh,
// store_warpgroup_tile_staged): the 128x256 warp-specialized rows whose rings leave room for two
// staging tiles (kW4A8: where its three rings do).
constexpr bool stages_epilogue(const TileConfig& t) {
  return t.kind == MainloopKind::kWarpSpecializedTma && t.bn == 256 && t.consumers == 2 &&
         (t.family != TileFamily::kW4A8 ||
          w4a8_ring_bytes(t) + 2 * kStagedBytes + 1024 <= kRingBudgetBytes);
}

// The handoff tile of the epilogue-warp rows (kWarpSpecializedEpilogue): the 128 x 256 tile
// as 16-bit values, rows of 512 bytes + 16 of padding (a consumer warp's store of 8 rows x 4 words
// hits 32 banks).
inline constexpr int kHandoffPitch = 256 * 2 + 16;
inline constexpr int kHandoffBytes = 128 * kHandoffPitch;

// Rows that can walk their work as stream-K units (GroupedGemmParams::stream_k): the swap-AB rows
// of the 16-bit and fp8 families (swapab_kernel).
constexpr bool stream_k_capable(const TileConfig& t) {
  return t.kind == MainloopKind::kSwapAB && t.family != TileFamily::kW4A16;
}
// fp32 partial-sum floats per CTA slot of the largest such row: 128 threads x bm / 2.
constexpr int stream_k_slot_floats() {
  int floats = 0;
  for (const TileConfig& t : kTileTable) {
    if (stream_k_capable(t)) floats = floats > 64 * t.bm ? floats : 64 * t.bm;
  }
  return floats;
}
// CTAs per SM of the stream-K rows (the grid the workspace's slots are sized for).
constexpr int stream_k_max_blocks() {
  int blocks = 0;
  for (const TileConfig& t : kTileTable) {
    if (stream_k_capable(t)) blocks = blocks > t.min_blocks ? blocks : t.min_blocks;
  }
  return blocks;
}

// The row of `family` named `name`, or -1.
constexpr int find_tile(std::string_view name, TileFamily family = TileFamily::k16Bit) {
  for (int i = 0; i < kNumTiles; ++i) {
    if (kTileTable[i].family == family && name == kTileTable[i].name) return i;
  }
  return -1;
}

// "64x64, 128x256": the names a forced tile of `family` may take.
inline std::string tile_names(TileFamily family = TileFamily::k16Bit) {
  std::string s;
  for (const TileConfig& t : kTileTable) {
    if (t.family == family) s += (s.empty() ? "" : ", ") + std::string(t.name);
  }
  return s;
}

// The row of `family` auto-selection picks for a problem of `rows_per_expert` (the rows bound over
// the experts, rounded up), with the reason in *why when non-null.
inline int select_tile(int64_t rows_per_expert, std::string* why = nullptr,
                       TileFamily family = TileFamily::k16Bit) {
  int i = 0;
  while (kTileTable[i].family != family || rows_per_expert > kTileTable[i].max_rows_per_expert)
    ++i;
  if (why != nullptr) {
    const TileConfig& t = kTileTable[i];
    *why = "rows per expert <= " + std::to_string(rows_per_expert) + ": " + t.name + " (" +
           (t.max_rows_per_expert == INT64_MAX
                ? std::string("above every smaller tile's bound")
                : "up to " + std::to_string(t.max_rows_per_expert) + " rows per expert") +
           "; " + t.why + ")";
  }
  return i;
}

}  // namespace moekit::cuda::sm90
