#include "moekit/quantization/quark/quark_config.h"

#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "moekit/core/error.h"
#include "moekit/io/json.h"

namespace moekit::quark {
namespace {

using json = nlohmann::json;
namespace qk = quant_keys;

// Quark's tensor data types (quark.torch.quantization.config.type.Dtype) and quantization
// schemes (QSchemeType, plus the per_block / per_token spellings vLLM's Quark configs use).
constexpr std::array<std::string_view, 21> kDtypes = {
    "int2",     "int3",     "int4",   "int8",     "int16",   "int32",    "uint4",
    "uint8",    "uint16",   "uint32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2",
    "fp6_e3m2", "fp6_e2m3", "fp4",    "mx",       "mx6",     "mx9",      "bfp16"};
constexpr std::array<std::string_view, 5> kQSchemes = {"per_tensor", "per_channel", "per_group",
                                                       "per_block", "per_token"};
// Bounds of the integer fields of a tensor quantizer.
constexpr int64_t kMaxGroupSize = int64_t{1} << 20;
constexpr int64_t kMaxChannelAxis = 8;
constexpr std::size_t kMaxBlockDims = 4;
// Longer "re:" exclude patterns are refused: std::regex compiles recursively.
constexpr std::size_t kMaxRegexChars = 1024;

std::string type_of(const json& v) {
  return v.type_name();
}

// NOTE: never dumps nested values (a hostile config may nest lists a million deep).
std::string value_text(const json& v) {
  return io::describe_json(v);
}

[[noreturn]] void wrong_type(const std::string& path, const json& v, std::string_view expected) {
  throw Error(fmt::format("{}: expected {}, got {} {}", path, expected, type_of(v), value_text(v)));
}

template <size_t N>
void expect_one_of(const std::string& path, const std::string& value,
                   const std::array<std::string_view, N>& valid, std::string_view what) {
  if (std::find(valid.begin(), valid.end(), value) != valid.end()) return;
  throw Error(fmt::format("{}: {} is not a known {}: expected one of {}", path,
                          value_text(json(value)), what, fmt::join(valid, ", ")));
}

int64_t int_in_range(const json& v, const std::string& path, int64_t min, int64_t max) {
  if (!v.is_number_integer()) wrong_type(path, v, "an integer");
  // NOTE: parsed non-negative integers are unsigned: above INT64_MAX they must not wrap.
  const bool representable =
      !v.is_number_unsigned() ||
      v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (!representable || v.get<int64_t>() < min || v.get<int64_t>() > max) {
    throw Error(fmt::format("{}: {} is out of range: expected an integer in [{}, {}]", path,
                            value_text(v), min, max));
  }
  return v.get<int64_t>();
}

// Bounds a "re:" exclude entry at parse time (std::regex compiles recursively); whether it is a
// valid expression is reported when it is first matched (is_excluded).
void check_exclude_regex(const std::string& path, const std::string& entry) {
  if (entry.rfind("re:", 0) == 0 && entry.size() - 3 > kMaxRegexChars) {
    throw Error(fmt::format("{}: the regular expression of {} chars is longer than {}", path,
                            entry.size() - 3, kMaxRegexChars));
  }
}

std::optional<std::string> opt_string(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) wrong_type(where + "." + key, *it, "a string");
  return it->get<std::string>();
}

std::optional<int64_t> opt_int(const json& o, const char* key, const std::string& where,
                               int64_t min, int64_t max) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  return int_in_range(*it, where + "." + key, min, max);
}

std::optional<bool> opt_bool(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) wrong_type(where + "." + key, *it, "true or false");
  return it->get<bool>();
}

