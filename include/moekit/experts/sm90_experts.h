// Experts on Hopper (sm_90a): the unquantized bf16/f16 MoE pipeline on the GPU.
//
// Sm90GroupedExperts (Standard format) does, on one stream and without host synchronization:
//   1. align: count the (token, k) slots per local expert (expert_map applied, -1 / out-of-range
//   ids
//      skipped), prefix-sum them and sort the slots by expert (stable, deterministic);
//   2. GEMM1 on tensor cores (wgmma), gathering the token rows: g = x[token] @ W13[e]^T (+ b13);
//   3. the activation (every activation of the library), rounded to the activation dtype;
//   4. GEMM2: y = act @ W2[e]^T (+ b2), in expert-sorted order;
//   5. the weighted unpermute and top-k reduction, j = 0..k-1 in order, fp32 accumulation.
// It applies the top-k weights itself, so its finalize is NoOp.
//
// The GEMM tile is chosen by rows per expert, or forced by MoEConfig::tile_config (a name of the
// tile table in src/experts/cuda/sm90/tiles.h; an unknown name is an error listing the valid
// ones).
//
// Sm90SharedExperts runs the shared dense MLP with the same GEMM (one "expert", every token).
// The capability records are compiled in every build, so a CPU-only build can say why they are
// not chosen; constructing them without CUDA throws.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moekit/modular/experts.h"
#include "moekit/modular/kernel.h"

namespace moekit {

namespace sm90 {
struct LaunchState;
struct SharedMlp;
}  // namespace sm90

// Whether the Hopper experts fuse the gated activation into GEMM1 for this layer. Then w13 and its
// bias must be in the blocks-of-32 gate/up order (the weight layout the sm90 backends register,
// sm90_experts.cpp, which the layer applies in place); otherwise they keep the standard layout.
bool sm90_fuses_activation(const MoEConfig& moe);

// The Standard-format launch sequence the Hopper grouped experts share (steps 1-5 above) and its
// launch state; each derived class adds its capability record and its construction (which scheme
// it takes, the tile family, weight scales laid out for the kernel).
class Sm90StandardExpertsBase : public ExpertsModular {
 public:
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* expert_tokens_meta,
                                   Activation activation) const override;
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override;
  void apply(const ExpertsApplyArgs& args, RunContext ctx) override;
  // Prepares the GEMMs' launch state of w1 / w2 once (SM count, kernel attributes, TMA
  // descriptors); applies given other weight tensors prepare theirs at launch.
  void bind_weights(const Tensor& w1, const Tensor& w2) override;
  ~Sm90StandardExpertsBase() override;

  // The tile family of its grouped GEMMs, as the tuned tile tables name it ("16bit", "fp8",
  // "fp8_direct", "int8", "w4a16"; src/experts/cuda/sm90/tile_tables.h), and the names of that
  // family's tiles.
  std::string tile_family() const;
  std::vector<std::string> tile_names() const;
  // Forces every GEMM onto the tile `name` from the next forward on (as MoEConfig::tile_config
  // would), or "auto" for the tuned tables / heuristic again. For `moekit tune`; never call it
  // while a forward is queued or captured. Throws moekit::Error for a name not of this family.
  void force_tile(const std::string& name);
  // Whether GEMM1 and GEMM2 may run as one launch (the decode pair) when both land on a CUDA-core
  // tile (default true); false launches them apart, for `moekit tune`'s per-GEMM times. Same
  // rules as force_tile.
  void allow_decode_pair(bool allow);
  // Its launch state (experts/cuda/sm90_experts.h): Sm90EpPeerExperts' one launch runs these
  // experts' GEMMs with it.
  const sm90::LaunchState& launch_state() const { return *state_; }

 protected:
  Sm90StandardExpertsBase(const ExpertsClass& klass, const MoEConfig& moe,
                          const QuantConfig& quant);
  std::unique_ptr<sm90::LaunchState> state_;  // experts/cuda/sm90_experts.h
};

class Sm90GroupedExperts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90GroupedExperts(const MoEConfig& moe, const QuantConfig& quant);
};

