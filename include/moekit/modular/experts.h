// Experts: [Permute -> GEMM1 -> activation (-> quantize) -> GEMM2 -> Unpermute]. Every concrete
// class publishes a static ExpertsClass: its capability record plus a factory, so the oracle can
// check support before construction (is_supported_config, in the seed's order, with reasons).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/modular/topk_weight_and_reduce.h"
#include "moekit/modular/types.h"

namespace moekit {

class Communicator;
class Experts;

// A (weight key, activation key) pair an experts class accepts; nullopt = unquantized operand.
struct QuantScheme {
  std::optional<QuantKey> weight;
  std::optional<QuantKey> activation;
};

// Parallel deployments an experts class can serve.
struct ParallelSupport {
  bool expert_parallel = true;  // EP (expert_map) at all
  bool all2all = true;          // DP+EP with an all-to-all prepare/finalize
  bool requires_ep = false;     // only under EP: the megakernel experts, which exchange tokens
  std::vector<All2AllBackend> all2all_backends;  // empty: any
};

// The static capability record of an experts class.
struct ExpertsCapabilities {
  std::string name;  // class name, e.g. "CpuReferenceExperts"
  ActivationFormat format = ActivationFormat::kStandard;
  bool monolithic = false;
  std::vector<DeviceType> device_types;  // where it runs
  int min_compute_capability = 0;        // CUDA only, e.g. 90
  int max_compute_capability = 1000;     // CUDA only, e.g. 90 for sm_90a-only kernels
  bool supports_no_act_and_mul = true;
  std::vector<Activation> activations;
  std::vector<QuantScheme> quant_schemes;
  ParallelSupport parallel;
  std::vector<RoutingMethodType> routing_methods;  // monolithic must list; modular: empty = any
  std::vector<DType> router_logits_dtypes;         // monolithic must list; modular: empty = any
  int64_t hidden_dim_multiple = 1;
  std::vector<DType> in_dtypes;  // activation dtypes (bf16, f16, f32)
  bool supports_expert_map = true;
  bool supports_bias = true;
  bool supports_lora = false;
  bool expects_unquantized_inputs = false;
};

struct SupportResult {
  bool supported = true;
  std::string reason;  // "kernel does not support ..." when not supported
};

// The "class object" of an experts implementation: its capabilities and a factory.
class ExpertsClass {
 public:
  using Factory = std::function<std::unique_ptr<Experts>(const MoEConfig&, const QuantConfig&,
                                                         std::optional<int64_t> max_num_tokens,
                                                         std::optional<int> num_dispatchers)>;
  // Optional extra predicate run after the record's checks (e.g. a GEMM's can_implement).
  using ShapeCheck = std::function<std::string(const MoEConfig&)>;

  ExpertsClass(ExpertsCapabilities caps, Factory make, ShapeCheck shape_check = {});

  const ExpertsCapabilities& caps() const { return caps_; }
  const std::string& name() const { return caps_.name; }
  ActivationFormat activation_format() const { return caps_.format; }
  bool is_monolithic() const { return caps_.monolithic; }

  // Checks, in the seed's order: device, no act-and-mul, activation, quant scheme, parallel config,
  // routing method, router-logits dtype, hidden-dim shape, activation format; then input dtype,
  // bias, LoRA. The reason reads "kernel does not support <what>".
  SupportResult is_supported_config(const MoEConfig& moe, const std::optional<QuantKey>& weight_key,
                                    const std::optional<QuantKey>& activation_key,
                                    ActivationFormat activation_format) const;

  std::unique_ptr<Experts> make(const MoEConfig& moe, const QuantConfig& quant,
                                std::optional<int64_t> max_num_tokens = std::nullopt,
                                std::optional<int> num_dispatchers = std::nullopt) const;

 private:
  ExpertsCapabilities caps_;
  Factory make_;
  ShapeCheck shape_check_;
};

class Experts {
 public:
  // Throws when max_num_tokens/num_dispatchers disagree with the activation format (both set for
  // BatchedExperts, both absent for Standard).
  Experts(const ExpertsClass& klass, const MoEConfig& moe, const QuantConfig& quant,
          std::optional<int64_t> max_num_tokens, std::optional<int> num_dispatchers);
  virtual ~Experts() = default;
  Experts(const Experts&) = delete;
  Experts& operator=(const Experts&) = delete;

  const ExpertsClass& klass() const { return klass_; }
  const std::string& name() const { return klass_.name(); }
  ActivationFormat activation_format() const { return klass_.activation_format(); }
  bool is_monolithic() const { return klass_.is_monolithic(); }
  virtual bool expects_unquantized_inputs() const {
    return klass_.caps().expects_unquantized_inputs;
  }
  virtual bool supports_expert_map() const { return klass_.caps().supports_expert_map; }
  virtual bool supports_packed_ue8m0_act_scales() const { return false; }

