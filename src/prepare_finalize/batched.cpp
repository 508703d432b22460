#include "moekit/prepare_finalize/batched.h"

#include <fmt/format.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_seam.h"
#include "modular/batched_layout.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/prepare_finalize/factory.h"
#include "prepare_finalize/cuda/batched.h"
#include "prepare_finalize/prepare_common.h"

namespace moekit {
namespace {

constexpr const char* kWho = "PrepareFinalizeBatched";

std::string counts_to_string(const std::vector<int32_t>& counts) {
  std::string s = "[";
  for (size_t i = 0; i < counts.size(); ++i)
    s += (i ? ", " : "") + std::to_string(counts[i]);
  return s + "]";
}

}  // namespace

PrepareFinalizeBatched::PrepareFinalizeBatched(int64_t max_num_tokens, int num_local_experts,
                                               int num_dispatchers, int rank)
    : max_num_tokens_(max_num_tokens),
      num_local_experts_(num_local_experts),
      num_dispatchers_(num_dispatchers),
      rank_(rank) {
  MOEKIT_CHECK(max_num_tokens > 0, "{}: max_num_tokens = {} must be positive", kWho,
               max_num_tokens);
  MOEKIT_CHECK(num_local_experts > 0, "{}: num_local_experts = {} must be positive", kWho,
               num_local_experts);
  MOEKIT_CHECK(num_dispatchers > 0, "{}: num_dispatchers = {} must be positive", kWho,
               num_dispatchers);
  MOEKIT_CHECK(rank >= 0, "{}: rank = {} must be >= 0", kWho, rank);
}

std::vector<WorkspaceRequest> PrepareFinalizeBatched::workspace_requests(
    int64_t, int64_t hidden, int64_t, DType, const QuantConfig& quant) const {
  return detail::input_quant_requests(
      static_cast<int64_t>(num_local_experts_) * max_num_tokens_ * num_dispatchers_, hidden, quant);
}

PrepareResult PrepareFinalizeBatched::prepare(const PrepareArgs& args, RunContext ctx) {
  const detail::PrepareDims dims = detail::check_prepare_args(args, kWho);
  Tensor a1 = args.a1;
  if (args.apply_router_weight_on_input) {
    a1 = detail::apply_router_weight_to_input(a1, args.topk_weights, kWho, &weighted_input_,
                                              ctx.stream);
  }
  if (a1.device().is_cuda()) {
    expert_map_ = args.expert_map;
    if constexpr (kCudaBuild) {
      const detail::DispatchPayload payload =
          detail::make_dispatch_payload(a1, args.quant_config, args.defer_input_quant, ctx);
      PrepareResult result = detail::batched_prepare_device(
          device_state_, payload.data, payload.scale_has_rows ? payload.scale : Tensor{},
          args.topk_ids, args.expert_map, args.num_experts, num_local_experts_,
          max_num_tokens_ * num_dispatchers_, rank_, ctx);
      detail::finish_batched_dispatch(result, result.expert_tokens_meta->expert_num_tokens, payload,
                                      args.quant_config, ctx);
      return result;
    } else {
      throw_no_cuda(std::string(kWho) + " on " + a1.device().to_string());
    }
  }
  if (!a1.is_contiguous()) a1 = a1.clone();

  const int64_t E = num_local_experts_;
  const int64_t T = max_num_tokens_ * num_dispatchers_;
  const int64_t K = dims.K;
  const std::vector<int64_t> ids = detail::read_topk_ids(args.topk_ids);
  const detail::LocalExpertMap to_local(args.expert_map, rank_, E);
  const detail::BatchedLayout layout =
      detail::make_batched_layout(ids, dims.M * dims.topk, to_local, E);
  for (int64_t e = 0; e < E; ++e) {
    const int32_t count = layout.counts[static_cast<size_t>(e)];
    MOEKIT_CHECK(count <= T,
                 "{}: local expert {} received {} tokens but holds at most max_num_tokens * "
                 "num_dispatchers = {} * {} = {} (tokens per local expert: {})",
                 kWho, e, count, max_num_tokens_, num_dispatchers_, T,
                 counts_to_string(layout.counts));
  }
  expert_map_ = args.expert_map;

  Tensor b_a1 = Tensor::zeros({E, T, K}, a1.dtype());
  const size_t row_bytes = static_cast<size_t>(K) * element_size(a1.dtype());
  const auto* src = static_cast<const uint8_t*>(a1.data());
  auto* dst = static_cast<uint8_t*>(b_a1.data());
  for (int64_t s = 0; s < dims.M * dims.topk; ++s) {
    const int64_t local = layout.slot_local[static_cast<size_t>(s)];
    if (local < 0) continue;
    const int64_t row = local * T + layout.slot_row[static_cast<size_t>(s)];
    const int64_t m = s / dims.topk;
    std::memcpy(dst + static_cast<size_t>(row) * row_bytes,
                src + static_cast<size_t>(m) * row_bytes, row_bytes);
  }

  PrepareResult result;
  QuantizedInput q = detail::maybe_quantize_input(b_a1.view({E * T, K}), args.quant_config,
                                                  args.defer_input_quant, ctx);
  // Per-row layouts (data and per-token / per-group scales) regain the expert dimension; packed
  // formats keep their own row width.
  result.a1q =
      q.data.dim() == 2 && q.data.size(0) == E * T ? q.data.view({E, T, q.data.size(1)}) : q.data;
  result.a1q_scale = q.scale;
  if (q.scale.defined() && q.scale.dim() == 2 && q.scale.size(0) == E * T) {
    result.a1q_scale = q.scale.view({E, T, q.scale.size(1)});
  }
  result.expert_tokens_meta = ExpertTokensMetadata::make_from_list(layout.counts, a1.device());
  return result;
}

void PrepareFinalizeBatched::finalize(const FinalizeArgs& args, RunContext ctx) {
  expect_defined(args.output, "output");
  std::shared_ptr<const TopKWeightAndReduce> impl = args.weight_and_reduce;
  const bool delegate =
      impl == nullptr || dynamic_cast<const TopKWeightAndReduceDelegate*>(impl.get()) != nullptr;
  if (args.output.device().is_cuda() && delegate) {
    if constexpr (kCudaBuild) {
      detail::batched_finalize_device(device_state_, args.output, args.fused_expert_output,
                                      args.topk_weights, args.apply_router_weight_on_input, ctx);
      return;
    } else {
      throw_no_cuda(std::string(kWho) + " on " + args.output.device().to_string());
    }
  }
  if (delegate) {
    impl =
        std::make_shared<TopKWeightAndReduceNaiveBatched>(rank_, num_local_experts_, expert_map_);
  }
  impl->apply(args.output, args.fused_expert_output, args.topk_weights, args.topk_ids,
              args.apply_router_weight_on_input, ctx);
}

// ---- factory registration ----------------------------------------------------------------------

// One rank whose experts take the batched format: the local scatter into (E_local, T, H).
// NOTE: multi-rank batched deployments need the low-latency all-to-all (key
// kBatchedLowLatency); a local scatter there would drop the tokens of other ranks' experts.
MOEKIT_REGISTER_PREPARE_FINALIZE(batched_local, [] {
  PrepareFinalizeFactory f;
  f.name = "batched_local";
  f.all2all = std::nullopt;
  f.priority = 20;
  f.description = "no token exchange: scatter tokens into per-expert batches (E, T, H)";
  f.check = [](const PrepareFinalizeRequest& r) -> std::string {
    if (!is_batched(r.experts->activation_format())) {
      return r.experts->name() + " takes the standard format";
    }
    if (r.experts->is_monolithic()) return "monolithic experts take the standard format";
    if (r.moe->max_num_tokens <= 0 || r.moe->num_local_experts <= 0) {
      return fmt::format("needs max_num_tokens > 0 and num_local_experts > 0 (got {} and {})",
                         r.moe->max_num_tokens, r.moe->num_local_experts);
    }
    return {};
  };
  f.make = [](const PrepareFinalizeRequest& r) -> std::unique_ptr<PrepareFinalize> {
    return std::make_unique<PrepareFinalizeBatched>(r.moe->max_num_tokens, r.moe->num_local_experts,
                                                    /*num_dispatchers=*/1, r.moe->parallel.ep_rank);
  };
  return f;
}());

}  // namespace moekit
