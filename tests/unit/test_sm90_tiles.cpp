// The Hopper grouped GEMM's tile table (src/experts/cuda/sm90/tiles.h) and MoEConfig::tile_config:
// plain data, checked without a GPU.
#include <gtest/gtest.h>

#include "core/cuda_seam.h"
#include "experts/cuda/sm90/tiles.h"
#include "experts/cuda/sm90_experts.h"
#include "moekit/experts/sm90_experts.h"
#include "testing.h"

namespace moekit {
namespace {

namespace sm90 = cuda::sm90;

TEST(Sm90Tiles, TableRowsAreFoundByName) {
  for (int i = 0; i < sm90::kNumTiles; ++i) {
    EXPECT_EQ(sm90::find_tile(sm90::kTileTable[i].name, sm90::kTileTable[i].family), i);
  }
  EXPECT_EQ(sm90::find_tile("16x64"), 0);
  EXPECT_EQ(sm90::find_tile("16x64tma"), 1);
  EXPECT_EQ(sm90::find_tile("1x64simt"), 2);
  EXPECT_EQ(sm90::find_tile("32x64"), 3);
  EXPECT_EQ(sm90::find_tile("64x64"), 4);
  EXPECT_EQ(sm90::find_tile("128x256"), 5);
  EXPECT_EQ(sm90::find_tile("256x128"), -1);
  EXPECT_EQ(sm90::find_tile("auto"), -1);
  EXPECT_EQ(sm90::tile_names(),
            "16x64, 16x64tma, 1x64simt, 32x64, 64x64, 128x256, 128x256epi, 128x256mc, 128x128, "
            "128x128pp");
  // The CUDA-core rows serve 16-bit and W4A16 only, 8 warps of 8 weight rows.
  EXPECT_EQ(sm90::tile_names(sm90::TileFamily::kW4A16), "1x64simt, 16x64, 64x64, 128x128");
  sm90::TileConfig simt_fp8 = sm90::kTileTable[sm90::find_tile("1x64simt")];
  EXPECT_TRUE(sm90::valid_tile(simt_fp8));
  simt_fp8.family = sm90::TileFamily::kFp8;
  EXPECT_FALSE(sm90::valid_tile(simt_fp8));
  sm90::TileConfig simt_wide = sm90::kTileTable[sm90::find_tile("1x64simt")];
  simt_wide.bn = 128;
  EXPECT_FALSE(sm90::valid_tile(simt_wide));
  simt_wide = sm90::kTileTable[sm90::find_tile("1x64simt")];
  simt_wide.consumers = 2;  // 8 warps of 8 rows: valid (measured slower, not in the table)
  EXPECT_TRUE(sm90::valid_tile(simt_wide));
  simt_wide.consumers = 3;  // 12 warps do not split 64 rows into gate / up halves
  EXPECT_FALSE(sm90::valid_tile(simt_wide));
  // The fp8 family has its own rows (a 64x64 of its own; its 128x256 promotes in 128-column
  // chunks, a row of its own too).
  EXPECT_EQ(sm90::kTileTable[sm90::find_tile("64x64", sm90::TileFamily::kFp8)].family,
            sm90::TileFamily::kFp8);
  EXPECT_NE(sm90::find_tile("128x256", sm90::TileFamily::kFp8), sm90::find_tile("128x256"));
  EXPECT_EQ(sm90::tile_names(sm90::TileFamily::kFp8),
            "16x64tma, 16x64, 64x64, 32x64, 64x128, 128x128, 128x256, 128x256mc");
  // fp8 without block scales keeps no temporary accumulator: its prefill row is 128x256.
  EXPECT_EQ(sm90::tile_names(sm90::TileFamily::kFp8Direct),
            "16x64tma, 16x64, 32x64, 64x64, 128x256, 128x256epi, 128x256mc, 128x128, "
            "128x128pp");
  // Ping-pong rows: a whole 128x128 item per consumer warpgroup, families without promotion,
  // one CTA per SM, no cluster.
  const sm90::TileConfig pp = sm90::kTileTable[sm90::find_tile("128x128pp")];
  EXPECT_TRUE(pp.pingpong);
  EXPECT_TRUE(sm90::valid_tile(pp));
  sm90::TileConfig bad_pp = pp;
  bad_pp.bn = 256;  // two 64x256 accumulators do not fit a consumer thread
  EXPECT_FALSE(sm90::valid_tile(bad_pp));
  bad_pp = pp;
  bad_pp.family = sm90::TileFamily::kFp8;  // block scales promote per K block
  EXPECT_FALSE(sm90::valid_tile(bad_pp));
  bad_pp = pp;
  bad_pp.cluster = 2;
  EXPECT_FALSE(sm90::valid_tile(bad_pp));
  bad_pp = pp;
  bad_pp.kind = sm90::MainloopKind::kSingleRole;
  EXPECT_FALSE(sm90::valid_tile(bad_pp));
  // 2-CTA clusters (W multicast): warp-specialized TMA rows of the TMA families only, halves of
  // W that are whole swizzle periods, one CTA per SM.
  const sm90::TileConfig mc = sm90::kTileTable[sm90::find_tile("128x256mc")];
  EXPECT_EQ(mc.cluster, 2);
  EXPECT_TRUE(sm90::valid_tile(mc));
  sm90::TileConfig bad_mc = mc;
  bad_mc.cluster = 4;
  EXPECT_FALSE(sm90::valid_tile(bad_mc));
  bad_mc = mc;
  bad_mc.bn = 192;
  EXPECT_FALSE(sm90::valid_tile(bad_mc));
  bad_mc = mc;
  bad_mc.kind = sm90::MainloopKind::kWarpSpecializedEpilogue;
  EXPECT_FALSE(sm90::valid_tile(bad_mc));
  bad_mc = mc;
  bad_mc.family = sm90::TileFamily::kW4A8;  // converted W: no TMA to multicast
  EXPECT_FALSE(sm90::valid_tile(bad_mc));
  EXPECT_EQ(sm90::kTileTable[sm90::find_tile("128x256")].cluster, 1);
  // 32 tokens per swap-AB item: 16-bit and fp8 (not W4A16, whose swap-AB converts W into
  // registers for 16 tokens), single-role loading only.
  sm90::TileConfig wide_swap = sm90::kTileTable[sm90::find_tile("32x64")];
  EXPECT_TRUE(sm90::valid_tile(wide_swap));
  wide_swap.family = sm90::TileFamily::kFp8;
  EXPECT_TRUE(sm90::valid_tile(wide_swap));
  wide_swap.family = sm90::TileFamily::kInt8;
  EXPECT_FALSE(sm90::valid_tile(wide_swap));
  wide_swap.family = sm90::TileFamily::kW4A16;
  EXPECT_FALSE(sm90::valid_tile(wide_swap));
  wide_swap = sm90::kTileTable[sm90::find_tile("32x64")];
  wide_swap.kind = sm90::MainloopKind::kSwapABTma;
  EXPECT_FALSE(sm90::valid_tile(wide_swap));
  EXPECT_NE(sm90::find_tile("64x64", sm90::TileFamily::kFp8Direct),
            sm90::find_tile("64x64", sm90::TileFamily::kFp8));
  // W4A8 converts in the producer warpgroup: only the producer kinds.
  EXPECT_EQ(sm90::tile_names(sm90::TileFamily::kW4A8), "16x64tma, 128x256, 256x128");
  // Two 64-row blocks per consumer warpgroup: W4A8's 256x128 only (128 accumulators).
  sm90::TileConfig two_blocks =
      sm90::kTileTable[sm90::find_tile("256x128", sm90::TileFamily::kW4A8)];
  EXPECT_TRUE(sm90::valid_tile(two_blocks));
  two_blocks.bn = 256;
  EXPECT_FALSE(sm90::valid_tile(two_blocks));
  two_blocks = sm90::kTileTable[sm90::find_tile("128x256", sm90::TileFamily::kFp8Direct)];
  two_blocks.bm = 256;
  two_blocks.bn = 128;
  EXPECT_FALSE(sm90::valid_tile(two_blocks));
  // The staged epilogue where the rings leave room: not W4A8's 6-stage 128x256, a 5-stage one.
  sm90::TileConfig w4a8_wide =
      sm90::kTileTable[sm90::find_tile("128x256", sm90::TileFamily::kW4A8)];
  EXPECT_FALSE(sm90::stages_epilogue(w4a8_wide));
  w4a8_wide.stages = 5;
  EXPECT_TRUE(sm90::stages_epilogue(w4a8_wide));

  EXPECT_EQ(sm90::tile_names(sm90::TileFamily::kW4A8Group), "16x64tma, 128x128");
  EXPECT_EQ(sm90::tile_names(sm90::TileFamily::kMxfp4A8), "16x64tma, 128x128");
  for (int i = 0; i < sm90::kNumTiles; ++i) {
    if (sm90::kTileTable[i].family != sm90::TileFamily::kW4A8 &&
        sm90::kTileTable[i].family != sm90::TileFamily::kW4A8Group &&
        sm90::kTileTable[i].family != sm90::TileFamily::kMxfp4A8) {
      continue;
    }
    EXPECT_TRUE(sm90::kTileTable[i].kind == sm90::MainloopKind::kSwapABTma ||
                sm90::kTileTable[i].kind == sm90::MainloopKind::kWarpSpecializedTma)
        << sm90::kTileTable[i].name;
  }
  sm90::TileConfig single_role_w4a8 = sm90::kTileTable[sm90::find_tile("64x64")];
  single_role_w4a8.family = sm90::TileFamily::kW4A8;
  EXPECT_FALSE(sm90::valid_tile(single_role_w4a8));
  single_role_w4a8.family = sm90::TileFamily::kW4A8Group;
  EXPECT_FALSE(sm90::valid_tile(single_role_w4a8));
  single_role_w4a8.family = sm90::TileFamily::kMxfp4A8;
  EXPECT_FALSE(sm90::valid_tile(single_role_w4a8));
  // Groups of 128: swap-AB up to 8 rows per expert, then the 128-wide prefill row.
  std::string why;
  EXPECT_EQ(sm90::select_tile(8, &why, sm90::TileFamily::kW4A8Group),
            sm90::find_tile("16x64tma", sm90::TileFamily::kW4A8Group));
  EXPECT_EQ(sm90::select_tile(9, &why, sm90::TileFamily::kW4A8Group),
            sm90::find_tile("128x128", sm90::TileFamily::kW4A8Group));
  EXPECT_TRUE(testing::contains_all(why, {"128x128", "group scales"})) << why;
}

// Selection by rows per expert, as measured (bench/grouped_gemm_notes.md): swap-AB up to 8 rows
// per expert, 32-token swap-AB up to 16 (16-bit and fp8 without block scales), then the 64x64
// decode tile below
// 64 rows per expert, from 64 on the prefill tile;
// W4A16 first runs the CUDA-core row at one row per expert (bf16's is tuned by name only).
TEST(Sm90Tiles, SelectionByRowsPerExpertGivesAReason) {
  std::string why;
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(1, &why, sm90::TileFamily::kW4A16)].name,
            std::string("1x64simt"));
  EXPECT_TRUE(testing::contains_all(why, {"rows per expert <= 1", "1x64simt", "CUDA-core"}));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(2, &why, sm90::TileFamily::kW4A16)].name,
            std::string("16x64"));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(0, &why)].name, std::string("16x64"));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(8, &why)].name, std::string("16x64"));
  EXPECT_TRUE(testing::contains_all(why, {"rows per expert <= 8", "16x64", "swap-AB"}));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(9, &why)].name, std::string("32x64"));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(16, &why)].name, std::string("32x64"));
  EXPECT_TRUE(testing::contains_all(why, {"rows per expert <= 16", "32x64", "read once"}));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(17, &why)].name, std::string("64x64"));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(63, &why)].name, std::string("64x64"));
  EXPECT_TRUE(testing::contains_all(why, {"rows per expert <= 63", "64x64", "weight streaming"}));
  EXPECT_EQ(sm90::kTileTable[sm90::select_tile(64, &why)].name, std::string("128x256"));
  EXPECT_TRUE(testing::contains_all(why, {"rows per expert <= 64", "128x256", "reuse"}));
  EXPECT_EQ(sm90::select_tile(int64_t{1} << 40), sm90::find_tile("128x256"));
  // Each family selects among its own rows only.
  const int fp8_small = sm90::select_tile(1, &why, sm90::TileFamily::kFp8);
  const int fp8_large = sm90::select_tile(int64_t{1} << 40, &why, sm90::TileFamily::kFp8);
  EXPECT_EQ(fp8_small, sm90::find_tile("16x64tma", sm90::TileFamily::kFp8));
  EXPECT_EQ(fp8_large, sm90::find_tile("128x256", sm90::TileFamily::kFp8));
  EXPECT_TRUE(testing::contains_all(why, {"128x256", "promoted 128 columns at a time"}));
  // fp8 with block scales keeps 64x64 from 9 rows: its 32x64 measured level there (forceable).
  EXPECT_EQ(sm90::select_tile(9, &why, sm90::TileFamily::kFp8),
            sm90::find_tile("64x64", sm90::TileFamily::kFp8));
  // fp8 decode runs swap-AB up to 8 rows per expert (weights as the wgmma's M), the loads from a
  // TMA producer warpgroup.
  EXPECT_EQ(sm90::select_tile(8, &why, sm90::TileFamily::kFp8Direct),
            sm90::find_tile("16x64tma", sm90::TileFamily::kFp8Direct));
  EXPECT_TRUE(testing::contains_all(why, {"16x64tma", "swap-AB", "TMA producer"}));
  EXPECT_EQ(sm90::select_tile(9, &why, sm90::TileFamily::kFp8Direct),
            sm90::find_tile("32x64", sm90::TileFamily::kFp8Direct));
  EXPECT_EQ(sm90::select_tile(17, &why, sm90::TileFamily::kFp8Direct),
            sm90::find_tile("64x64", sm90::TileFamily::kFp8Direct));
  EXPECT_EQ(sm90::select_tile(64, &why, sm90::TileFamily::kFp8Direct),
            sm90::find_tile("128x256", sm90::TileFamily::kFp8Direct));
  // W4A8: swap-AB up to 8 rows per expert, then 128x256, from 256 rows per expert 256x128.
  EXPECT_EQ(sm90::select_tile(8, &why, sm90::TileFamily::kW4A8),
            sm90::find_tile("16x64tma", sm90::TileFamily::kW4A8));
  EXPECT_TRUE(testing::contains_all(why, {"16x64tma", "packed weights in flight"}));
  EXPECT_EQ(sm90::select_tile(9, &why, sm90::TileFamily::kW4A8),
            sm90::find_tile("128x256", sm90::TileFamily::kW4A8));
  EXPECT_EQ(sm90::select_tile(255, &why, sm90::TileFamily::kW4A8),
            sm90::find_tile("128x256", sm90::TileFamily::kW4A8));
  EXPECT_EQ(sm90::select_tile(256, &why, sm90::TileFamily::kW4A8),
            sm90::find_tile("256x128", sm90::TileFamily::kW4A8));
  EXPECT_TRUE(testing::contains_all(why, {"256x128", "half the conversions"}));
}

