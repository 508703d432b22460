// Prepare/finalize that move tokens between expert-parallel ranks (DP + EP: each rank brings its
// own tokens, owns experts [rank * E_local, (rank + 1) * E_local) and gets back the whole MoE
// output of its tokens). They exchange through a Communicator (comm/communicator.h) and are chosen
// by the deployment's all-to-all backend (prepare_finalize/factory.h):
//
//   backend                   class                           format    exchange per forward
//   naive                     PrepareFinalizeAllGather         standard  all-gather + all-reduce
//   allgather_reducescatter   PrepareFinalizeAllGather         standard  all-gather +
//   reduce-scatter nccl_all2all              PrepareFinalizeAllToAll          standard  all-to-all
//   each way, only
//                                                                        the tokens a rank needs
//   batched_low_latency       PrepareFinalizeLowLatency        batched   fixed-size all-to-all each
//                                                                        way (per-expert capacity)
//
// Shared by all three:
// - Activations travel quantized (codes + their scales) when every row carries its own scales
//   (per-token or per-group dynamic); a per-tensor scale cannot travel with the rows (a dynamic
//   one depends on the batch; a static one is the maximum over the rank's own experts'
//   calibrated scales, so it differs between ranks), so those activations travel unquantized and
//   the receiving rank quantizes its batch. The router weight is folded into the input (top-1
//   only) before dispatch.
// - Standard format: the experts' output is weighted and reduced on the rank that computed it, in
//   f32 (CPU ranks), and the partials travel back; the token's rank sums them (in rank order, so
//   results are deterministic) and rounds once to the output dtype. Batched (low-latency): the
//   unweighted rows travel back and the token's rank weights and sums them in f32.
// - Every rank calls prepare and finalize in every forward, also with M = 0 tokens (it still
//   serves the others' tokens). State from prepare (who sent what) is kept for the finalize of the
//   same forward.
// - Ranks run on the CPU (MPI); GPU ranks (NCCL) are not served yet and the factories say so.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moekit/comm/communicator.h"
#include "moekit/modular/prepare_finalize.h"

namespace moekit {

// What the three share: the communicator, this rank's place, the experts' split; the standard
// format, where a rank's experts may receive every rank's tokens (the batched one overrides).
class PrepareFinalizeExchange : public PrepareFinalizeModular {
 public:
  // Throws moekit::Error without a communicator, or when num_experts is not a positive multiple
  // of its ranks.
  PrepareFinalizeExchange(Communicator* comm, int64_t num_experts, const char* who);

  std::optional<DType> topk_indices_dtype() const override { return DType::kInt32; }
  int num_dispatchers() const override { return world_; }
  bool output_is_reduced() const override { return true; }
  ActivationFormat activation_format() const override { return ActivationFormat::kStandard; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return std::nullopt; }
  int64_t max_dispatched_tokens(int64_t max_num_tokens) const override {
    return max_num_tokens * world_;
  }

 protected:
  Communicator* comm_;
  int world_, rank_;
  int64_t num_experts_, local_experts_;  // rank d owns [d * local_experts_, (d + 1) * ...)
};

// DP + EP by gathering every rank's tokens: each rank runs its experts over all W * M_max rows
// (padded to the largest rank's M; padding rows route nowhere) and the partial outputs are summed
// back, by a reduce-scatter, or (naive) an all-reduce of which each rank keeps its block.
// Also on GPU ranks (a GPU communicator, e.g. NCCL): the token counts travel on the host (no
// stream is synchronised), the rows in workspace slots reserved for max_num_tokens per rank, so a
// forward allocates nothing; there the partials are summed in the layer dtype (NCCL sums bf16)
// and activations travel unquantized (the receiving rank quantizes them).
class PrepareFinalizeAllGather final : public PrepareFinalizeExchange {
 public:
  enum class Combine { kAllReduce, kReduceScatter };
  PrepareFinalizeAllGather(Communicator* comm, int64_t num_experts, Combine combine);
  // On a GPU communicator: the send / receive / partial-sum slots ("exchange.*") and the input
  // quantization's for W * max_num_tokens rows.
  std::vector<WorkspaceRequest> workspace_requests(int64_t max_num_tokens, int64_t hidden,
                                                   int64_t topk, DType dtype,
                                                   const QuantConfig& quant) const override;

