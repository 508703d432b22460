// CPU implementations of the four TopKWeightAndReduce strategies. CUDA tensors go to the device
// entry point (modular/cuda/reduce.h) for the contiguous reduce.
#include "moekit/modular/topk_weight_and_reduce.h"

#include <algorithm>
#include <vector>

#include "core/cuda_seam.h"
#include "modular/batched_layout.h"
#include "modular/cpu_rows.h"
#include "modular/cuda/reduce.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

// Returns `output` checked as (M, K), or a new (M, K) tensor of `dtype` on `device`.
Tensor output_or_new(const Tensor& output, int64_t M, int64_t K, DType dtype, Device device,
                     const char* who) {
  if (!output.defined()) return Tensor::empty({M, K}, dtype, device);
  expect_shape(output, "output", {M, K});
  MOEKIT_CHECK(detail::is_cpu_float_dtype(output.dtype()),
               "{}: output dtype {} must be bf16, f16 or f32", who, dtype_name(output.dtype()));
  MOEKIT_CHECK(output.device() == device, "{}: output is on {} but fused_expert_output on {}", who,
               output.device().to_string(), device.to_string());
  return output;
}

// (M * topk,) f32 weights, or empty when they were applied on the input.
std::vector<float> read_weights(const Tensor& topk_weights, int64_t M, int64_t topk,
                                bool apply_router_weight_on_input) {
  if (apply_router_weight_on_input) return {};
  expect_defined(topk_weights, "topk_weights");
  expect_dtype(topk_weights, "topk_weights", {DType::kF32});
  expect_shape(topk_weights, "topk_weights", {M, topk});
  MOEKIT_CHECK(topk_weights.device().is_cpu(), "topk_weights must be on the CPU here, got {}",
               topk_weights.device().to_string());
  return topk_weights.to_float_vector();
}

// output[m, :] = sum_j w[m, j] * y[offset(m, j) .. + K] over the slots with an offset >= 0, in
// order j = 0..topk-1, fp32 accumulation, rounded once to output's dtype.
Tensor weighted_reduce(Tensor output, const Tensor& y, const std::vector<int64_t>& slot_offset,
                       const std::vector<float>& weights, int64_t M, int64_t topk, int64_t K) {
  Tensor dst = output.is_contiguous() ? output : Tensor::empty({M, K}, output.dtype());
  const void* src = y.data();
  const DType src_dtype = y.dtype();
  void* out = dst.data();
  const DType out_dtype = dst.dtype();
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(K));
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < topk; ++j) {
        const int64_t s = m * topk + j;
        const int64_t offset = slot_offset[static_cast<size_t>(s)];
        if (offset < 0) continue;
        detail::load_row(src, src_dtype, offset, K, row.data());
        const float w = weights.empty() ? 1.0f : weights[static_cast<size_t>(s)];
        for (int64_t k = 0; k < K; ++k)
          acc[static_cast<size_t>(k)] += w * row[static_cast<size_t>(k)];
      }
      detail::store_row(out, out_dtype, m * K, K, acc.data());
    }
  }
  if (dst.data() != output.data()) output.copy_from(dst);
  return output;
}

void expect_float_contiguous(const Tensor& t, const char* name) {
  MOEKIT_CHECK(detail::is_cpu_float_dtype(t.dtype()), "{} dtype {} must be bf16, f16 or f32", name,
               dtype_name(t.dtype()));
  expect_contiguous(t, name);
}

}  // namespace

Tensor TopKWeightAndReduceNoOp::apply(Tensor output, const Tensor& fused_expert_output,
                                      const Tensor& topk_weights, const Tensor& topk_ids,
                                      bool apply_router_weight_on_input, RunContext ctx) const {
  expect_defined(fused_expert_output, "fused_expert_output");
  expect_dim(fused_expert_output, "fused_expert_output", 2);
  if (!output.defined()) return fused_expert_output;
  if (output.data() == fused_expert_output.data() &&
      output.shape() == fused_expert_output.shape() &&
      output.strides() == fused_expert_output.strides() &&
      output.dtype() == fused_expert_output.dtype()) {
    return output;
  }
  expect_shape(output, "output", {fused_expert_output.size(0), fused_expert_output.size(1)});
  MOEKIT_CHECK(output.dtype() == fused_expert_output.dtype(),
               "TopKWeightAndReduceNoOp: output dtype {} differs from fused_expert_output dtype {}",
               dtype_name(output.dtype()), dtype_name(fused_expert_output.dtype()));
  output.copy_from_async(fused_expert_output, ctx.stream);  // stream-ordered on the GPU
  return output;
}