// fp8 W8A8 on Hopper, Standard format: Sm90GroupedExperts' launch sequence on e4m3 operands.
// prepare quantizes a1 on the GPU (workspace slots of the prepare/finalize); GEMM1 gathers the
// token rows of a1q, applies the block / row / tensor scales (block scales per 128 of K, promoted
// out of the tensor cores) and the gated activation; the activation is requantized per the a2
// scheme (fp8, same granularity as a1) and GEMM2 writes bf16/f16 rows that the weighted unpermute
// reduces. Schemes: (128x128 block weights, f32 or e8m0 scales; dynamic 1x128 activation groups),
// (per-tensor weights; static or dynamic per-tensor, or dynamic per-token activations),
// (per-channel weights; dynamic per-token or static / dynamic per-tensor activations).
// At construction the weight scales are laid out for the kernel on the device (the block / channel
// scales follow the gate/up reorder of w13) and static activation scales are copied there.
class Sm90Fp8Experts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90Fp8Experts(const MoEConfig& moe, const QuantConfig& quant);
};

// int8 W8A8 on Hopper, Standard format: the same launch sequence on int8 operands (s8 wgmma,
// exact int32 accumulation, the scales applied once in the epilogue). prepare quantizes a1 to
// int8 on the GPU; the activation is requantized per the a2 scheme. Schemes: per-channel or
// per-tensor weights with dynamic per-token, static per-tensor or dynamic per-tensor activations
// (int8_w8a8_schemes()).
class Sm90Int8Experts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90Int8Experts(const MoEConfig& moe, const QuantConfig& quant);
};

// W4A8 on Hopper, Standard format: int4 weights (uint4b8 pairs, the Quark W4A8 method's layout,
// per-channel f32 scales with the fp8 per-tensor scale folded in) with fp8 activations, the fp8
// launch sequence on e4m3 operands: prepare quantizes a1 (dynamic per-token or static per-tensor),
// the GEMMs stream W packed (half the bytes of fp8) and their producer warpgroup converts each K
// step exactly to e4m3 for the e4m3 wgmma (accumulated over all of K, the scales in the
// epilogue); the activation is requantized per the a2 scheme. Schemes:
// (kInt4W4A8StaticChannelSym or kInt4W4A8StaticGroup128Sym; kFp8DynamicTokenSym or
// kFp8StaticTensorSym): with groups of 128 along K the GEMMs promote every K step with each weight
// row's group scale. H and I multiples of 32.
class Sm90W4A8Experts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90W4A8Experts(const MoEConfig& moe, const QuantConfig& quant);
};

// MXFP4 weights with static per-tensor fp8 activations on the e4m3 wgmma (Quark's
// w_mxfp4_a_fp8), Standard format: Sm90W4A8Experts' launch sequence on the group rows' kernels
// (TileFamily::kMxfp4A8). The e2m1 codes stream packed in their standard order with each row's
// four e8m0 codes per 128 of K (laid out K-major at construction, w13's rows in the kernel order);
// the producer converts each 32-element group exactly to e4m3 with its scale folded in relative
// to a reference per row and K step (sm90/mx_e4m3.h: exact unless a group is under 2^-11 of its
// step's largest), and the consumers promote every step with the reference scale. Schemes:
// (kMxfp4Static, kFp8StaticTensorSym); H and I multiples of 32.
class Sm90Mxfp4Fp8Experts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90Mxfp4Fp8Experts(const MoEConfig& moe, const QuantConfig& quant);
};

// MXFP4 weights with bf16 activations on Hopper (gpt-oss W4A16), Standard format: the same launch
// sequence with W streamed packed (e2m1 pairs, 4.25 bits per weight with the e8m0 scale of each
// 32 of K) and converted to bf16 in shared memory inside the GEMMs' mainloop. Schemes:
// (kMxfp4Static, no activation quantization); bf16 activations; H and I multiples of 32. The
// group scales are laid out at construction in w13's kernel row order on the device. Also
// (kMxfp4Static, kMxfp4Dynamic | kMxfp6E3M2Dynamic | kMxfp6E2M3Dynamic), W4A4 / W4A6 emulated on
// Hopper (no fp4 / fp6 tensor cores): the experts take bf16 inputs, round x and the activation
// to their MX values on the GPU (quant/cuda/mx_qdq.h; every such value is a bf16) and run the
// bf16 GEMMs on them — the CPU OCP MX emulation's numbers up to the order of fp32 sums.
class Sm90Mxfp4Experts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90Mxfp4Experts(const MoEConfig& moe, const QuantConfig& quant);
};

