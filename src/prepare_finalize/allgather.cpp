// PrepareFinalizeAllGather (prepare_finalize/exchange.h): every rank's tokens to every rank, the
// partial outputs summed back.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <numeric>

#include "moekit/prepare_finalize/exchange.h"
#include "prepare_finalize/exchange_common.h"

namespace moekit {
namespace {

constexpr const char* kWho = "PrepareFinalizeAllGather";

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

PrepareResult PrepareFinalizeAllGather::prepare(const PrepareArgs& args, RunContext ctx) {
  const detail::PrepareDims dims = detail::check_prepare_args(args, kWho);
  detail::expect_host_exchange(args.a1, kWho);
  Tensor a1 = args.a1;
  if (args.apply_router_weight_on_input) {
    a1 = detail::apply_router_weight_to_input(a1, args.topk_weights, kWho);
  }
  const std::vector<int64_t> counts = comm_->all_gather_host(dims.M);
  M_ = dims.M;
  M_max_ = *std::max_element(counts.begin(), counts.end());
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

void PrepareFinalizeAllGather::finalize(const FinalizeArgs& args, RunContext ctx) {
  expect_defined(args.output, "output");
  expect_shape(args.output, "output", {M_, kAnyDim});
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
