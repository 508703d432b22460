// libFuzzer target: the Quark quantization_config parser on arbitrary text, then everything a
// parsed config is used for: layer matching (fnmatch patterns, layer types, fused-shard
// agreement), exclusion (exact, fnmatch and "re:" patterns), the scheme predicates and
// QuantSpec::to_string. The same text as a HuggingFace fp8 / MXFP4, compressed-tensors or ModelOpt
// config (by its quant_method), translated into Quark's and used alike. Every failure must be a
// moekit::Error; a crash, a sanitizer report or another exception is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/core/error.h"
#include "moekit/io/json.h"
#include "moekit/quantization/compressed_tensors.h"
#include "moekit/quantization/hf_fp8.h"
#include "moekit/quantization/hf_mxfp4.h"
#include "moekit/quantization/modelopt.h"
#include "moekit/quantization/quark/quark_config.h"

namespace {

using namespace moekit::quark;

const QuantSpec* first(const TensorHint& h) {
  return h.empty() ? nullptr : &h.front();
}

void use(const QuarkConfig& c) {
  for (const char* name :
       {"model.layers.0.mlp.experts", "model.layers.1.block_sparse_moe.experts", "lm_head",
        "model.layers.3.mlp.shared_experts.gate_proj", "model.layers.12.mlp.gate"}) {
    (void)c.is_excluded(name);
    for (const auto& [pattern, layer] : c.layer_quant_config)
      (void)fnmatch(pattern, name);
    try {
      const LayerQuantConfig& l = c.find_matched_config(name);
      const QuantSpec* w = first(l.weight);
      const QuantSpec* a = first(l.input_tensors);
      (void)is_fp8_w8a8(w, a);
      (void)is_w_ocp_mx_a_x(w, a, true);
      (void)is_w8a8_int8(w, a);
      (void)is_fp8_w4a8(l.weight, l.input_tensors);
      (void)is_nvfp4(l.weight, l.input_tensors);
      for (const TensorHint* h : {&l.weight, &l.input_tensors, &l.output_tensors, &l.bias}) {
        for (const QuantSpec& s : *h) {
          (void)s.to_string();
          (void)ocp_mx_dtype_of(s.dtype);
        }
      }
    } catch (const moekit::Error&) {
      // e.g. the fused projections of an experts layer disagree
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    use(QuarkConfig::parse(text));
  } catch (const moekit::Error&) {
    // refused with a message
  }
  try {
    namespace q = moekit::quantization;
    const nlohmann::json j = moekit::io::parse_json(text, "fuzz");
    if (q::is_hf_fp8_config(j)) use(q::parse_hf_fp8_config(j, "fuzz").to_quark_config());
    if (q::is_hf_mxfp4_config(j)) use(q::parse_hf_mxfp4_config(j, "fuzz").to_quark_config());
    if (q::is_modelopt_config(j)) {
      const q::ModelOptConfig c = q::parse_modelopt_config(j, "fuzz");
      (void)c.to_json();
      use(c.to_quark_config());
    }
    if (q::is_compressed_tensors_config(j)) {
      const q::CompressedTensorsConfig c = q::parse_compressed_tensors_config(j, "fuzz");
      (void)c.to_json();
      use(c.to_quark_config());
    }
  } catch (const moekit::Error&) {
    // refused with a message
  }
  return 0;
}