QuantSpec parse_spec(const json& j, const std::string& where) {
  if (!j.is_object()) wrong_type(where, j, "an object (a tensor quantizer)");
  QuantSpec s;
  auto dtype = opt_string(j, "dtype", where);
  if (!dtype) throw Error(fmt::format("{}: missing required key 'dtype'", where));
  s.dtype = *dtype;
  expect_one_of(where + ".dtype", s.dtype, kDtypes, "Quark dtype");
  s.qscheme = opt_string(j, "qscheme", where);
  if (s.qscheme) expect_one_of(where + ".qscheme", *s.qscheme, kQSchemes, "Quark qscheme");
  s.group_size = opt_int(j, "group_size", where, 1, kMaxGroupSize);
  if (s.qscheme == "per_group" && !s.group_size) {
    throw Error(fmt::format("{}: qscheme \"per_group\" needs a group_size (an integer in [1, {}])",
                            where, kMaxGroupSize));
  }
  s.is_dynamic = opt_bool(j, "is_dynamic", where);
  s.symmetric = opt_bool(j, "symmetric", where);
  s.scale_format = opt_string(j, "scale_format", where);
  s.scale_type = opt_string(j, "scale_type", where);
  s.ch_axis = opt_int(j, "ch_axis", where, -kMaxChannelAxis, kMaxChannelAxis);
  if (auto it = j.find("block_size"); it != j.end() && !it->is_null()) {
    const std::string path = where + ".block_size";
    if (!it->is_array()) wrong_type(path, *it, "a list of integers");
    if (it->empty() || it->size() > kMaxBlockDims) {
      throw Error(fmt::format("{}: a list of {} block dims: expected 1 to {}", path, it->size(),
                              kMaxBlockDims));
    }
    std::vector<int64_t> b;
    for (size_t i = 0; i < it->size(); ++i)
      b.push_back(int_in_range((*it)[i], fmt::format("{}[{}]", path, i), 1, kMaxGroupSize));
    s.block_size = std::move(b);
  }
  return s;
}

TensorHint parse_hint(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return {};
  const std::string path = where + "." + key;
  TensorHint hint;
  if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i)
      hint.push_back(parse_spec((*it)[i], fmt::format("{}[{}]", path, i)));
    return hint;
  }
  if (!it->is_object()) wrong_type(path, *it, "null, an object or a list of objects");
  hint.push_back(parse_spec(*it, path));
  return hint;
}

LayerQuantConfig parse_layer(const json& j, const std::string& where) {
  if (!j.is_object()) wrong_type(where, j, "an object with weight / input_tensors entries");
  LayerQuantConfig c;
  c.weight = parse_hint(j, "weight", where);
  c.input_tensors = parse_hint(j, "input_tensors", where);
  c.output_tensors = parse_hint(j, "output_tensors", where);
  c.bias = parse_hint(j, "bias", where);
  return c;
}

std::vector<std::pair<std::string, LayerQuantConfig>> parse_layer_map(const json& o,
                                                                      const char* key,
                                                                      const std::string& where) {
  std::vector<std::pair<std::string, LayerQuantConfig>> out;
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return out;
  const std::string path = where + "." + key;
  if (!it->is_object()) wrong_type(path, *it, "an object (name -> layer config)");
  for (auto e = it->begin(); e != it->end(); ++e)
    out.emplace_back(e.key(), parse_layer(e.value(), path + "." + e.key()));
  return out;
}

bool is_spec(const QuantSpec* s, std::string_view dtype) {
  return s != nullptr && s->dtype == dtype;
}
bool qscheme_is(const QuantSpec* s, std::string_view q) {
  return s != nullptr && s->qscheme.has_value() && *s->qscheme == q;
}
bool is_mx_e8m0_group(const QuantSpec* s) {
  return qscheme_is(s, "per_group") && s->group_size == 32 && s->scale_format == "e8m0";
}

std::optional<QuantKey> mx_key(std::string_view dtype, bool dynamic) {
  if (dtype == "fp4") return dynamic ? qk::kMxfp4Dynamic : qk::kMxfp4Static;
  if (dtype == "fp6_e3m2") return dynamic ? qk::kMxfp6E3M2Dynamic : qk::kMxfp6E3M2Static;
  if (dtype == "fp6_e2m3") return dynamic ? qk::kMxfp6E2M3Dynamic : qk::kMxfp6E2M3Static;
  return std::nullopt;
}

QuantKey asym(QuantKey key, bool symmetric) {
  key.symmetric = symmetric;
  return key;
}

const LayerQuantConfig* match_pattern(const QuarkConfig& c, std::string_view name) {
  for (const auto& [pattern, cfg] : c.layer_quant_config) {
    if (fnmatch(pattern, name)) return &cfg;
  }
  return nullptr;
}

const LayerQuantConfig& match_one(const QuarkConfig& c, std::string_view name,
                                  std::string_view layer_type) {
  if (const LayerQuantConfig* p = match_pattern(c, name)) return *p;
  for (const auto& [type, cfg] : c.layer_type_quant_config) {
    if (type == layer_type ||
        (!layer_type.empty() && std::string_view(type).find(layer_type) != std::string_view::npos))
      return cfg;
  }
  return c.global_quant_config;
}

