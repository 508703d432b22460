// Device entry points of core/elementwise.h (core/cuda/elementwise.cu): same contracts, CUDA
// tensors.
#pragma once

#include "moekit/core/tensor.h"

namespace moekit {

void interleave_gate_up_blocks_cuda(Tensor& dst, const Tensor& src, bool pairwise, Stream stream);
void scale_rows_cuda(Tensor& out, const Tensor& in, const Tensor& weights, Stream stream);
void fill_uniform_cuda(Tensor& t, uint64_t seed, float scale, Stream stream, uint64_t first_index);
void add_inplace_cuda(Tensor& out, const Tensor& other, const Tensor& row_scale, Stream stream);
void shared_expert_gate_cuda(const Tensor& x, const Tensor& gate_weight, Tensor& gate,
                             Stream stream);
void append_shared_slots_cuda(const Tensor& ids, const Tensor& weights, int first_id, int count,
                              const Tensor& x, const Tensor& gate_weight, Tensor& out_ids,
                              Tensor& out_weights, Stream stream);
void convert_ids_to_int32_cuda(const Tensor& ids64, Tensor& ids32, Stream stream);

}  // namespace moekit
