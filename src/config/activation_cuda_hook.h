// Internal: the CUDA implementation of apply_moe_activation (src/config/activation_cuda_hook.cu).
#pragma once

#include "moekit/config/activation.h"

namespace moekit {
void apply_moe_activation_cuda(Activation activation, const ActivationParams& params,
                               Tensor& output, const Tensor& input, Stream stream);
}  // namespace moekit