// NOTE: a config is untrusted input. libstdc++'s default (backtracking) matcher takes
// exponential time on patterns such as "(.*)*x" or "e**" (found by fuzz_quark_config: one
// exclude entry hung the loader); its polynomial mode (a Thompson NFA, no back-references) cannot.
#if defined(__GLIBCXX__)
constexpr std::regex::flag_type kRegexFlags =
    std::regex::ECMAScript | std::regex_constants::__polynomial;
#else
constexpr std::regex::flag_type kRegexFlags = std::regex::ECMAScript;
#endif

// NOTE: libstdc++'s regex compiler reads a number (a back-reference, a {n,m} bound) into a long
// without an overflow check: a run of 19+ digits is undefined behaviour (found by
// fuzz_quark_config). Numbers in exclude patterns are bounded before it sees them.
void check_regex_numbers(const std::string& entry) {
  size_t run = 0;
  for (const char c : entry) {
    run = std::isdigit(static_cast<unsigned char>(c)) ? run + 1 : 0;
    if (run > 9) {
      throw Error(fmt::format(
          "quantization_config.exclude: '{}' has a number of more than 9 digits; numbers in "
          "exclude regular expressions (layer indices, {{n,m}} bounds) are limited to 9 digits",
          entry.size() > 80 ? entry.substr(0, 80) + "..." : entry));
    }
  }
}

bool exclude_entry_matches(const std::string& entry, std::string_view name) {
  if (entry.rfind("re:", 0) == 0) {
    check_regex_numbers(entry);
    try {
      const std::regex re(entry.substr(3), kRegexFlags);
      std::match_results<std::string_view::const_iterator> m;
      return std::regex_search(name.begin(), name.end(), m, re,
                               std::regex_constants::match_continuous);
    } catch (const std::regex_error& e) {
      throw Error(
          fmt::format("quantization_config.exclude: '{}' is not a valid regular "
                      "expression: {}",
                      entry, e.what()));
    }
  }
  if (entry.find_first_of("*?[") != std::string::npos) return fnmatch(entry, name);
  return entry == name;
}

std::vector<std::string> shard_names(std::string_view layer_name) {
  std::vector<std::string> out;
  for (const char* s : {"gate_proj", "up_proj", "down_proj", "w1", "w3", "w2"})
    out.push_back(fmt::format("{}.0.{}", layer_name, s));
  return out;
}

bool is_experts_layer(std::string_view layer_name) {
  return layer_name.size() >= 7 && layer_name.substr(layer_name.size() - 7) == "experts";
}

}  // namespace

std::string QuantSpec::to_string() const {
  std::string s = dtype;
  if (qscheme) s += " " + *qscheme;
  if (group_size) s += fmt::format(" group {}", *group_size);
  if (block_size) s += fmt::format(" block {}", fmt::join(*block_size, "x"));
  s += dynamic() ? " dynamic" : " static";
  if (symmetric && !*symmetric) s += " asymmetric";
  if (scale_format) s += " scale_format " + *scale_format;
  if (scale_type) s += " scale_type " + *scale_type;
  return s;
}

bool fnmatch(std::string_view p, std::string_view n) {
  // Iterative wildcard matching with backtracking to the last '*'.
  size_t pi = 0, ni = 0, star = std::string_view::npos, mark = 0;
  auto class_match = [&](size_t& i, char c) -> std::optional<bool> {
    // p[i] == '['; returns nullopt for an unterminated class (then '[' is literal).
    size_t j = i + 1;
    bool negate = false;
    if (j < p.size() && (p[j] == '!' || p[j] == '^')) {
      negate = true;
      ++j;
    }
    bool found = false;
    bool first = true;
    for (; j < p.size() && (first || p[j] != ']'); ++j, first = false) {
      if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
        if (p[j] <= c && c <= p[j + 2]) found = true;
        j += 2;
      } else if (p[j] == c) {
        found = true;
      }
    }
    if (j >= p.size()) return std::nullopt;
    i = j + 1;
    return found != negate;
  };
  while (ni < n.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ni;
      continue;
    }
    if (pi < p.size()) {
      if (p[pi] == '?') {
        ++pi;
        ++ni;
        continue;
      }
      if (p[pi] == '[') {
        size_t next = pi;
        if (auto r = class_match(next, n[ni])) {
          if (*r) {
            pi = next;
            ++ni;
            continue;
          }
        } else if (n[ni] == '[') {
          ++pi;
          ++ni;
          continue;
        }
      } else if (p[pi] == n[ni]) {
        ++pi;
        ++ni;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    pi = star + 1;
    ni = ++mark;
  }
  while (pi < p.size() && p[pi] == '*')
    ++pi;
  return pi == p.size();
}

