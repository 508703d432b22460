// libFuzzer target: the HuggingFace config.json reader (preset_from_hf_config_text) on arbitrary
// text. An input either reads into a ModelPreset that satisfies the documented bounds, or throws
// moekit::Error. A crash, a sanitizer report, another exception or a broken bound is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "moekit/core/error.h"
#include "moekit/layer/presets.h"

namespace {

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_hf_config: invariant broken: %s\n", what.c_str());
  std::abort();
}

void check(const moekit::ModelPreset& p) {
  const int64_t max_dim = std::numeric_limits<int32_t>::max();
  if (p.num_experts < 1 || p.num_experts > 65536) finding("num_experts out of bounds");
  if (p.top_k < 1 || p.top_k > p.num_experts) finding("top_k out of bounds");
  if (p.hidden_size < 1 || p.hidden_size > max_dim) finding("hidden_size out of bounds");
  if (p.intermediate_size < 1 || p.intermediate_size > max_dim) finding("I out of bounds");
  if (p.num_shared_experts < 0 || p.shared_intermediate_size < 1) finding("shared experts");
  if (p.num_layers < 0 || p.first_moe_layer < 0) finding("layers out of bounds");
  if (p.num_expert_group > 0 && (p.num_experts % p.num_expert_group != 0 || p.topk_group < 1 ||
                                 p.topk_group > p.num_expert_group)) {
    finding("grouped routing inconsistent");
  }
  if (p.routed_scaling_factor && !(*p.routed_scaling_factor > 0.0f)) finding("scaling factor");
  (void)p.summary();
  try {
    (void)p.routing_method();
  } catch (const moekit::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    check(moekit::preset_from_hf_config_text(text));
  } catch (const moekit::Error&) {
    // refused with a message
  }
  return 0;
}
