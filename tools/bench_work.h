// The work `moekit bench` divides its times by: the unique expert-weight bytes one forward reads
// and the FLOPs of its real (unpadded) routed tokens, computed from the weights THIS RANK holds —
// the intermediate size split by tensor parallelism, only the local experts under expert
// parallelism — never from the unsharded model (which overstated TB/s and TFLOP/s by the TP
// factor). Pure functions of the shapes and the routing, so they are tested on the CPU.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moekit/layer/moe_layer.h"
#include "moekit/layer/presets.h"

namespace moekit::cli {

// The expert weights one rank holds, as MoELayer builds them.
struct LayerShard {
  int64_t hidden = 0;               // H
  int64_t intermediate = 0;         // I per partition: model I / tp_size
  bool gated = true;                // w13 holds 2 * I rows (gate and up)
  int first_local_expert = 0;       // global id of local expert 0 (ep_rank * E_local)
  int num_local_experts = 0;        // E_local: E / ep_size
  int64_t shared_intermediate = 0;  // this rank's shared-expert width (0: none; TP-sliced)
  double bytes_per_element = 2;     // of the unquantized weights (the shared experts always)
  // Bytes of one routed expert when it is quantized: packed codes + scales + biases as the layer
  // holds them (MoELayer::expert_weight_bytes() / E_local); 0: elements * bytes_per_element.
  double quantized_expert_bytes = 0;

  // From the layer's own MoEConfig (MoELayer::make_moe_config), so bench and layer agree.
  static LayerShard of(const ModelPreset& model, const MoELayerOptions& options);

  // Weight elements of one routed expert: w13 (N, H) + w2 (H, I), N = 2I when gated.
  double expert_elements() const;
  // Bytes one routed expert's weights occupy (quantized or not).
  double expert_bytes() const;
  // Weight elements of the shared experts (0 when none).
  double shared_elements() const;
};

struct LayerWork {
  int experts_touched = 0;  // local experts with at least one routed token
  int64_t routed_rows = 0;  // (token, local expert) pairs the experts compute
  double weight_bytes = 0;  // unique weight bytes read: touched experts + shared experts
  double flops = 0;         // 2 * rows * (N*H + H*I) + 2 * tokens * shared (N_s*H + H*I_s)
};

// topk_ids: (num_tokens * top_k) global expert ids; -1 and ids of other ranks' experts count
// for nothing. num_tokens = 0 is no work.
LayerWork layer_work(const LayerShard& shard, std::span<const int64_t> topk_ids,
                     int64_t num_tokens);

// The models one bench run times: the config.json given with --config (once), else each preset
// of `model_names`; with plain_topk each routes with softmax top-k + renormalize (no groups, bias,
// scaling or Llama4 top-1), as the Triton peer does, so both touch the same experts. Throws
// moekit::Error for an unknown preset or a bad config.json.
std::vector<ModelPreset> bench_models(const std::string& config_json,
                                      const std::vector<std::string>& model_names,
                                      bool plain_topk = false);

}  // namespace moekit::cli