QuarkConfig QuarkConfig::from_json(const json& j, std::string_view where_view) {
  const std::string where(where_view);
  if (!j.is_object()) wrong_type(where, j, "an object");
  const auto method = opt_string(j, "quant_method", where);
  if (!method) throw Error(fmt::format("{}: missing required key 'quant_method'", where));
  if (*method != "quark") {
    throw Error(fmt::format(
        "{}.quant_method: '{}' is not supported by the Quark parser (expected \"quark\")", where,
        *method));
  }
  QuarkConfig c;
  auto g = j.find("global_quant_config");
  if (g != j.end() && !g->is_null()) {
    c.global_quant_config = parse_layer(*g, where + ".global_quant_config");
  }
  c.layer_quant_config = parse_layer_map(j, "layer_quant_config", where);
  c.layer_type_quant_config = parse_layer_map(j, "layer_type_quant_config", where);
  if (auto e = j.find("exclude"); e != j.end() && !e->is_null()) {
    const std::string path = where + ".exclude";
    if (!e->is_array()) wrong_type(path, *e, "a list of layer names");
    for (size_t i = 0; i < e->size(); ++i) {
      const std::string entry_path = fmt::format("{}[{}]", path, i);
      if (!(*e)[i].is_string()) wrong_type(entry_path, (*e)[i], "a string");
      c.exclude.push_back((*e)[i].get<std::string>());
      check_exclude_regex(entry_path, c.exclude.back());
    }
  }
  return c;
}

QuarkConfig QuarkConfig::parse(std::string_view text, std::string_view where) {
  return from_json(io::parse_json(text, where), where);
}

bool QuarkConfig::is_excluded(std::string_view layer_name) const {
  std::vector<std::string> names = {std::string(layer_name)};
  if (is_experts_layer(layer_name)) {
    for (auto& s : shard_names(layer_name))
      names.push_back(std::move(s));
  }
  for (const std::string& entry : exclude) {
    for (const std::string& n : names) {
      if (exclude_entry_matches(entry, n)) return true;
    }
  }
  return false;
}

const LayerQuantConfig& QuarkConfig::find_matched_config(std::string_view layer_name,
                                                         std::string_view layer_type) const {
  if (const LayerQuantConfig* direct = match_pattern(*this, layer_name)) return *direct;
  const LayerQuantConfig& own = match_one(*this, layer_name, layer_type);
  if (!is_experts_layer(layer_name)) return own;
  // The projections of one expert are fused (w13) and run by one kernel: one scheme for all.
  // A per-projection pattern decides the layer's config when one matches; the three projections
  // (of either naming family) must then agree.
  const std::vector<std::string> shards = shard_names(layer_name);
  for (size_t family = 0; family < 2; ++family) {
    bool any_pattern = false;
    for (size_t s = 3 * family; s < 3 * family + 3; ++s)
      any_pattern = any_pattern || match_pattern(*this, shards[s]) != nullptr;
    if (!any_pattern) continue;
    const LayerQuantConfig& first = match_one(*this, shards[3 * family], layer_type);
    std::vector<std::string> disagree;
    for (size_t s = 3 * family + 1; s < 3 * family + 3; ++s) {
      if (!(match_one(*this, shards[s], layer_type) == first)) disagree.push_back(shards[s]);
    }
    if (!disagree.empty()) {
      throw Error(fmt::format(
          "quantization_config: found a different quantization configuration for {} than for "
          "{} in {}; the fused MoE layer needs one scheme for all its projections",
          fmt::join(disagree, ", "), shards[3 * family], layer_name));
    }
    return first;
  }
  return own;
}

std::optional<std::string> ocp_mx_dtype_of(std::string_view d) {
  if (d == "fp4") return "mxfp4";
  if (d == "fp6_e3m2") return "mxfp6_e3m2";
  if (d == "fp6_e2m3") return "mxfp6_e2m3";
  return std::nullopt;
}

