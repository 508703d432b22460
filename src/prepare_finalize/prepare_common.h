// Internal: steps every single-rank prepare shares: checking the inputs, applying the router
// weight on the input (top-1 only) and quantizing the activations.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/cuda_seam.h"
#include "core/elementwise.h"
#include "modular/cpu_rows.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"
#include "moekit/core/workspace.h"
#include "moekit/modular/prepare_finalize.h"
#include "moekit/quant/moe_input_quant.h"
#include "quant/cuda/moe_input_quant.h"

namespace moekit::detail {

// Workspace slots of the input quantization on a GPU.
inline constexpr std::string_view kA1qSlot = "prepare.a1q";
inline constexpr std::string_view kA1qScaleSlot = "prepare.a1q_scale";
inline constexpr std::string_view kAmaxSlot = "prepare.amax";

struct PrepareDims {
  int64_t M = 0, K = 0, topk = 0;
};

// a1 (M, K) bf16/f16/f32; topk_ids (M, topk) int32; topk_weights (M, topk) f32; all on a1's device.
inline PrepareDims check_prepare_args(const PrepareArgs& args, const char* who) {
  expect_defined(args.a1, "a1");
  expect_dim(args.a1, "a1", 2);
  expect_dtype(args.a1, "a1", {DType::kBF16, DType::kF16, DType::kF32});
  expect_defined(args.topk_ids, "topk_ids");
  expect_defined(args.topk_weights, "topk_weights");
  const PrepareDims dims{args.a1.size(0), args.a1.size(1),
                         args.topk_ids.dim() == 2 ? args.topk_ids.size(1) : -1};
  expect_shape(args.topk_ids, "topk_ids", {dims.M, kAnyDim});
  expect_dtype(args.topk_ids, "topk_ids", {DType::kInt32});
  expect_shape(args.topk_weights, "topk_weights", {dims.M, dims.topk});
  expect_dtype(args.topk_weights, "topk_weights", {DType::kF32});
  expect_device(args.topk_ids, "topk_ids", args.a1.device());
  expect_device(args.topk_weights, "topk_weights", args.a1.device());
  return dims;
}

// a1[m, :] * topk_weights[m, 0], rounded to a1's dtype. The weight can only be folded into the
// input when each token goes to a single expert. On the CPU the result is a new tensor; on a GPU it
// is written into *device_buffer, which is allocated on first use (a warm-up forward) and reused,
// so later forwards (and CUDA-graph captures) allocate nothing.
inline Tensor apply_router_weight_to_input(const Tensor& a1, const Tensor& topk_weights,
                                           const char* who, Tensor* device_buffer = nullptr,
                                           Stream stream = {}) {
  MOEKIT_CHECK(topk_weights.size(1) == 1,
               "{}: apply_router_weight_on_input needs topk == 1 (the weight multiplies the input "
               "before the experts), got topk = {}",
               who, topk_weights.size(1));
  const int64_t M = a1.size(0), K = a1.size(1);
  if (!a1.device().is_cpu()) {
    MOEKIT_CHECK(device_buffer != nullptr, "{}: no device buffer for the router-weighted input",
                 who);
    if (!device_buffer->defined() || device_buffer->dtype() != a1.dtype() ||
        device_buffer->device() != a1.device() || device_buffer->numel() < M * K) {
      *device_buffer = Tensor::empty({std::max<int64_t>(M * K, 1)}, a1.dtype(), a1.device());
    }
    Tensor out = device_buffer->reinterpret({M, K}, a1.dtype());
    scale_rows(out, a1, topk_weights, stream);
    return out;
  }
  const Tensor src = a1.is_contiguous() ? a1 : a1.clone();
  Tensor out = Tensor::empty({M, K}, a1.dtype());
  const float* w = topk_weights.is_contiguous() ? topk_weights.data_as<const float>() : nullptr;
  const Tensor w_copy = w == nullptr ? topk_weights.clone() : Tensor{};
  if (w == nullptr) w = w_copy.data_as<const float>();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      load_row(src.data(), src.dtype(), m * K, K, row.data());
      for (float& v : row)
        v *= w[m];
      store_row(out.data(), out.dtype(), m * K, K, row.data());
    }
  }
  return out;
}

