#include "moekit/quantization/compressed_tensors.h"

#include <fmt/format.h>

#include <algorithm>

#include "moekit/core/error.h"
#include "moekit/io/json.h"

namespace moekit::quantization {
namespace {

using nlohmann::json;

const json& required(const json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    throw Error(fmt::format("{}: missing required key '{}'", where, key));
  }
  return *it;
}

CompressedTensorsArgs parse_args(const json& a, const std::string& where, bool weights) {
  if (!a.is_object()) {
    throw Error(fmt::format("{}={} must be an object (a quantizer)", where, io::describe_json(a)));
  }
  const int64_t bits = io::json_integer(required(a, "num_bits", where), where + ".num_bits", 1, 64);
  if (bits != 8) {
    throw Error(fmt::format(
        "{}.num_bits={}: moekit serves 8-bit compressed-tensors quantizers (fp8 e4m3 or int8); "
        "packed 4-bit, NVFP4 and MXFP4 checkpoints are not read in this format",
        where, bits));
  }
  CompressedTensorsArgs c;
  c.type = io::json_choice(required(a, "type", where), where + ".type", {"float", "int"});
  c.strategy = weights ? io::json_choice(required(a, "strategy", where), where + ".strategy",
                                         {"tensor", "channel", "block"})
                       : io::json_choice(required(a, "strategy", where), where + ".strategy",
                                         {"tensor", "token", "group"});
  if (const auto it = a.find("symmetric"); it != a.end() && !it->is_null()) {
    if (!io::json_bool(*it, where + ".symmetric")) {
      throw Error(fmt::format(
          "{}.symmetric=false: asymmetric (zero-point) quantizers are not served", where));
    }
  }
  if (const auto it = a.find("dynamic"); it != a.end() && !it->is_null()) {
    c.dynamic = io::json_bool(*it, where + ".dynamic");
  }
  if (weights && c.dynamic) {
    throw Error(fmt::format("{}.dynamic=true: weights are quantized in the checkpoint", where));
  }
  if (c.strategy == "block" || c.strategy == "group") {
    if (c.type != "float") {
      throw Error(
          fmt::format("{}.strategy=\"{}\" with type \"int\": int8 is served per tensor, "
                      "channel or token",
                      where, c.strategy));
    }
  }
  if (c.strategy == "block") {
    const json& b = required(a, "block_structure", where);
    if (!b.is_array() || b.size() != 2 ||
        io::json_integer(b[0], where + ".block_structure[0]", 1, 1 << 20) != 128 ||
        io::json_integer(b[1], where + ".block_structure[1]", 1, 1 << 20) != 128) {
      throw Error(fmt::format(
          "{}.block_structure={}: moekit's fp8 block scheme takes 128x128 weight blocks", where,
          b.dump()));
    }
    c.block_structure = {128, 128};
  }
  if (c.strategy == "group") {
    c.group_size =
        io::json_integer(required(a, "group_size", where), where + ".group_size", 1, 1 << 20);
    if (c.group_size != 128 || !c.dynamic) {
      throw Error(
          fmt::format("{}: group activations are served as dynamic 1x128 groups (got "
                      "group_size {}, dynamic {})",
                      where, c.group_size, c.dynamic));
    }
  }
  if (c.strategy == "token" && !c.dynamic) {
    throw Error(fmt::format("{}.strategy=\"token\" must be dynamic", where));
  }
  return c;
}

// The Quark spec of one quantizer (quark::spec_json plus its axis, group or block).
json quark_spec(const CompressedTensorsArgs& a) {
  static const std::pair<const char*, const char*> kQschemes[] = {{"tensor", "per_tensor"},
                                                                  {"channel", "per_channel"},
                                                                  {"token", "per_channel"},
                                                                  {"block", "per_block"},
                                                                  {"group", "per_group"}};
  const char* qscheme = "per_tensor";
  for (const auto& [strategy, q] : kQschemes) {
    if (a.strategy == strategy) qscheme = q;
  }
  json s = quark::spec_json(a.type == "float" ? "fp8_e4m3" : "int8", qscheme, a.dynamic);
  if (a.strategy == "channel") s["ch_axis"] = 0;
  if (a.strategy == "token") s["ch_axis"] = 1;
  if (a.strategy == "block") s["block_size"] = a.block_structure;
  if (a.strategy == "group") {
    s["group_size"] = a.group_size;
    s["ch_axis"] = -1;
  }
  return s;
}

json args_json(const CompressedTensorsArgs& a) {
  json j{{"num_bits", 8},
         {"type", a.type},
         {"strategy", a.strategy},
         {"dynamic", a.dynamic},
         {"symmetric", true}};
  j["group_size"] = a.group_size > 0 ? json(a.group_size) : json(nullptr);
  j["block_structure"] = a.block_structure.empty() ? json(nullptr) : json(a.block_structure);
  return j;
}

}  // namespace

bool is_compressed_tensors_config(const nlohmann::json& qc) {
  return quark::quant_method_is(qc, "compressed-tensors");
}

