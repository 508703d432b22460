// Tuned tile tables of the Hopper grouped GEMMs; see src/experts/cuda/sm90/tile_tables.h.
#include "experts/cuda/sm90/tile_tables.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <map>
#include <mutex>

#include "moekit/core/env.h"
#include "moekit/core/error.h"
#include "moekit/io/json.h"

namespace moekit::cuda::sm90 {
namespace {

using json = nlohmann::json;

constexpr std::pair<TileFamily, const char*> kFamilyNames[] = {
    {TileFamily::k16Bit, "16bit"},          {TileFamily::kFp8, "fp8"},
    {TileFamily::kFp8Direct, "fp8_direct"}, {TileFamily::kInt8, "int8"},
    {TileFamily::kW4A16, "w4a16"},          {TileFamily::kW4A8, "w4a8"},
    {TileFamily::kW4A8Group, "w4a8_group"}, {TileFamily::kMxfp4A8, "mxfp4_a8"},
};

constexpr int64_t kMaxDim = int64_t{1} << 31;

const json& member(const json& object, const char* name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end()) throw Error(fmt::format("moekit: {} has no '{}'", where, name));
  return *it;
}

bool same_slot(const TunedTile& a, const TunedTile& b) {
  return a.device == b.device && a.key.family == b.key.family && a.key.experts == b.key.experts &&
         a.key.n == b.key.n && a.key.k == b.key.k && a.m == b.m;
}

bool same_gemm(const TunedTile& t, std::string_view device, const GemmShapeKey& key) {
  return t.device == device && t.key.family == key.family && t.key.experts == key.experts &&
         t.key.n == key.n && t.key.k == key.k;
}

TunedTile parse_entry(const json& e, const std::string& device, const std::string& where) {
  if (!e.is_object()) {
    throw Error(fmt::format("moekit: {}={} must be an object", where, io::describe_json(e)));
  }
  TunedTile t;
  t.device = device;
  const std::string family = io::json_choice(
      member(e, "family", where), where + ".family",
      {"16bit", "fp8", "fp8_direct", "int8", "w4a16", "w4a8", "w4a8_group", "mxfp4_a8"});
  t.key.family = *family_by_name(family);
  t.gemm = io::json_choice(member(e, "gemm", where), where + ".gemm", {"gemm1", "gemm2"});
  t.key.experts = io::json_integer(member(e, "experts", where), where + ".experts", 1, kMaxDim);
  t.key.n = io::json_integer(member(e, "n", where), where + ".n", 1, kMaxDim);
  t.key.k = io::json_integer(member(e, "k", where), where + ".k", 1, kMaxDim);
  t.m = io::json_integer(member(e, "m", where), where + ".m", 1, INT64_MAX);
  t.tile = io::json_string(member(e, "tile", where), where + ".tile");
  if (find_tile(t.tile, t.key.family) < 0) {
    throw Error(fmt::format("moekit: {}.tile='{}' is not a tile of family {} (valid: {})", where,
                            t.tile, family, tile_names(t.key.family)));
  }
  t.us = io::json_number(member(e, "us", where), where + ".us", 0.0, 1e12);
  if (const auto c = e.find("candidates"); c != e.end()) {
    if (!c->is_object()) {
      throw Error(fmt::format("moekit: {}.candidates={} must be an object of tile: us", where,
                              io::describe_json(*c)));
    }
    for (const auto& [name, us] : c->items()) {
      const std::string at = where + ".candidates." + name;
      if (find_tile(name, t.key.family) < 0) {
        throw Error(fmt::format("moekit: {} is not a tile of family {} (valid: {})", at, family,
                                tile_names(t.key.family)));
      }
      t.candidates.emplace_back(name, io::json_number(us, at, 0.0, 1e12));
    }
  }
  return t;
}

}  // namespace

const char* family_name(TileFamily family) {
  for (const auto& [f, name] : kFamilyNames) {
    if (f == family) return name;
  }
  return "?";
}

std::optional<TileFamily> family_by_name(std::string_view name) {
  for (const auto& [f, n] : kFamilyNames) {
    if (name == n) return f;
  }
  return std::nullopt;
}

