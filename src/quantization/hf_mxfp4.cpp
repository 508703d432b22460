#include "moekit/quantization/hf_mxfp4.h"

#include <fmt/format.h>

#include "moekit/core/error.h"
#include "moekit/io/json.h"

namespace moekit::quantization {

using nlohmann::json;

bool is_hf_mxfp4_config(const nlohmann::json& qc) {
  return quark::quant_method_is(qc, "mxfp4");
}

HfMxfp4Config parse_hf_mxfp4_config(const nlohmann::json& qc, std::string_view where) {
  if (!is_hf_mxfp4_config(qc)) {
    throw Error(
        fmt::format("{}: not a HuggingFace MXFP4 config (quant_method must be \"mxfp4\")", where));
  }
  HfMxfp4Config c;
  if (const auto it = qc.find("modules_to_not_convert"); it != qc.end() && !it->is_null()) {
    c.modules_to_not_convert =
        io::json_string_array(*it, fmt::format("{}.modules_to_not_convert", where), "module names");
  }
  if (const auto it = qc.find("dequantize"); it != qc.end() && !it->is_null()) {
    c.dequantize = io::json_bool(*it, fmt::format("{}.dequantize", where));
  }
  return c;
}

nlohmann::json HfMxfp4Config::to_json() const {
  json j{{"quant_method", "mxfp4"}, {"modules_to_not_convert", modules_to_not_convert}};
  if (dequantize) j["dequantize"] = true;
  return j;
}

quark::QuarkConfig HfMxfp4Config::to_quark_config() const {
  json weight = quark::spec_json("fp4", "per_group", false);
  weight["ch_axis"] = -1;
  weight["group_size"] = 32;
  weight["scale_format"] = "e8m0";
  json exclude = json::array();
  // HuggingFace skips a module when an entry, as a regular expression, matches at the start of
  // its name: Quark's "re:" entries match the same way.
  for (const std::string& m : modules_to_not_convert)
    exclude.push_back("re:" + m);
  return quark::global_config(weight, nullptr, exclude,
                              "quantization_config (HuggingFace MXFP4 as Quark)");
}

}  // namespace moekit::quantization
