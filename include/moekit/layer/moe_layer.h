// MoELayer: one Mixture-of-Experts layer as an inference engine uses it — weights, router, expert
// map of this rank, optional shared experts, and the kernel the oracle chose.
//
//   MoELayer layer(find_preset("qwen3-30b-a3b"), MoELayer::random_weights(...), options);
//   Tensor y = layer.forward(x, router_logits, ctx);   // x (M, H), logits (M, E) -> y (M, H)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/core/workspace.h"
#include "moekit/layer/presets.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/oracle.h"
#include "moekit/router/router.h"

namespace moekit {

// The tensors of one layer on this rank. Shapes: E_local experts, H hidden, I intermediate.
struct MoELayerWeights {
  Tensor w13;                      // (E_local, 2I, H) gated, (E_local, I, H) `_no_mul`
  Tensor w2;                       // (E_local, H, I)
  Tensor w13_bias;                 // (E_local, 2I or I), optional
  Tensor w2_bias;                  // (E_local, H), optional
  Tensor e_score_correction_bias;  // (E,) f32, optional (DeepSeek-V3 selection bias)
  Tensor shared_w13;               // (2*I_s, H), optional shared experts
  Tensor shared_w2;                // (H, I_s)
};

struct MoELayerOptions {
  DType dtype = DType::kBF16;             // activation and weight dtype
  DeviceInfo device = cpu_device_info();  // where the layer runs
  ParallelConfig parallel;                // EP rank / size (the expert_map follows from it)
  std::string backend = "auto";           // force an experts backend by name ("auto": the oracle)
  std::string tile_config = "auto";       // force the experts' GEMM tile config by table name
  int64_t max_num_tokens = 8192;          // per forward; sizes the workspaces once
  // Caller-owned workspaces shared by several layers (grown to this layer's worst case at
  // construction); when null the layer owns its own.
  WorkspaceManager* workspace = nullptr;
};

class MoELayer {
 public:
  // Validates the weights against the model shape and the rank's expert range, builds the router,
  // selects the experts backend (throws moekit::UnsupportedError when a forced backend cannot serve
  // the deployment) and reserves the workspaces for max_num_tokens.
  MoELayer(const ModelPreset& model, MoELayerWeights weights, MoELayerOptions options = {});

  // Seeded random weights for this rank (scaled so activations stay O(1)); on options.device.
  static MoELayerWeights random_weights(const ModelPreset& model, const MoELayerOptions& options,
                                        uint64_t seed);

  // hidden_states (M, H) in the layer dtype, router_logits (M, E) f32/bf16/f16 -> (M, H).
  // Adds the shared experts' output when the layer has shared experts (under EP within one
  // data-parallel group, on EP rank 0 only, since the ranks' outputs are summed).
  // With a monolithic kernel (e.g. the forced "cpu_monolithic" backend) the layer does not route:
  // it hands the logits, with its router's grouping, bias and scaling factor, to
  // kernel().apply_monolithic. Monolithic kernels take no shared experts, so the layer then runs
  // them itself beside the kernel and adds them the same way (the same result as the modular
  // kernel's shared experts).
  Tensor forward(const Tensor& hidden_states, const Tensor& router_logits, RunContext ctx = {});
  // Graph-capturable form: writes into a caller-provided output (M, H) and allocates nothing on the
  // device (routing buffers and workspaces were sized at construction). Needs ctx.stream on a GPU.
  void forward_into(Tensor& output, const Tensor& hidden_states, const Tensor& router_logits,
                    RunContext ctx);
  // Same with routing already done: topk_ids (M, k) int32 or int64, topk_weights (M, k) f32.
  // Throws moekit::Error on a layer with a monolithic kernel (its experts route internally).
  Tensor forward_routed(const Tensor& hidden_states, const Tensor& topk_ids,
                        const Tensor& topk_weights, RunContext ctx = {});
  void forward_routed_into(Tensor& output, const Tensor& hidden_states, const Tensor& topk_ids,
                           const Tensor& topk_weights, RunContext ctx);

  const ModelPreset& model() const { return model_; }
  const MoEConfig& moe_config() const { return moe_; }
  // The weights as given (standard layout); kernel_w13() is what the kernel reads.
  const MoELayerWeights& weights() const { return weights_; }
  const Tensor& kernel_w13() const { return kernel_w13_; }
  const Tensor& kernel_w13_bias() const { return kernel_w13_bias_; }
  const Router& router() const { return *router_; }
  FusedMoEKernel& kernel() const { return *kernel_; }
  // Whether the layer has shared experts (inside the kernel, or beside a monolithic one).
  bool has_shared_experts() const {
    return kernel_->has_shared_experts() || shared_beside_kernel_ != nullptr;
  }
  // The oracle's decision table for this layer (chosen backend, every rejection and its reason).
  const OracleReport& selection() const { return report_; }
  const Tensor& expert_map() const { return expert_map_; }  // (E,) int32, undefined without EP
  int first_local_expert() const { return first_local_expert_; }
  WorkspaceManager& workspace() { return options_.workspace ? *options_.workspace : *workspace_; }
  // The layer's own stream, used when a forward's RunContext has none (GPU layers only).
  Stream default_stream() const { return stream_ ? stream_->get() : Stream{}; }

  // The MoEConfig a layer of this model gets under these options (also used by `moekit explain`).
  static MoEConfig make_moe_config(const ModelPreset& model, const MoELayerOptions& options);
  static RouterConfig make_router_config(const ModelPreset& model, const Tensor& bias);

 private:
  ModelPreset model_;
  MoELayerOptions options_;
  MoEConfig moe_;
  MoELayerWeights weights_;  // as given (standard layout)
  // What the kernel reads: the same tensors, or copies in the chosen backend's layout
  // (convert_to_kernel_format), e.g. blocks-of-32 gate/up rows for a fused GEMM1 activation.
  Tensor kernel_w13_, kernel_w2_, kernel_w13_bias_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<FusedMoEKernel> kernel_;
  // The shared experts when the kernel is monolithic (run by the layer, not the kernel).
  std::shared_ptr<SharedExperts> shared_beside_kernel_;
  OracleReport report_;
  Tensor expert_map_;
  int first_local_expert_ = 0;
  std::unique_ptr<WorkspaceManager> workspace_;
  std::unique_ptr<CudaStream> stream_;
  Tensor routing_ids_;      // (max_num_tokens, k) int32: router output / converted int64 ids
  Tensor routing_weights_;  // (max_num_tokens, k) f32
  RunContext complete(RunContext ctx) const;
  void check_hidden_states(const Tensor& hidden_states) const;
  // Adds the shared experts' output (M, H) to output when this rank contributes them.
  void add_shared_output(Tensor& output, const Tensor& shared_output, RunContext ctx) const;
  void forward_monolithic_into(Tensor& output, const Tensor& hidden_states,
                               const Tensor& router_logits, RunContext ctx);
};

}  // namespace moekit