Tensor TopKWeightAndReduceContiguous::apply(Tensor output, const Tensor& fused_expert_output,
                                            const Tensor& topk_weights, const Tensor& topk_ids,
                                            bool apply_router_weight_on_input,
                                            RunContext ctx) const {
  expect_defined(fused_expert_output, "fused_expert_output");
  int64_t M = -1, topk = -1;
  if (topk_ids.defined()) {
    expect_dim(topk_ids, "topk_ids", 2);
    M = topk_ids.size(0);
    topk = topk_ids.size(1);
  } else if (topk_weights.defined()) {
    expect_dim(topk_weights, "topk_weights", 2);
    M = topk_weights.size(0);
    topk = topk_weights.size(1);
  } else {
    MOEKIT_CHECK(fused_expert_output.dim() == 3,
                 "TopKWeightAndReduceContiguous: fused_expert_output {} must be (M, topk, K) when "
                 "neither topk_ids nor topk_weights is given",
                 fused_expert_output.describe());
    M = fused_expert_output.size(0);
    topk = fused_expert_output.size(1);
  }
  const int64_t K = fused_expert_output.size(-1);
  if (fused_expert_output.dim() == 3) {
    expect_shape(fused_expert_output, "fused_expert_output", {M, topk, K});
  } else {
    MOEKIT_CHECK(fused_expert_output.dim() == 2 && fused_expert_output.size(0) == M * topk,
                 "TopKWeightAndReduceContiguous: fused_expert_output {} must be (M, topk, K) or "
                 "(M * topk, K) with M = {}, topk = {}",
                 fused_expert_output.describe(), M, topk);
  }
  expect_float_contiguous(fused_expert_output, "fused_expert_output");
  output = output_or_new(output, M, K, fused_expert_output.dtype(), fused_expert_output.device(),
                         "TopKWeightAndReduceContiguous");
  if (M == 0) return output;

  if (fused_expert_output.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      expect_contiguous(output, "output");
      reduce_topk_on_device(output, fused_expert_output.view({M, topk, K}), topk_weights, topk_ids,
                            apply_router_weight_on_input, ctx.stream);
      return output;
    } else {
      throw_no_cuda("TopKWeightAndReduceContiguous on " + fused_expert_output.device().to_string() +
                    " (move the tensors to the CPU)");
    }
  }

  const std::vector<float> weights =
      read_weights(topk_weights, M, topk, apply_router_weight_on_input);
  std::vector<int64_t> ids;
  if (topk_ids.defined()) ids = detail::read_topk_ids(topk_ids);
  std::vector<int64_t> slot_offset(static_cast<size_t>(M * topk));
  for (int64_t s = 0; s < M * topk; ++s) {
    const bool valid = ids.empty() || ids[static_cast<size_t>(s)] >= 0;
    slot_offset[static_cast<size_t>(s)] = valid ? s * K : -1;
  }
  return weighted_reduce(std::move(output), fused_expert_output, slot_offset, weights, M, topk, K);
}

Tensor TopKWeightAndReduceNaiveBatched::apply(Tensor output, const Tensor& fused_expert_output,
                                              const Tensor& topk_weights, const Tensor& topk_ids,
                                              bool apply_router_weight_on_input,
                                              RunContext ctx) const {
  expect_defined(fused_expert_output, "fused_expert_output");
  expect_defined(topk_ids, "topk_ids");
  expect_dim(fused_expert_output, "fused_expert_output", 3);
  expect_dim(topk_ids, "topk_ids", 2);
  MOEKIT_CHECK(fused_expert_output.device().is_cpu(),
               "TopKWeightAndReduceNaiveBatched runs on the CPU only; fused_expert_output is on {}",
               fused_expert_output.device().to_string());
  const int64_t E = fused_expert_output.size(0);
  const int64_t T = fused_expert_output.size(1);
  const int64_t K = fused_expert_output.size(2);
  MOEKIT_CHECK(E == num_local_experts_,
               "TopKWeightAndReduceNaiveBatched: fused_expert_output {} has {} experts, expected "
               "num_local_experts = {}",
               fused_expert_output.describe(), E, num_local_experts_);
  expect_float_contiguous(fused_expert_output, "fused_expert_output");
  const int64_t M = topk_ids.size(0);
  const int64_t topk = topk_ids.size(1);
  output = output_or_new(output, M, K, fused_expert_output.dtype(), fused_expert_output.device(),
                         "TopKWeightAndReduceNaiveBatched");
  if (M == 0) return output;

  const std::vector<float> weights =
      read_weights(topk_weights, M, topk, apply_router_weight_on_input);
  const std::vector<int64_t> ids = detail::read_topk_ids(topk_ids);
  const detail::LocalExpertMap to_local(expert_map_, rank_, num_local_experts_);
  const detail::BatchedLayout layout = detail::make_batched_layout(ids, M * topk, to_local, E);
  for (int64_t e = 0; e < E; ++e) {
    MOEKIT_CHECK(layout.counts[static_cast<size_t>(e)] <= T,
                 "TopKWeightAndReduceNaiveBatched: local expert {} has {} tokens but "
                 "fused_expert_output {} holds at most {} per expert",
                 e, layout.counts[static_cast<size_t>(e)], fused_expert_output.describe(), T);
  }
  std::vector<int64_t> slot_offset(static_cast<size_t>(M * topk));
  for (int64_t s = 0; s < M * topk; ++s) {
    const int64_t local = layout.slot_local[static_cast<size_t>(s)];
    slot_offset[static_cast<size_t>(s)] =
        local < 0 ? -1 : (local * T + layout.slot_row[static_cast<size_t>(s)]) * K;
  }
  return weighted_reduce(std::move(output), fused_expert_output, slot_offset, weights, M, topk, K);
}

Tensor TopKWeightAndReduceDelegate::apply(Tensor output, const Tensor& fused_expert_output,
                                          const Tensor& topk_weights, const Tensor& topk_ids,
                                          bool apply_router_weight_on_input, RunContext ctx) const {
  throw Error(
      "TopKWeightAndReduceDelegate::apply must not be called: the prepare/finalize substitutes its "
      "own TopKWeightAndReduce (e.g. Contiguous for no-EP, NaiveBatched for batched)");
}

}  // namespace moekit
