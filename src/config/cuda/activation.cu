// The device path of apply_moe_activation.
#include "config/cuda/activation.h"
#include "core/cuda/cuda_check.cuh"
#include "experts/cuda/moe_activation.h"
#include "moekit/core/checks.h"

namespace moekit {

void apply_moe_activation_cuda(Activation activation, const ActivationParams& params,
                               Tensor& output, const Tensor& input, Stream stream) {
  MOEKIT_CHECK(stream.handle != nullptr, "activation on {} needs a CUDA stream",
               input.device().to_string());
  MOEKIT_CHECK(input.dtype() == output.dtype(), "activation input {} and output {} differ in dtype",
               input.describe(), output.describe());
  expect_contiguous(input, "activation input");
  expect_contiguous(output, "activation output");
  cuda::run_activation(activation, params, input.data(), output.data(), input.dtype(),
                       input.size(0), input.size(1), nullptr, nullptr, stream);
}

}  // namespace moekit
