#include "moekit/quantization/hf_fp8.h"

#include <fmt/format.h>

#include "moekit/core/error.h"
#include "moekit/io/json.h"

namespace moekit::quantization {
namespace {

using nlohmann::json;

void read_names(const json& qc, const char* key, std::string_view where,
                std::vector<std::string>& out) {
  const auto it = qc.find(key);
  if (it == qc.end() || it->is_null()) return;
  for (std::string& name :
       io::json_string_array(*it, fmt::format("{}.{}", where, key), "module names"))
    out.push_back(std::move(name));
}

}  // namespace

bool is_hf_fp8_config(const nlohmann::json& qc) {
  return quark::quant_method_is(qc, "fp8");
}

HfFp8Config parse_hf_fp8_config(const nlohmann::json& qc, std::string_view where) {
  if (!is_hf_fp8_config(qc)) {
    throw Error(
        fmt::format("{}: not a HuggingFace fp8 config (quant_method must be \"fp8\")", where));
  }
  HfFp8Config c;
  if (const auto it = qc.find("fmt"); it != qc.end() && !it->is_null()) {
    const std::string f = io::json_choice(*it, fmt::format("{}.fmt", where),
                                          {"e4m3", "float8_e4m3fn", "e5m2", "float8_e5m2"});
    if (f == "e5m2" || f == "float8_e5m2") {
      throw Error(
          fmt::format("{}.fmt=\"{}\": moekit loads e4m3 fp8 checkpoints (e5m2 weights "
                      "are not served)",
                      where, f));
    }
  }
  const auto scheme = qc.find("activation_scheme");
  if (scheme == qc.end() || scheme->is_null()) {
    throw Error(
        fmt::format("{}: missing required key 'activation_scheme' (\"dynamic\" or "
                    "\"static\")",
                    where));
  }
  c.static_activations = io::json_choice(*scheme, fmt::format("{}.activation_scheme", where),
                                         {"dynamic", "static"}) == "static";
  if (const auto it = qc.find("weight_block_size"); it != qc.end() && !it->is_null()) {
    const std::string at = fmt::format("{}.weight_block_size", where);
    if (!it->is_array() || it->size() != 2) {
      throw Error(fmt::format("{}={} must be [128, 128] (block rows, block columns)", at,
                              io::describe_json(*it)));
    }
    const int64_t rows = io::json_integer((*it)[0], at + "[0]", 1, 1 << 20);
    const int64_t cols = io::json_integer((*it)[1], at + "[1]", 1, 1 << 20);
    if (rows != 128 || cols != 128) {
      throw Error(fmt::format("{}=[{}, {}]: moekit's fp8 block scheme takes 128x128 weight blocks",
                              at, rows, cols));
    }
    if (c.static_activations) {
      throw Error(
          fmt::format("{}.activation_scheme=\"static\" with weight_block_size: block fp8 "
                      "checkpoints quantize activations dynamically per 1x128 group",
                      where));
    }
    c.block = true;
  }
  read_names(qc, "ignored_layers", where, c.ignored);
  read_names(qc, "modules_to_not_convert", where, c.ignored);
  return c;
}

nlohmann::json HfFp8Config::to_json() const {
  json j{{"quant_method", "fp8"},
         {"fmt", "e4m3"},
         {"activation_scheme", static_activations ? "static" : "dynamic"}};
  if (block) j["weight_block_size"] = json::array({128, 128});
  j["ignored_layers"] = ignored;
  return j;
}

quark::QuarkConfig HfFp8Config::to_quark_config() const {
  json weight = quark::spec_json("fp8_e4m3", block ? "per_block" : "per_tensor", false);
  json input =
      quark::spec_json("fp8_e4m3", block ? "per_group" : "per_tensor", !static_activations);
  if (block) {
    weight["block_size"] = json::array({128, 128});
    input["group_size"] = 128;
    input["ch_axis"] = -1;
  }
  return quark::global_config(weight, input, ignored,
                              "quantization_config (HuggingFace fp8 as Quark)");
}

}  // namespace moekit::quantization
