// Internal: small elementwise ops the layer needs on either device (CPU here, CUDA in
// elementwise.cu). Stream-ordered on the GPU; they never allocate.
#pragma once

#include "moekit/core/tensor.h"

namespace moekit {

// out += other, same shape and dtype (bf16/f16/f32), fp32 math, rounded once.
void add_inplace(Tensor& out, const Tensor& other, Stream stream);
// Converts int64 ids to int32 into a preallocated tensor of the same shape.
void convert_ids_to_int32(const Tensor& ids64, Tensor& ids32, Stream stream);

// out[m, :] = in[m, :] * weights[m, 0] (weights (M, 1) f32), rounded once to out's dtype.
void scale_rows(Tensor& out, const Tensor& in, const Tensor& weights, Stream stream);

// Fills a contiguous float tensor with scale * u, u uniform in [-1, 1) from a counter-based hash of
// (seed, element index): the same values on every device. A null stream on the GPU synchronizes.
void fill_uniform(Tensor& t, uint64_t seed, float scale, Stream stream);
// The hash behind fill_uniform, for host-side recomputation.
float hashed_uniform(uint64_t seed, uint64_t index);

#ifdef MOEKIT_WITH_CUDA
void scale_rows_cuda(Tensor& out, const Tensor& in, const Tensor& weights, Stream stream);
void fill_uniform_cuda(Tensor& t, uint64_t seed, float scale, Stream stream);
void add_inplace_cuda(Tensor& out, const Tensor& other, Stream stream);
void convert_ids_to_int32_cuda(const Tensor& ids64, Tensor& ids32, Stream stream);
#endif

}  // namespace moekit
