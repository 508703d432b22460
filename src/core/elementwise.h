// Internal: small elementwise ops the layer needs on either device (CPU here, CUDA in
// core/cuda/elementwise.cu). Stream-ordered on the GPU; they never allocate.
#pragma once

#include "moekit/core/tensor.h"

namespace moekit {

// out += other, same shape and dtype (bf16/f16/f32), fp32 math, rounded once. With row_scale
// ((M,) f32 for out (M, K)): out[m, :] += row_scale[m] * other[m, :].
void add_inplace(Tensor& out, const Tensor& other, Stream stream, const Tensor& row_scale = {});
// gate[m] = sigmoid(x[m, :] . gate_weight): the per-token gate of a shared expert (Qwen2-MoE's
// shared_expert_gate). x (M, H) bf16/f16/f32, gate_weight (H,) f32, gate (M,) f32; fp32 dot
// product on the GPU, double on the CPU.
void shared_expert_gate(const Tensor& x, const Tensor& gate_weight, Tensor& gate, Stream stream);
// The routing of a layer whose shared experts run as extra routed experts: every token keeps its
// k routed slots and gains `count` slots of experts first_id .. first_id + count - 1:
//   out_ids[m, :k] = ids[m, :], out_ids[m, k + j] = first_id + j,
//   out_weights[m, :k] = weights[m, :], out_weights[m, k + j] = the slot weight,
// the slot weight being sigmoid(x[m, :] . gate_weight) when gate_weight is defined (as
// shared_expert_gate), else 1. ids (M, k) int32, weights (M, k) f32, out (M, k + count).
void append_shared_slots(const Tensor& ids, const Tensor& weights, int first_id, int count,
                         const Tensor& x, const Tensor& gate_weight, Tensor& out_ids,
                         Tensor& out_weights, Stream stream);
// Converts int64 ids to int32 into a preallocated tensor of the same shape.
void convert_ids_to_int32(const Tensor& ids64, Tensor& ids32, Stream stream);

// out[m, :] = in[m, :] * weights[m, 0] (weights (M, 1) f32), rounded once to out's dtype.
void scale_rows(Tensor& out, const Tensor& in, const Tensor& weights, Stream stream);

// Reorders the rows of a gated w13 (E, 2I, K) — or its bias (E, 2I), with K = 1 — into blocks of 64
// rows: [64b, 64b+32) gate rows and [64b+32, 64b+64) the matching up rows of output columns
// [32b, 32b+32) (the layout of GEMM1 with a fused gated activation). The source has gate rows
// [0, I) and up rows [I, 2I), or gate = row 2i / up = row 2i+1 when `pairwise` (gpt-oss swigluoai).
// I must be a multiple of 32. dst and src are distinct contiguous tensors of the same shape.
void interleave_gate_up_blocks(Tensor& dst, const Tensor& src, bool pairwise, Stream stream);

// Fills a contiguous float tensor with scale * u, u uniform in [-1, 1) from a counter-based hash of
// (seed, first_index + element index): the same values on every device, and a slice of a larger
// tensor filled alone gets its elements' values in the whole (first_index = its offset). A null
// stream on the GPU synchronizes.
void fill_uniform(Tensor& t, uint64_t seed, float scale, Stream stream, uint64_t first_index = 0);
// The hash behind fill_uniform, for host-side recomputation.
float hashed_uniform(uint64_t seed, uint64_t index);

}  // namespace moekit
