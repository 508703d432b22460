// The tuned tile tables of the Hopper grouped GEMMs (src/experts/cuda/sm90/tile_tables.h): the file
// format and its errors, the nearest-M lookup, overriding by $MOEKIT_TILE_TABLES, the experts'
// per-launch rows and `moekit explain`'s notes. Plain host code, checked without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "core/cuda_seam.h"
#include "experts/cuda/sm90/tile_tables.h"
#include "experts/cuda/sm90_experts.h"
#include "moekit/layer/moe_layer.h"
#include "moekit/layer/presets.h"
#include "moekit/oracle/plan.h"
#include "previewed_h200.h"
#include "testing.h"

namespace moekit {
namespace {

namespace sm90 = cuda::sm90;
using testing::contains_all;
using testing::error_of;

// A table of one GEMM (16-bit rows, E=8, n=512, k=256) tuned at m = 1, 64 and 1024.
std::string table_text(const std::string& device = "NVIDIA H200",
                       const std::string& tile_at_1024 = "128x256") {
  return R"({"format": "moekit-tile-table-1", "device": ")" + device + R"(", "entries": [
    {"family": "16bit", "gemm": "gemm1", "experts": 8, "n": 512, "k": 256, "m": 1,
     "tile": "64x64", "us": 10.5, "candidates": {"64x64": 10.5, "128x256": 14.0}},
    {"family": "16bit", "gemm": "gemm1", "experts": 8, "n": 512, "k": 256, "m": 64,
     "tile": "128x256", "us": 20.0},
    {"family": "16bit", "gemm": "gemm1", "experts": 8, "n": 512, "k": 256, "m": 1024,
     "tile": ")" +
         tile_at_1024 + R"(", "us": 90.0}]})";
}

const sm90::GemmShapeKey kKey{sm90::TileFamily::k16Bit, 8, 512, 256};

TEST(Sm90TileTables, NearestTunedBatchSizeInLog2) {
  const sm90::TileTables t = sm90::TileTables::parse(table_text(), "t.json");
  ASSERT_EQ(t.entries().size(), 3u);
  auto tuned_m = [&](int64_t m) {
    const sm90::TunedTile* e = t.find("NVIDIA H200", kKey, m);
    return e == nullptr ? int64_t{-1} : e->m;
  };
  EXPECT_EQ(tuned_m(1), 1);
  EXPECT_EQ(tuned_m(0), 1);
  EXPECT_EQ(tuned_m(2), 1);
  EXPECT_EQ(tuned_m(32), 64);
  EXPECT_EQ(tuned_m(128), 64);
  EXPECT_EQ(tuned_m(2048), 1024);
  // More than a factor of 2 from every tuned size: the heuristic's, not a guess from afar.
  EXPECT_EQ(tuned_m(3), -1);
  EXPECT_EQ(tuned_m(8), -1);
  EXPECT_EQ(tuned_m(300), -1);
  EXPECT_EQ(tuned_m(int64_t{1} << 20), -1);
  // Between two tuned sizes a factor of 2 apart each way: the larger.
  sm90::TileTables ties = t;
  sm90::TunedTile at_16 = t.entries()[0];
  at_16.m = 16;
  ties.add(at_16);
  EXPECT_EQ(ties.find("NVIDIA H200", kKey, 32)->m, 64);
  const sm90::TunedTile* e = t.find("NVIDIA H200", kKey, 1);
  EXPECT_EQ(e->tile, "64x64");
  EXPECT_EQ(e->source, "t.json");
  ASSERT_EQ(e->candidates.size(), 2u);
  double us_128x256 = 0;
  for (const auto& [name, us] : e->candidates) {
    if (name == "128x256") us_128x256 = us;
  }
  EXPECT_DOUBLE_EQ(us_128x256, 14.0);
  // Another device, family or shape was never tuned.
  EXPECT_EQ(t.find("NVIDIA H100", kKey, 1), nullptr);
  EXPECT_EQ(t.find("NVIDIA H200", {sm90::TileFamily::kFp8, 8, 512, 256}, 1), nullptr);
  EXPECT_EQ(t.find("NVIDIA H200", {sm90::TileFamily::k16Bit, 8, 512, 128}, 1), nullptr);
}

