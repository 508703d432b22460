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
  CompressedTensorsArgs c;
  c.num_bits = static_cast<int>(
      io::json_integer(required(a, "num_bits", where), where + ".num_bits", 1, 64));
  if (c.num_bits != 8 && c.num_bits != 4) {
    throw Error(fmt::format(
        "{}.num_bits={}: moekit serves 8-bit compressed-tensors quantizers (fp8 e4m3 or int8), "
        "NVFP4 (4-bit float, strategy \"tensor_group\", group_size 16) and int4 weights in "
        "groups of 128 (W4AFP8)",
        where, c.num_bits));
  }
  c.type = io::json_choice(required(a, "type", where), where + ".type", {"float", "int"});
  c.strategy = weights ? io::json_choice(required(a, "strategy", where), where + ".strategy",
                                         {"tensor", "channel", "block", "group", "tensor_group"})
                       : io::json_choice(required(a, "strategy", where), where + ".strategy",
                                         {"tensor", "token", "group", "tensor_group"});
  const bool nvfp4 = c.strategy == "tensor_group";
  const bool int4 = c.num_bits == 4 && c.type == "int";
  const bool four_bit_ok = nvfp4 ? c.type == "float" : weights && c.strategy == "group";
  if ((c.num_bits == 4) != (nvfp4 || int4) || (c.num_bits == 4 && !four_bit_ok)) {
    throw Error(fmt::format(
        "{}: num_bits {} with type \"{}\" and strategy \"{}\" is not served: 4 bits are NVFP4 "
        "(type float, strategy tensor_group) or int4 weights (type int, strategy group), the "
        "other strategies take 8 bits",
        where, c.num_bits, c.type, c.strategy));
  }
  if (const auto it = a.find("symmetric"); it != a.end() && !it->is_null()) {
    if (!io::json_bool(*it, where + ".symmetric")) {
      throw Error(fmt::format(
          "{}.symmetric=false: asymmetric (zero-point) quantizers are not served", where));
    }
  }
  if (const auto it = a.find("dynamic"); it != a.end() && !it->is_null()) {
    // NVFP4 activations: "local" (each group's scale computed on the fly, the global scale stored).
    if (it->is_string() && nvfp4 && !weights) {
      c.dynamic = io::json_choice(*it, where + ".dynamic", {"local"}) == "local";
    } else {
      c.dynamic = io::json_bool(*it, where + ".dynamic");
    }
  }
  if (weights && c.dynamic) {
    throw Error(fmt::format("{}.dynamic=true: weights are quantized in the checkpoint", where));
  }
  if (nvfp4) {
    c.group_size =
        io::json_integer(required(a, "group_size", where), where + ".group_size", 1, 1 << 20);
    if (c.group_size != 16 || (!weights && !c.dynamic)) {
      throw Error(fmt::format(
          "{}: NVFP4 scales groups of 16 (got group_size {}), activations' groups dynamically "
          "(\"local\")",
          where, c.group_size));
    }
  }
  if (weights && c.strategy == "group" && !int4) {
    throw Error(fmt::format(
        "{}.strategy=\"group\" with {}-bit {} weights: weight groups are served for int4 "
        "(W4AFP8); 8-bit weights per tensor, channel or 128x128 block",
        where, c.num_bits, c.type));
  }
  if (c.strategy == "block" || (c.strategy == "group" && !int4)) {
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
  if (int4) {
    c.group_size =
        io::json_integer(required(a, "group_size", where), where + ".group_size", 1, 1 << 20);
    if (c.group_size != 128) {
      throw Error(
          fmt::format("{}.group_size={}: int4 weights are served in groups of 128 along K (W4AFP8)",
                      where, c.group_size));
    }
    // actorder "group" permutes the columns (a g_idx tensor); "weight" only orders the
    // quantization, the stored groups stay contiguous.
    if (const auto it = a.find("actorder");
        it != a.end() && !it->is_null() && !(it->is_boolean() && !it->get<bool>())) {
      const std::string order = io::json_choice(*it, where + ".actorder", {"group", "weight"});
      if (order == "group") {
        throw Error(fmt::format(
            "{}.actorder=\"group\": activation-ordered groups (a g_idx permutation) are not "
            "served",
            where));
      }
    }
  } else if (c.strategy == "group") {
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
  if (a.strategy == "tensor_group") return quark::nvfp4_spec_json(a.dynamic);
  static const std::pair<const char*, const char*> kQschemes[] = {{"tensor", "per_tensor"},
                                                                  {"channel", "per_channel"},
                                                                  {"token", "per_channel"},
                                                                  {"block", "per_block"},
                                                                  {"group", "per_group"}};
  const char* qscheme = "per_tensor";
  for (const auto& [strategy, q] : kQschemes) {
    if (a.strategy == strategy) qscheme = q;
  }
  const char* dtype = a.type == "float" ? "fp8_e4m3" : a.num_bits == 4 ? "int4" : "int8";
  json s = quark::spec_json(dtype, qscheme, a.dynamic);
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
  json j{{"num_bits", a.num_bits},
         {"type", a.type},
         {"strategy", a.strategy},
         {"dynamic", a.dynamic},
         {"symmetric", true}};
  if (a.strategy == "tensor_group" && a.dynamic) j["dynamic"] = "local";
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
        c.format != "naive-quantized" && c.format != "nvfp4-pack-quantized" &&
        c.format != "pack-quantized") {
      throw Error(fmt::format(
          "{}.format=\"{}\" is not served: moekit reads the 8-bit formats float-quantized, "
          "int-quantized and naive-quantized, NVFP4's nvfp4-pack-quantized and int4's "
          "pack-quantized (the marlin-24 and sparse formats are not read)",
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
  if ((c.format == "nvfp4-pack-quantized") != c.nvfp4() ||
      (c.format == "pack-quantized") != c.int4_packed()) {
    throw Error(fmt::format(
        "{}.format=\"{}\" with {}-bit {} weights: NVFP4 weights (strategy tensor_group) are "
        "stored as nvfp4-pack-quantized, int4 ones as pack-quantized, 8-bit ones in the other "
        "formats",
        where, c.format, c.weights.num_bits, c.weights.strategy));
  }
  if (const auto it = g.find("output_activations"); it != g.end() && !it->is_null()) {
    throw Error(fmt::format("{}.output_activations: quantized outputs are not served", gw));
  }
  const auto in = g.find("input_activations");
  if (in == g.end() || in->is_null()) {
    if (!c.nvfp4()) {
      throw Error(
          fmt::format("{}.input_activations is null: weight-only {}-bit experts (W{}A16) are "
                      "not served; moekit reads W8A8 schemes, int4 weights with fp8 "
                      "activations (W4AFP8) and NVFP4 with or without activation quantization",
                      gw, c.weights.num_bits, c.weights.num_bits));
    }
  } else {
    c.input = parse_args(*in, gw + ".input_activations", false);
  }
  const CompressedTensorsArgs& w = c.weights;
  // The pairs the W8A8 methods serve (vLLM's compressed-tensors MoE methods take the same), and
  // NVFP4 weights with NVFP4 activations or none (NVFP4A16).
  // W4AFP8: int4 groups with fp8 activations per token (dynamic) or per tensor (static).
  const auto w4afp8 = [&](const CompressedTensorsArgs& in) {
    return in.type == "float" &&
           (in.strategy == "token" || (in.strategy == "tensor" && !in.dynamic));
  };
  const bool ok = !c.input ? w.strategy == "tensor_group"
                  : c.int4_packed()
                      ? w4afp8(*c.input)
                      : w.type == c.input->type &&
                            ((w.strategy == "tensor" && c.input->strategy == "tensor" &&
                              (w.type == "float" || !c.input->dynamic)) ||
                             (w.strategy == "channel" && c.input->strategy == "token") ||
                             (w.strategy == "block" && c.input->strategy == "group") ||
                             (w.strategy == "tensor_group" && c.input->strategy == "tensor_group"));
  const CompressedTensorsArgs none;
  const CompressedTensorsArgs& a = c.input ? *c.input : none;
  if (!ok) {
    throw Error(fmt::format(
        "{}: {} weights per {} with {} activations per {} ({}) are not served: the pairs are "
        "per-tensor weights with per-tensor activations (int8: static), per-channel weights "
        "with dynamic per-token activations, 128x128 float blocks with dynamic 1x128 groups, "
        "int4 groups of 128 with float activations per token (dynamic) or per tensor "
        "(static), NVFP4 (tensor_group) weights with NVFP4 activations or none",
        gw, w.type, w.strategy, c.input ? a.type : "no", c.input ? a.strategy : "-",
        a.dynamic ? "dynamic" : "static"));
  }
  if (const auto it = qc.find("ignore"); it != qc.end() && !it->is_null()) {
    c.ignore = io::json_string_array(*it, where + ".ignore", "module names");
  }
  return c;
}

namespace {
// NVFP4's file names of the Quark suffixes; the global scales are stored as reciprocals.
constexpr std::pair<const char*, const char*> kNvfp4Suffixes[] = {
    {"weight", "weight_packed"},
    {"weight_scale_2", "weight_global_scale"},
    {"input_scale_2", "input_global_scale"}};
}  // namespace

std::string CompressedTensorsConfig::file_suffix(const std::string& quark_suffix) const {
  if (int4_packed() && quark_suffix == "weight") return "weight_packed";
  if (nvfp4()) {
    for (const auto& [quark_name, file_name] : kNvfp4Suffixes) {
      if (quark_suffix == quark_name) return file_name;
    }
  }
  return quark_suffix;
}

bool CompressedTensorsConfig::reciprocal_in_file(const std::string& quark_suffix) const {
  return nvfp4() && (quark_suffix == "weight_scale_2" || quark_suffix == "input_scale_2");
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
