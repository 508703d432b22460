// Prepare/finalize that move tokens between expert-parallel ranks (DP + EP: each rank brings its
// own tokens, owns experts [rank * E_local, (rank + 1) * E_local) and gets back the whole MoE
// output of its tokens). They exchange through a Communicator (comm/communicator.h) and are chosen
// by the deployment's all-to-all backend (prepare_finalize/factory.h):
//
//   - naive: PrepareFinalizeAllGather, standard format, all-gather + all-reduce;
//   - allgather_reducescatter: PrepareFinalizeAllGather, standard, all-gather + reduce-scatter;
//   - nccl_all2all: PrepareFinalizeAllToAll, standard, an all-to-all each way of only the tokens
//     a rank needs;
//   - batched_low_latency: PrepareFinalizeLowLatency, batched, a fixed-size all-to-all each way
//     (per-expert capacity).
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
// - Ranks run on the CPU (MPI) or on GPUs (NCCL): every form exchanges on both; on GPU ranks
//   the all-to-all reads the routing back to the host (not graph-capturable), and only the
//   low-latency form sends quantized rows (the others quantize on the receiving rank).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "moekit/comm/communicator.h"
#include "moekit/modular/prepare_finalize.h"

namespace moekit {
namespace detail {
struct BatchedDeviceState;
}  // namespace detail

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
  // a1 as it is sent: checked to be where the communicator's buffers are, and multiplied by the
  // router weight when args apply it on the input (on a GPU into weighted_input_, allocated on
  // the first forward).
  Tensor input_to_send(const PrepareArgs& args, const char* who, Stream stream);

  Communicator* comm_;
  int world_, rank_;
  int64_t num_experts_, local_experts_;  // rank d owns [d * local_experts_, (d + 1) * ...)
  Tensor weighted_input_;
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
};

// DP + EP by all-to-all: a token goes once to each rank that owns one of its experts (with its
// k ids and weights; the receiving experts skip the ids they do not own), and its partial output
// comes back from each. Asynchronous form: prepare_async / finalize_async start the transfer and
// return at once; the hook waits for it (the kernel runs the shared experts before calling the
// combine's hook, so they overlap the communication); the receiver finishes.
// On GPU ranks (a GPU communicator, e.g. NCCL): the exchange sizes depend on the routing, and the
// communicator's all-to-all takes its counts on the host, so prepare waits for the stream and
// reads the routing back (M * top_k ids), as DeepEP's normal mode does; the rows move by gather
// kernels and the communicator on the stream, in workspace slots sized for W * max_num_tokens
// rows. Not graph-capturable (refused with the reason while a stream is being captured:
// batched_low_latency is the capturable exchange). The partials travel and are summed (in rank
// order, f32) in the layer dtype; activations travel unquantized and the receiving rank quantizes
// them. The async form completes the transfers before returning on a GPU.
class PrepareFinalizeAllToAll final : public PrepareFinalizeExchange {
 public:
  PrepareFinalizeAllToAll(Communicator* comm, int64_t num_experts);
  ~PrepareFinalizeAllToAll() override;
  PrepareFinalizeAllToAll(const PrepareFinalizeAllToAll&) = delete;
  PrepareFinalizeAllToAll& operator=(const PrepareFinalizeAllToAll&) = delete;

  std::string name() const override { return "PrepareFinalizeAllToAll"; }
  std::vector<WorkspaceRequest> workspace_requests(int64_t max_num_tokens, int64_t hidden,
                                                   int64_t topk, DType dtype,
                                                   const QuantConfig& quant) const override;

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override;
  void finalize(const FinalizeArgs& args, RunContext ctx) override;
  bool supports_async() const override { return true; }
  AsyncHandle<PrepareResult> prepare_async(const PrepareArgs& args, RunContext ctx) override;
  AsyncHandle<void> finalize_async(const FinalizeArgs& args, RunContext ctx) override;

 private:
  PrepareResult prepare_on_device(const PrepareArgs& args, const Tensor& a1, int64_t topk,
                                  RunContext ctx);
  // Starts the combine of GPU ranks: the weighted partials on ctx.stream, their all-to-all on
  // the exchange's own stream (so that what the caller queues on ctx.stream next, the shared
  // experts, overlaps it); returns the rows that come back, ready on ctx.stream once
  // wait_for_combine(ctx) has queued the wait.
  Tensor start_combine_on_device(const FinalizeArgs& args, RunContext ctx);
  void wait_for_combine(RunContext ctx) const;
  // Which local token goes to which rank (send_token_, send_counts_) from the host ids.
  void route(const std::vector<int64_t>& ids, int64_t topk);

  // From the last prepare: the local token of every row sent (in send order), and the counts.
  std::vector<int64_t> send_token_;
  std::vector<int64_t> send_counts_, recv_counts_;
  int64_t M_ = 0;
  // GPU: each token's rows of what comes back ((M, W) int32, -1: none), uploaded by prepare.
  Tensor token_rows_;
  // GPU: the combine's stream and its events (partials ready on the caller's stream; the rows
  // back), created with the object.
  void* combine_stream_ = nullptr;
  void* partials_ready_ = nullptr;
  void* rows_back_ = nullptr;
};

// DP + EP for decode: fixed-size buffers, so every exchange has the same size whatever the
// routing (what makes the GPU form graph-capturable). Each rank may send at most
// `max_tokens_per_rank` rows to each expert; a rank's experts receive the batched layout
// (E_local, W * max_tokens_per_rank, H) with per-expert counts, rows of source rank 0 first. The
// experts' unweighted rows travel back in their dtype and the token's rank weights and sums them.
// On GPU ranks (a GPU communicator, e.g. NCCL) every step runs on the stream: the align + scatter
// kernels build the send layout, the counts and rows travel by the communicator's all_to_all_v of
// fixed sizes, a pack kernel orders each expert's rows by source; nothing is read back to the host
// and the exchange buffers are workspace slots, so a forward is graph-capturable (after a first
// forward sized the routing tables). Quantized activations travel as on CPU ranks: codes with
// their per-row scales (per token, or 1x128 groups: half the bytes of bf16 rows) exchanged and
// packed beside them; under a per-tensor scale the rows travel unquantized and the receiving rank
// quantizes the rows that exist in its batch.
class PrepareFinalizeLowLatency final : public PrepareFinalizeExchange {
 public:
  PrepareFinalizeLowLatency(Communicator* comm, int64_t num_experts, int64_t max_tokens_per_rank);

  std::string name() const override { return "PrepareFinalizeLowLatency"; }
  ActivationFormat activation_format() const override { return ActivationFormat::kBatchedExperts; }
  std::optional<int64_t> max_num_tokens_per_rank() const override { return capacity_; }
  // On a GPU communicator: the received rows, the packed rows, their scales and the counts
  // ("exchange.ll_*"), and the input quantization's slots.
  std::vector<WorkspaceRequest> workspace_requests(int64_t max_num_tokens, int64_t hidden,
                                                   int64_t topk, DType dtype,
                                                   const QuantConfig& quant) const override;

  PrepareResult prepare(const PrepareArgs& args, RunContext ctx) override;
  void finalize(const FinalizeArgs& args, RunContext ctx) override;

 private:
  PrepareResult prepare_on_device(const PrepareArgs& args, const Tensor& a1, RunContext ctx);
  void finalize_on_device(const FinalizeArgs& args, RunContext ctx);

  // GPU: the send layout (E, capacity, H) and its routing tables (the batched scatter's), sized on
  // the first forward.
  std::shared_ptr<detail::BatchedDeviceState> send_state_;
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
