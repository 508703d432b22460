// Prepare/finalize for a single rank without expert-parallel communication (TP only, or EP
// without DP): prepare only quantizes, finalize only weights and reduces.
#pragma once

#include <optional>
#include <string>

#include "moekit/modular/prepare_finalize.h"

namespace moekit {

// Standard format. prepare: checks a1 (M, K) bf16/f16/f32, topk_ids (M, topk) int32 and
// topk_weights (M, topk) f32; folds the router weight into a1 when asked (topk == 1 only);
// quantizes a1 unless the experts defer it or a1 is unquantized. Returns no token metadata and no
// dispatched ids. finalize: applies the experts' TopKWeightAndReduce into output, with Delegate
// replaced by Contiguous. The async variants defer the same work to their hook / receiver.
class PrepareFinalizeNoEP final : public PrepareFinalizeModular {
 public:
  std::string name() const override { return "PrepareFinalizeNoEP"; }
  ActivationFormat activation_format() const override { return ActivationFormat::kStandard; }
  std::optional<DType> topk_indices_dtype() const override { return std::nullopt; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return std::nullopt; }
  int num_dispatchers() const override { return 1; }
  bool output_is_reduced() const override { return false; }

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override;
  void finalize(const FinalizeArgs& args, RunContext ctx) override;
  bool supports_async() const override { return true; }
  AsyncHandle<PrepareResult> prepare_async(const PrepareArgs& args, RunContext ctx) override;
  AsyncHandle<void> finalize_async(const FinalizeArgs& args, RunContext ctx) override;
  // On a GPU, a1's codes and scales (when quantized in prepare).
  std::vector<WorkspaceRequest> workspace_requests(int64_t max_num_tokens, int64_t hidden,
                                                   int64_t topk, DType dtype,
                                                   const QuantConfig& quant) const override;

 private:
  // GPU only: the router-weighted input (apply_router_weight_on_input), allocated on first use.
  Tensor weighted_input_;
};

// The megakernel deployment's prepare/finalize (All2AllBackend::kMegakernel): the experts exchange
// the tokens themselves (Experts::exchanges_tokens), so prepare and finalize are those of one rank
// (PrepareFinalizeNoEP, the input left unquantized for the experts) and the communicator is only
// handed to the experts. Its output is reduced across ranks; the experts receive up to ep_size
// times the tokens of one rank.
class PrepareFinalizePassThrough final : public PrepareFinalizeModular {
 public:
  explicit PrepareFinalizePassThrough(Communicator* comm) : comm_(comm) {}
  std::string name() const override { return "PrepareFinalizePassThrough"; }
  ActivationFormat activation_format() const override { return ActivationFormat::kStandard; }
  std::optional<DType> topk_indices_dtype() const override { return std::nullopt; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return std::nullopt; }
  int num_dispatchers() const override { return 1; }
  bool output_is_reduced() const override { return true; }
  Communicator* communicator() const override { return comm_; }
  int64_t max_dispatched_tokens(int64_t max_num_tokens) const override;

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override {
    return local_.prepare(args, ctx);
  }
  void finalize(const FinalizeArgs& args, RunContext ctx) override { local_.finalize(args, ctx); }
  std::vector<WorkspaceRequest> workspace_requests(int64_t max_num_tokens, int64_t hidden,
                                                   int64_t topk, DType dtype,
                                                   const QuantConfig& quant) const override {
    return local_.workspace_requests(max_num_tokens, hidden, topk, dtype, quant);
  }

 private:
  Communicator* comm_;
  PrepareFinalizeNoEP local_;
};

// Monolithic counterpart: prepare passes a1 (quantized like the modular one, unless deferred or
// unquantized) and the router logits through; finalize returns the experts' (M, K) output.
class PrepareFinalizeMonolithicNoEP final : public PrepareFinalizeMonolithic {
 public:
  std::string name() const override { return "PrepareFinalizeMonolithicNoEP"; }
  ActivationFormat activation_format() const override { return ActivationFormat::kStandard; }
  std::optional<DType> topk_indices_dtype() const override { return std::nullopt; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return std::nullopt; }
  int num_dispatchers() const override { return 1; }
  bool output_is_reduced() const override { return false; }

  PrepareMonolithicResult prepare(const Tensor& a1, const Tensor& router_logits,
                                  const QuantConfig& quant_config, bool defer_input_quant,
                                  RunContext ctx) override;
  Tensor finalize(const Tensor& fused_expert_output, RunContext ctx) override;
};

}  // namespace moekit