std::optional<QuantKeyMatch> is_fp8_w8a8(const QuantSpec* w, const QuantSpec* a) {
  if (w == nullptr || a == nullptr) return std::nullopt;
  if (!is_spec(w, "fp8_e4m3") || !is_spec(a, "fp8_e4m3") || w->dynamic()) return std::nullopt;
  if (qscheme_is(w, "per_tensor") || qscheme_is(w, "per_channel")) {
    const QuantKey wk =
        qscheme_is(w, "per_tensor") ? qk::kFp8StaticTensorSym : qk::kFp8StaticChannelSym;
    if (a->dynamic()) {
      if (qscheme_is(a, "per_channel")) return QuantKeyMatch{wk, qk::kFp8DynamicTokenSym};
      if (qscheme_is(a, "per_tensor") || qscheme_is(a, "per_token")) {
        return QuantKeyMatch{
            wk, qscheme_is(a, "per_tensor") ? qk::kFp8DynamicTensorSym : qk::kFp8DynamicTokenSym};
      }
      return std::nullopt;
    }
    if (qscheme_is(a, "per_tensor")) return QuantKeyMatch{wk, qk::kFp8StaticTensorSym};
    return std::nullopt;
  }
  if (qscheme_is(w, "per_block")) {
    const bool block128 = w->block_size && *w->block_size == std::vector<int64_t>{128, 128};
    if (!block128 || !w->symmetric.value_or(true)) return std::nullopt;
    if (!a->dynamic() || !qscheme_is(a, "per_group") || a->group_size != 128) return std::nullopt;
    const bool e8m0 = w->scale_type == "float8_e8m0fnu" || w->scale_format == "e8m0";
    return QuantKeyMatch{e8m0 ? qk::kFp8Static128BlockE8M0Sym : qk::kFp8Static128BlockSym,
                         qk::kFp8Dynamic128Sym};
  }
  return std::nullopt;
}

std::optional<QuantKeyMatch> is_w_ocp_mx_a_x(const QuantSpec* w, const QuantSpec* a,
                                             bool allow_static_fp8) {
  if (w == nullptr || w->dynamic() || !is_mx_e8m0_group(w)) return std::nullopt;
  const auto wk = mx_key(w->dtype, false);
  if (!wk) return std::nullopt;
  if (a == nullptr) return QuantKeyMatch{wk, std::nullopt};
  if (mx_key(a->dtype, true)) {
    if (!a->dynamic() || !is_mx_e8m0_group(a)) return std::nullopt;
    return QuantKeyMatch{wk, mx_key(a->dtype, true)};
  }
  if (is_spec(a, "fp8_e4m3") && qscheme_is(a, "per_tensor")) {
    if (a->dynamic()) return QuantKeyMatch{wk, qk::kFp8DynamicTensorSym};
    if (allow_static_fp8 && a->symmetric.value_or(true)) {
      return QuantKeyMatch{wk, qk::kFp8StaticTensorSym};
    }
  }
  return std::nullopt;
}

std::optional<QuantKeyMatch> is_w8a8_int8(const QuantSpec* w, const QuantSpec* a) {
  if (w == nullptr || a == nullptr) return std::nullopt;
  if (!is_spec(w, "int8") || !is_spec(a, "int8")) return std::nullopt;
  if (w->dynamic() || !w->symmetric.value_or(true)) return std::nullopt;
  QuantKey wk;
  if (qscheme_is(w, "per_tensor")) {
    wk = qk::kInt8StaticTensorSym;
  } else if (qscheme_is(w, "per_channel")) {
    wk = qk::kInt8StaticChannelSym;
  } else {
    return std::nullopt;
  }
  const bool sym = a->symmetric.value_or(true);
  if (!a->dynamic()) {
    if (!qscheme_is(a, "per_tensor")) return std::nullopt;
    return QuantKeyMatch{wk, asym(qk::kInt8StaticTensorSym, sym)};
  }
  if (qscheme_is(a, "per_channel") || qscheme_is(a, "per_token")) {
    return QuantKeyMatch{wk, asym(qk::kInt8DynamicTokenSym, sym)};
  }
  if (qscheme_is(a, "per_tensor")) return QuantKeyMatch{wk, asym(qk::kInt8DynamicTensorSym, sym)};
  return std::nullopt;
}

