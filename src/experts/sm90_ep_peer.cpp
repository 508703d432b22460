// Sm90EpPeerExperts (moekit/experts/sm90_experts.h): expert parallelism through the ranks' memory,
// the local GEMMs those of Sm90GroupedExperts. The exchange's kernels: experts/cuda/ep_peer.h.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/cuda_seam.h"
#include "experts/cuda/ep_peer.h"
#include "experts/cuda/sm90_experts.h"
#include "moekit/comm/communicator.h"
#include "moekit/core/checks.h"
#include "moekit/core/env.h"
#include "moekit/core/error.h"
#include "moekit/experts/sm90_experts.h"

namespace moekit {
namespace {

constexpr const char* kWho = "Sm90EpPeerExperts";

Sm90EpPeerExperts::Launch launch_from_env() {
  const std::optional<std::string> v = env::get("MOEKIT_EP_PEER_LAUNCH");
  if (!v || v->empty() || *v == "auto") return Sm90EpPeerExperts::Launch::kAuto;
  if (*v == "one") return Sm90EpPeerExperts::Launch::kOne;
  if (*v == "sequence") return Sm90EpPeerExperts::Launch::kSequence;
  MOEKIT_CHECK(false, "MOEKIT_EP_PEER_LAUNCH={} is not one of auto, one, sequence", *v);
  return Sm90EpPeerExperts::Launch::kAuto;
}

}  // namespace

// This rank's buffer and every rank's, as this process addresses them.
struct Sm90EpPeerExperts::Peers {
  cuda::ep::PeerLayout layout;
  cuda::ep::PeerPointers pointers;
  int rank = 0;
  // Frees this rank's buffer and closes the others (those opened so far, if binding failed).
  ~Peers() {
    if constexpr (kCudaBuild) {
      for (int r = 0; r < cuda::ep::kMaxRanks; ++r) {
        char* base = pointers.base[static_cast<size_t>(r)];
        if (r == rank) {
          cuda::ep::free_peer_buffer(base);
        } else {
          cuda::ep::close_peer_buffer(base);
        }
      }
    }
  }
};

namespace {

bool fp4_weights(const QuantConfig& quant, int64_t group) {
  return quant.w1.dtype == QuantDType::kFp4E2M1 && quant.w1.shape == GroupShape{1, group};
}

}  // namespace

const ExpertsClass& Sm90EpPeerExperts::klass_for(const QuantConfig& quant) {
  if (!quant.is_quantized()) return klass();
  if (fp4_weights(quant, 32)) return mxfp4_klass();
  MOEKIT_CHECK(fp4_weights(quant, 16),
               "{} runs bf16 / f16, MXFP4 or NVFP4 weights (the local experts of one of them), "
               "got {}",
               kWho, quant.describe());
  return nvfp4_klass();
}

Sm90EpPeerExperts::Sm90EpPeerExperts(const MoEConfig& moe, const QuantConfig& quant)
    : ExpertsModular(klass_for(quant), moe, quant, std::nullopt, std::nullopt) {
  if constexpr (!kCudaBuild) throw_no_cuda(kWho);
  if (!quant.is_quantized()) {
    local_ = std::make_unique<Sm90GroupedExperts>(moe, quant);
  } else if (fp4_weights(quant, 32)) {
    local_ = std::make_unique<Sm90Mxfp4Experts>(moe, quant);
  } else {
    local_ = std::make_unique<Sm90Nvfp4Experts>(moe, quant);
  }
  launch_ = launch_from_env();
}

Sm90EpPeerExperts::~Sm90EpPeerExperts() = default;

void Sm90EpPeerExperts::bind_communicator(Communicator* comm) {
  const MoEConfig& moe = moe_config();
  const int world = moe.parallel.ep_size;
  MOEKIT_CHECK(comm != nullptr,
               "{}: exchanging tokens needs a communicator of ep_size {} ranks to bootstrap the "
               "peer buffers (MoELayerOptions::communicator)",
               kWho, world);
  MOEKIT_CHECK(comm->world_size() == world && comm->rank() == moe.parallel.ep_rank,
               "{}: the {} communicator is rank {} of {} but the deployment is EP rank {} of {}",
               kWho, comm->name(), comm->rank(), comm->world_size(), moe.parallel.ep_rank, world);
  MOEKIT_CHECK(world <= cuda::ep::kMaxRanks, "{}: ep_size {} > {}", kWho, world,
               cuda::ep::kMaxRanks);
  MOEKIT_CHECK(moe.max_num_tokens > 0, "{}: max_num_tokens must be > 0 to size the buffers, got {}",
               kWho, moe.max_num_tokens);
  const Device device = moe.device.device();
  MOEKIT_CHECK(device.is_cuda(), "{} runs on a CUDA device, not {}", kWho, device.to_string());
  if constexpr (kCudaBuild) {
    auto peers = std::make_unique<Peers>();
    peers->rank = comm->rank();
    peers->layout = cuda::ep::make_peer_layout(world, moe.max_num_tokens, moe.hidden_dim,
                                               moe.experts_per_token, element_size(moe.in_dtype));
    const cuda::ep::OwnBuffer own = cuda::ep::allocate_peer_buffer(peers->layout, device.index);
    peers->pointers.base[static_cast<size_t>(peers->rank)] = own.base;
    // The 64-byte handles travel as eight int64 through the communicator's host exchange.
    std::array<std::vector<int64_t>, 8> words;
    for (size_t i = 0; i < own.handle.size(); ++i)
      words[i] = comm->all_gather_host(own.handle[i]);
    for (int r = 0; r < world; ++r) {
      if (r == peers->rank) continue;
      std::array<int64_t, 8> handle{};
      for (size_t i = 0; i < handle.size(); ++i)
        handle[i] = words[i][static_cast<size_t>(r)];
      peers->pointers.base[static_cast<size_t>(r)] =
          cuda::ep::open_peer_buffer(handle, device.index);
    }
    // Every rank holds every buffer before any forward writes into one.
    comm->barrier();
    peers_ = std::move(peers);
  }
}

void Sm90EpPeerExperts::bind_weights(const Tensor& w1, const Tensor& w2) {
  local_->bind_weights(w1, w2);
}

WorkspaceShapes Sm90EpPeerExperts::workspace_shapes(int64_t M, int64_t N, int64_t K, int64_t topk,
                                                    int64_t global_num_experts,
                                                    int64_t local_num_experts,
                                                    const ExpertTokensMetadata* meta,
                                                    Activation activation) const {
  // The local GEMMs see every rank's capacity of rows whatever this rank's M; their output (the
  // partials to send back) follows GEMM1's workspace.
  const int64_t rows = moe_config().parallel.ep_size * moe_config().max_num_tokens;
  const WorkspaceShapes local = local_->workspace_shapes(rows, N, K, topk, global_num_experts,
                                                         local_num_experts, meta, activation);
  // workspace2 also holds the one-launch forward's scratch (whichever form a forward takes).
  int64_t ws2 = numel_of(local.workspace2);
  if constexpr (kCudaBuild) {
    const MoEConfig& moe = moe_config();
    const cuda::ep::PeerLayout l =
        cuda::ep::make_peer_layout(moe.parallel.ep_size, moe.max_num_tokens, K,
                                   static_cast<int>(topk), element_size(moe.in_dtype));
    const int64_t es = static_cast<int64_t>(element_size(moe.in_dtype));
    const auto bytes = static_cast<int64_t>(
        sm90::ep_one_launch_workspace_bytes(l, local_num_experts, N, activation));
    ws2 = std::max(ws2, (bytes + es - 1) / es);
  }
  return {{numel_of(local.workspace13) + rows * K}, {ws2}, {M, K}};
}

std::shared_ptr<const TopKWeightAndReduce> Sm90EpPeerExperts::finalize_weight_and_reduce_impl()
    const {
  return std::make_shared<TopKWeightAndReduceNoOp>();
}

void Sm90EpPeerExperts::apply(const ExpertsApplyArgs& args, RunContext ctx) {
  MOEKIT_CHECK(peers_ != nullptr,
               "{}: no peer buffers; the kernel binds the communicator when it is assembled "
               "(make_moe_kernel / MoELayer)",
               kWho);
  const MoEConfig& moe = moe_config();
  const Tensor& x = args.hidden_states;
  expect_dim(x, "hidden_states", 2);
  expect_dtype(x, "hidden_states", {moe.in_dtype});
  expect_contiguous(x, "hidden_states");
  expect_contiguous(args.topk_ids, "topk_ids");
  expect_contiguous(args.topk_weights, "topk_weights");
  expect_contiguous(args.output, "output");
  const int64_t M = x.size(0), K = x.size(1);
  const cuda::ep::PeerLayout& l = peers_->layout;
  MOEKIT_CHECK(M <= l.capacity,
               "{}: hidden_states has M={} tokens but the exchange buffers hold max_num_tokens={}",
               kWho, M, l.capacity);
  MOEKIT_CHECK(
      K == l.hidden && args.topk_ids.size(1) == l.topk,
      "{}: hidden_states (M, {}) with top_k {} but the buffers are for hidden {}, top_k {}", kWho,
      K, args.topk_ids.size(1), l.hidden, l.topk);
  expect_shape(args.output, "output", {M, K});
  MOEKIT_CHECK(reinterpret_cast<uintptr_t>(x.data()) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(args.output.data()) % 16 == 0,
               "{}: hidden_states and output must be 16-byte aligned", kWho);
  MOEKIT_CHECK(ctx.stream.handle != nullptr, "{} on {} needs a CUDA stream", kWho,
               x.device().to_string());

  const int64_t rows = static_cast<int64_t>(l.world) * l.capacity;
  char* own = peers_->pointers.base[static_cast<size_t>(peers_->rank)];
  const Device d = x.device();
  const DType dt = x.dtype();
  const WorkspaceShapes local =
      local_->workspace_shapes(rows, args.w1.size(1), K, l.topk, args.global_num_experts,
                               args.w1.size(0), nullptr, args.activation);
  const int64_t ws13 = numel_of(local.workspace13);
  MOEKIT_CHECK(args.workspace13.numel() >= ws13 + rows * K,
               "{}: workspace13 holds {} elements, needs {}", kWho, args.workspace13.numel(),
               ws13 + rows * K);
  Tensor partial = Tensor::from_blob(
      static_cast<char*>(args.workspace13.data()) + static_cast<size_t>(ws13) * element_size(dt),
      {rows, K}, dt, d);

  cuda::ep::ForwardArgs f;
  f.layout = l;
  f.peers = peers_->pointers;
  f.rank = peers_->rank;
  f.local_experts = moe.num_local_experts;
  f.global_experts = args.global_num_experts;
  f.M = M;
  f.x = x.data();
  f.topk_ids = args.topk_ids.data_as<const int32_t>();
  f.topk_weights = args.topk_weights.data_as<const float>();
  f.partial = partial.data();
  f.out = args.output.data();
  f.f16 = dt == DType::kF16;
  f.stream = ctx.stream.handle;
  auto step = [](int status, const char* what) {
    MOEKIT_CHECK(status == 0, "{}: launching the {} failed (CUDA error {})", kWho, what, status);
  };
  if constexpr (kCudaBuild) {
    // One launch where chosen (Launch) and possible; kOne refuses with the reason.
    const bool decode = kOneLaunchExpertsPerSlot * l.world * std::max<int64_t>(M, 1) * l.topk <=
                        args.global_num_experts;
    if (launch_ == Launch::kOne || (launch_ == Launch::kAuto && decode)) {
      const std::string why =
          sm90::ep_one_launch_unsupported_reason(*local_, local_->launch_state(), f, args);
      MOEKIT_CHECK(
          why.empty() || launch_ == Launch::kAuto,
          "{}: the one-launch forward was asked for (MOEKIT_EP_PEER_LAUNCH=one) but cannot "
          "run this layer: {}",
          kWho, why);
      if (why.empty()) {
        sm90::ep_one_launch_apply(*local_, local_->launch_state(), f, args);
        last_one_launch_ = true;
        ctx.stage_done("dispatch+experts+combine");
        return;
      }
    }
    last_one_launch_ = false;
    step(cuda::ep::launch_dispatch(f), "dispatch");
    step(cuda::ep::launch_barrier(f), "dispatch barrier");
    step(cuda::ep::launch_mask_received(f), "received-row mask");
  }
  ctx.stage_done("exchange");
  ExpertsApplyArgs mine = args;
  mine.hidden_states = Tensor::from_blob(own + l.x, {rows, K}, dt, d);
  mine.topk_ids = Tensor::from_blob(own + l.ids, {rows, l.topk}, DType::kInt32, d);
  mine.topk_weights = Tensor::from_blob(own + l.w, {rows, l.topk}, DType::kF32, d);
  mine.output = partial;
  mine.skip_unrouted_rows = true;  // combine sends back only the rows with an expert here
  // The tiles for about one rank's tokens from each rank, not for the padded buffer.
  mine.tile_tokens = std::max<int64_t>(M, 1) * l.world;
  mine.workspace13 = args.workspace13.reinterpret(local.workspace13, dt);
  mine.workspace2 = args.workspace2;
  local_->apply(mine, ctx);
  if constexpr (kCudaBuild) {
    step(cuda::ep::launch_combine(f), "combine");
    step(cuda::ep::launch_barrier(f), "combine barrier");
    step(cuda::ep::launch_sum(f), "sum of the partials");
  }
  ctx.stage_done("combine");
}

}  // namespace moekit