// The experts' weight-and-reduce as a finalize applies it: Delegate (or none) becomes Contiguous.
inline std::shared_ptr<const TopKWeightAndReduce> resolve_weight_and_reduce(
    const std::shared_ptr<const TopKWeightAndReduce>& impl) {
  if (impl == nullptr || dynamic_cast<const TopKWeightAndReduceDelegate*>(impl.get()) != nullptr) {
    return std::make_shared<TopKWeightAndReduceContiguous>();
  }
  return impl;
}

// Quantizes the activations unless the experts quantize them or a1 is not quantized.
// Workspace slots of the GPU input quantization (prepare.a1q, prepare.a1q_scale, prepare.amax)
// for up to max_num_tokens rows of `hidden` when `quant` quantizes a1 in a way the GPU serves;
// none otherwise. NOTE: a CPU layer reserves them too (it does not use them; the P/F does not know
// the device).
inline std::vector<WorkspaceRequest> input_quant_requests(int64_t max_num_tokens, int64_t hidden,
                                                          const QuantConfig& quant) {
  if (quant.a1.dtype == QuantDType::kNone || !device_quant_unsupported(quant.a1).empty()) return {};
  const DeviceQuantShapes s = device_quant_shapes(max_num_tokens, hidden, quant.a1);
  return {{std::string(kA1qSlot), static_cast<size_t>(numel_of(s.data))},
          {std::string(kA1qScaleSlot), static_cast<size_t>(numel_of(s.scale)) * 4},
          {std::string(kAmaxSlot), 4}};
}

// a1, or its codes and scales when the experts expect the prepare to quantize (not deferred).
// On the CPU the result is new tensors; on a GPU it is written into the workspace slots above
// (reserved by the layer), so a forward allocates nothing.
inline QuantizedInput maybe_quantize_input(const Tensor& a1, const QuantConfig* quant_config,
                                           bool defer_input_quant, RunContext ctx) {
  if (defer_input_quant || quant_config == nullptr || quant_config->a1.dtype == QuantDType::kNone) {
    return {a1, Tensor{}};
  }
  if (!a1.device().is_cuda()) return quantize_moe_input(a1, quant_config->a1, ctx);
  if constexpr (kCudaBuild) {
    MOEKIT_CHECK(ctx.workspace != nullptr,
                 "quantizing a1 on the GPU needs the workspace manager in RunContext (slots {}, "
                 "{})",
                 kA1qSlot, kA1qScaleSlot);
    const DeviceQuantShapes s = device_quant_shapes(a1.size(0), a1.size(1), quant_config->a1);
    QuantizedInput q;
    q.data = ctx.workspace->get(kA1qSlot, s.data, s.data_dtype);
    const bool static_scale = quant_config->a1.scale.defined();
    if (!static_scale) q.scale = ctx.workspace->get(kA1qScaleSlot, s.scale, DType::kF32);
    const Tensor amax = ctx.workspace->get(kAmaxSlot, {4}, DType::kUInt8);
    quantize_on_device(a1, quant_config->a1, q.data, q.scale, amax.data(), {}, ctx.stream);
    return q;
  } else {
    throw_no_cuda("quantizing a1 on the GPU");
  }
}

// The activations as they travel (to another rank, or into the batched format): quantized before
// the exchange when each row carries its own (dynamic per-token or per-group) scales — then
// `scale` is (rows, groups); on a GPU in the input quantization's workspace slots — else
// unquantized (`quantize_after`: the receiving rank quantizes its batch). A per-tensor scale
// cannot travel with the rows: a dynamic one depends on the batch, and a static one is the
// maximum over the rank's own experts' calibrated scales, which differs between ranks, so the
// codes must be made with the scale of the experts that read them.
struct DispatchPayload {
  Tensor data;
  Tensor scale;
  bool scale_has_rows = false;
  bool quantize_after = false;
};