std::optional<QuantKeyMatch> is_fp8_w4a8(const TensorHint& w, const TensorHint& a) {
  if (w.size() != 2 || a.size() != 1) return std::nullopt;
  const QuantSpec& fp8 = w[0];
  const QuantSpec& int4 = w[1];
  if (!is_spec(&fp8, "fp8_e4m3") || !qscheme_is(&fp8, "per_tensor") || fp8.dynamic()) {
    return std::nullopt;
  }
  if (!is_spec(&int4, "int4") || !qscheme_is(&int4, "per_channel") || int4.dynamic() ||
      !int4.symmetric.value_or(true) || int4.ch_axis.value_or(0) != 0) {
    return std::nullopt;
  }
  const QuantSpec& in = a[0];
  if (!is_spec(&in, "fp8_e4m3") || !qscheme_is(&in, "per_tensor")) return std::nullopt;
  return QuantKeyMatch{qk::kInt4W4A8StaticChannelSym,
                       in.dynamic() ? qk::kFp8DynamicTokenSym : qk::kFp8StaticTensorSym};
}

std::optional<QuantKeyMatch> is_int4_group_w4a8(const QuantSpec* w, const QuantSpec* a) {
  if (w == nullptr || a == nullptr) return std::nullopt;
  if (!is_spec(w, "int4") || !qscheme_is(w, "per_group") || w->group_size != 128 || w->dynamic() ||
      !w->symmetric.value_or(true)) {
    return std::nullopt;
  }
  // Groups along K, the last axis of a (N, K) weight.
  if (const int64_t axis = w->ch_axis.value_or(-1); axis != 1 && axis != -1) return std::nullopt;
  if (!is_spec(a, "fp8_e4m3") || !a->symmetric.value_or(true)) return std::nullopt;
  if (a->dynamic() && (qscheme_is(a, "per_channel") || qscheme_is(a, "per_token"))) {
    return QuantKeyMatch{qk::kInt4W4A8StaticGroup128Sym, qk::kFp8DynamicTokenSym};
  }
  if (!a->dynamic() && qscheme_is(a, "per_tensor")) {
    return QuantKeyMatch{qk::kInt4W4A8StaticGroup128Sym, qk::kFp8StaticTensorSym};
  }
  return std::nullopt;
}

std::optional<QuantKeyMatch> is_nvfp4(const TensorHint& w, const TensorHint& a) {
  if (w.size() != 2 || (a.size() != 2 && !a.empty())) return std::nullopt;
  auto fp4_group16 = [](const QuantSpec& s) {
    return is_spec(&s, "fp4") && qscheme_is(&s, "per_group") && s.group_size == 16;
  };
  auto fp8_tensor_static = [](const QuantSpec& s) {
    return is_spec(&s, "fp8_e4m3") && qscheme_is(&s, "per_tensor") && !s.dynamic();
  };
  if (!fp4_group16(w[0]) || w[0].dynamic() || !fp8_tensor_static(w[1])) return std::nullopt;
  if (a.empty()) return QuantKeyMatch{qk::kNvfp4Static, std::nullopt};  // weight-only (W4A16)
  if (!fp4_group16(a[0]) || !a[0].dynamic() || !fp8_tensor_static(a[1])) return std::nullopt;
  return QuantKeyMatch{qk::kNvfp4Static, qk::kNvfp4Dynamic};
}

json spec_json(std::string_view dtype, std::string_view qscheme, bool dynamic) {
  return json{{"dtype", dtype},
              {"qscheme", qscheme},
              {"is_dynamic", dynamic},
              {"symmetric", true},
              {"ch_axis", nullptr},
              {"group_size", nullptr},
              {"round_method", "half_even"},
              {"scale_type", "float"}};
}

json nvfp4_spec_json(bool dynamic) {
  json fp4 = spec_json("fp4", "per_group", dynamic);
  fp4["group_size"] = 16;
  fp4["ch_axis"] = -1;
  return json::array({fp4, spec_json("fp8_e4m3", "per_tensor", false)});
}

bool quant_method_is(const json& qc, std::string_view method) {
  if (!qc.is_object()) return false;
  const auto it = qc.find("quant_method");
  return it != qc.end() && it->is_string() && it->get<std::string>() == method;
}

QuarkConfig global_config(const json& weight, const json& input, const json& exclude,
                          std::string_view where) {
  const json q{{"quant_method", "quark"},
               {"global_quant_config",
                {{"weight", weight},
                 {"input_tensors", input},
                 {"output_tensors", nullptr},
                 {"bias", nullptr}}},
               {"layer_quant_config", json::object()},
               {"layer_type_quant_config", json::object()},
               {"exclude", exclude}};
  return QuarkConfig::from_json(q, where);
}

}  // namespace moekit::quark
