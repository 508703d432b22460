// PrepareFinalizeAllGather (prepare_finalize/exchange.h): every rank's tokens to every rank, the
// partial outputs summed back.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <numeric>

#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"
#include "moekit/prepare_finalize/exchange.h"
#include "prepare_finalize/exchange_common.h"

namespace moekit {
namespace {

constexpr const char* kWho = "PrepareFinalizeAllGather";

// Workspace slots of the GPU path.
constexpr detail::InputExchangeSlots kSlots{"exchange.a1_send",      "exchange.a1_recv",
                                            "exchange.ids_send",     "exchange.ids_recv",
                                            "exchange.weights_send", "exchange.weights_recv"};
constexpr std::string_view kPartialSlot = "exchange.partial";
constexpr std::string_view kMineSlot = "exchange.mine";

// dst (rows, ...) = src's M rows, then `fill` bytes (stream-ordered, device memory).
void copy_padded(const Tensor& dst, const Tensor& src, int fill, Stream stream) {
  const size_t have = src.nbytes(), want = dst.nbytes();
  if constexpr (kCudaBuild) {
    if (have > 0) cuda_rt::copy_async(dst.data(), src.data(), have, stream);
    if (want > have)
      cuda_rt::memset_async(static_cast<char*>(dst.data()) + have, fill, want - have, stream);
  } else {
    throw_no_cuda(std::string(kWho) + " on a GPU");
  }
}

// The local rows padded to `rows` (index -1: zero padding).
std::vector<int64_t> padded_index(int64_t M, int64_t rows) {
  std::vector<int64_t> index(static_cast<size_t>(rows), -1);
  std::iota(index.begin(), index.begin() + M, int64_t{0});
  return index;
}

// send (rows, ...) gathered from every rank: (W * rows, ...).
Tensor all_gather_rows(Communicator& comm, const Tensor& send) {
  Tensor recv = detail::rows_like(send, send.size(0) * comm.world_size());
  comm.all_gather(send, recv, Stream{});
  return recv;
}

}  // namespace

PrepareFinalizeAllGather::PrepareFinalizeAllGather(Communicator* comm, int64_t num_experts,
                                                   Combine combine)
    : PrepareFinalizeExchange(comm, num_experts, kWho), combine_(combine) {}

std::vector<WorkspaceRequest> PrepareFinalizeAllGather::workspace_requests(
    int64_t max_num_tokens, int64_t hidden, int64_t topk, DType dtype,
    const QuantConfig& quant) const {
  if (comm_->device().is_cpu()) return {};
  const size_t rows = static_cast<size_t>(max_num_tokens), all = rows * static_cast<size_t>(world_);
  std::vector<WorkspaceRequest> out =
      detail::input_exchange_requests(kSlots, kPartialSlot, rows, all, hidden, topk, dtype, quant);
  out.push_back({std::string(kMineSlot), rows * static_cast<size_t>(hidden) * element_size(dtype)});
  return out;
}

PrepareResult PrepareFinalizeAllGather::prepare(const PrepareArgs& args, RunContext ctx) {
  const detail::PrepareDims dims = detail::check_prepare_args(args, kWho);
  const Tensor a1 = input_to_send(args, kWho, ctx.stream);
  const std::vector<int64_t> counts = comm_->all_gather_host(dims.M);
  M_ = dims.M;
  M_max_ = *std::max_element(counts.begin(), counts.end());
  if (a1.device().is_cuda()) return prepare_on_device(args, a1, dims.topk, ctx);
  const std::vector<int64_t> index = padded_index(M_, M_max_);

  const detail::DispatchPayload payload =
      detail::make_dispatch_payload(a1, args.quant_config, args.defer_input_quant, ctx);
  const Tensor data = all_gather_rows(*comm_, detail::gather_rows(payload.data, index));
  Tensor scale = payload.scale;
  if (payload.scale_has_rows) scale = all_gather_rows(*comm_, detail::gather_rows(scale, index));
  // Padding rows route nowhere (id -1, weight 0).
  Tensor ids = detail::gather_rows(args.topk_ids, index);
  int32_t* id = ids.data_as<int32_t>();
  std::fill(id + M_ * dims.topk, id + M_max_ * dims.topk, -1);
  PrepareResult result;
  QuantizedInput q = detail::finish_dispatch(data, scale, payload, args.quant_config, ctx);
  result.a1q = std::move(q.data);
  result.a1q_scale = std::move(q.scale);
  result.topk_ids = all_gather_rows(*comm_, ids);
  result.topk_weights = all_gather_rows(*comm_, detail::gather_rows(args.topk_weights, index));
  return result;
}

PrepareResult PrepareFinalizeAllGather::prepare_on_device(const PrepareArgs& args, const Tensor& a1,
                                                          int64_t topk, RunContext ctx) {
  MOEKIT_CHECK(ctx.workspace != nullptr && ctx.stream.handle != nullptr,
               "{} on a GPU needs the workspace manager and a stream in RunContext", kWho);
  expect_contiguous(a1, "a1");
  expect_contiguous(args.topk_ids, "topk_ids");
  expect_contiguous(args.topk_weights, "topk_weights");
  WorkspaceManager& ws = *ctx.workspace;
  const int64_t K = a1.size(1), all = world_ * M_max_;
  auto exchange = [&](std::string_view send_slot, std::string_view recv_slot, const Tensor& src,
                      int64_t cols, int fill) {
    const Tensor send = ws.get(send_slot, {M_max_, cols}, src.dtype());
    copy_padded(send, src, fill, ctx.stream);
    Tensor recv = ws.get(recv_slot, {all, cols}, src.dtype());
    comm_->all_gather(send, recv, ctx.stream);
    return recv;
  };
  const Tensor data = exchange(kSlots.rows_send, kSlots.rows_recv, a1, K, 0);
  PrepareResult result;
  result.topk_ids = exchange(kSlots.ids_send, kSlots.ids_recv, args.topk_ids, topk, 0xFF);  // -1
  result.topk_weights =
      exchange(kSlots.weights_send, kSlots.weights_recv, args.topk_weights, topk, 0);
  QuantizedInput q =
      detail::maybe_quantize_input(data, args.quant_config, args.defer_input_quant, ctx);
  result.a1q = std::move(q.data);
  result.a1q_scale = std::move(q.scale);
  return result;
}

void PrepareFinalizeAllGather::finalize_on_device(const FinalizeArgs& args, RunContext ctx) {
  WorkspaceManager& ws = *ctx.workspace;
  const int64_t K = args.output.size(1);
  const DType dt = args.output.dtype();
  Tensor partial = ws.get(kPartialSlot, {world_ * M_max_, K}, dt);
  detail::resolve_weight_and_reduce(args.weight_and_reduce)
      ->apply(partial, args.fused_expert_output, args.topk_weights, args.topk_ids,
              args.apply_router_weight_on_input, ctx);
  Tensor mine;
  if (combine_ == Combine::kReduceScatter) {
    mine = ws.get(kMineSlot, {M_max_, K}, dt);
    comm_->reduce_scatter(partial, mine, ctx.stream);
  } else {
    comm_->all_reduce(partial, ctx.stream);
    mine = partial.slice(0, rank_ * M_max_, (rank_ + 1) * M_max_);
  }
  if (M_ > 0) {
    Tensor out = args.output;
    out.copy_from_async(mine.slice(0, 0, M_), ctx.stream);
  }
}

void PrepareFinalizeAllGather::finalize(const FinalizeArgs& args, RunContext ctx) {
  expect_defined(args.output, "output");
  expect_shape(args.output, "output", {M_, kAnyDim});
  if (args.output.device().is_cuda()) {
    finalize_on_device(args, ctx);
    return;
  }
  const int64_t K = args.output.size(1);
  Tensor partial = detail::weighted_partials_f32(args, world_ * M_max_, K, ctx);
  Tensor mine;
  if (combine_ == Combine::kReduceScatter) {
    mine = Tensor::empty({M_max_, K}, DType::kF32);
    comm_->reduce_scatter(partial, mine, Stream{});
  } else {
    comm_->all_reduce(partial, Stream{});
    mine = partial.slice(0, rank_ * M_max_, (rank_ + 1) * M_max_);
  }
  detail::store_output(args.output, mine.slice(0, 0, M_));
}

// ---- factory registrations -----------------------------------------------------------------

namespace {

PrepareFinalizeFactory allgather_factory(const char* name, All2AllBackend backend,
                                         PrepareFinalizeAllGather::Combine combine,
                                         const char* description) {
  PrepareFinalizeFactory f;
  f.name = name;
  f.all2all = backend;
  f.priority = 30;
  f.description = description;
  f.check = [](const PrepareFinalizeRequest& r) {
    return detail::check_exchange_request(r, /*batched=*/false);
  };
  f.make = [combine](const PrepareFinalizeRequest& r) -> std::unique_ptr<PrepareFinalize> {
    return std::make_unique<PrepareFinalizeAllGather>(r.comm, r.moe->num_experts, combine);
  };
  return f;
}

}  // namespace

MOEKIT_REGISTER_PREPARE_FINALIZE(
    naive_allgather,
    allgather_factory("naive_allgather", All2AllBackend::kNaive,
                      PrepareFinalizeAllGather::Combine::kAllReduce,
                      "DP+EP: all-gather every rank's tokens, all-reduce the outputs"));

MOEKIT_REGISTER_PREPARE_FINALIZE(
    allgather_reducescatter,
    allgather_factory("allgather_reducescatter", All2AllBackend::kAllGatherReduceScatter,
                      PrepareFinalizeAllGather::Combine::kReduceScatter,
                      "DP+EP: all-gather every rank's tokens, reduce-scatter the outputs"));

}  // namespace moekit
