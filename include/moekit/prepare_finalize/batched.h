// Prepare/finalize that builds the BatchedExperts layout on one rank (no communication): the test
// and reference partner of batched experts, and the model of what a low-latency dispatch produces.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "moekit/modular/prepare_finalize.h"

namespace moekit {
namespace detail {
struct BatchedDeviceState;
}  // namespace detail

// prepare: scatters a1 (M, K) into a1q (E_local, T, K), T = max_num_tokens * num_dispatchers,
// where local expert e's rows are its (token m, slot j) pairs in increasing m, then j; unused rows
// are zero. Global ids map to local experts through the expert_map when one is given, otherwise the
// rank owns experts [rank * E_local, (rank + 1) * E_local); ids that map nowhere (-1, out of range,
// another rank's) are skipped. Reports per-expert counts in ExpertTokensMetadata (device tensor and
// host list). An expert with more than T rows is an error naming the expert and the counts.
// Router weight on input (topk == 1) and input quantization as in PrepareFinalizeNoEP.
// finalize: applies the experts' TopKWeightAndReduce, Delegate replaced by NaiveBatched over the
// same layout. On a GPU the same layout is built by the align + scatter kernels and finalize runs
// the batched weighted combine; its buffers are sized for T tokens on first use (a warm-up
// forward) and reused, so later forwards allocate nothing. Quantized activations on a GPU: codes
// with per-row scales (dynamic per token or per group) are made before the scatter and their
// scales scattered beside them; a per-tensor scale (static, or dynamic over the rows that exist)
// quantizes the batch after it, as the CPU path does.
class PrepareFinalizeBatched final : public PrepareFinalizeModular {
 public:
  PrepareFinalizeBatched(int64_t max_num_tokens, int num_local_experts, int num_dispatchers = 1,
                         int rank = 0);

  std::string name() const override { return "PrepareFinalizeBatched"; }
  ActivationFormat activation_format() const override { return ActivationFormat::kBatchedExperts; }
  std::optional<DType> topk_indices_dtype() const override { return std::nullopt; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return max_num_tokens_; }
  int num_dispatchers() const override { return num_dispatchers_; }
  bool output_is_reduced() const override { return false; }
  int num_local_experts() const { return num_local_experts_; }
  int rank() const { return rank_; }

  // The input quantization's slots (detail::input_quant_requests) for E_local * T rows: on a GPU
  // the codes of quantized activations (per-row scales: the M rows before the scatter; a
  // per-tensor scale: the batch after it).
  std::vector<WorkspaceRequest> workspace_requests(int64_t max_num_tokens, int64_t hidden,
                                                   int64_t topk, DType dtype,
                                                   const QuantConfig& quant) const override;
  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override;
  // NOTE: uses the expert_map of the last prepare call (FinalizeArgs does not carry it).
  void finalize(const FinalizeArgs& args, RunContext ctx) override;

 private:
  int64_t max_num_tokens_;
  int num_local_experts_;
  int num_dispatchers_;
  int rank_;
  Tensor expert_map_;  // from the last prepare
  // GPU: routing tables and the batched activations (see src/prepare_finalize/batched_cuda.h).
  std::shared_ptr<detail::BatchedDeviceState> device_state_;
  Tensor weighted_input_;  // GPU: the router-weighted input, allocated on first use
};

}  // namespace moekit
