// MoELayer: one Mixture-of-Experts layer as an inference engine uses it — for every scheme
// (unquantized, fp8, int8, int4/int8 weight-only, MXFP4/6/8, NVFP4, W4A8, Quark checkpoints) and
// deployment: weights held once in the chosen kernel's layout, the router, the expert map of this
// rank, optional shared experts, and the kernel of the plan (oracle/plan.h).
//
//   MoELayer layer(find_preset("qwen3-30b-a3b"), MoELayer::random_weights(...), options);
//   Tensor y = layer.forward(x, router_logits, ctx);   // x (M, H), logits (M, E) -> y (M, H)
//   MoELayer q(model, quant_config, quantized_weights, options);   // codes + QuantConfig scales
//   MoELayer c = load_moe_layer("ckpt/", 3, options);  // layer/checkpoint.h
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/comm/communicator.h"
#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/core/workspace.h"
#include "moekit/layer/presets.h"
#include "moekit/modular/expert_weights.h"
#include "moekit/modular/kernel.h"
#include "moekit/oracle/plan.h"
#include "moekit/router/router.h"

namespace moekit {

// Environment variable: "1" makes every layer batch-invariant (MoELayerOptions::batch_invariant).

// Folded shared experts run as extra routed experts: their width split into c = I_s / I chunks
// that every token visits with weight 1 (or the model's per-token gate), so one pass of the grouped
// GEMMs computes both and the finalize adds them (no separate MLP, no separate add). Possible for
// an unquantized layer without EP, a modular kernel, no expert biases, the router weight not on the
// input, I_s a multiple of I. NOTE: folding copies the routed experts once, at construction, into
// tensors with room for the chunks; the device holds both copies for that moment.
enum class SharedExpertsMode {
  // Fold where possible and the shared experts span at least two chunks, or one chunk of
  // I < kAutoFoldMinWidth on a tensor-parallel rank (tp_size > 1); chunks of
  // I < kAutoFoldMinWidth only for forwards of up to kAutoFoldMaxTokensNarrow tokens (larger ones
  // run the separate pass, from the shared tensors the layer then also keeps; a batch-invariant
  // layer folds them at every size). Measured on the
  // H200 (bench/results/2026-12-02-h200-shared-fold), folded / separate: qwen1.5-moe-a2.7b (4
  // chunks of 1408) 1.06x-1.55x at M <= 4096, 0.98x-1.17x at 16384; deepseek-v3 (1 chunk, whose
  // own pass overlaps the routed experts) 0.96x-1.04x. (deepseek-v3 --tp 8 was measured with
  // 8 chunks of 256, when every TP rank held the whole shared expert: 1.01x-1.26x at M <= 256,
  // 0.83x-0.88x at M >= 1024. Since 2026-12-05 a rank holds its I_s / tp slice, one chunk there:
  // on an H100, bench/results/2026-12-05-h100-load-groups, folded / separate 91.9 -> 62.9 us at
  // M = 1, 914 -> 817 at 64, 1.04x-1.07x at 1024 and 16384, which still run the separate pass.)
  kAuto,
  kFolded,    // fold; a layer that cannot throws moekit::UnsupportedError with the reason
  kSeparate,  // the shared experts' own pass, added after the routed experts
};
inline constexpr int64_t kAutoFoldMinWidth = 1024;
inline constexpr int64_t kAutoFoldMaxTokensNarrow = 256;
const char* shared_experts_mode_name(SharedExpertsMode mode);  // "auto", "folded", "separate"
// Parses a name of shared_experts_mode_name; false for any other.
bool parse_shared_experts_mode(std::string_view name, SharedExpertsMode* mode);
inline constexpr const char* kBatchInvariantEnvVar = "MOEKIT_BATCH_INVARIANT";

// The tensors of one layer on this rank. Shapes: E_local experts, E global, H hidden,
// I intermediate, N1 = 2I gated or I `_no_mul`; Kc = the packed row bytes of a quantized format.
//
// NOTE: the layer takes these tensors over: the routed experts' tensors are rewritten in place
// into the chosen kernel's layout (MoELayer::kernel_weights()), so a caller that kept views of
// them sees that layout afterwards — unless the shared experts fold into the routed ones
// (MoELayerOptions::fold_shared_experts): then the routed and shared tensors are copied once into
// tensors with room for the shared chunks and released. Read experts back with
// MoELayer::expert_reference(), the shared experts with MoELayer::shared_reference().
struct MoELayerWeights {
  Tensor w13;       // (E_local, N1, H) in options.dtype, or (E_local, N1, Kc) codes (quantized)
  Tensor w2;        // (E_local, H, I) in options.dtype, or (E_local, H, Kc) codes
  Tensor w13_bias;  // (E_local, N1) in options.dtype (f32 also for quantized layers), optional
  Tensor w2_bias;   // (E_local, H), optional
  Tensor e_score_correction_bias;  // (E,) f32, optional (DeepSeek-V3 selection bias)
  Tensor shared_w13;               // (2*I_s, H) in options.dtype, optional shared experts
  Tensor shared_w2;                // (H, I_s)
  Tensor router_weight;            // (E, H) f32 on the CPU, optional: the gate (router_logits())
  Tensor router_bias;              // (E,) f32 on the CPU, optional: the gate's bias (gpt-oss)
  // (1, H) or (H,), f32 or options.dtype: the per-token gate of the shared experts, for models with
  // ModelPreset::shared_expert_gate (Qwen2-MoE): shared output scaled by sigmoid(x . shared_gate).
  Tensor shared_gate;
};

struct MoELayerOptions {
  DType dtype = DType::kBF16;             // activation dtype (and of unquantized weights)
  DeviceInfo device = cpu_device_info();  // where the layer runs
  ParallelConfig parallel;                // EP rank / size (the expert_map follows from it)
  std::string backend = "auto";           // force an experts backend by name ("auto": the oracle)
  std::string tile_config = "auto";       // force the experts' GEMM tile config by table name
  // Force a prepare/finalize factory by name ("auto": the deployment's all-to-all backend
  // chooses), e.g. an exchanging one on a single rank to test it against no_ep.
  std::string prepare_finalize = "auto";
  // A token's output independent of the other tokens in its batch (MoEConfig::batch_invariant);
  // also set by the environment variable MOEKIT_BATCH_INVARIANT=1.
  bool batch_invariant = false;
  int64_t max_num_tokens = 8192;  // per forward; sizes the workspaces once
  // Caller-owned workspaces shared by several layers (grown to this layer's worst case at
  // construction); when null the layer owns its own.
  WorkspaceManager* workspace = nullptr;
  // The ranks' token exchange, for deployments that move tokens between ranks (the plan's
  // prepare/finalize says when one is needed); null for single-rank deployments.
  std::shared_ptr<Communicator> communicator;
  // Loading checkpoints (load_moe_layer): scan every weight once and refuse a non-finite value
  // (NaN / Inf floats, fp8 NaN codes), naming the tensor, the element and the value. Scales are
  // always checked. Off by default in the library (it reads every byte); on in the CLI.
  bool check_finite_weights = false;
  // How the shared experts run (SharedExpertsMode); MoELayer::shared_fold_reason() says why a
  // layer does not fold.
  SharedExpertsMode shared_experts = SharedExpertsMode::kAuto;
};

// The shared experts as f32 host tensors in the standard layout (MoELayer::shared_reference()).
struct SharedExpertWeights {
  Tensor w13;   // (N_s, H): [gate; up] rows for gated activations
  Tensor w2;    // (H, I_s)
  Tensor gate;  // (H,) when the model gates them per token, else undefined
};

class MoELayer {
 public:
  // An unquantized layer: weights in options.dtype.
  MoELayer(const ModelPreset& model, MoELayerWeights weights, MoELayerOptions options = {});
  // Any scheme: `quant` describes the weights (QuantConfig::unquantized() for float weights;
  // quantized: codes in weights.w13/w2, scales in the QuantConfig, config/quant_factories.h).
  // Validates the weights against the model shape and the rank's expert range, builds the router,
  // plans once (throws moekit::UnsupportedError with every candidate's reason when nothing, or a
  // forced backend that, cannot serve the deployment), rewrites the weights into the kernel's
  // layout in place and reserves the workspaces for max_num_tokens.
  // `plan`: a plan already made for this deployment and scheme (a Quark method plans at
  // construction, as the seed's methods do); the layer then does not select again.
  MoELayer(const ModelPreset& model, QuantConfig quant, MoELayerWeights weights,
           MoELayerOptions options, std::optional<MoEPlan> plan = std::nullopt);
  MoELayer(MoELayer&&) noexcept;
  MoELayer& operator=(MoELayer&&) noexcept;
  ~MoELayer();