inline DispatchPayload make_dispatch_payload(const Tensor& a1, const QuantConfig* quant,
                                             bool defer_input_quant, RunContext ctx) {
  DispatchPayload out;
  const bool quantized =
      !defer_input_quant && quant != nullptr && quant->a1.dtype != QuantDType::kNone;
  if (!quantized) {
    out.data = a1;
    return out;
  }
  if (has_static_scale(quant->a1) || quant->a1.shape.is_per_tensor()) {
    out.data = a1;
    out.quantize_after = true;
    return out;
  }
  QuantizedInput q = a1.device().is_cuda() ? maybe_quantize_input(a1, quant, false, ctx)
                                           : quantize_moe_input(a1, quant->a1, ctx);
  out.data = std::move(q.data);
  out.scale = std::move(q.scale);
  out.scale_has_rows = out.scale.defined();
  return out;
}

// The received activations as the experts take them (quantizing them now when they travelled
// unquantized).
inline QuantizedInput finish_dispatch(const Tensor& data, const Tensor& scale,
                                      const DispatchPayload& sent, const QuantConfig* quant,
                                      RunContext ctx) {
  if (sent.quantize_after) return quantize_moe_input(data, quant->a1, ctx);
  return {data, scale};
}

// Batched rows (E, T, K) on a GPU quantized under `desc` into the input quantization's workspace
// slots (input_quant_requests for E * T rows), where only the first counts[e] rows of expert e
// exist (the others are left as they are and out of a dynamic per-tensor amax): the codes
// (E, T, K) and the scale (a per-tensor one: the rows that travelled unquantized).
inline QuantizedInput quantize_batched_input(const Tensor& rows, const Tensor& counts,
                                             const QuantDesc& desc, RunContext ctx) {
  if constexpr (kCudaBuild) {
    MOEKIT_CHECK(ctx.workspace != nullptr && rows.dim() == 3 && counts.dtype() == DType::kInt32 &&
                     counts.numel() == rows.size(0),
                 "quantizing batched rows {} on the GPU needs the workspace manager and int32 "
                 "counts per expert, got {}",
                 rows.describe(), counts.describe());
    const int64_t E = rows.size(0), T = rows.size(1), K = rows.size(2);
    const DeviceQuantShapes s = device_quant_shapes(E * T, K, desc);
    QuantizedInput q;
    q.data = ctx.workspace->get(kA1qSlot, s.data, s.data_dtype);
    if (!desc.scale.defined()) q.scale = ctx.workspace->get(kA1qScaleSlot, s.scale, DType::kF32);
    const Tensor amax = ctx.workspace->get(kAmaxSlot, {4}, DType::kUInt8);
    quantize_on_device(rows.view({E * T, K}), desc, q.data, q.scale, amax.data(),
                       {nullptr, counts.data_as<const int32_t>(), T}, ctx.stream);
    q.data = q.data.view({E, T, K});
    if (q.scale.dim() == 2) q.scale = q.scale.view({E, T, q.scale.size(1)});
    return q;
  } else {
    throw_no_cuda("quantizing batched rows on the GPU");
  }
}

// The batched activations as the experts take them on a GPU: rows that travelled unquantized (a
// per-tensor scale, `sent.quantize_after`) quantized now over the rows that exist (counts per
// expert), in place of result's a1q / a1q_scale; otherwise as they are.
inline void finish_batched_dispatch(PrepareResult& result, const Tensor& counts,
                                    const DispatchPayload& sent, const QuantConfig* quant,
                                    RunContext ctx) {
  if (!sent.quantize_after) return;
  QuantizedInput q = quantize_batched_input(result.a1q, counts, quant->a1, ctx);
  result.a1q = std::move(q.data);
  result.a1q_scale = std::move(q.scale);
}

}  // namespace moekit::detail
