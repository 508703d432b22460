// TopKWeightAndReduce: how top-k weighting and reduction are finished after the experts. The
// experts choose one (finalize_weight_and_reduce_impl) and the prepare/finalize applies it.
#pragma once

#include <memory>
#include <string>

#include "moekit/modular/types.h"

namespace moekit {

class TopKWeightAndReduce {
 public:
  virtual ~TopKWeightAndReduce() = default;
  virtual std::string name() const = 0;
  // Applies topk_weights to fused_expert_output and/or reduces it into output (M, K). When output
  // is undefined a new tensor is allocated. Returns the result.
  virtual Tensor apply(Tensor output, const Tensor& fused_expert_output, const Tensor& topk_weights,
                       const Tensor& topk_ids, bool apply_router_weight_on_input,
                       RunContext ctx) const = 0;
};

// The experts already weighted and reduced: fused_expert_output is (M, K); copy it to output if
// they differ.
class TopKWeightAndReduceNoOp final : public TopKWeightAndReduce {
 public:
  std::string name() const override { return "NoOp"; }
  Tensor apply(Tensor output, const Tensor& fused_expert_output, const Tensor& topk_weights,
               const Tensor& topk_ids, bool apply_router_weight_on_input,
               RunContext ctx) const override;
};

// fused_expert_output is (M, topk, K) (or (M*topk, K)): output[m] = sum_j w[m, j] * y[m, j] in
// order j = 0..topk-1, fp32 accumulation; slots with id -1 contribute nothing; weights are 1 when
// they were applied on the input.
class TopKWeightAndReduceContiguous final : public TopKWeightAndReduce {
 public:
  std::string name() const override { return "Contiguous"; }
  Tensor apply(Tensor output, const Tensor& fused_expert_output, const Tensor& topk_weights,
               const Tensor& topk_ids, bool apply_router_weight_on_input,
               RunContext ctx) const override;
};

// fused_expert_output is batched (E_local, max_tokens, K), in the order the batched prepare laid
// the tokens out (token order within each expert). Needs the expert_map (global -> local) of the
// rank.
class TopKWeightAndReduceNaiveBatched final : public TopKWeightAndReduce {
 public:
  TopKWeightAndReduceNaiveBatched(int rank, int num_local_experts, Tensor expert_map = {})
      : rank_(rank), num_local_experts_(num_local_experts), expert_map_(std::move(expert_map)) {}
  std::string name() const override { return "NaiveBatched"; }
  Tensor apply(Tensor output, const Tensor& fused_expert_output, const Tensor& topk_weights,
               const Tensor& topk_ids, bool apply_router_weight_on_input,
               RunContext ctx) const override;

 private:
  int rank_;
  int num_local_experts_;
  Tensor expert_map_;
};

// "Let the prepare/finalize decide": it substitutes its own implementation.
class TopKWeightAndReduceDelegate final : public TopKWeightAndReduce {
 public:
  std::string name() const override { return "Delegate"; }
  Tensor apply(Tensor output, const Tensor& fused_expert_output, const Tensor& topk_weights,
               const Tensor& topk_ids, bool apply_router_weight_on_input,
               RunContext ctx) const override;
};

}  // namespace moekit
