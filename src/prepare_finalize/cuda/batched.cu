// The GPU half of PrepareFinalizeBatched and the exchanges' row movers (see
// prepare_finalize/cuda/batched.h).
#include <algorithm>

#include "core/cuda/cuda_check.cuh"
#include "experts/cuda/moe_permute.h"
#include "experts/cuda/moe_unpermute.h"
#include "moekit/core/checks.h"
#include "prepare_finalize/cuda/batched.h"

namespace moekit::detail {

struct BatchedDeviceState {
  int64_t T = 0, K = 0, max_slots = 0;
  int E = 0;
  DType dtype = DType::kBF16;
  Tensor a1q;        // (E, T, K)
  Tensor a1q_scale;  // (E, T, G) f32: the rows' scales scattered beside them (G = 0: none)
  int64_t G = 0;
  Tensor counts;           // (E,) int32: tokens per expert (align)
  Tensor out_counts;       // (E,) int32: min(count, T), what the experts see
  Tensor offsets;          // (E + 1,) int32
  Tensor permuted;         // (max_slots,) int32
  Tensor slot_to_row;      // (max_slots,) int32
  Tensor overflow;         // (1,) int32
  Tensor align_workspace;  // bytes
  int64_t M = 0;           // tokens of the last prepare
  int top_k = 0;
};

PrepareResult batched_prepare_device(std::shared_ptr<BatchedDeviceState>& state, const Tensor& a1,
                                     const Tensor& a1_scale, const Tensor& topk_ids,
                                     const Tensor& expert_map, int64_t num_global_experts,
                                     int num_local_experts, int64_t T, int rank, RunContext ctx) {
  MOEKIT_CHECK(ctx.stream.handle != nullptr, "PrepareFinalizeBatched on {} needs a CUDA stream",
               a1.device().to_string());
  MOEKIT_CHECK(expert_map.defined() || rank == 0,
               "PrepareFinalizeBatched on the GPU: rank {} needs an expert_map (global -> local)",
               rank);
  expect_contiguous(a1, "a1");
  expect_contiguous(topk_ids, "topk_ids");
  const int64_t M = a1.size(0), K = a1.size(1);
  const int top_k = static_cast<int>(topk_ids.size(1));
  const int64_t G = a1_scale.defined() ? a1_scale.size(1) : 0;
  if (a1_scale.defined()) {
    expect_contiguous(a1_scale, "a1_scale");
    MOEKIT_CHECK(a1_scale.dim() == 2 && a1_scale.size(0) == M && a1_scale.dtype() == DType::kF32,
                 "PrepareFinalizeBatched: a1_scale {} must be f32 rows (M={}, groups) beside a1",
                 a1_scale.describe(), M);
  }
  MOEKIT_CHECK(M <= T, "PrepareFinalizeBatched: M={} tokens exceed max_num_tokens * dispatchers={}",
               M, T);
  const int64_t max_slots = T * top_k;
  if (!state || state->T != T || state->K != K || state->E != num_local_experts ||
      state->dtype != a1.dtype() || state->G != G || state->max_slots < max_slots) {
    auto s = std::make_shared<BatchedDeviceState>();
    const Device d = a1.device();
    s->T = T;
    s->K = K;
    s->E = num_local_experts;
    s->dtype = a1.dtype();
    s->max_slots = max_slots;
    s->a1q = Tensor::zeros({num_local_experts, T, K}, a1.dtype(), d);
    s->G = G;
    if (G > 0) s->a1q_scale = Tensor::zeros({num_local_experts, T, G}, DType::kF32, d);
    s->counts = Tensor::empty({num_local_experts}, DType::kInt32, d);
    s->out_counts = Tensor::empty({num_local_experts}, DType::kInt32, d);
    s->offsets = Tensor::empty({num_local_experts + 1}, DType::kInt32, d);
    s->permuted = Tensor::empty({max_slots}, DType::kInt32, d);
    s->slot_to_row = Tensor::empty({max_slots}, DType::kInt32, d);
    s->overflow = Tensor::empty({1}, DType::kInt32, d);
    const size_t ws = cuda::moe_align_workspace_bytes(T, top_k, num_local_experts);
    s->align_workspace =
        Tensor::empty({static_cast<int64_t>(std::max<size_t>(ws, 4))}, DType::kUInt8, d);
    state = std::move(s);
  }
  BatchedDeviceState& s = *state;
  s.M = M;
  s.top_k = top_k;
  const cudaStream_t stream = to_cuda(ctx.stream);

  cuda::MoeAlignParams align;
  align.topk_ids = topk_ids.data_as<const int32_t>();
  align.num_tokens = M;
  align.top_k = top_k;
  align.expert_map = expert_map.defined() ? expert_map.data_as<const int32_t>() : nullptr;
  align.num_global_experts = static_cast<int>(num_global_experts);
  align.num_local_experts = num_local_experts;
  align.row_align = 1;
  align.expert_counts = s.counts.data_as<int32_t>();
  align.expert_offsets = s.offsets.data_as<int32_t>();
  align.permuted_rows = s.permuted.data_as<int32_t>();
  align.slot_to_row = s.slot_to_row.data_as<int32_t>();
  align.workspace = s.align_workspace.data();
  align.workspace_bytes = s.align_workspace.nbytes();
  if (const char* why = cuda::moe_align_unsupported_reason(align)) {
    MOEKIT_CHECK(false, "PrepareFinalizeBatched align: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_moe_align(align, stream));

  cuda::BatchedScatterParams sc;
  sc.x = a1.data();
  sc.x_row_stride = K;
  sc.hidden = K;
  sc.elem_bytes = static_cast<int>(element_size(a1.dtype()));
  sc.top_k = top_k;
  sc.permuted_rows = s.permuted.data_as<const int32_t>();
  sc.expert_offsets = s.offsets.data_as<const int32_t>();
  sc.expert_counts = s.counts.data_as<const int32_t>();
  sc.num_local_experts = num_local_experts;
  sc.max_tokens = static_cast<int>(T);
  sc.out = s.a1q.data();
  sc.out_counts = s.out_counts.data_as<int32_t>();
  sc.overflow = s.overflow.data_as<int32_t>();
  if (const char* why = cuda::batched_scatter_unsupported_reason(sc)) {
    MOEKIT_CHECK(false, "PrepareFinalizeBatched scatter: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_batched_scatter(sc, stream));
  if (G > 0) {  // the same rows of the scales
    sc.x = a1_scale.data();
    sc.x_row_stride = sc.hidden = G;
    sc.elem_bytes = 4;
    sc.out = s.a1q_scale.data();
    MOEKIT_CUDA_CHECK(cuda::launch_batched_scatter(sc, stream));
  }

  PrepareResult result;
  result.a1q = s.a1q;
  if (G > 0) result.a1q_scale = s.a1q_scale;
  ExpertTokensMetadata meta;
  meta.expert_num_tokens = s.out_counts;
  result.expert_tokens_meta = meta;
  return result;
}

void batched_finalize_device(const std::shared_ptr<BatchedDeviceState>& state, Tensor output,
                             const Tensor& fused_expert_output, const Tensor& topk_weights,
                             bool apply_router_weight_on_input, RunContext ctx) {
  MOEKIT_CHECK(state != nullptr, "PrepareFinalizeBatched: finalize before prepare on the GPU");
  const BatchedDeviceState& s = *state;
  expect_shape(output, "output", {s.M, s.K});
  expect_shape(fused_expert_output, "fused_expert_output", {s.E, s.T, s.K});
  expect_contiguous(fused_expert_output, "fused_expert_output");
  cuda::MoeUnpermuteParams u;
  u.layout = cuda::UnpermuteLayout::kBatched;
  u.y = fused_expert_output.data();
  u.y_type = cuda::float_storage_of(fused_expert_output.dtype());
  u.y_row_stride = s.K;
  u.slot_to_row = s.slot_to_row.data_as<const int32_t>();
  u.topk_weights = topk_weights.data_as<const float>();
  u.apply_router_weight_on_input = apply_router_weight_on_input;
  u.num_tokens = s.M;
  u.top_k = s.top_k;
  u.hidden = s.K;
  u.expert_offsets = s.offsets.data_as<const int32_t>();
  u.num_local_experts = s.E;
  u.max_tokens = static_cast<int>(s.T);
  u.out = output.data();
  u.out_type = cuda::float_storage_of(output.dtype());
  u.out_row_stride = s.K;
  if (const char* why = cuda::moe_unpermute_unsupported_reason(u)) {
    MOEKIT_CHECK(false, "PrepareFinalizeBatched combine: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_moe_unpermute(u, to_cuda(ctx.stream)));
}

void exchange_pack_device(const Tensor& exchanged, const Tensor& packed, const Tensor& counts,
                          const Tensor& expert_num_tokens, int world, int64_t capacity, bool unpack,
                          RunContext ctx) {
  expect_contiguous(exchanged, "exchanged");
  expect_contiguous(packed, "packed");
  MOEKIT_CHECK(exchanged.dtype() == packed.dtype() && exchanged.numel() == packed.numel(),
               "exchange pack: exchanged {} and packed {} must hold the same rows",
               exchanged.describe(), packed.describe());
  MOEKIT_CHECK(counts.dtype() == DType::kInt32 && counts.numel() % world == 0,
               "exchange pack: counts {} must be int32, world = {} blocks of the local experts",
               counts.describe(), world);
  cuda::ExchangePackParams p;
  p.exchanged = exchanged.data();
  p.packed = packed.data();
  p.counts = counts.data_as<const int32_t>();
  p.expert_num_tokens =
      expert_num_tokens.defined() ? expert_num_tokens.data_as<int32_t>() : nullptr;
  p.world = world;
  p.num_local_experts = static_cast<int>(counts.numel() / world);
  p.capacity = static_cast<int>(capacity);
  p.hidden = exchanged.size(exchanged.dim() - 1);
  p.elem_bytes = static_cast<int>(element_size(exchanged.dtype()));
  p.unpack = unpack;
  if (const char* why = cuda::exchange_pack_unsupported_reason(p)) {
    MOEKIT_CHECK(false, "exchange pack: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_exchange_pack(p, to_cuda(ctx.stream)));
}

void gather_rows_device(const Tensor& src, const Tensor& index, const Tensor& out, RunContext ctx) {
  expect_contiguous(src, "src");
  expect_contiguous(out, "out");
  MOEKIT_CHECK(index.dtype() == DType::kInt32 && index.numel() == out.size(0) &&
                   src.dtype() == out.dtype() &&
                   src.numel() / std::max<int64_t>(src.size(0), 1) ==
                       out.numel() / std::max<int64_t>(out.size(0), 1),
               "gather rows: index {} must be int32 with a row of out {} each, rows like src {}",
               index.describe(), out.describe(), src.describe());
  cuda::GatherRowsParams p;
  p.src = src.data();
  p.index = index.data_as<const int32_t>();
  p.num_rows = out.size(0);
  p.row_bytes = out.size(0) > 0 ? static_cast<int64_t>(out.nbytes()) / out.size(0) : 0;
  p.out = out.data();
  if (const char* why = cuda::gather_rows_unsupported_reason(p)) {
    MOEKIT_CHECK(false, "gather rows: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_gather_rows(p, to_cuda(ctx.stream)));
}

void sum_rows_device(const Tensor& output, const Tensor& rows, const Tensor& row_of, int per_token,
                     RunContext ctx) {
  expect_contiguous(rows, "rows");
  expect_contiguous(output, "output");
  const int64_t M = output.size(0), K = output.size(1);
  MOEKIT_CHECK(row_of.dtype() == DType::kInt32 && row_of.numel() == M * per_token &&
                   rows.dim() == 2 && rows.size(1) == K,
               "sum rows: row_of {} must be int32 (M * {}), rows {} of output {}'s width",
               row_of.describe(), per_token, rows.describe(), output.describe());
  if (M == 0) return;
  cuda::MoeUnpermuteParams u;
  u.layout = cuda::UnpermuteLayout::kStandard;
  u.y = rows.data();
  u.y_type = cuda::float_storage_of(rows.dtype());
  u.y_row_stride = K;
  u.slot_to_row = row_of.data_as<const int32_t>();
  u.apply_router_weight_on_input = true;  // the partials are weighted already: w = 1
  u.num_tokens = M;
  u.top_k = per_token;
  u.hidden = K;
  u.out = output.data();
  u.out_type = cuda::float_storage_of(output.dtype());
  u.out_row_stride = K;
  if (const char* why = cuda::moe_unpermute_unsupported_reason(u)) {
    MOEKIT_CHECK(false, "sum rows: {}", why);
  }
  MOEKIT_CUDA_CHECK(cuda::launch_moe_unpermute(u, to_cuda(ctx.stream)));
}

}  // namespace moekit::detail
