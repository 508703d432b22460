// PrepareFinalizeAllToAll (prepare_finalize/exchange.h): each token to the ranks that own its
// experts and its partial outputs back, synchronously or with the hook/receiver protocol.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <numeric>

#include "moekit/prepare_finalize/exchange.h"
#include "prepare_finalize/exchange_common.h"

namespace moekit {
namespace {

constexpr const char* kWho = "PrepareFinalizeAllToAll";

int64_t sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

// Transfers started by one prepare or finalize; wait() completes them all.
struct Transfers {
  std::vector<std::unique_ptr<PendingCollective>> pending;
  void wait() {
    for (auto& p : pending)
      p->wait();
    pending.clear();
  }
};

// What a started dispatch holds until its receiver runs.
struct DispatchInFlight {
  detail::DispatchPayload payload;
  Tensor send_data, send_scale, send_ids, send_weights;  // alive until the transfers complete
  Tensor data, scale, ids, weights;                      // filled by the transfers
  Transfers transfers;
};

// What a started combine holds until its receiver runs.
struct CombineInFlight {
  Tensor partial;  // sent
  Tensor back;     // received, in send order
  Transfers transfers;
};

}  // namespace

PrepareFinalizeAllToAll::PrepareFinalizeAllToAll(Communicator* comm, int64_t num_experts)
    : PrepareFinalizeExchange(comm, num_experts, kWho) {}

AsyncHandle<PrepareResult> PrepareFinalizeAllToAll::prepare_async(const PrepareArgs& args,
                                                                  RunContext ctx) {
  const detail::PrepareDims dims = detail::check_prepare_args(args, kWho);
  detail::expect_host_exchange(args.a1, kWho);
  Tensor a1 = args.a1;
  if (args.apply_router_weight_on_input) {
    a1 = detail::apply_router_weight_to_input(a1, args.topk_weights, kWho);
  }
  // Which rows go where: for each destination rank in order, its tokens in increasing order (a
  // token goes once to each rank that owns one of its experts).
  M_ = dims.M;
  const std::vector<int64_t> ids = args.topk_ids.to_int_vector();
  std::vector<std::vector<int64_t>> to_rank(static_cast<size_t>(world_));
  std::vector<bool> seen(static_cast<size_t>(world_));
  for (int64_t m = 0; m < M_; ++m) {
    std::fill(seen.begin(), seen.end(), false);
    for (int64_t j = 0; j < dims.topk; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * dims.topk + j)];
      if (e < 0 || e >= num_experts_) continue;
      seen[static_cast<size_t>(e / local_experts_)] = true;
    }
    for (int d = 0; d < world_; ++d) {
      if (seen[static_cast<size_t>(d)]) to_rank[static_cast<size_t>(d)].push_back(m);
    }
  }
  send_token_.clear();
  send_counts_.assign(static_cast<size_t>(world_), 0);
  for (int d = 0; d < world_; ++d) {
    const auto& rows = to_rank[static_cast<size_t>(d)];
    send_token_.insert(send_token_.end(), rows.begin(), rows.end());
    send_counts_[static_cast<size_t>(d)] = static_cast<int64_t>(rows.size());
  }
  // The counts first (one row per rank), so every rank can size what it receives.
  const std::vector<int64_t> ones(static_cast<size_t>(world_), 1);
  const Tensor counts_out = Tensor::from_ints(send_counts_, {world_, 1}, DType::kInt64);
  Tensor counts_in = Tensor::empty({world_, 1}, DType::kInt64);
  comm_->all_to_all_v(counts_out, ones, counts_in, ones, Stream{});
  recv_counts_ = counts_in.to_int_vector();
  const int64_t received = sum(recv_counts_);

  auto state = std::make_shared<DispatchInFlight>();
  state->payload =
      detail::make_dispatch_payload(a1, args.quant_config, args.defer_input_quant, ctx);
  auto start = [&](Tensor& send, Tensor& recv, const Tensor& src) {
    send = detail::gather_rows(src, send_token_);
    recv = detail::rows_like(send, received);
    state->transfers.pending.push_back(
        comm_->all_to_all_v_start(send, send_counts_, recv, recv_counts_, Stream{}));
  };
  start(state->send_data, state->data, state->payload.data);
  if (state->payload.scale_has_rows) {
    start(state->send_scale, state->scale, state->payload.scale);
  } else {
    state->scale = state->payload.scale;
  }
  start(state->send_ids, state->ids, args.topk_ids);
  start(state->send_weights, state->weights, args.topk_weights);

  const QuantConfig* quant = args.quant_config;
  AsyncHandle<PrepareResult> handle;
  handle.hook = [state] { state->transfers.wait(); };
  handle.receiver = [state, quant, ctx] {
    state->transfers.wait();
    PrepareResult result;
    QuantizedInput q =
        detail::finish_dispatch(state->data, state->scale, state->payload, quant, ctx);
    result.a1q = std::move(q.data);
    result.a1q_scale = std::move(q.scale);
    result.topk_ids = state->ids;
    result.topk_weights = state->weights;
    return result;
  };
  return handle;
}