CompressedTensorsConfig parse_compressed_tensors_config(const nlohmann::json& qc,
                                                        std::string_view where_view) {
  const std::string where(where_view);
  if (!is_compressed_tensors_config(qc)) {
    throw Error(fmt::format(
        "{}: not a compressed-tensors config (quant_method must be \"compressed-tensors\")",
        where));
  }
  CompressedTensorsConfig c;
  c.format = "naive-quantized";
  if (const auto it = qc.find("format"); it != qc.end() && !it->is_null()) {
    c.format = io::json_string(*it, where + ".format");
    if (c.format != "float-quantized" && c.format != "int-quantized" &&
        c.format != "naive-quantized") {
      throw Error(fmt::format(
          "{}.format=\"{}\" is not served: moekit reads the 8-bit formats float-quantized, "
          "int-quantized and naive-quantized (packed and sparse formats are not read)",
          where, c.format));
    }
  }
  // Keys that change what the tensors mean: refused rather than ignored.
  if (const auto it = qc.find("sparsity_config"); it != qc.end() && !it->is_null()) {
    const auto f = it->find("format");
    const bool dense = it->is_object() && (f == it->end() || (f->is_string() && *f == "dense"));
    if (!dense) {
      throw Error(
          fmt::format("{}.sparsity_config={}: sparse (2:4) compressed weights are not "
                      "served",
                      where, it->dump()));
    }
  }
  if (const auto it = qc.find("transform_config"); it != qc.end() && !it->is_null()) {
    throw Error(
        fmt::format("{}.transform_config: rotated (Hadamard / SpinQuant) weights are not "
                    "served",
                    where));
  }
  const json& groups = required(qc, "config_groups", where);
  if (!groups.is_object() || groups.size() != 1) {
    throw Error(
        fmt::format("{}.config_groups={}: moekit reads configs of one config group (one "
                    "scheme for every Linear layer)",
                    where, io::describe_json(groups)));
  }
  const std::string gw = fmt::format("{}.config_groups.{}", where, groups.begin().key());
  const json& g = groups.begin().value();
  if (!g.is_object()) {
    throw Error(fmt::format("{}={} must be an object", gw, io::describe_json(g)));
  }
  const std::vector<std::string> targets =
      io::json_string_array(required(g, "targets", gw), gw + ".targets", "module names");
  if (std::find(targets.begin(), targets.end(), "Linear") == targets.end()) {
    throw Error(
        fmt::format("{}.targets=[{}]: moekit reads groups that target every Linear layer "
                    "(\"Linear\")",
                    gw, fmt::join(targets, ", ")));
  }
  c.weights = parse_args(required(g, "weights", gw), gw + ".weights", true);
  if (const auto it = g.find("output_activations"); it != g.end() && !it->is_null()) {
    throw Error(fmt::format("{}.output_activations: quantized outputs are not served", gw));
  }
  const auto in = g.find("input_activations");
  if (in == g.end() || in->is_null()) {
    throw Error(
        fmt::format("{}.input_activations is null: weight-only 8-bit experts (W8A16) are "
                    "not served; moekit reads W8A8 schemes",
                    gw));
  }
  c.input = parse_args(*in, gw + ".input_activations", false);
  const CompressedTensorsArgs& w = c.weights;
  const CompressedTensorsArgs& a = *c.input;
  // The pairs the W8A8 methods serve (vLLM's compressed-tensors MoE methods take the same).
  const bool ok =
      w.type == a.type &&
      ((w.strategy == "tensor" && a.strategy == "tensor" && (w.type == "float" || !a.dynamic)) ||
       (w.strategy == "channel" && a.strategy == "token") ||
       (w.strategy == "block" && a.strategy == "group"));
  if (!ok) {
    throw Error(fmt::format(
        "{}: {} weights per {} with {} activations per {} ({}) are not served: the pairs are "
        "per-tensor weights with per-tensor activations (int8: static), per-channel weights "
        "with dynamic per-token activations, 128x128 float blocks with dynamic 1x128 groups",
        gw, w.type, w.strategy, a.type, a.strategy, a.dynamic ? "dynamic" : "static"));
  }
  if (const auto it = qc.find("ignore"); it != qc.end() && !it->is_null()) {
    c.ignore = io::json_string_array(*it, where + ".ignore", "module names");
  }
  return c;
}

nlohmann::json CompressedTensorsConfig::to_json() const {
  json group{{"targets", json::array({"Linear"})},
             {"weights", args_json(weights)},
             {"input_activations", input ? args_json(*input) : json(nullptr)},
             {"output_activations", nullptr}};
  return json{{"quant_method", "compressed-tensors"},
              {"format", format},
              {"config_groups", {{"group_0", group}}},
              {"ignore", ignore},
              {"quantization_status", "compressed"}};
}

quark::QuarkConfig CompressedTensorsConfig::to_quark_config() const {
  return quark::global_config(quark_spec(weights), input ? quark_spec(*input) : json(nullptr),
                              ignore, "quantization_config (compressed-tensors as Quark)");
}

}  // namespace moekit::quantization
