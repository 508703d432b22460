// FusedMoEKernel: one PrepareFinalize paired with one Experts (both modular or both monolithic,
// with the same activation format), plus optional shared experts.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "moekit/modular/experts.h"
#include "moekit/modular/prepare_finalize.h"

namespace moekit {

// A dense MLP every token passes through, beside the routed experts.
class SharedExperts {
 public:
  virtual ~SharedExperts() = default;
  // Workspace slots a forward of up to max_num_tokens tokens uses (reserved once by the layer).
  virtual std::vector<WorkspaceRequest> workspace_requests(int64_t /*max_num_tokens*/) const {
    return {};
  }
  // x (M, H) -> (M, H)
  virtual Tensor forward(const Tensor& x, RunContext ctx) = 0;
};

struct ModularApplyArgs {
  Tensor hidden_states;  // (M, K)
  Tensor w1;             // (E_local, N, K)
  Tensor w2;             // (E_local, K, N/2 or N)
  Tensor topk_weights;   // (M, topk) f32
  Tensor topk_ids;       // (M, topk) int32 (int64 converted at the layer edge)
  Activation activation = Activation::kSilu;
  int64_t global_num_experts = -1;  // -1: the local expert count
  Tensor expert_map;                // (E_global,) int32 or undefined
  bool apply_router_weight_on_input = false;
  Tensor shared_experts_input;  // optional separate input of the shared experts (latent MoE)
  // The caller computes the shared experts another way in this forward (MoELayer's folded
  // slots): the kernel's shared experts do not run and shared_output stays undefined.
  bool skip_shared_experts = false;
  Tensor output;  // optional preallocated (M, K) output; allocated when undefined (CPU convenience)
};

struct MoEOutput {
  Tensor output;         // (M, K) routed experts' result
  Tensor shared_output;  // (M, K) shared experts' result, when there are shared experts
};

class FusedMoEKernel final {
 public:
  // Throws moekit::Error when the two parts disagree (modular/monolithic, activation format).
  FusedMoEKernel(std::unique_ptr<PrepareFinalize> prepare_finalize,
                 std::unique_ptr<Experts> experts,
                 std::shared_ptr<SharedExperts> shared_experts = nullptr,
                 std::optional<ParallelConfig> parallel = std::nullopt, bool inplace = false);

  bool is_monolithic() const { return prepare_finalize_->is_monolithic(); }
  PrepareFinalize& prepare_finalize() const { return *prepare_finalize_; }
  Experts& fused_experts() const { return *experts_; }
  bool supports_expert_map() const { return experts_->supports_expert_map(); }
  bool output_is_reduced() const { return prepare_finalize_->output_is_reduced(); }
  bool has_shared_experts() const { return shared_experts_ != nullptr; }

  // The workspace slots a forward of M tokens needs (reserve once at the worst case): the experts'
  // two (workspace_slots::kExperts13, kExperts2), the prepare/finalize's and the shared experts'.
  std::vector<WorkspaceRequest> workspace_requests(int64_t M, int64_t N, int64_t K, int64_t topk,
                                                   int64_t global_num_experts,
                                                   int64_t local_num_experts, Activation activation,
                                                   DType act_dtype) const;

  MoEOutput apply(const ModularApplyArgs& args, RunContext ctx);
  Tensor apply_monolithic(const MonolithicApplyArgs& args, RunContext ctx);

 private:
  std::unique_ptr<PrepareFinalize> prepare_finalize_;
  std::unique_ptr<Experts> experts_;
  std::shared_ptr<SharedExperts> shared_experts_;
  std::optional<ParallelConfig> parallel_;
  bool inplace_;
};

}  // namespace moekit
