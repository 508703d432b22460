// The CPU reference experts: a straightforward loop over (token, slot) pairs that the GPU kernels
// are compared with. Numerics, identical in every class here:
//   1. h = the input row as float
//   2. g = W1[e] @ h (+ b1[e]), fp32 accumulation, rounded to the activation dtype (as a GEMM1
//      epilogue stores it)
//   3. a = act(g) in fp32 (apply_activation_row), rounded to the activation dtype
//   4. y = W2[e] @ a (+ b2[e]), fp32 accumulation, rounded once to the output dtype
// The activation dtype is the dtype of the experts' output (the workspace dtype: bf16, f16 or
// f32). Unquantized weights only (issue 3 adds the quantization emulation classes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "moekit/config/activation.h"
#include "moekit/modular/experts.h"
#include "moekit/modular/kernel.h"
#include "moekit/router/router.h"

namespace moekit {

// Standard format. apply writes output (M, topk, K) unweighted: row (m, j) is expert
// topk_ids[m, j]'s MLP of hidden_states[m]; slots whose id is -1, out of range or mapped to -1 by
// the expert_map are written as zeros. Biases come from quant_config().w1_bias() (E_local, N) and
// w2_bias() (E_local, K); activation parameters from moe_config().activation_params().
// finalize_weight_and_reduce_impl: Contiguous.
class CpuReferenceExperts final : public ExpertsModular {
 public:
  // Throws UnsupportedError for a quantized QuantConfig.
  CpuReferenceExperts(const MoEConfig& moe, const QuantConfig& quant,
                      std::optional<int64_t> max_num_tokens = std::nullopt,
                      std::optional<int> num_dispatchers = std::nullopt);
  // Capabilities: "CpuReferenceExperts", Standard, CPU, every activation, (unquantized,
  // unquantized) only, bf16/f16/f32 inputs, no-act-and-mul, EP, all2all, expert_map and bias.
  static const ExpertsClass& klass();

  // ws13 (M*topk, max(N, K)), ws2 (M*topk, N/2 gated or N), output (M, topk, K).
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* expert_tokens_meta,
                                   Activation activation) const override;
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override;
  void apply(const ExpertsApplyArgs& args, RunContext ctx) override;
};

// BatchedExperts format (needs max_num_tokens and num_dispatchers). apply reads hidden_states
// (E_local, T, K) and expert_tokens_meta counts and writes output (E_local, T, K): rows below the
// expert's count get the MLP of the same row, the others zeros. Same numerics as
// CpuReferenceExperts, so the batched and standard pipelines agree bitwise.
// finalize_weight_and_reduce_impl: Delegate (the batched prepare/finalize reduces).
class CpuBatchedReferenceExperts final : public ExpertsModular {
 public:
  CpuBatchedReferenceExperts(const MoEConfig& moe, const QuantConfig& quant,
                             std::optional<int64_t> max_num_tokens,
                             std::optional<int> num_dispatchers);
  // As CpuReferenceExperts, named "CpuBatchedReferenceExperts", BatchedExperts format.
  static const ExpertsClass& klass();

  // T = max_num_tokens * num_dispatchers: ws13 (E_local, T, max(N, K)), ws2 (E_local, T, N/2 or
  // N), output (E_local, T, K).
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* expert_tokens_meta,
                                   Activation activation) const override;
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override;
  void apply(const ExpertsApplyArgs& args, RunContext ctx) override;
};

// Monolithic (routes inside), Standard format: apply takes the router logits, routes them with the
// library's routers (include/moekit/router/router.h) and then runs exactly the modular reference
// pipeline: the router weight folded into the input when it goes there (as PrepareFinalizeNoEP
// does), CpuReferenceExperts, then TopKWeightAndReduceContiguous. Its result is therefore bitwise
// the one of router + FusedMoEKernel(PrepareFinalizeNoEP, CpuReferenceExperts).
//
// Routing: moe_config().routing_method gives the scoring and the normalization (see
// router_config()); the MonolithicApplyArgs give the grouping (num_expert_group, topk_group), the
// e_score_correction_bias and the routed_scaling_factor; moe_config().experts_per_token gives k.
// The router weight goes on the input when the router says so (Llama4) or the args ask for it
// (top-1 only).
class CpuReferenceMonolithicExperts final : public ExpertsMonolithic {
 public:
  // Throws UnsupportedError for a quantized QuantConfig.
  CpuReferenceMonolithicExperts(const MoEConfig& moe, const QuantConfig& quant,
                                std::optional<int64_t> max_num_tokens = std::nullopt,
                                std::optional<int> num_dispatchers = std::nullopt);
  // Capabilities: "CpuReferenceMonolithicExperts", monolithic, Standard, CPU, every activation,
  // (unquantized, unquantized) only, bf16/f16/f32 inputs, EP (expert_map: ids of other ranks
  // contribute nothing), bias; routing methods kDefault, kRenormalize, kRenormalizeNaive,
  // kSigmoid, kSigmoidRenorm, kDeepSeekV3, kMiniMax2, kLlama4 (not kTopK: no router here weights
  // the raw logits); router-logits dtypes f32, bf16, f16.
  static const ExpertsClass& klass();

  // The router configuration apply() uses for `moe` and `args`:
  //   kDefault                                softmax, no renormalization
  //   kRenormalize, kRenormalizeNaive         softmax, renormalized (a softmax over the chosen k
  //                                           logits is the renormalized softmax top-k)
  //   kSigmoid                                sigmoid, no renormalization
  //   kSigmoidRenorm, kDeepSeekV3, kMiniMax2  sigmoid, renormalized
  //   kLlama4                                 llama4_top1
  // plus grouped top-k when args.num_expert_group > 0, the bias and the scaling factor of args.
  // E = args.global_num_experts when > 0, else moe.num_experts. Throws UnsupportedError for a
  // routing method outside that list; the router's validate() reports inconsistent fields.
  static RouterConfig router_config(const MoEConfig& moe, const MonolithicApplyArgs& args);

  // hidden_states (M, K) bf16/f16/f32 on the CPU, router_logits (M, E) f32/bf16/f16, w1/w2 as
  // CpuReferenceExperts (same dtype as hidden_states) -> (M, K) in hidden_states' dtype. M = 0
  // returns an empty (0, K) tensor. Allocates its routing and intermediate buffers (CPU only).
  Tensor apply(const MonolithicApplyArgs& args, RunContext ctx) override;

 private:
  CpuReferenceExperts experts_;  // the modular reference this class runs after routing
};

// A dense MLP on the CPU with the same rounding points: y = W2 @ act(W13 @ x + b13) + b2.
class CpuReferenceSharedExperts final : public SharedExperts {
 public:
  // w13 (2*I_s, H) gated or (I_s, H) for `_no_mul` activations; w2 (H, I_s); same float dtype.
  // Optional biases: b13 (2*I_s or I_s,), b2 (H,).
  CpuReferenceSharedExperts(Tensor w13, Tensor w2, Activation activation,
                            ActivationParams params = {}, Tensor b13 = {}, Tensor b2 = {});
  // x (M, H) bf16/f16/f32 -> (M, H) in x's dtype (also the activation dtype).
  Tensor forward(const Tensor& x, RunContext ctx) override;

 private:
  Tensor w13_, w2_, b13_, b2_;
  Activation activation_;
  ActivationParams params_;
};

}  // namespace moekit