// fp8 layers pick their family from the scales' group shapes, by the launch's own rule
// (cuda::tile_family_of): block scales on either operand promote, the others accumulate directly.
TEST(Sm90Tiles, Fp8FamilyFollowsTheScaleShapes) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA";
  const GroupShape block{128, 128}, group{1, 128};
  EXPECT_EQ(::moekit::sm90::fp8_tile_family(GroupShape::per_channel(), GroupShape::per_token()),
            sm90::TileFamily::kFp8Direct);
  EXPECT_EQ(::moekit::sm90::fp8_tile_family(GroupShape::per_tensor(), GroupShape::per_tensor()),
            sm90::TileFamily::kFp8Direct);
  EXPECT_EQ(::moekit::sm90::fp8_tile_family(block, group), sm90::TileFamily::kFp8);
  EXPECT_EQ(::moekit::sm90::fp8_tile_family(GroupShape::per_channel(), group),
            sm90::TileFamily::kFp8);
  EXPECT_EQ(::moekit::sm90::fp8_tile_family(block, GroupShape::per_token()),
            sm90::TileFamily::kFp8);
}

// A small layer the Hopper classes take: 8 experts, top-2, H = I = 64.
MoEConfig eight_experts() {
  MoEConfig moe;
  moe.num_experts = 8;
  moe.experts_per_token = 2;
  moe.hidden_dim = 64;
  moe.intermediate_size = 64;
  moe.num_local_experts = 8;
  moe.num_logical_experts = 8;
  return moe;
}