  std::string name() const override {
    return combine_ == Combine::kAllReduce ? "PrepareFinalizeNaiveAllGather"
                                           : "PrepareFinalizeAllGatherReduceScatter";
  }

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override;
  void finalize(const FinalizeArgs& args, RunContext ctx) override;

 private:
  PrepareResult prepare_on_device(const PrepareArgs& args, const Tensor& a1, int64_t topk,
                                  RunContext ctx);
  void finalize_on_device(const FinalizeArgs& args, RunContext ctx);

  Combine combine_;
  int64_t M_ = 0, M_max_ = 0;  // this rank's tokens and the largest rank's, of the last prepare
  Tensor weighted_input_;      // GPU: the router-weighted input, allocated on first use
};

// DP + EP by all-to-all: a token goes once to each rank that owns one of its experts (with its
// k ids and weights; the receiving experts skip the ids they do not own), and its partial output
// comes back from each. Asynchronous form: prepare_async / finalize_async start the transfer and
// return at once; the hook waits for it (the kernel runs the shared experts before calling the
// combine's hook, so they overlap the communication); the receiver finishes.
class PrepareFinalizeAllToAll final : public PrepareFinalizeExchange {
 public:
  PrepareFinalizeAllToAll(Communicator* comm, int64_t num_experts);

  std::string name() const override { return "PrepareFinalizeAllToAll"; }

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override;
  void finalize(const FinalizeArgs& args, RunContext ctx) override;
  bool supports_async() const override { return true; }
  AsyncHandle<PrepareResult> prepare_async(const PrepareArgs& args, RunContext ctx) override;
  AsyncHandle<void> finalize_async(const FinalizeArgs& args, RunContext ctx) override;

 private:
  // From the last prepare: the local token of every row sent (in send order), and the counts.
  std::vector<int64_t> send_token_;
  std::vector<int64_t> send_counts_, recv_counts_;
  int64_t M_ = 0;
};

// DP + EP for decode: fixed-size buffers, so every exchange has the same size whatever the
// routing (what makes the GPU form graph-capturable). Each rank may send at most
// `max_tokens_per_rank` rows to each expert; a rank's experts receive the batched layout
// (E_local, W * max_tokens_per_rank, H) with per-expert counts, rows of source rank 0 first. The
// experts' unweighted rows travel back in their dtype and the token's rank weights and sums them.
class PrepareFinalizeLowLatency final : public PrepareFinalizeExchange {
 public:
  PrepareFinalizeLowLatency(Communicator* comm, int64_t num_experts, int64_t max_tokens_per_rank);

  std::string name() const override { return "PrepareFinalizeLowLatency"; }
  ActivationFormat activation_format() const override { return ActivationFormat::kBatchedExperts; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return capacity_; }

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override;
  void finalize(const FinalizeArgs& args, RunContext ctx) override;

 private:
  int64_t capacity_;
  // From the last prepare: for every (token, slot) of this rank the row of the fixed-size send
  // buffer it went to (-1: no expert); the counts received per (source rank, local expert).
  std::vector<int64_t> slot_row_;
  std::vector<int64_t> recv_counts_;
  // Host buffers of the fixed-size exchanges, kept across forwards (their sizes depend only on
  // the capacity and the row width): allocating them per forward costs page faults that dominate
  // the exchange on the CPU.
  Tensor send_, recv_, send_scale_, recv_scale_, packed_, packed_scale_, back_send_, back_;
  int64_t M_ = 0, topk_ = 0;
  bool weights_on_input_ = false;
};

}  // namespace moekit
