// DLPack interop: share moekit tensors with PyTorch, JAX, CuPy, ... without copying.
#pragma once

#include "moekit/core/tensor.h"

struct DLManagedTensor;

namespace moekit {

// Exports a view; the returned DLManagedTensor keeps the storage alive until its deleter runs.
// Dtypes without a DLPack code (packed fp4, ue8m0, ue4m3) are exported as uint8.
DLManagedTensor* to_dlpack(const Tensor& tensor);
// Imports (takes ownership of) a DLManagedTensor; its deleter runs when the last view goes away.
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace moekit
