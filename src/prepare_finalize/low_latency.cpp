// PrepareFinalizeLowLatency (prepare_finalize/exchange.h): fixed-size per-expert buffers, one
// exchange of counts and one of rows each way, whatever the routing.
//
// The send buffer of a rank is (W * E_local * C) rows, C = max_tokens_per_rank: block (d, e)
// holds the rows this rank sends to rank d's local expert e, in token order. Rank d receives the
// same layout from every source s, and packs expert e's rows as source 0's, then source 1's, ...
// into (E_local, W * C) rows for the batched experts. The combine sends the experts' rows back
// into the same fixed layout, so row (d, e, p) of what a rank receives is the answer to the row
// it sent to (d, e) at position p.
#include <fmt/format.h>

#include <memory>

#include "core/cuda_seam.h"
#include "moekit/prepare_finalize/exchange.h"
#include "prepare_finalize/cuda/batched.h"
#include "prepare_finalize/exchange_common.h"

namespace moekit {
namespace {

constexpr const char* kWho = "PrepareFinalizeLowLatency";

// Workspace slots of the GPU path. The rows slot holds what prepare received, then what finalize
// sends back; the packed slot the experts' input, then what finalize receives (each is dead by
// the time it is reused: the experts have read the packed rows before the combine starts).
constexpr std::string_view kRowsSlot = "exchange.ll_rows";
constexpr std::string_view kPackedSlot = "exchange.ll_packed";
constexpr std::string_view kScaleRowsSlot = "exchange.ll_scale_rows";  // per-row scales: the same
constexpr std::string_view kScalePackedSlot = "exchange.ll_scale_packed";
constexpr std::string_view kCountsSlot = "exchange.ll_counts";
constexpr std::string_view kExpertTokensSlot = "exchange.ll_expert_tokens";

}  // namespace

PrepareFinalizeLowLatency::PrepareFinalizeLowLatency(Communicator* comm, int64_t num_experts,
                                                     int64_t max_tokens_per_rank)
    : PrepareFinalizeExchange(comm, num_experts, kWho), capacity_(max_tokens_per_rank) {
  MOEKIT_CHECK(max_tokens_per_rank > 0, "{}: max_tokens_per_rank = {} must be positive", kWho,
               max_tokens_per_rank);
}

std::vector<WorkspaceRequest> PrepareFinalizeLowLatency::workspace_requests(
    int64_t /*max_num_tokens*/, int64_t hidden, int64_t /*topk*/, DType dtype,
    const QuantConfig& quant) const {
  if (comm_->device().is_cpu()) return {};
  const int64_t rows = num_experts_ * capacity_;  // W * E_local * C, sent and received
  const size_t bytes = static_cast<size_t>(rows * hidden) * element_size(dtype);
  std::vector<WorkspaceRequest> out = {
      {std::string(kRowsSlot), bytes},
      {std::string(kPackedSlot), bytes},
      {std::string(kCountsSlot), static_cast<size_t>(num_experts_) * 4},
      {std::string(kExpertTokensSlot), static_cast<size_t>(local_experts_) * 4}};
  // The input quantization's slots: this rank's M <= C rows (per-row scales, before the
  // exchange) or its received batch (a per-tensor scale, after it).
  std::vector<WorkspaceRequest> q = detail::input_quant_requests(rows, hidden, quant);
  if (!q.empty() && !quant.a1.shape.is_per_tensor()) {
    const size_t scales =
        static_cast<size_t>(numel_of(device_quant_shapes(rows, hidden, quant.a1).scale) * 4);
    out.push_back({std::string(kScaleRowsSlot), scales});
    out.push_back({std::string(kScalePackedSlot), scales});
  }
  out.insert(out.end(), q.begin(), q.end());
  return out;
}

PrepareResult PrepareFinalizeLowLatency::prepare(const PrepareArgs& args, RunContext ctx) {
  const detail::PrepareDims dims = detail::check_prepare_args(args, kWho);
  MOEKIT_CHECK(dims.M <= capacity_,
               "{}: a1 has M = {} tokens but the low-latency buffers hold max_tokens_per_rank = {} "
               "per rank (MoELayerOptions::max_num_tokens)",
               kWho, dims.M, capacity_);
  M_ = dims.M;
  topk_ = dims.topk;
  weights_on_input_ = args.apply_router_weight_on_input;
  const Tensor a1 = input_to_send(args, kWho, ctx.stream);
  if (a1.device().is_cuda()) return prepare_on_device(args, a1, ctx);
  const int64_t El = local_experts_, C = capacity_, W = world_;
  const int64_t block_rows = El * C;  // rows per destination rank, fixed

  // Every (token, slot) to its row of the send buffer.
  const std::vector<int64_t> ids = args.topk_ids.to_int_vector();
  std::vector<int64_t> sent(static_cast<size_t>(W * El), 0);
  std::vector<int64_t> send_src(static_cast<size_t>(W * block_rows), -1);
  slot_row_.assign(static_cast<size_t>(M_ * topk_), -1);
  for (int64_t m = 0; m < M_; ++m) {
    for (int64_t j = 0; j < topk_; ++j) {
      const int64_t e = ids[static_cast<size_t>(m * topk_ + j)];
      if (e < 0 || e >= num_experts_) continue;
      int64_t& p = sent[static_cast<size_t>(e)];  // block (d, local) is index e = d * El + local
      MOEKIT_CHECK(p < C,
                   "{}: expert {} would receive more than max_tokens_per_rank = {} rows from rank "
                   "{} (a token lists it twice?)",
                   kWho, e, C, rank_);
      const int64_t row = e * C + p;
      ++p;
      send_src[static_cast<size_t>(row)] = m;
      slot_row_[static_cast<size_t>(m * topk_ + j)] = row;
    }
  }

  // Counts: (W * El) per rank, El to each destination; then the rows, El * C to each.
  const std::vector<int64_t> per_rank_counts(static_cast<size_t>(W), El);
  const std::vector<int64_t> per_rank_rows(static_cast<size_t>(W), block_rows);
  const Tensor counts_out = Tensor::from_ints(sent, {W * El, 1}, DType::kInt64);
  Tensor counts_in = Tensor::empty({W * El, 1}, DType::kInt64);
  comm_->all_to_all_v(counts_out, per_rank_counts, counts_in, per_rank_counts, Stream{});
  recv_counts_ = counts_in.to_int_vector();

  const detail::DispatchPayload payload =
      detail::make_dispatch_payload(a1, args.quant_config, args.defer_input_quant, ctx);
  auto exchange = [&](const Tensor& src, Tensor& send, Tensor& recv) -> const Tensor& {
    detail::gather_rows_into(send, src, send_src);
    Shape shape = send.shape();
    shape[0] = W * block_rows;
    detail::reuse_host_tensor(recv, shape, send.dtype());
    comm_->all_to_all_v(send, per_rank_rows, recv, per_rank_rows, Stream{});
    return recv;
  };
  const Tensor data = exchange(payload.data, send_, recv_);
  const Tensor scale =
      payload.scale_has_rows ? exchange(payload.scale, send_scale_, recv_scale_) : Tensor{};

  // Pack each local expert's rows: source 0's first, then source 1's, ...
  const int64_t T = W * C;
  std::vector<int64_t> pack(static_cast<size_t>(El * T), -1);
  std::vector<int32_t> counts(static_cast<size_t>(El), 0);
  for (int64_t e = 0; e < El; ++e) {
    int64_t offset = 0;
    for (int64_t s = 0; s < W; ++s) {
      const int64_t c = recv_counts_[static_cast<size_t>(s * El + e)];
      for (int64_t i = 0; i < c; ++i)
        pack[static_cast<size_t>(e * T + offset + i)] = (s * El + e) * C + i;
      offset += c;
    }
    counts[static_cast<size_t>(e)] = static_cast<int32_t>(offset);
  }
  auto batched = [&](const Tensor& rows, Tensor& packed) {
    detail::gather_rows_into(packed, rows, pack);
    return packed.view({El, T, packed.size(1)});
  };
  PrepareResult result;
  if (payload.quantize_after) {
    const Tensor b = detail::gather_rows(data, pack);
    QuantizedInput q = detail::finish_dispatch(b, Tensor{}, payload, args.quant_config, ctx);
    result.a1q = q.data.view({El, T, q.data.size(1)});
    result.a1q_scale = q.scale;  // one per-tensor scale for the whole batch
  } else {
    result.a1q = batched(data, packed_);
    result.a1q_scale = payload.scale_has_rows ? batched(scale, packed_scale_) : payload.scale;
  }
  result.expert_tokens_meta = ExpertTokensMetadata::make_from_list(counts, Device::cpu());
  return result;
}

PrepareResult PrepareFinalizeLowLatency::prepare_on_device(const PrepareArgs& args,
                                                           const Tensor& a1, RunContext ctx) {
  MOEKIT_CHECK(ctx.workspace != nullptr && ctx.stream.handle != nullptr,
               "{} on a GPU needs the workspace manager and a stream in RunContext", kWho);
  if constexpr (kCudaBuild) {
    WorkspaceManager& ws = *ctx.workspace;
    const int64_t E = num_experts_, El = local_experts_, C = capacity_, W = world_;
    // Codes with their per-row scales when the rows carry them; else the rows themselves.
    const detail::DispatchPayload payload =
        detail::make_dispatch_payload(a1, args.quant_config, args.defer_input_quant, ctx);
    const Tensor& data = payload.data;
    // This rank's rows in the send layout (E, C, K): the batched scatter over every expert of
    // the model (block (d, e) = rank d's local expert e), with its counts.
    const PrepareResult sent = detail::batched_prepare_device(
        send_state_, data, payload.scale_has_rows ? payload.scale : Tensor{}, args.topk_ids,
        Tensor{}, E, static_cast<int>(E), C, /*rank=*/0, ctx);
    const Tensor sent_counts = sent.expert_tokens_meta->expert_num_tokens.view({E, 1});
    Tensor counts = ws.get(kCountsSlot, {E, 1}, DType::kInt32);
    comm_->all_to_all_v(sent_counts, std::vector<int64_t>(static_cast<size_t>(W), El), counts,
                        std::vector<int64_t>(static_cast<size_t>(W), El), ctx.stream);
    Tensor expert_tokens = ws.get(kExpertTokensSlot, {El}, DType::kInt32);
    // Fixed-size blocks of El * C rows each way, then each local expert's rows packed by source.
    auto exchange = [&](const Tensor& send, std::string_view rows_slot,
                        std::string_view packed_slot, const Tensor& num_tokens) {
      const int64_t cols = send.size(2);
      Tensor rows = ws.get(rows_slot, {E * C, cols}, send.dtype());
      const std::vector<int64_t> block(static_cast<size_t>(W), El * C);
      comm_->all_to_all_v(send.view({E * C, cols}), block, rows, block, ctx.stream);
      Tensor packed = ws.get(packed_slot, {El, W * C, cols}, send.dtype());
      detail::exchange_pack_device(rows, packed, counts, num_tokens, world_, C, /*unpack=*/false,
                                   ctx);
      return packed;
    };
    PrepareResult result;
    result.a1q = exchange(sent.a1q, kRowsSlot, kPackedSlot, expert_tokens);
    if (payload.scale_has_rows) {
      result.a1q_scale = exchange(sent.a1q_scale, kScaleRowsSlot, kScalePackedSlot, Tensor{});
    }
    // A per-tensor scale: this rank's received batch, the rows that exist.
    detail::finish_batched_dispatch(result, expert_tokens, payload, args.quant_config, ctx);
    ExpertTokensMetadata meta;
    meta.expert_num_tokens = expert_tokens;
    result.expert_tokens_meta = meta;
    return result;
  } else {
    throw_no_cuda(std::string(kWho) + " on " + a1.device().to_string());
  }
}

void PrepareFinalizeLowLatency::finalize_on_device(const FinalizeArgs& args, RunContext ctx) {
  if constexpr (kCudaBuild) {
    MOEKIT_CHECK(send_state_ != nullptr, "{}: finalize before prepare on the GPU", kWho);
    WorkspaceManager& ws = *ctx.workspace;
    const int64_t E = num_experts_, C = capacity_;
    const Tensor& y = args.fused_expert_output;  // (E_local, W * C, K), checked by finalize
    const int64_t K = y.size(2);
    expect_contiguous(y, "fused_expert_output");
    const Tensor counts = ws.get(kCountsSlot, {E, 1}, DType::kInt32);
    // The experts' rows back into the blocks they answer, then home.
    Tensor back_send = ws.get(kRowsSlot, {E * C, K}, y.dtype());
    detail::exchange_pack_device(back_send, y, counts, Tensor{}, world_, C, /*unpack=*/true, ctx);
    Tensor back = ws.get(kPackedSlot, {E * C, K}, y.dtype());
    const std::vector<int64_t> block(static_cast<size_t>(world_), local_experts_ * C);
    comm_->all_to_all_v(back_send, block, back, block, ctx.stream);
    // Row (d, e, p) of `back` answers the row this rank sent to block (d, e) at p: the send
    // layout's combine (weighted, in slot order, f32).
    detail::batched_finalize_device(send_state_, args.output, back.view({E, C, K}),
                                    args.topk_weights, weights_on_input_, ctx);
  } else {
    throw_no_cuda(std::string(kWho) + " on " + args.output.device().to_string());
  }
}

void PrepareFinalizeLowLatency::finalize(const FinalizeArgs& args, RunContext ctx) {
  expect_defined(args.output, "output");
  expect_shape(args.output, "output", {M_, kAnyDim});
  const int64_t El = local_experts_, C = capacity_, W = world_, T = W * C;
  const int64_t K = args.output.size(1);
  expect_shape(args.fused_expert_output, "fused_expert_output", {El, T, K});
  if (args.output.device().is_cuda()) {
    finalize_on_device(args, ctx);
    return;
  }

  // The experts' rows back into the fixed layout of what each source sent.
  std::vector<int64_t> back_src(static_cast<size_t>(W * El * C), -1);
  for (int64_t e = 0; e < El; ++e) {
    int64_t offset = 0;
    for (int64_t s = 0; s < W; ++s) {
      const int64_t c = recv_counts_[static_cast<size_t>(s * El + e)];
      for (int64_t i = 0; i < c; ++i)
        back_src[static_cast<size_t>((s * El + e) * C + i)] = e * T + offset + i;
      offset += c;
    }
  }
  // The rows travel in the experts' output dtype: they are not summed before they arrive, so
  // nothing is lost (and bf16 halves the bytes of f32).
  const Tensor rows = args.fused_expert_output.view({El * T, K});
  const Tensor& send = detail::gather_rows_into(back_send_, rows, back_src);
  Shape back_shape = send.shape();
  back_shape[0] = W * El * C;
  Tensor& back = detail::reuse_host_tensor(back_, back_shape, send.dtype());
  const std::vector<int64_t> per_rank_rows(static_cast<size_t>(W), El * C);
  comm_->all_to_all_v(send, per_rank_rows, back, per_rank_rows, Stream{});

  // Each token: its slots' rows, weighted, in slot order.
  std::vector<float> weights;
  if (!weights_on_input_) weights = args.topk_weights.to_float_vector();
  std::vector<float> acc(static_cast<size_t>(M_ * K), 0.0f);
  std::vector<float> row_values(static_cast<size_t>(K));
  for (int64_t m = 0; m < M_; ++m) {
    float* out = acc.data() + m * K;
    for (int64_t j = 0; j < topk_; ++j) {
      const int64_t row = slot_row_[static_cast<size_t>(m * topk_ + j)];
      if (row < 0) continue;
      const float w = weights.empty() ? 1.0f : weights[static_cast<size_t>(m * topk_ + j)];
      detail::load_row(back.data(), back.dtype(), row * K, K, row_values.data());
      for (int64_t c = 0; c < K; ++c)
        out[c] += w * row_values[static_cast<size_t>(c)];
    }
  }
  detail::store_output(args.output, Tensor::from_floats(acc, {M_, K}, DType::kF32));
}

// ---- factory registration ------------------------------------------------------------------

MOEKIT_REGISTER_PREPARE_FINALIZE(batched_low_latency, [] {
  PrepareFinalizeFactory f;
  f.name = "batched_low_latency";
  f.all2all = All2AllBackend::kBatchedLowLatency;
  f.priority = 30;
  f.description =
      "DP+EP decode: fixed-size per-expert buffers (max_num_tokens per rank), batched format";
  f.check = [](const PrepareFinalizeRequest& r) -> std::string {
    if (r.moe->max_num_tokens <= 0) {
      return fmt::format("needs max_num_tokens > 0 (got {})", r.moe->max_num_tokens);
    }
    return detail::check_exchange_request(r, /*batched=*/true);
  };
  f.make = [](const PrepareFinalizeRequest& r) -> std::unique_ptr<PrepareFinalize> {
    return std::make_unique<PrepareFinalizeLowLatency>(r.comm, r.moe->num_experts,
                                                       r.moe->max_num_tokens);
  };
  return f;
}());

}  // namespace moekit