TEST(Sm90TileTables, WritesWhatItReads) {
  const sm90::TileTables t = sm90::TileTables::parse(table_text(), "t.json");
  const sm90::TileTables back = sm90::TileTables::parse(t.to_json("NVIDIA H200"), "back.json");
  ASSERT_EQ(back.entries().size(), t.entries().size());
  for (size_t i = 0; i < t.entries().size(); ++i) {
    EXPECT_EQ(back.entries()[i].tile, t.entries()[i].tile);
    EXPECT_EQ(back.entries()[i].m, t.entries()[i].m);
    EXPECT_EQ(back.entries()[i].gemm, t.entries()[i].gemm);
    EXPECT_DOUBLE_EQ(back.entries()[i].us, t.entries()[i].us);
    EXPECT_EQ(back.entries()[i].candidates.size(), t.entries()[i].candidates.size());
  }
  // Another device's entries are not written.
  EXPECT_TRUE(contains_all(t.to_json("NVIDIA H100"), {"\"entries\": []"}));
}

TEST(Sm90TileTables, BadTablesNameTheEntryAndTheRequirement) {
  auto bad = [](const std::string& text) {
    return error_of([&] { sm90::TileTables::parse(text, "bad.json"); });
  };
  const std::string head = R"({"format": "moekit-tile-table-1", "device": "NVIDIA H200", )";
  const std::string entry =
      R"("family": "fp8", "gemm": "gemm1", "experts": 8, "n": 512, "k": 256, "m": 1, "us": 1)";
  EXPECT_TRUE(contains_all(bad("[1]"), {"bad.json", "JSON object"}));
  EXPECT_TRUE(contains_all(bad(R"({"format": "v0", "device": "x", "entries": []})"),
                           {"bad.json", "format", "moekit-tile-table-1"}));
  EXPECT_TRUE(contains_all(bad(R"({"format": "moekit-tile-table-1", "entries": []})"),
                           {"bad.json", "no 'device'"}));
  EXPECT_TRUE(contains_all(bad(head + R"("entries": {}})"), {"entries", "must be an array"}));
  EXPECT_TRUE(
      contains_all(bad(head + R"("entries": [{)" + entry + R"(, "tile": "32x32"}]})"),
                   {"entries[0].tile='32x32'", "family fp8", "16x64tma, 16x64, 64x64, 32x64"}));
  EXPECT_TRUE(contains_all(
      bad(head + R"("entries": [{)" + entry + R"(, "tile": "64x64", "family": "fp4"}]})"),
      {"bad.json"}));
  EXPECT_TRUE(contains_all(
      bad(head +
          R"("entries": [{"family": "fp4", "gemm": "gemm1", "experts": 8, "n": 512, "k": 256,)"
          R"( "m": 1, "us": 1, "tile": "64x64"}]})"),
      {"entries[0].family", "fp8_direct", "w4a16"}));
  EXPECT_TRUE(contains_all(
      bad(head + R"("entries": [{"family": "fp8", "gemm": "gemm1", "experts": 8, "n": 512, "m": 1,)"
                 R"( "us": 1, "tile": "64x64"}]})"),
      {"entries[0]", "no 'k'"}));
  EXPECT_TRUE(contains_all(
      bad(head +
          R"("entries": [{"family": "fp8", "gemm": "gemm1", "experts": 8, "n": 512, "k": 256,)"
          R"( "m": 0, "us": 1, "tile": "64x64"}]})"),
      {"entries[0].m=0", "must be"}));
  EXPECT_TRUE(contains_all(bad(head + R"("entries": [{)" + entry +
                               R"(, "tile": "64x64", "candidates": {"99x99": 3}}]})"),
                           {"entries[0].candidates.99x99", "not a tile of family fp8"}));
  EXPECT_TRUE(contains_all(
      bad(head + R"("entries": [{)" + entry + R"(, "tile": "64x64",)" + R"( "gemm": "gemm3"}]})"),
      {"bad.json"}));
}

