// Device entry point of apply_moe_activation (config/cuda/activation.cu).
#pragma once

#include "moekit/config/activation.h"

namespace moekit {
void apply_moe_activation_cuda(Activation activation, const ActivationParams& params,
                               Tensor& output, const Tensor& input, Stream stream);
}  // namespace moekit
