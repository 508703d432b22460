#include "moekit/config/activation.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "config/cuda/activation.h"
#include "core/cuda_seam.h"
#include "moekit/core/checks.h"
#include "moekit/core/error.h"

namespace moekit {
namespace {

constexpr std::array<Activation, 10> kAll = {
    Activation::kSilu,       Activation::kGelu,       Activation::kGeluTanh,
    Activation::kSwigluOai,  Activation::kSwigluStep, Activation::kRelu2,
    Activation::kSiluNoMul,  Activation::kGeluNoMul,  Activation::kGeluTanhNoMul,
    Activation::kRelu2NoMul,
};

inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float gelu_erf(float x) {
  return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
}
inline float gelu_tanh(float x) {
  const float k = 0.79788456080286536f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}
inline float relu2(float x) {
  const float r = std::max(x, 0.0f);
  return r * r;
}

}  // namespace

std::span<const Activation> all_activations() {
  return kAll;
}

bool is_gated(Activation a) {
  switch (a) {
    case Activation::kSiluNoMul:
    case Activation::kGeluNoMul:
    case Activation::kGeluTanhNoMul:
    case Activation::kRelu2NoMul:
      return false;
    default:
      return true;
  }
}

std::string_view activation_name(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSwigluOai:
      return "swigluoai";
    case Activation::kSwigluStep:
      return "swiglustep";
    case Activation::kRelu2:
      return "relu2";
    case Activation::kSiluNoMul:
      return "silu_no_mul";
    case Activation::kGeluNoMul:
      return "gelu_no_mul";
    case Activation::kGeluTanhNoMul:
      return "gelu_tanh_no_mul";
    case Activation::kRelu2NoMul:
      return "relu2_no_mul";
  }
  return "?";
}

std::optional<Activation> parse_activation(std::string_view name) {
  if (name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (name == "swiglu") return Activation::kSilu;
  for (Activation a : kAll) {
    if (activation_name(a) == name) return a;
  }
  return std::nullopt;
}

int64_t activation_output_dim(Activation activation, int64_t n) {
  return is_gated(activation) ? n / 2 : n;
}

void apply_activation_row(Activation activation, const ActivationParams& params, const float* in,
                          float* out, int64_t d) {
  const float* gate = in;
  const float* up = in + d;
  switch (activation) {
    case Activation::kSilu:
      if (params.clamp_limit) {
        const float limit = *params.clamp_limit;
        for (int64_t i = 0; i < d; ++i) {
          out[i] = silu(std::min(gate[i], limit)) * std::clamp(up[i], -limit, limit);
        }
      } else {
        for (int64_t i = 0; i < d; ++i)
          out[i] = silu(gate[i]) * up[i];
      }
      return;
    case Activation::kGelu:
      for (int64_t i = 0; i < d; ++i)
        out[i] = gelu_erf(gate[i]) * up[i];
      return;
    case Activation::kGeluTanh:
      for (int64_t i = 0; i < d; ++i)
        out[i] = gelu_tanh(gate[i]) * up[i];
      return;
    case Activation::kSwigluOai: {
      const float limit = params.clamp_limit.value_or(7.0f);
      for (int64_t i = 0; i < d; ++i) {
        const float g = std::min(in[2 * i], limit);
        const float u = std::clamp(in[2 * i + 1], -limit, limit);
        out[i] = (u + params.beta) * g * sigmoid(params.alpha * g);
      }
      return;
    }
    case Activation::kSwigluStep: {
      const float limit = params.clamp_limit.value_or(7.0f);
      for (int64_t i = 0; i < d; ++i) {
        out[i] = std::min(silu(gate[i]), limit) * std::clamp(up[i], -limit, limit);
      }
      return;
    }
    case Activation::kRelu2:
      for (int64_t i = 0; i < d; ++i)
        out[i] = relu2(gate[i]) * up[i];
      return;
    case Activation::kSiluNoMul:
      for (int64_t i = 0; i < d; ++i)
        out[i] = silu(in[i]);
      return;
    case Activation::kGeluNoMul:
      for (int64_t i = 0; i < d; ++i)
        out[i] = gelu_erf(in[i]);
      return;
    case Activation::kGeluTanhNoMul:
      for (int64_t i = 0; i < d; ++i)
        out[i] = gelu_tanh(in[i]);
      return;
    case Activation::kRelu2NoMul:
      for (int64_t i = 0; i < d; ++i)
        out[i] = relu2(in[i]);
      return;
  }
}

void apply_moe_activation(Activation activation, const ActivationParams& params, Tensor& output,
                          const Tensor& input, Stream stream) {
  expect_dim(input, "activation input", 2);
  expect_dim(output, "activation output", 2);
  const int64_t rows = input.size(0);
  const int64_t n = input.size(1);
  const int64_t d = activation_output_dim(activation, n);
  MOEKIT_CHECK(!is_gated(activation) || n % 2 == 0,
               "activation input width {} must be even for the gated activation {}", n,
               activation_name(activation));
  expect_shape(output, "activation output", {rows, d});
  MOEKIT_CHECK(input.device() == output.device(), "activation input on {} but output on {}",
               input.device().to_string(), output.device().to_string());
  if (input.device().is_cuda()) {
    if constexpr (kCudaBuild) {
      apply_moe_activation_cuda(activation, params, output, input, stream);
      return;
    } else {
      throw_no_cuda("the activation on " + input.device().to_string());
    }
  }
  expect_contiguous(input, "activation input");
  expect_contiguous(output, "activation output");
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> in(static_cast<size_t>(n));
    std::vector<float> out(static_cast<size_t>(d));
    for (int64_t i = 0; i < n; ++i)
      in[i] = load_float(input.data(), input.dtype(), r * n + i);
    apply_activation_row(activation, params, in.data(), out.data(), d);
    for (int64_t i = 0; i < d; ++i)
      store_float(output.data(), output.dtype(), r * d + i, out[i]);
  }
}

}  // namespace moekit
