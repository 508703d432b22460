// Internal: what the token-exchanging prepare/finalize (prepare_finalize/exchange.h) share — the
// factories' check, the activations as they travel, row gathers on the host, and the f32 partials
// of the experts' output.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "comm/collective_checks.h"
#include "moekit/comm/communicator.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/prepare_finalize/factory.h"
#include "moekit/quant/moe_input_quant.h"
#include "prepare_finalize/prepare_common.h"

namespace moekit::detail {

// "" when a token-exchanging prepare/finalize can serve the request, else why not. `batched`: the
// prepare/finalize produces the batched format (else the standard one). Every one exchanges
// between CPU ranks and GPU ranks alike; the experts must run where the communicator's buffers
// are. `bootstrap_only`: the communicator only bootstraps experts that move the tokens
// themselves, so where its buffers live does not matter.
inline std::string check_exchange_request(const PrepareFinalizeRequest& r, bool batched,
                                          bool bootstrap_only = false) {
  const ParallelConfig& p = r.moe->parallel;
  if (r.experts->is_monolithic()) {
    return "monolithic experts route internally; exchanging tokens needs modular experts";
  }
  if (is_batched(r.experts->activation_format()) != batched) {
    return fmt::format("{} takes the {} format", r.experts->name(),
                       is_batched(r.experts->activation_format()) ? "batched" : "standard");
  }
  if (!p.use_ep) return "exchanges tokens between expert-parallel ranks: needs use_ep";
  if (p.ep_size != p.dp_size) {
    return fmt::format(
        "each expert-parallel rank must be a data-parallel rank of its own (ep_size {} != dp_size "
        "{}: tensor parallelism inside a data-parallel group is not served)",
        p.ep_size, p.dp_size);
  }
  if (r.moe->num_experts % p.ep_size != 0) {
    return fmt::format("num_experts {} is not divisible by ep_size {}", r.moe->num_experts,
                       p.ep_size);
  }
  if (r.comm == nullptr && !r.preview) {
    return fmt::format(
        "needs a communicator of {} ranks (MoELayerOptions::communicator; `moekit run` makes an "
        "MPI one under mpirun)",
        p.ep_size);
  }
  if (r.comm != nullptr && (r.comm->world_size() != p.ep_size || r.comm->rank() != p.ep_rank)) {
    return fmt::format(
        "the {} communicator is rank {} of {} but the deployment is EP rank {} of {}",
        r.comm->name(), r.comm->rank(), r.comm->world_size(), p.ep_rank, p.ep_size);
  }
  if (bootstrap_only || r.comm == nullptr) return {};
  const DeviceType where = r.comm->device().type;
  const auto& types = r.experts->caps().device_types;
  if (std::find(types.begin(), types.end(), where) == types.end()) {
    return fmt::format("{} does not run on {}, where the {} communicator's buffers are",
                       r.experts->name(), r.comm->device().to_string(), r.comm->name());
  }
  return {};
}

// The GPU workspace slots of one exchange of the layer's inputs: the rows, the top-k ids and
// the top-k weights, each with a send side and a receive side.
struct InputExchangeSlots {
  std::string_view rows_send, rows_recv, ids_send, ids_recv, weights_send, weights_recv;
};

// The requests of those slots for `sent` rows sent and `received` rows received, of the
// experts' partial output of the received rows (`partial`, the layer's dtype) and of their input
// quantization.
inline std::vector<WorkspaceRequest> input_exchange_requests(const InputExchangeSlots& s,
                                                             std::string_view partial, size_t sent,
                                                             size_t received, int64_t hidden,
                                                             int64_t topk, DType dtype,
                                                             const QuantConfig& quant) {
  const size_t row = static_cast<size_t>(hidden) * element_size(dtype);
  const size_t k = static_cast<size_t>(topk);
  std::vector<WorkspaceRequest> out = {
      {std::string(s.rows_send), sent * row},      {std::string(s.rows_recv), received * row},
      {std::string(s.ids_send), sent * k * 4},     {std::string(s.ids_recv), received * k * 4},
      {std::string(s.weights_send), sent * k * 4}, {std::string(s.weights_recv), received * k * 4},
      {std::string(partial), received * row}};
  for (WorkspaceRequest& r : input_quant_requests(static_cast<int64_t>(received), hidden, quant))
    out.push_back(std::move(r));
  return out;
}

// A host tensor of `rows` rows shaped like src's rows: row i = src row index[i], or zeros where
// index[i] < 0. Any dtype (rows are copied as bytes).
// `slot` as an empty host tensor of `shape` and `dtype`, reallocated only when either differs.
inline Tensor& reuse_host_tensor(Tensor& slot, const Shape& shape, DType dtype) {
  if (!slot.defined() || slot.shape() != shape || slot.dtype() != dtype) {
    slot = Tensor::empty(shape, dtype);
  }
  return slot;
}

// out[i] = src[index[i]] row by row (zeros where index[i] < 0); out is reused when it already
// has the shape (index.size(), src's row) and src's dtype.
inline Tensor& gather_rows_into(Tensor& out, const Tensor& src, std::span<const int64_t> index) {
  MOEKIT_CHECK(src.device().is_cpu(), "gather_rows: {} must be on the CPU", src.describe());
  const Tensor s = src.is_contiguous() ? src : src.clone();
  Shape shape = s.shape();
  shape[0] = static_cast<int64_t>(index.size());
  reuse_host_tensor(out, shape, s.dtype());
  const int64_t rb = row_bytes(s);
  const char* from = static_cast<const char*>(s.data());
  char* to = static_cast<char*>(out.data());
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0) {
      std::memset(to + static_cast<int64_t>(i) * rb, 0, static_cast<size_t>(rb));
    } else {
      std::memcpy(to + static_cast<int64_t>(i) * rb, from + index[i] * rb, static_cast<size_t>(rb));
    }
  }
  return out;
}

inline Tensor gather_rows(const Tensor& src, std::span<const int64_t> index) {
  Tensor out;
  gather_rows_into(out, src, index);
  return out;
}

// An empty host tensor of `rows` rows shaped like t's rows.
inline Tensor rows_like(const Tensor& t, int64_t rows) {
  Shape shape = t.shape();
  shape[0] = rows;
  return Tensor::empty(shape, t.dtype());
}

// The experts' output weighted and reduced per token, in f32: (rows, K). Experts that reduce
// themselves (NoOp) give their (rows, K) output, converted.
inline Tensor weighted_partials_f32(const FinalizeArgs& args, int64_t rows, int64_t K,
                                    RunContext ctx) {
  const auto impl = resolve_weight_and_reduce(args.weight_and_reduce);
  if (dynamic_cast<const TopKWeightAndReduceNoOp*>(impl.get()) != nullptr) {
    expect_shape(args.fused_expert_output, "fused_expert_output", {rows, K});
    return args.fused_expert_output.to_dtype(DType::kF32);
  }
  Tensor partial = Tensor::empty({rows, K}, DType::kF32);
  if (rows == 0) return partial;
  impl->apply(partial, args.fused_expert_output, args.topk_weights, args.topk_ids,
              args.apply_router_weight_on_input, ctx);
  return partial;
}

// output (M, K) in its dtype = the f32 rows, rounded once.
inline void store_output(Tensor output, const Tensor& rows_f32) {  // output: a view
  if (output.numel() == 0) return;
  output.copy_from(rows_f32.to_dtype(output.dtype()));
}

}  // namespace moekit::detail
