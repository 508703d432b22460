// MoE activations: gated ones map [.., 2d] -> [.., d] (act(gate) * up, gate = first half, except
// swigluoai which interleaves gate/up); `_no_mul` ones are elementwise [.., d] -> [.., d].
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/core/device.h"
#include "moekit/core/tensor.h"

namespace moekit {

enum class Activation {
  kSilu,
  kGelu,
  kGeluTanh,
  kSwigluOai,   // gpt-oss: interleaved g = x[2i], u = x[2i+1]; (u + 1) * g * sigmoid(alpha * g)
  kSwigluStep,  // min(silu(g), L) * clamp(u, -L, L), L = 7
  kRelu2,       // relu(g)^2 * u
  kSiluNoMul,
  kGeluNoMul,
  kGeluTanhNoMul,
  kRelu2NoMul,  // relu(x)^2 (Nemotron-H)
};

// Every activation, for sweeps.
std::span<const Activation> all_activations();
bool is_gated(Activation activation);
std::string_view activation_name(
    Activation activation);  // "silu", "swigluoai", "relu2_no_mul", ...
// Accepts the names above and the alias "gelu_pytorch_tanh".
std::optional<Activation> parse_activation(std::string_view name);

// Parameters of the clamped / scaled variants (from quant_config.gemm1_* or moe_config.swiglu_*).
struct ActivationParams {
  std::optional<float> clamp_limit;  // silu: silu(min(g, L)) * clamp(u, +-L); swigluoai default 7
  float alpha = 1.702f;              // swigluoai sigmoid scale
  float beta = 1.0f;                 // swigluoai: (u + beta)
};

// Output width for a GEMM1 width N: N / 2 when gated, N otherwise.
int64_t activation_output_dim(Activation activation, int64_t n);

// One row on the CPU: `in` has 2d values (gated) or d values; `out` gets d values. fp32 math.
void apply_activation_row(Activation activation, const ActivationParams& params, const float* in,
                          float* out, int64_t d);

// Rows of a [rows, N] tensor into [rows, N or N/2] (CPU or CUDA; fp32 math, output rounded once).
void apply_moe_activation(Activation activation, const ActivationParams& params, Tensor& output,
                          const Tensor& input, Stream stream = {});

}  // namespace moekit
