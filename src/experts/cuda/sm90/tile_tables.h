// Tuned tile tables of the Hopper grouped GEMMs: for a device, a tile family and one GEMM's shape
// (local experts E, N, K), the row of the tile table (tiles.h) that `moekit tune` measured fastest
// at each batch size M, with the times of every candidate. The experts look a launch up here
// before falling back to the rows-per-expert heuristic (select_tile); `moekit explain` names the
// entry. Tables come from two places: the ones shipped with the library (data/tile_tables/*.json,
// compiled in) and, over them, $MOEKIT_TILE_TABLES (a .json file or a directory of them). Host
// code only: no CUDA headers.
//
// The file format ("moekit-tile-table-1"):
//   {"format": "moekit-tile-table-1", "device": "NVIDIA H200",
//    "entries": [{"family": "fp8", "gemm": "gemm1", "experts": 256, "n": 4096, "k": 7168,
//                 "m": 64, "tile": "64x64", "us": 1742.4,
//                 "candidates": {"64x64": 1742.4, "128x256": 2093.0}}, ...]}
// family: one of family_name's names; tile: a row of that family; m: tokens of the forward (the
// layer's M, not rows per expert); us: the GEMM's time at that M (median over graph replays).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "experts/cuda/sm90/tiles.h"

namespace moekit::cuda::sm90 {

inline constexpr const char* kTileTableFormat = "moekit-tile-table-1";

// "16bit", "fp8", "fp8_direct", "int8", "w4a16", "w4a8": a family's name in the tables.
const char* family_name(TileFamily family);
std::optional<TileFamily> family_by_name(std::string_view name);

// One GEMM of a layer as the tables key it (besides the device and M).
struct GemmShapeKey {
  TileFamily family = TileFamily::k16Bit;
  int64_t experts = 0;  // local experts
  int64_t n = 0;
  int64_t k = 0;
};

struct TunedTile {
  std::string device;  // DeviceInfo::name, e.g. "NVIDIA H200"
  GemmShapeKey key;
  std::string gemm;  // "gemm1" or "gemm2" (what it was measured as; not part of the key)
  int64_t m = 0;     // tokens of the forward
  std::string tile;  // a row name of key.family
  double us = 0;
  std::vector<std::pair<std::string, double>> candidates;  // every row timed, us
  std::string source;                                      // the file it came from
};

class TileTables {
 public:
  // Parses one table; `source` names it in errors ("<source>: entries[3].tile='256x256' is not a
  // tile of family fp8 (valid: ...)"). Throws moekit::Error.
  static TileTables parse(std::string_view json_text, const std::string& source);
  // Every table of a .json file, or of each *.json file of a directory (in name order).
  static TileTables load(const std::string& path);
  // The shipped tables with $MOEKIT_TILE_TABLES over them, read once per value of the variable.
  static std::shared_ptr<const TileTables> active();

  // Adds t, replacing an entry of the same device, key and m.
  void add(TunedTile t);
  // over's entries replace this table's entries of the same device, key and m.
  void merge(const TileTables& over);
  // The entry for this device and GEMM whose m is nearest to `m` (nearest_m); null when the GEMM
  // was never tuned on this device or at a size within a factor of 2 of m.
  const TunedTile* find(std::string_view device, const GemmShapeKey& key, int64_t m) const;
  // Every entry of `device` for `key`, by increasing m.
  std::vector<const TunedTile*> entries_for(std::string_view device, const GemmShapeKey& key) const;
  // The entries of one device as a table file.
  std::string to_json(std::string_view device) const;

  const std::vector<TunedTile>& entries() const { return entries_; }

 private:
  std::vector<TunedTile> entries_;
};

// The index of the m in `ms` nearest to `m` in log2 (ties: the larger m), or -1 when even that
// one is more than a factor of 2 away (a table tuned at 1, 16, 64, ... 16384 covers every M up to
// 32768; beyond the tuned sizes, or between sizes tuned too sparsely, the heuristic decides).
// TileTables::find and the experts' per-launch lookup share this rule; ms: each >= 1.
inline int nearest_m(const int64_t* ms, size_t count, int64_t m) {
  int best = -1;
  double best_distance = 0;
  const double lm = std::log2(static_cast<double>(m < 1 ? 1 : m));
  for (size_t i = 0; i < count; ++i) {
    const double d = std::fabs(std::log2(static_cast<double>(ms[i])) - lm);
    if (d > 1.0) continue;
    if (best < 0 || d < best_distance || (d == best_distance && ms[i] > ms[best])) {
      best = static_cast<int>(i);
      best_distance = d;
    }
  }
  return best;
}

// The tables compiled into the library: {source name, JSON text} per shipped file.
std::vector<std::pair<std::string, std::string_view>> shipped_tile_tables();

}  // namespace moekit::cuda::sm90