TEST(Sm90TileTables, LaterTablesOverrideEntryByEntry) {
  sm90::TileTables t = sm90::TileTables::parse(table_text(), "shipped.json");
  const std::string over = R"({"format": "moekit-tile-table-1", "device": "NVIDIA H200",
    "entries": [{"family": "16bit", "gemm": "gemm1", "experts": 8, "n": 512, "k": 256,
                 "m": 64, "tile": "64x64", "us": 18.0}]})";
  t.merge(sm90::TileTables::parse(over, "mine.json"));
  ASSERT_EQ(t.entries().size(), 3u);
  EXPECT_EQ(t.find("NVIDIA H200", kKey, 64)->tile, "64x64");
  EXPECT_EQ(t.find("NVIDIA H200", kKey, 64)->source, "mine.json");
  EXPECT_EQ(t.find("NVIDIA H200", kKey, 1024)->source, "shipped.json");
}

// A directory of tables for $MOEKIT_TILE_TABLES, removed afterwards.
struct TableDir {
  std::filesystem::path path;
  explicit TableDir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  void write(const std::string& file, const std::string& text) const {
    std::ofstream(path / file) << text;
  }
  ~TableDir() {
    ::unsetenv("MOEKIT_TILE_TABLES");
    std::filesystem::remove_all(path);
  }
};

TEST(Sm90TileTables, EnvironmentDirectoryOverridesTheShippedTables) {
  TableDir dir("moekit_tile_tables_");
  dir.write("a.json", table_text());
  dir.write("b.json", table_text("NVIDIA H200", "64x64"));  // later in name order: wins at 1024
  dir.write("notes.txt", "not a table");
  ::setenv("MOEKIT_TILE_TABLES", dir.path.c_str(), 1);
  auto active = sm90::TileTables::active();
  const sm90::TunedTile* e = active->find("NVIDIA H200", kKey, 1024);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->tile, "64x64");
  EXPECT_TRUE(contains_all(e->source, {"b.json"}));
  // A single file works too, and the tables are re-read when the variable changes.
  ::setenv("MOEKIT_TILE_TABLES", (dir.path / "a.json").c_str(), 1);
  EXPECT_EQ(sm90::TileTables::active()->find("NVIDIA H200", kKey, 1024)->tile, "128x256");
  // A broken table is an error naming the variable and the file, not a silently ignored file.
  dir.write("c.json", R"({"format": "moekit-tile-table-1"})");
  ::setenv("MOEKIT_TILE_TABLES", dir.path.c_str(), 1);
  EXPECT_TRUE(contains_all(error_of([] { sm90::TileTables::active(); }),
                           {"MOEKIT_TILE_TABLES=", "c.json", "no 'device'"}));
  ::setenv("MOEKIT_TILE_TABLES", (dir.path / "missing.json").c_str(), 1);
  EXPECT_TRUE(contains_all(error_of([] { sm90::TileTables::active(); }),
                           {"MOEKIT_TILE_TABLES=", "missing.json"}));
}

