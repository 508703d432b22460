// FusedMoEConfig: the shape and deployment of one MoE layer, as the kernels and the oracle see it.
#pragma once

#include <optional>
#include <string>

#include "moekit/config/activation.h"
#include "moekit/config/parallel_config.h"
#include "moekit/config/routing.h"
#include "moekit/core/device.h"
#include "moekit/core/dtype.h"

namespace moekit {

enum class ActivationFormat;

struct MoEConfig {
  int num_experts = 0;            // global experts E
  int experts_per_token = 0;      // top-k
  int64_t hidden_dim = 0;         // H (K of GEMM1)
  int64_t intermediate_size = 0;  // I of the full layer (before TP split)
  int num_local_experts = 0;      // experts on this rank
  int num_logical_experts = 0;    // experts of the model before EPLB replication
  Activation activation = Activation::kSilu;
  DeviceInfo device;  // the hardware this layer runs on
  RoutingMethodType routing_method = RoutingMethodType::kRenormalizeNaive;
  ParallelConfig parallel;
  DType in_dtype = DType::kBF16;
  std::optional<DType> router_logits_dtype;  // nullopt: same as in_dtype
  int64_t hidden_dim_unpadded = 0;
  int64_t intermediate_size_per_partition_unpadded = 0;
  int64_t intermediate_pad = 0;
  std::string moe_backend = "auto";  // user-facing backend name, "auto" to let the oracle choose
  // A prepare/finalize factory by name (prepare_finalize/factory.h), "auto": the deployment's
  // all-to-all backend chooses. A forced one serves whatever the key, if its check passes.
  std::string prepare_finalize = "auto";
  // Forces the experts' GEMM tile configuration by its table name ("auto": the experts choose;
  // `moekit bench --tile`). Experts without a tile table ignore it only when it is "auto".
  std::string tile_config = "auto";
  int64_t max_num_tokens = 8192;  // per rank per forward (sizes workspaces and batched buffers)
  // A token's output must not depend on the other tokens of its batch: experts keep one reduction
  // order for every batch size (no batch-size-dependent split-K or tile change that reorders sums).
  bool batch_invariant = false;
  bool has_bias = false;
  bool is_lora_enabled = false;
  std::optional<float> swiglu_limit;
  std::optional<float> swiglu_alpha;
  std::optional<float> swiglu_beta;

  int64_t intermediate_size_per_partition() const { return intermediate_size / parallel.tp_size; }
  bool is_act_and_mul() const { return is_gated(activation); }
  int w13_num_shards() const { return is_act_and_mul() ? 2 : 1; }
  ActivationFormat activation_format() const;
  ActivationParams activation_params() const;
  // Throws moekit::Error naming the field when the config is inconsistent (top_k > E, ...).
  void validate() const;
  std::string to_string() const;
};

}  // namespace moekit