TEST(Sm90Tiles, UnknownTileConfigIsAnErrorListingTheValidNames) {
  if constexpr (!kCudaBuild)
    GTEST_SKIP() << "moekit was built without CUDA (the experts throw first)";
  MoEConfig moe = eight_experts();
  moe.tile_config = "96x96";
  const std::string msg =
      testing::error_of([&] { Sm90GroupedExperts e(moe, QuantConfig::unquantized()); });
  EXPECT_TRUE(testing::contains_all(
      msg, {"tile_config '96x96'",
            "auto, 16x64, 16x64tma, 1x64simt, 32x64, 64x64, 128x256, 128x256epi, 128x256mc, "
            "128x128, 128x128pp"}));
  moe.tile_config = "128x256";
  EXPECT_NO_THROW(Sm90GroupedExperts(moe, QuantConfig::unquantized()));
  moe.tile_config = "auto";
  EXPECT_NO_THROW(Sm90BatchedExperts(moe, QuantConfig::unquantized(), 16, 1));
}

// The Standard-format Hopper classes refuse the batched format's arguments by name, before any
// construction (so also without CUDA).
TEST(Sm90Tiles, StandardClassesRefuseBatchedArgumentsByName) {
  MoEConfig moe = eight_experts();
  for (const ExpertsClass* k : {&Sm90GroupedExperts::klass(), &Sm90Fp8Experts::klass(),
                                &Sm90Mxfp4Experts::klass(), &Sm90EpPeerExperts::klass()}) {
    const std::string msg =
        testing::error_of([&] { k->make(moe, QuantConfig::unquantized(), int64_t{16}, 1); });
    EXPECT_TRUE(testing::contains_all(
        msg, {k->name() + ":", "should only be set for the BatchedExperts activation format"}))
        << msg;
  }
}

}  // namespace
}  // namespace moekit