TileTables TileTables::parse(std::string_view json_text, const std::string& source) {
  const json doc = io::parse_json(json_text, source);
  if (!doc.is_object()) {
    throw Error(fmt::format("moekit: {}: a tile table is a JSON object, got {}", source,
                            io::describe_json(doc)));
  }
  io::json_choice(member(doc, "format", source), source + ": format", {kTileTableFormat});
  const std::string device = io::json_string(member(doc, "device", source), source + ": device");
  const json& entries = member(doc, "entries", source);
  if (!entries.is_array()) {
    throw Error(
        fmt::format("moekit: {}: entries={} must be an array", source, io::describe_json(entries)));
  }
  TileTables tables;
  for (size_t i = 0; i < entries.size(); ++i) {
    TunedTile t = parse_entry(entries[i], device, fmt::format("{}: entries[{}]", source, i));
    t.source = source;
    tables.add(std::move(t));
  }
  return tables;
}

TileTables TileTables::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TileTables tables;
  if (!fs::is_directory(path, ec)) {
    tables.merge(parse(io::read_text_file(path), path));
    return tables;
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& f : fs::directory_iterator(path, ec)) {
    if (f.path().extension() == ".json") files.push_back(f.path());
  }
  if (ec) throw Error(fmt::format("moekit: cannot list {}: {}", path, ec.message()));
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files)
    tables.merge(parse(io::read_text_file(f), f.string()));
  return tables;
}

std::shared_ptr<const TileTables> TileTables::active() {
  static std::mutex mutex;
  static std::optional<std::string> loaded_for;  // the variable's value `cached` was read with
  static std::shared_ptr<const TileTables> cached;
  const std::optional<std::string> dir = env::get("MOEKIT_TILE_TABLES");
  std::lock_guard<std::mutex> lock(mutex);
  if (cached && loaded_for == dir) return cached;
  auto tables = std::make_shared<TileTables>();
  for (const auto& [source, text] : shipped_tile_tables())
    tables->merge(parse(text, source));
  if (dir) {
    try {
      tables->merge(load(*dir));
    } catch (const Error& e) {
      std::string_view why = e.what();
      if (why.substr(0, 8) == "moekit: ") why.remove_prefix(8);
      throw Error(fmt::format("moekit: MOEKIT_TILE_TABLES={}: {}", *dir, why));
    }
  }
  cached = std::move(tables);
  loaded_for = dir;
  return cached;
}

void TileTables::add(TunedTile t) {
  for (TunedTile& e : entries_) {
    if (same_slot(e, t)) {
      e = std::move(t);
      return;
    }
  }
  entries_.push_back(std::move(t));
}

void TileTables::merge(const TileTables& over) {
  for (const TunedTile& t : over.entries_)
    add(t);
}

const TunedTile* TileTables::find(std::string_view device, const GemmShapeKey& key,
                                  int64_t m) const {
  const std::vector<const TunedTile*> tuned = entries_for(device, key);
  if (tuned.empty()) return nullptr;
  std::vector<int64_t> ms;
  for (const TunedTile* t : tuned)
    ms.push_back(t->m);
  const int i = nearest_m(ms.data(), ms.size(), m);
  return i < 0 ? nullptr : tuned[i];
}

std::vector<const TunedTile*> TileTables::entries_for(std::string_view device,
                                                      const GemmShapeKey& key) const {
  std::vector<const TunedTile*> out;
  for (const TunedTile& t : entries_) {
    if (same_gemm(t, device, key)) out.push_back(&t);
  }
  std::sort(out.begin(), out.end(),
            [](const TunedTile* a, const TunedTile* b) { return a->m < b->m; });
  return out;
}

std::string TileTables::to_json(std::string_view device) const {
  json doc;
  doc["format"] = kTileTableFormat;
  doc["device"] = std::string(device);
  doc["entries"] = json::array();
  for (const TunedTile& t : entries_) {
    if (t.device != device) continue;
    json c = json::object();
    for (const auto& [name, us] : t.candidates)
      c[name] = std::round(us * 10) / 10;
    doc["entries"].push_back({{"family", family_name(t.key.family)},
                              {"gemm", t.gemm},
                              {"experts", t.key.experts},
                              {"n", t.key.n},
                              {"k", t.key.k},
                              {"m", t.m},
                              {"tile", t.tile},
                              {"us", std::round(t.us * 10) / 10},
                              {"candidates", c}});
  }
  return doc.dump(1) + "\n";
}

}  // namespace moekit::cuda::sm90