  // Seeded random unquantized weights for this rank (scaled so activations stay O(1)): EP rank r's
  // experts are experts [r * E_local, (r + 1) * E_local) of the single-rank model of the seed; on
  // options.device. `routed_experts` false leaves w13/w2 and their biases out (a quantized layer
  // brings its own).
  static MoELayerWeights random_weights(const ModelPreset& model, const MoELayerOptions& options,
                                        uint64_t seed, bool routed_experts = true);
  // Global expert e of random_weights(model, options, seed) as f32 host tensors in the standard
  // layout (w13 (N1, H), w2 (H, I), biases when the model has them), whichever rank holds it.
  static ExpertWeights random_expert(const ModelPreset& model, const MoELayerOptions& options,
                                     uint64_t seed, int64_t expert);

  // hidden_states (M, H) in the layer dtype, router_logits (M, E) f32/bf16/f16 -> (M, H).
  // Adds the shared experts' output when the layer has shared experts (under EP within one
  // data-parallel group, on EP rank 0 only, since the ranks' outputs are summed).
  // With a monolithic kernel (e.g. the forced "cpu_monolithic" backend) the layer does not route:
  // it hands the logits, with its router's grouping, bias and scaling factor, to
  // kernel().apply_monolithic. Monolithic kernels take no shared experts, so the layer then runs
  // them itself beside the kernel and adds them the same way.
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

