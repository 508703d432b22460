#include "moekit/quantization/modelopt.h"

#include <fmt/format.h>

#include "moekit/core/error.h"
#include "moekit/io/json.h"

namespace moekit::quantization {

using nlohmann::json;

bool is_modelopt_config(const nlohmann::json& qc) {
  return quark::quant_method_is(qc, "modelopt");
}

ModelOptConfig parse_modelopt_config(const nlohmann::json& qc, std::string_view where_view) {
  std::string where(where_view);
  if (!is_modelopt_config(qc)) {
    throw Error(
        fmt::format("{}: not a ModelOpt config (quant_method must be \"modelopt\")", where));
  }
  // hf_quant_config.json's layout: the keys under "quantization".
  const json* q = &qc;
  if (const auto it = qc.find("quantization"); it != qc.end() && it->is_object()) {
    q = &*it;
    where += ".quantization";
  }
  ModelOptConfig c;
  const auto algo = q->find("quant_algo");
  if (algo == q->end() || algo->is_null()) {
    throw Error(fmt::format("{}: missing required key 'quant_algo' (\"FP8\" or \"NVFP4\")", where));
  }
  c.quant_algo = io::json_string(*algo, where + ".quant_algo");
  if (c.quant_algo != "FP8" && c.quant_algo != "NVFP4") {
    throw Error(fmt::format(
        "{}.quant_algo=\"{}\" is not served: moekit loads ModelOpt FP8 (per-tensor weights and "
        "static activations) and NVFP4 checkpoints",
        where, c.quant_algo));
  }
  if (const auto it = q->find("group_size"); it != q->end() && !it->is_null()) {
    const int64_t g = io::json_integer(*it, where + ".group_size", 1, 1 << 20);
    if (c.quant_algo == "NVFP4" && g != 16) {
      throw Error(fmt::format("{}.group_size={}: NVFP4 scales groups of 16", where, g));
    }
  }
  if (const auto it = q->find("exclude_modules"); it != q->end() && !it->is_null()) {
    c.exclude_modules =
        io::json_string_array(*it, where + ".exclude_modules", "module names or patterns");
  }
  return c;
}

std::string ModelOptConfig::file_suffix(const std::string& quark_suffix) const {
  return quant_algo == "NVFP4" && quark_suffix == "input_scale_2" ? "input_scale" : quark_suffix;
}

nlohmann::json ModelOptConfig::to_json() const {
  json j{{"quant_method", "modelopt"},
         {"quant_algo", quant_algo},
         {"kv_cache_quant_algo", nullptr},
         {"exclude_modules", exclude_modules}};
  if (quant_algo == "NVFP4") j["group_size"] = 16;
  return j;
}

quark::QuarkConfig ModelOptConfig::to_quark_config() const {
  const char* where = "quantization_config (ModelOpt as Quark)";
  if (quant_algo == "FP8") {
    return quark::global_config(quark::spec_json("fp8_e4m3", "per_tensor", false),
                                quark::spec_json("fp8_e4m3", "per_tensor", false), exclude_modules,
                                where);
  }
  // NVFP4: e2m1 codes in groups of 16 under an fp8 per-tensor global scale, activations alike.
  return quark::global_config(quark::nvfp4_spec_json(false), quark::nvfp4_spec_json(true),
                              exclude_modules, where);
}

}  // namespace moekit::quantization