PrepareResult PrepareFinalizeAllToAll::prepare(const PrepareArgs& args, RunContext ctx) {
  return prepare_async(args, ctx).receiver();
}

AsyncHandle<void> PrepareFinalizeAllToAll::finalize_async(const FinalizeArgs& args,
                                                          RunContext ctx) {
  expect_defined(args.output, "output");
  expect_shape(args.output, "output", {M_, kAnyDim});
  const int64_t K = args.output.size(1);
  auto state = std::make_shared<CombineInFlight>();
  state->partial = detail::weighted_partials_f32(args, sum(recv_counts_), K, ctx);
  state->back = Tensor::empty({sum(send_counts_), K}, DType::kF32);
  state->transfers.pending.push_back(
      comm_->all_to_all_v_start(state->partial, recv_counts_, state->back, send_counts_, Stream{}));
  Tensor output = args.output;
  AsyncHandle<void> handle;
  handle.hook = [state] { state->transfers.wait(); };
  handle.receiver = [state, output, tokens = send_token_, M = M_, K]() mutable {
    state->transfers.wait();
    // Each token's partials, summed in send order (destination rank order).
    std::vector<float> acc(static_cast<size_t>(M * K), 0.0f);
    const float* back = state->back.data_as<const float>();
    for (size_t i = 0; i < tokens.size(); ++i) {
      float* row = acc.data() + tokens[i] * K;
      const float* part = back + static_cast<int64_t>(i) * K;
      for (int64_t c = 0; c < K; ++c)
        row[c] += part[c];
    }
    detail::store_output(output, Tensor::from_floats(acc, {M, K}, DType::kF32));
  };
  return handle;
}

void PrepareFinalizeAllToAll::finalize(const FinalizeArgs& args, RunContext ctx) {
  finalize_async(args, ctx).receiver();
}

// ---- factory registration ------------------------------------------------------------------

MOEKIT_REGISTER_PREPARE_FINALIZE(all2all, [] {
  PrepareFinalizeFactory f;
  f.name = "all2all";
  f.all2all = All2AllBackend::kNcclAllToAll;
  f.priority = 30;
  f.description =
      "DP+EP: all-to-all of the tokens to the ranks owning their experts and back (async "
      "hook/receiver: shared experts overlap the combine)";
  f.check = [](const PrepareFinalizeRequest& r) {
    return detail::check_exchange_request(r, /*batched=*/false);
  };
  f.make = [](const PrepareFinalizeRequest& r) -> std::unique_ptr<PrepareFinalize> {
    return std::make_unique<PrepareFinalizeAllToAll>(r.comm, r.moe->num_experts);
  };
  return f;
}());

}  // namespace moekit