  // x (M, H) on the CPU -> logits (M, E) f32 on the CPU: x @ router_weight^T + router_bias (when
  // given) in double. Throws when the layer has no router weight.
  Tensor router_logits(const Tensor& x) const;

  const ModelPreset& model() const { return model_; }
  const MoEConfig& moe_config() const { return moe_; }
  const MoELayerOptions& options() const { return options_; }
  // What the kernel runs with: the given QuantConfig with the biases of the kernel's layout.
  const QuantConfig& quant_config() const { return quant_; }
  bool is_quantized() const { return quant_.is_quantized(); }
  // "unquantized (bf16)", or the scheme's quant keys, e.g. "fp8_w8a8 (QuantKey(...) x ...)".
  std::string scheme() const;
  // The tolerance-table entry a check of this layer uses ("bf16", "fp8_w8a8", "mxfp4", ...).
  std::string tolerance_name() const;
  // The routed experts' tensors as the kernel reads them (the plan's weight layout); with folded
  // shared experts, E_local + shared_chunks() experts.
  const ExpertWeights& kernel_weights() const { return kernel_weights_; }
  // The non-routed tensors as given (router bias and weight, shared experts unless folded).
  const MoELayerWeights& weights() const { return weights_; }
  // f32 host copies of local expert `e` in the standard layout, dequantized for quantized
  // schemes: w13 (N1, H), w2 (H, I), biases (N1,) / (H,) when present. Reads one expert.
  ExpertWeights expert_reference(int64_t e) const;
  // Bytes of the routed experts' tensors (codes + biases; scales of the QuantConfig included).
  size_t expert_weight_bytes() const;

  const Router& router() const { return *router_; }
  FusedMoEKernel& kernel() const { return *kernel_; }
  // Whether the layer has shared experts (folded into the routed experts, inside the kernel, or
  // beside a monolithic one).
  bool has_shared_experts() const {
    return shared_chunks_ > 0 || kernel_->has_shared_experts() || shared_beside_kernel_ != nullptr;
  }
  // "" when the shared experts run folded into the routed ones (MoELayerOptions::shared_experts),
  // else why they run as a separate pass (or that there are none).
  const std::string& shared_fold_reason() const { return shared_fold_reason_; }
  // Extra routed experts the folded shared experts occupy: local experts [E_local, E_local + c)
  // of kernel_weights(), I wide each; 0 when not folded.
  int shared_chunks() const { return shared_chunks_; }
  // Forwards of at most this many tokens visit the chunks; larger ones run the shared experts'
  // own pass (shared_fold_token_limit). 0 when not folded.
  int64_t shared_fold_max_tokens() const {
    return shared_chunks_ > 0 ? shared_fold_max_tokens_ : 0;
  }
  // The shared experts wherever the layer holds them (as given, or chunks of kernel_weights()).
  // Throws when the layer has none.
  SharedExpertWeights shared_reference() const;
  // The plan this layer was built from (experts, prepare/finalize, weight layout, every reason).
  const MoEPlan& plan() const { return plan_; }
  // The experts part of the plan as a table (chosen backend, every rejection and its reason).
  const OracleReport& selection() const { return plan_.experts_report; }
  const Tensor& expert_map() const { return expert_map_; }  // (E,) int32, undefined without EP
  int first_local_expert() const { return first_local_expert_; }
  WorkspaceManager& workspace() { return options_.workspace ? *options_.workspace : *workspace_; }
  // The workspace slots a forward of up to max_num_tokens tokens uses (reserved at construction).
  const std::vector<WorkspaceRequest>& workspace_requests() const { return workspace_requests_; }
  // The layer's own stream, used when a forward's RunContext has none (GPU layers only).
  Stream default_stream() const { return stream_ ? stream_->get() : Stream{}; }