// The experts resolve their GEMMs' rows once (choose_tiles) and pick the nearest tuned M per
// launch (tile_for); a forced tile_config wins; a layer the tables do not know keeps the heuristic.
TEST(Sm90TileTables, ExpertsTakeTheTunedRowNearestTheBatchSize) {
  MoELayerOptions o;
  o.device = device_info_by_name("h200");
  MoEConfig moe = MoELayer::make_moe_config(find_preset("small"), o);
  const auto keys = ::moekit::sm90::gemm_shape_keys(moe, sm90::TileFamily::k16Bit);
  EXPECT_EQ(keys[0].n, (moe.is_act_and_mul() ? 2 : 1) * moe.intermediate_size_per_partition());
  EXPECT_EQ(keys[0].k, moe.hidden_dim);
  EXPECT_EQ(keys[1].n, moe.hidden_dim);
  EXPECT_EQ(keys[1].k, moe.intermediate_size_per_partition());
  EXPECT_EQ(keys[0].experts, moe.num_local_experts);
  TableDir dir("moekit_tile_tables_experts_");
  const std::string entry = R"({"family": "16bit", "gemm": "gemm2", "experts": )" +
                            std::to_string(keys[1].experts) + R"(, "n": )" +
                            std::to_string(keys[1].n) + R"(, "k": )" + std::to_string(keys[1].k);
  dir.write("t.json", R"({"format": "moekit-tile-table-1", "device": ")" + moe.device.name +
                          R"(", "entries": [)" + entry +
                          R"(, "m": 4, "tile": "128x256", "us": 1},)" + entry +
                          R"(, "m": 512, "tile": "64x64", "us": 2}]})");
  ::setenv("MOEKIT_TILE_TABLES", dir.path.c_str(), 1);
  ::moekit::sm90::LaunchState state;
  ::moekit::sm90::choose_tiles(state, moe, "test", sm90::TileFamily::k16Bit);
  EXPECT_EQ(state.tile, -1);
  EXPECT_TRUE(state.tuned[0].m.empty());  // GEMM1 untuned: the heuristic
  EXPECT_EQ(::moekit::sm90::tile_for(state, 0, 4), -1);
  EXPECT_EQ(::moekit::sm90::tile_for(state, 1, 2), sm90::find_tile("128x256"));
  EXPECT_EQ(::moekit::sm90::tile_for(state, 1, 300), sm90::find_tile("64x64"));
  EXPECT_EQ(::moekit::sm90::tile_for(state, 1, 64), -1);  // 8x from both tuned sizes
  EXPECT_EQ(::moekit::sm90::tile_for(state, 1, 4096), -1);
  // A forced tile wins over the table.
  moe.tile_config = "128x256";
  ::moekit::sm90::choose_tiles(state, moe, "test", sm90::TileFamily::k16Bit);
  EXPECT_EQ(::moekit::sm90::tile_for(state, 1, 1000), sm90::find_tile("128x256"));
  // Another device does not see the H200's table.
  moe.tile_config = "auto";
  moe.device.name = "NVIDIA H100";
  ::moekit::sm90::choose_tiles(state, moe, "test", sm90::TileFamily::k16Bit);
  EXPECT_TRUE(state.tuned[1].m.empty());
}

// `moekit explain` names the tuned entry (its file, M and time, the other candidates) where a
// table has one, and the heuristic's reason elsewhere. Planned for a previewed H200.
TEST(Sm90TileTables, ExplainNamesTheTunedEntry) {
  if constexpr (!kCudaBuild) GTEST_SKIP() << "built without CUDA: no Hopper backends";
  const testing::PreviewedH200 h200 = testing::previewed_h200();
  const MoEConfig moe = MoELayer::make_moe_config(find_preset("small"), h200.layer);
  const auto keys = ::moekit::sm90::gemm_shape_keys(moe, sm90::TileFamily::k16Bit);
  TableDir dir("moekit_tile_tables_explain_");
  dir.write("h200.json",
            R"({"format": "moekit-tile-table-1", "device": "NVIDIA H200", "entries": [)"
            R"({"family": "16bit", "gemm": "gemm1", "experts": )" +
                std::to_string(keys[0].experts) + R"(, "n": )" + std::to_string(keys[0].n) +
                R"(, "k": )" + std::to_string(keys[0].k) +
                R"(, "m": 16384, "tile": "64x64", "us": 123.4,)"
                R"( "candidates": {"64x64": 123.4, "128x256": 150.0}}]})");
  ::setenv("MOEKIT_TILE_TABLES", dir.path.c_str(), 1);
  const MoEPlan plan = plan_moe(moe, QuantConfig::unquantized(), h200.plan);
  ASSERT_TRUE(plan.ok()) << plan.error();
  const std::string text = plan.to_string();
  EXPECT_TRUE(contains_all(
      text, {"M=16384  gemm1 64x64    gemm2 128x256", "tuned on NVIDIA H200 at M=16384: 123.4 us",
             "h200.json", "128x256 150.0", "rows per expert <= "}))
      << text;
}

}  // namespace
}  // namespace moekit