// MXFP6 weights (e3m2 or e2m3 codes, an e8m0 scale per 32 of K) with MXFP6 activations of the same
// element (Quark w_mxfp6_e3m2_a_mxfp6_e3m2 / w_mxfp6_e2m3_a_mxfp6_e2m3) on Hopper, Standard format:
// the W4A16 kernels of Sm90Mxfp4Experts on rows repacked at load into a low nibble plane (the
// MXFP4 kernel layout) and a plane of the codes' top two bits (sm90_mxfp6 backend's weight
// layout), converted exactly to bf16 in the mainloop; the activations rounded to their MXFP6
// values on the GPU (exact in bf16), as for Sm90Mxfp4Experts' MX activations. Also with static
// per-tensor fp8 activations (Quark w_mxfp6_*_a_fp8): their e4m3 codes as bf16 values, the scale
// in each GEMM's epilogue, as Sm90Mxfp4Experts' fp8 ones. H and I multiples of 64 (rows of 3k / 4
// bytes in whole 16-byte chunks).
class Sm90Mxfp6Experts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90Mxfp6Experts(const MoEConfig& moe, const QuantConfig& quant);
};

// NVFP4 weights with bf16 activations on Hopper, Standard format: the W4A16 kernels of
// Sm90Mxfp4Experts with one ue4m3 scale per 16 of K (kernel scale codes laid out at construction)
// and each expert's global scale applied in the GEMMs' epilogue. Scheme: (kNvfp4Static, no
// activation quantization), reached also from W4A4 checkpoints through the weight-only sm90_nvfp4
// backend (their input scales unused); bf16 activations; H and I multiples of 32.
class Sm90Nvfp4Experts final : public Sm90StandardExpertsBase {
 public:
  static const ExpertsClass& klass();
  Sm90Nvfp4Experts(const MoEConfig& moe, const QuantConfig& quant);
};

// BatchedExperts format: hidden_states (E_local, T, K) with per-expert token counts on the device
// (ExpertTokensMetadata); the same GEMM on the batched schedule (expert e's rows are
// [e*T, e*T + count_e)), the activation, GEMM2 into (E_local, T, K). The prepare/finalize's batched
// combine applies the weights (finalize: Delegate).
// Expert parallelism on Hopper without a communication library in the data path: each rank's
// experts exchange the tokens themselves through the other ranks' memory (CUDA IPC: NVLink
// between GPUs, or two processes sharing one GPU), behind the pass-through prepare/finalize of the
// megakernel deployment (All2AllBackend::kMegakernel), as seed 001's megakernel experts. A forward
// dispatches (rows and masked ids into the owning ranks' buffers), meets the other ranks at a
// barrier, runs the local experts on the received rows, combines (partials back into the sources'
// buffers), meets them again and sums the partials in rank order (fp32) into the output;
// graph-capturable. At decode sizes it is one persistent launch (experts/cuda/ep_one_launch.h:
// the GEMMs as CUDA-core tasks), above them a sequence of launches whose local GEMMs are the
// scheme's Hopper experts on the (ranks x max_num_tokens) received rows. Weights: bf16 / f16
// (Sm90GroupedExperts), MXFP4 (Sm90Mxfp4Experts: bf16, MX or fp8 activations; one launch with
// bf16 ones) or NVFP4 weight-only (Sm90Nvfp4Experts, its per-expert global scales in the GEMMs'
// epilogue as the seed's alphas); one record per scheme (klass, mxfp4_klass, nvfp4_klass), each
// registered as backend sm90_ep_peer of its oracle. Every rank must run the same number of
// forwards. The communicator (bind_communicator, from the prepare/finalize) only bootstraps: it
// carries the IPC handles once.
class Sm90EpPeerExperts final : public ExpertsModular {
 public:
  static const ExpertsClass& klass();        // bf16 / f16 weights
  static const ExpertsClass& mxfp4_klass();  // MXFP4 weights
  static const ExpertsClass& nvfp4_klass();  // NVFP4 weights, weight-only
  Sm90EpPeerExperts(const MoEConfig& moe, const QuantConfig& quant);
  ~Sm90EpPeerExperts() override;