  // The MoEConfig a layer of this model gets under these options (also used by `moekit explain`).
  static MoEConfig make_moe_config(const ModelPreset& model, const MoELayerOptions& options);
  static RouterConfig make_router_config(const ModelPreset& model, const Tensor& bias);
  // The shared experts' intermediate width on this rank: I_s = shared_intermediate_size x
  // num_shared_experts split over the tensor-parallel ranks as the routed experts' I is (a rank
  // holds gate and up rows [tp_rank I_s / tp, (tp_rank + 1) I_s / tp) and those columns of down,
  // so the ranks' partial outputs sum to the layer's output). Throws when tp_size does not divide
  // I_s; 0 for a model without shared experts.
  static int64_t shared_width(const ModelPreset& model, const ParallelConfig& parallel);
  // Why a layer of this model, deployment, scheme and plan runs its shared experts as a separate
  // pass, or "" when they fold into the routed experts (SharedExpertsMode). *impossible (when
  // given) is set when the reason rules folding out, not just the mode.
  static std::string shared_fold_reason_for(const ModelPreset& model, const MoEConfig& moe,
                                            const QuantConfig& quant, const MoEPlan& plan,
                                            SharedExpertsMode mode = SharedExpertsMode::kAuto,
                                            bool* impossible = nullptr);
  // How such a layer runs its shared experts, for `explain` ("folded into the routed experts: ..."
  // or "separate pass (why)"); "" when the model has none.
  // The largest forward (tokens) that runs folded shared experts as slots; larger ones run the
  // separate pass. auto with chunks of I < kAutoFoldMinWidth: kAutoFoldMaxTokensNarrow (the
  // layer then holds the shared experts twice: chunks and dense), except in a batch-invariant
  // layer (one order of a token's sums at every batch size); otherwise no limit.
  static int64_t shared_fold_token_limit(const MoEConfig& moe, SharedExpertsMode mode);
  static std::string shared_experts_note(const ModelPreset& model, const MoEConfig& moe,
                                         const QuantConfig& quant, const MoEPlan& plan,
                                         SharedExpertsMode mode = SharedExpertsMode::kAuto);

 private:
  ModelPreset model_;
  MoELayerOptions options_;
  MoEConfig moe_;
  QuantConfig quant_;
  MoEPlan plan_;
  MoELayerWeights weights_;       // router bias and weight, shared experts (routed ones moved out)
  ExpertWeights kernel_weights_;  // the routed experts, in the plan's weight layout
  std::unique_ptr<Router> router_;
  std::unique_ptr<FusedMoEKernel> kernel_;
  // The shared experts when the kernel is monolithic (run by the layer, not the kernel).
  std::shared_ptr<SharedExperts> shared_beside_kernel_;
  Tensor expert_map_;
  int first_local_expert_ = 0;
  std::unique_ptr<WorkspaceManager> workspace_;
  std::vector<WorkspaceRequest> workspace_requests_;
  std::unique_ptr<CudaStream> stream_;
  Tensor routing_ids_;      // (max_num_tokens, k) int32: router output / converted int64 ids
  Tensor routing_weights_;  // (max_num_tokens, k) f32
  // Folded shared experts: the routing with their slots, (max_num_tokens, k + c).
  Tensor folded_ids_, folded_weights_;
  Tensor shared_gate_;  // (H,) f32 on the device: the shared experts' per-token gate, if any
  Tensor gate_values_;  // (max_num_tokens,) f32: the gate's values (the separate pass)
  std::string shared_fold_reason_;
  int shared_chunks_ = 0;
  int64_t shared_fold_max_tokens_ = 0;
  MoEConfig kernel_moe_;  // moe_, with the folded shared experts as extra experts and slots
  RunContext complete(RunContext ctx) const;
  void check_hidden_states(const Tensor& hidden_states) const;
  void check_weights() const;
  // Adds the shared experts' output (M, H) to output when this rank contributes them, scaled per
  // token by the shared gate when the model has one (computed from hidden_states).
  void add_shared_output(Tensor& output, const Tensor& shared_output, const Tensor& hidden_states,
                         RunContext ctx) const;
  void fold_shared_into_routed();
  // The kernel on a routing: ids / topk_weights (M, k), or (M, k + c) with the folded shared
  // experts' slots already in it when slots_routed.
  void apply_routed(Tensor& output, const Tensor& hidden_states, const Tensor& ids,
                    const Tensor& topk_weights, bool slots_routed, RunContext ctx);
  static std::string fold_obstacle(const ModelPreset& model, const MoEConfig& moe,
                                   const QuantConfig& quant, const MoEPlan& plan);
  void forward_monolithic_into(Tensor& output, const Tensor& hidden_states,
                               const Tensor& router_logits, RunContext ctx);
};

// The tolerance-table entry for a scheme ("bf16", "fp8_w8a8", "int4_w4a16", "nvfp4", ...).
std::string tolerance_name_for(const QuantConfig& quant, DType activation_dtype);

}  // namespace moekit
