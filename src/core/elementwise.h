// Internal: small elementwise ops the layer needs on either device (CPU here, CUDA in
// elementwise.cu). Stream-ordered on the GPU; they never allocate.
#pragma once

#include "moekit/core/tensor.h"

namespace moekit {

// out += other, same shape and dtype (bf16/f16/f32), fp32 math, rounded once.
void add_inplace(Tensor& out, const Tensor& other, Stream stream);
// Converts int64 ids to int32 into a preallocated tensor of the same shape.
void convert_ids_to_int32(const Tensor& ids64, Tensor& ids32, Stream stream);

#ifdef MOEKIT_WITH_CUDA
void add_inplace_cuda(Tensor& out, const Tensor& other, Stream stream);
void convert_ids_to_int32_cuda(const Tensor& ids64, Tensor& ids32, Stream stream);
#endif

}  // namespace moekit
