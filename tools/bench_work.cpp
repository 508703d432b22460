// Byte and FLOP accounting of `moekit bench`; see bench_work.h.
#include "bench_work.h"

#include <vector>

namespace moekit::cli {

LayerShard LayerShard::of(const ModelPreset& model, const MoELayerOptions& options) {
  const MoEConfig moe = MoELayer::make_moe_config(model, options);
  LayerShard s;
  s.hidden = moe.hidden_dim;
  s.intermediate = moe.intermediate_size_per_partition();
  s.gated = moe.is_act_and_mul();
  s.num_local_experts = moe.num_local_experts;
  s.first_local_expert = moe.parallel.ep_rank * moe.num_local_experts;
  s.shared_intermediate = MoELayer::shared_width(model, moe.parallel);  // this TP rank's slice
  s.bytes_per_element = static_cast<double>(element_size(options.dtype));
  return s;
}

double LayerShard::expert_elements() const {
  const int64_t n = gated ? 2 * intermediate : intermediate;
  return static_cast<double>(n * hidden + hidden * intermediate);
}

double LayerShard::expert_bytes() const {
  return quantized_expert_bytes > 0 ? quantized_expert_bytes
                                    : bytes_per_element * expert_elements();
}

double LayerShard::shared_elements() const {
  const int64_t n = gated ? 2 * shared_intermediate : shared_intermediate;
  return static_cast<double>(n * hidden + hidden * shared_intermediate);
}

LayerWork layer_work(const LayerShard& shard, std::span<const int64_t> topk_ids,
                     int64_t num_tokens) {
  LayerWork w;
  if (num_tokens <= 0) return w;
  std::vector<bool> touched(static_cast<size_t>(shard.num_local_experts), false);
  for (int64_t id : topk_ids) {
    const int64_t local = id - shard.first_local_expert;
    if (id < 0 || local < 0 || local >= shard.num_local_experts) continue;
    ++w.routed_rows;
    if (!touched[static_cast<size_t>(local)]) {
      touched[static_cast<size_t>(local)] = true;
      ++w.experts_touched;
    }
  }
  w.weight_bytes =
      shard.expert_bytes() * w.experts_touched + shard.bytes_per_element * shard.shared_elements();
  // One multiply-add (2 FLOPs) per weight element per row that passes through it.
  w.flops = 2.0 * (shard.expert_elements() * static_cast<double>(w.routed_rows) +
                   shard.shared_elements() * static_cast<double>(num_tokens));
  return w;
}

std::vector<ModelPreset> bench_models(const std::string& config_json,
                                      const std::vector<std::string>& model_names,
                                      bool plain_topk) {
  std::vector<ModelPreset> out;
  if (!config_json.empty()) {
    out.push_back(preset_from_hf_config(config_json));
  } else {
    for (const std::string& name : model_names)
      out.push_back(find_preset(name));
  }
  if (plain_topk) {
    for (ModelPreset& m : out) {
      m.scoring = ScoringFunc::kSoftmax;
      m.renormalize = true;
      m.num_expert_group = 0;
      m.topk_group = 0;
      m.routed_scaling_factor.reset();
      m.has_e_score_correction_bias = false;
      m.llama4_top1 = false;
    }
  }
  return out;
}

}  // namespace moekit::cli
