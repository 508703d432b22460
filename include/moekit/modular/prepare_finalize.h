// PrepareFinalize: [Quantize + Dispatch] before the experts and [Combine + weight/reduce] after.
// Modular variants take topk ids/weights; monolithic ones take router logits.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "moekit/config/quant_config.h"
#include "moekit/modular/topk_weight_and_reduce.h"
#include "moekit/modular/types.h"

namespace moekit {

class Communicator;
class Experts;

struct PrepareArgs {
  Tensor a1;                // (M, K) unquantized layer input
  Tensor topk_weights;      // (M, topk) f32
  Tensor topk_ids;          // (M, topk) int32, global ids, -1 = no expert
  int64_t num_experts = 0;  // global experts
  Tensor expert_map;        // (E_global,) int32 global -> local id or -1; undefined without EP
  bool apply_router_weight_on_input = false;
  const QuantConfig* quant_config = nullptr;
  bool defer_input_quant = false;  // the experts quantize the input themselves
};

// What prepare hands to the experts.
struct PrepareResult {
  Tensor a1q;        // dispatched (and maybe quantized) activations: (M', K) or (E_local, T, K)
  Tensor a1q_scale;  // their scales, if quantized
  std::optional<ExpertTokensMetadata> expert_tokens_meta;
  Tensor topk_ids;      // dispatched ids when the P/F moved them, else undefined
  Tensor topk_weights;  // dispatched weights when the P/F moved them, else undefined
};

struct FinalizeArgs {
  Tensor output;               // (M, K), written in place
  Tensor fused_expert_output;  // the experts' output (unweighted unless the experts reduced)
  Tensor topk_weights;
  Tensor topk_ids;
  bool apply_router_weight_on_input = false;
  std::shared_ptr<const TopKWeightAndReduce> weight_and_reduce;
};

// An asynchronous step: calling `hook` (optional, cheap) waits for the transfer, `receiver` yields
// the result. Calling both in order is equivalent to the synchronous call.
template <typename Result>
struct AsyncHandle {
  std::function<void()> hook;
  std::function<Result()> receiver;
};

class PrepareFinalize {
 public:
  virtual ~PrepareFinalize() = default;
  virtual std::string name() const = 0;
  virtual bool is_monolithic() const = 0;
  // Settings that depend on the experts (e.g. packed scales); called by FusedMoEKernel.
  virtual void post_init_setup(const Experts& experts) {}
  virtual ActivationFormat activation_format() const = 0;
  // Required dtype of topk ids, if the dispatch constrains it.
  virtual std::optional<DType> topk_indices_dtype() const = 0;
  // Batched implementations process at most this many tokens per rank.
  virtual std::optional<int64_t> max_num_tokens_per_rank() const = 0;
  virtual int num_dispatchers() const = 0;
  // The communicator it exchanges through (null when it has none); the kernel hands it to the
  // experts (Experts::bind_communicator).
  virtual Communicator* communicator() const { return nullptr; }
  // Whether finalize's output is already reduced across ranks.
  virtual bool output_is_reduced() const = 0;
  // The most tokens the experts receive when each rank brings up to max_num_tokens (what sizes
  // their workspaces): more than max_num_tokens when tokens arrive from other ranks.
  virtual int64_t max_dispatched_tokens(int64_t max_num_tokens) const { return max_num_tokens; }
  // Workspace slots (named "<part>.<what>") a forward of up to max_num_tokens tokens of `hidden`
  // elements of `dtype`, quantized in prepare as `quant` (the experts' QuantConfig) says, needs
  // beside the experts'; reserved once by the layer. Default: none.
  virtual std::vector<WorkspaceRequest> workspace_requests(int64_t /*max_num_tokens*/,
                                                           int64_t /*hidden*/, int64_t /*topk*/,
                                                           DType /*dtype*/,
                                                           const QuantConfig& /*quant*/) const {
    return {};
  }
};

class PrepareFinalizeModular : public PrepareFinalize {
 public:
  bool is_monolithic() const final { return false; }
  virtual PrepareResult prepare(const PrepareArgs& args, RunContext ctx) = 0;
  virtual bool supports_async() const { return false; }
  // Throws unless supports_async().
  virtual AsyncHandle<PrepareResult> prepare_async(const PrepareArgs& args, RunContext ctx);
  virtual void finalize(const FinalizeArgs& args, RunContext ctx) = 0;
  virtual AsyncHandle<void> finalize_async(const FinalizeArgs& args, RunContext ctx);
};

struct PrepareMonolithicResult {
  Tensor a1q;
  Tensor a1q_scale;
  Tensor router_logits;  // dispatched router logits
};

class PrepareFinalizeMonolithic : public PrepareFinalize {
 public:
  bool is_monolithic() const final { return true; }
  virtual PrepareMonolithicResult prepare(const Tensor& a1, const Tensor& router_logits,
                                          const QuantConfig& quant_config, bool defer_input_quant,
                                          RunContext ctx) = 0;
  virtual Tensor finalize(const Tensor& fused_expert_output, RunContext ctx) = 0;
};

}  // namespace moekit