  const MoEConfig& moe_config() const { return moe_; }
  const QuantConfig& quant_config() const { return quant_; }
  std::optional<int64_t> max_num_tokens() const { return max_num_tokens_; }
  std::optional<int> num_dispatchers() const { return num_dispatchers_; }
  const Tensor& a2_scale() const { return quant_.a2.scale; }

  // Whether the experts exchange tokens between ranks themselves (the megakernel experts, whose
  // record says requires_ep): the kernel then calls apply on every forward, an idle rank's (M = 0)
  // too, since the other ranks' tokens still arrive there.
  bool exchanges_tokens() const { return klass_.caps().parallel.requires_ep; }
  // Called once when the kernel is assembled, with the communicator of the prepare/finalize (null
  // without one). Experts that exchange tokens bootstrap their transport here. Default: nothing.
  virtual void bind_communicator(Communicator* /*comm*/) {}
  // Called once by the layer after the weights are in this class's layout and before the first
  // apply (outside any graph capture): experts may precompute per-weight launch state here
  // (tensor maps, kernel attributes). Later applies receive these same tensors. Default: nothing.
  virtual void bind_weights(const Tensor& /*w1*/, const Tensor& /*w2*/) {}

 private:
  const ExpertsClass& klass_;
  MoEConfig moe_;
  QuantConfig quant_;
  std::optional<int64_t> max_num_tokens_;
  std::optional<int> num_dispatchers_;
};

struct ExpertsApplyArgs {
  Tensor output;  // (M, topk, K) unweighted, or (E_local, T, K) batched, or (M, K) if reduced
  Tensor hidden_states;  // a1q: (M, K) or (E_local, T, K)
  Tensor w1;             // (E_local, N, K), N = 2I gated or I
  Tensor w2;             // (E_local, K, I)
  Tensor topk_weights;   // (M, topk) f32
  Tensor topk_ids;       // (M, topk) int32 global ids
  Activation activation = Activation::kSilu;
  int64_t global_num_experts = 0;
  Tensor expert_map;  // (E_global,) int32 or undefined
  Tensor a1q_scale;
  Tensor a2_scale;
  // >= either GEMM output. The kernel may place `output` over it (FusedMoEKernel does unless the
  // experts write the caller's output directly): nothing GEMM2 reads may live here.
  Tensor workspace13;
  Tensor workspace2;  // >= the activation output
  const ExpertTokensMetadata* expert_tokens_meta = nullptr;
  bool apply_router_weight_on_input = false;
  // Output rows of tokens with no expert on this rank may be left unwritten (the caller never
  // reads them: the expert-parallel peer experts' received rows). Default: they are zeros.
  bool skip_unrouted_rows = false;
  // The token count the GEMM tiles are chosen for; 0: hidden_states' rows. Experts given padded
  // rows (the peer experts' ranks x max_num_tokens) pass the count they expect to be routed.
  int64_t tile_tokens = 0;
};

class ExpertsModular : public Experts {
 public:
  using Experts::Experts;
  // (E, M, N, K, topk) from the tensors; M is max_num_tokens in batched format.
  virtual ProblemSize moe_problem_size(const Tensor& a1, const Tensor& w1, const Tensor& w2,
                                       const Tensor& topk_ids) const;
  virtual DType workspace_dtype(DType act_dtype) const { return act_dtype; }
  virtual WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                           int64_t global_num_experts, int64_t local_num_experts,
                                           const ExpertTokensMetadata* expert_tokens_meta,
                                           Activation activation) const = 0;
  static int64_t adjust_N_for_activation(int64_t N, Activation activation) {
    return activation_output_dim(activation, N);
  }
  // Default: the library's activation op on the tensor's device.
  virtual void activation(Activation activation, Tensor& output, const Tensor& input,
                          RunContext ctx) const;
  virtual std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const = 0;
  virtual void apply(const ExpertsApplyArgs& args, RunContext ctx) = 0;

 protected:
  // The workspaces of a BatchedExperts-format class computing row by row: (E, T, max(N, K)),
  // (E, T, N after the activation), output (E, T, K) with T = max_num_tokens * num_dispatchers.
  WorkspaceShapes batched_row_workspace_shapes(int64_t local_num_experts, int64_t N, int64_t K,
                                               Activation activation) const;
};

struct MonolithicApplyArgs {
  Tensor hidden_states;  // (M, K)
  Tensor w1, w2;
  Tensor router_logits;  // (M, E_global)
  Activation activation = Activation::kSilu;
  int64_t global_num_experts = 0;
  Tensor expert_map;
  Tensor a1q_scale;
  bool apply_router_weight_on_input = false;
  std::optional<int> num_expert_group;
  Tensor e_score_correction_bias;  // (E_global,) f32
  std::optional<float> routed_scaling_factor;
  std::optional<int> topk_group;
};

class ExpertsMonolithic : public Experts {
 public:
  using Experts::Experts;
  // Routes, computes and reduces: returns (M, K).
  virtual Tensor apply(const MonolithicApplyArgs& args, RunContext ctx) = 0;
};

}  // namespace moekit