  // Allocates this rank's exchange buffer and opens every other rank's (collective: all ranks
  // call it in the same order). Throws moekit::Error without a communicator of ep_size ranks.
  void bind_communicator(Communicator* comm) override;
  void bind_weights(const Tensor& w1, const Tensor& w2) override;
  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* expert_tokens_meta,
                                   Activation activation) const override;
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override;
  void apply(const ExpertsApplyArgs& args, RunContext ctx) override;

  // How a forward runs: as one persistent launch (the megakernel, experts/cuda/ep_one_launch.h:
  // dispatch, the GEMMs on the CUDA-core row, combine and sum in one kernel) or as the sequence
  // of launches whose local GEMMs take the tensor-core tiles. kAuto: one launch where supported
  // and kOneLaunchExpertsPerSlot x ranks x M x top_k <= the global experts (at most a quarter
  // of a row per expert on average: the experts hit get a row each, where the CUDA-core row
  // measured level with the tensor-core tiles — qwen3-30b-a3b M = 1 GEMM1 21.6 vs 19.3 us, GEMM2
  // 13.6 vs 12.8 in the shipped H200 tile table — and a decode step is mostly launches; at a row
  // per expert it is 40% slower, M = 16 GEMM1 177.5 vs 126.0); the sequence otherwise. kOne
  // refuses a forward it cannot run with the reason. The default comes from
  // MOEKIT_EP_PEER_LAUNCH (auto, one, sequence).
  enum class Launch : uint8_t { kAuto, kOne, kSequence };
  static constexpr int64_t kOneLaunchExpertsPerSlot = 4;
  void set_launch(Launch launch) { launch_ = launch; }
  Launch launch() const { return launch_; }
  // Whether the last forward ran as one launch (tests, logs).
  bool last_forward_was_one_launch() const { return last_one_launch_; }

 private:
  static const ExpertsClass& klass_for(const QuantConfig& quant);
  struct Peers;                                     // experts/sm90_ep_peer.cpp
  std::unique_ptr<Sm90StandardExpertsBase> local_;  // the GEMMs on the received rows
  std::unique_ptr<Peers> peers_;
  Launch launch_ = Launch::kAuto;
  bool last_one_launch_ = false;
};

class Sm90BatchedExperts : public ExpertsModular {
 public:
  static const ExpertsClass& klass();
  Sm90BatchedExperts(const MoEConfig& moe, const QuantConfig& quant, int64_t max_num_tokens,
                     int num_dispatchers);

  WorkspaceShapes workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                   int64_t global_num_experts, int64_t local_num_experts,
                                   const ExpertTokensMetadata* expert_tokens_meta,
                                   Activation activation) const override;
  std::shared_ptr<const TopKWeightAndReduce> finalize_weight_and_reduce_impl() const override;
  void apply(const ExpertsApplyArgs& args, RunContext ctx) override;
  // Prepares the GEMMs' launch state of w1 / w2 once (SM count, kernel attributes, TMA
  // descriptors); applies given other weight tensors prepare theirs at launch.
  void bind_weights(const Tensor& w1, const Tensor& w2) override;
  ~Sm90BatchedExperts() override;

 protected:
  Sm90BatchedExperts(const ExpertsClass& klass, const MoEConfig& moe, const QuantConfig& quant,
                     int64_t max_num_tokens, int num_dispatchers);
  std::unique_ptr<sm90::LaunchState> state_;  // experts/cuda/sm90_experts.h
};

// fp8 W8A8 on the batched format (the low-latency exchange's experts for DeepSeek-style fp8
// dispatch): Sm90BatchedExperts' launches on e4m3 operands with Sm90Fp8Experts' schemes and weight
// scales. hidden_states are the codes (E_local, T, K) with a1q_scale (E_local, T, groups) for
// per-row scales (1x128 groups, per token) or the per-tensor scale; the activation is requantized
// per the a2 scheme over the rows that exist (each expert's first count rows; a dynamic
// per-tensor scale's amax over those only), and GEMM2 writes bf16 / f16 rows.
class Sm90BatchedFp8Experts final : public Sm90BatchedExperts {
 public:
  static const ExpertsClass& klass();
  Sm90BatchedFp8Experts(const MoEConfig& moe, const QuantConfig& quant, int64_t max_num_tokens,
                        int num_dispatchers);
};

class Sm90SharedExperts final : public SharedExperts {
 public:
  // w13 (2*I_s or I_s, H), w2 (H, I_s), bf16/f16 on a CUDA device. Its buffers for up to
  // max_num_tokens tokens are workspace slots (shared.hidden / shared.act / shared.out, reserved
  // by the layer through workspace_requests); forward allocates nothing.
  Sm90SharedExperts(Tensor w13, Tensor w2, Activation activation, ActivationParams params,
                    int64_t max_num_tokens);
  ~Sm90SharedExperts() override;
  std::vector<WorkspaceRequest> workspace_requests(int64_t max_num_tokens) const override;
  // Needs ctx.workspace (the slots above) and ctx.stream.
  Tensor forward(const Tensor& x, RunContext ctx) override;

 private:
  std::unique_ptr<sm90::SharedMlp> mlp_;  // weights and launch state (experts/cuda/sm90_experts.h)
  int64_t max_num_tokens_;
};

}  // namespace moekit
