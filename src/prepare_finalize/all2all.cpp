// PrepareFinalizeAllToAll (prepare_finalize/exchange.h): each token to the ranks that own its
// experts and its partial outputs back, synchronously or with the hook/receiver protocol.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <numeric>

#include "core/cuda/runtime.h"
#include "core/cuda_seam.h"
#include "moekit/prepare_finalize/exchange.h"
#include "prepare_finalize/cuda/batched.h"
#include "prepare_finalize/exchange_common.h"

namespace moekit {
namespace {

constexpr const char* kWho = "PrepareFinalizeAllToAll";

// Workspace slots of the GPU path (rows sized for W * max_num_tokens: a rank receives at most
// every rank's tokens and sends each of its tokens at most once to each rank).
constexpr detail::InputExchangeSlots kSlots{
    "exchange.a2a_send",     "exchange.a2a_recv",         "exchange.a2a_ids_send",
    "exchange.a2a_ids_recv", "exchange.a2a_weights_send", "exchange.a2a_weights_recv"};
constexpr std::string_view kPartialSlot = "exchange.a2a_partial";
constexpr std::string_view kBackSlot = "exchange.a2a_back";
constexpr std::string_view kSendIndexSlot = "exchange.a2a_send_index";
constexpr std::string_view kTokenRowsSlot = "exchange.a2a_token_rows";

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
    : PrepareFinalizeExchange(comm, num_experts, kWho) {
  if constexpr (kCudaBuild) {
    if (const Device d = comm_->device(); d.is_cuda()) {
      combine_stream_ = cuda_rt::create_stream(d.index);
      partials_ready_ = cuda_rt::create_event(d.index);
      rows_back_ = cuda_rt::create_event(d.index);
    }
  }
}

PrepareFinalizeAllToAll::~PrepareFinalizeAllToAll() {
  if constexpr (kCudaBuild) {
    if (combine_stream_ != nullptr) {
      // A combine still in flight finishes before its stream and events go.
      cuda_rt::destroy_event(partials_ready_);
      cuda_rt::destroy_event(rows_back_);
      cuda_rt::destroy_stream(combine_stream_);
    }
  }
}

void PrepareFinalizeAllToAll::route(const std::vector<int64_t>& ids, int64_t topk) {
  // For each destination rank in order, its tokens in increasing order (a token goes once to each
  // rank that owns one of its experts).
  std::vector<std::vector<int64_t>> to_rank(static_cast<size_t>(world_));
  std::vector<bool> seen(static_cast<size_t>(world_));
  for (int64_t m = 0; m < M_; ++m) {
    std::fill(seen.begin(), seen.end(), false);
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * topk + j)];
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
}

std::vector<WorkspaceRequest> PrepareFinalizeAllToAll::workspace_requests(
    int64_t max_num_tokens, int64_t hidden, int64_t topk, DType dtype,
    const QuantConfig& quant) const {
  if (comm_->device().is_cpu()) return {};
  const size_t all = static_cast<size_t>(max_num_tokens) * static_cast<size_t>(world_);
  std::vector<WorkspaceRequest> out =
      detail::input_exchange_requests(kSlots, kPartialSlot, all, all, hidden, topk, dtype, quant);
  out.push_back({std::string(kBackSlot), all * static_cast<size_t>(hidden) * element_size(dtype)});
  out.push_back({std::string(kSendIndexSlot), all * 4});
  out.push_back({std::string(kTokenRowsSlot), all * 4});
  return out;
}

PrepareResult PrepareFinalizeAllToAll::prepare_on_device(const PrepareArgs& args, const Tensor& a1,
                                                         int64_t topk, RunContext ctx) {
  MOEKIT_CHECK(ctx.workspace != nullptr && ctx.stream.handle != nullptr,
               "{} on a GPU needs the workspace manager and a stream in RunContext", kWho);
  if constexpr (kCudaBuild) {
    MOEKIT_CHECK(!cuda_rt::stream_is_capturing(ctx.stream.handle),
                 "{} (nccl_all2all) cannot be captured in a CUDA graph: its exchange sizes depend "
                 "on the routing, which it reads back to the host in every forward; capture "
                 "batched_low_latency instead",
                 kWho);
    expect_contiguous(a1, "a1");
    expect_contiguous(args.topk_ids, "topk_ids");
    expect_contiguous(args.topk_weights, "topk_weights");
    WorkspaceManager& ws = *ctx.workspace;
    // The routing, on the host: the stream has produced it once this returns.
    synchronize(ctx.stream);
    route(args.topk_ids.to_int_vector(), topk);
    // What every rank sends this one: one host all-to-all of the counts.
    recv_counts_ = comm_->all_to_all_host(send_counts_);
    const int64_t sent = sum(send_counts_), received = sum(recv_counts_);
    const int64_t K = a1.size(1);
    // The index tables, uploaded (pageable host memory: staged before the copy call returns).
    std::vector<int32_t> index(send_token_.begin(), send_token_.end());
    std::vector<int32_t> token_rows(static_cast<size_t>(M_ * world_), -1);
    std::vector<int> filled(static_cast<size_t>(M_), 0);
    for (size_t i = 0; i < send_token_.size(); ++i) {
      const int64_t t = send_token_[i];
      token_rows[static_cast<size_t>(t * world_ + filled[static_cast<size_t>(t)]++)] =
          static_cast<int32_t>(i);
    }
    const Tensor send_index = ws.get(kSendIndexSlot, {sent}, DType::kInt32);
    token_rows_ = ws.get(kTokenRowsSlot, {M_ * world_}, DType::kInt32);
    cuda_rt::copy_async(send_index.data(), index.data(), index.size() * 4, ctx.stream);
    cuda_rt::copy_async(token_rows_.data(), token_rows.data(), token_rows.size() * 4, ctx.stream);
    auto exchange = [&](std::string_view send_slot, std::string_view recv_slot, const Tensor& src,
                        int64_t cols) {
      const Tensor send = ws.get(send_slot, {sent, cols}, src.dtype());
      detail::gather_rows_device(src, send_index, send, ctx);
      Tensor recv = ws.get(recv_slot, {received, cols}, src.dtype());
      comm_->all_to_all_v(send, send_counts_, recv, recv_counts_, ctx.stream);
      return recv;
    };
    const Tensor data = exchange(kSlots.rows_send, kSlots.rows_recv, a1, K);
    PrepareResult result;
    result.topk_ids = exchange(kSlots.ids_send, kSlots.ids_recv, args.topk_ids, topk);
    result.topk_weights =
        exchange(kSlots.weights_send, kSlots.weights_recv, args.topk_weights, topk);
    QuantizedInput q =
        detail::maybe_quantize_input(data, args.quant_config, args.defer_input_quant, ctx);
    result.a1q = std::move(q.data);
    result.a1q_scale = std::move(q.scale);
    return result;
  } else {
    throw_no_cuda(std::string(kWho) + " on " + a1.device().to_string());
  }
}

Tensor PrepareFinalizeAllToAll::start_combine_on_device(const FinalizeArgs& args, RunContext ctx) {
  if constexpr (kCudaBuild) {
    MOEKIT_CHECK(ctx.workspace != nullptr && ctx.stream.handle != nullptr,
                 "{} on a GPU needs the workspace manager and a stream in RunContext", kWho);
    WorkspaceManager& ws = *ctx.workspace;
    const int64_t K = args.output.size(1);
    const DType dt = args.output.dtype();
    const int64_t received = sum(recv_counts_), sent = sum(send_counts_);
    Tensor partial = ws.get(kPartialSlot, {received, K}, dt);
    if (received > 0) {
      detail::resolve_weight_and_reduce(args.weight_and_reduce)
          ->apply(partial, args.fused_expert_output, args.topk_weights, args.topk_ids,
                  args.apply_router_weight_on_input, ctx);
    }
    Tensor back = ws.get(kBackSlot, {sent, K}, dt);
    // The exchange on its own stream, after the partials; the slots it reads and writes are its
    // own, so the caller's next work (the shared experts) runs beside it.
    cuda_rt::record_event(partials_ready_, ctx.stream.handle);
    cuda_rt::stream_wait_event(combine_stream_, partials_ready_);
    comm_->all_to_all_v(partial, recv_counts_, back, send_counts_, Stream{combine_stream_});
    cuda_rt::record_event(rows_back_, combine_stream_);
    return back;
  } else {
    throw_no_cuda(std::string(kWho) + " on " + args.output.device().to_string());
  }
}

void PrepareFinalizeAllToAll::wait_for_combine(RunContext ctx) const {
  if constexpr (kCudaBuild) cuda_rt::stream_wait_event(ctx.stream.handle, rows_back_);
}

AsyncHandle<PrepareResult> PrepareFinalizeAllToAll::prepare_async(const PrepareArgs& args,
                                                                  RunContext ctx) {
  const detail::PrepareDims dims = detail::check_prepare_args(args, kWho);
  const Tensor a1 = input_to_send(args, kWho, ctx.stream);
  if (a1.device().is_cuda()) {
    M_ = dims.M;
    auto result = std::make_shared<PrepareResult>(prepare_on_device(args, a1, dims.topk, ctx));
    AsyncHandle<PrepareResult> handle;
    handle.hook = [] {};
    handle.receiver = [result] { return *result; };
    return handle;
  }
  M_ = dims.M;
  route(args.topk_ids.to_int_vector(), dims.topk);
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
  if (args.output.device().is_cuda()) {
    const Tensor back = start_combine_on_device(args, ctx);
    AsyncHandle<void> handle;
    handle.hook = [this, ctx] { wait_for_combine(ctx); };
    handle.receiver = [this, ctx, back, output = args.output] {
      wait_for_combine(ctx);
      // Each token's partials in send order (destination rank order), f32, rounded once.
      Tensor out = output;
      detail::sum_rows_device(out, back, token_rows_, world_, ctx);
    };
    return handle;
  }
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
      "hook/receiver: shared experts overlap the combine, on GPU ranks from a stream of its "
      "own)";
  f.check = [](const PrepareFinalizeRequest& r) {
    return detail::check_exchange_request(r, /*batched=*/false);
  };
  f.make = [](const PrepareFinalizeRequest& r) -> std::unique_ptr<PrepareFinalize> {
    return std::make_unique<PrepareFinalizeAllToAll>(r.comm, r.moe->num_experts);
  };
  return f;
}());

}  // namespace moekit
