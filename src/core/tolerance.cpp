#include "moekit/core/tolerance.h"

#include <array>

#include "moekit/core/error.h"

namespace moekit {
namespace {

// NOTE: bf16 keeps 8 mantissa bits (2^-9 relative rounding), f16 11 bits; a layer rounds at the
// GEMM1 output, the activation output and the GEMM2 output, so a few roundings are allowed.
// Quantized schemes: the error of their formats' rounding of weights, activations and the
// intermediate (an fp8 layer is ~6% from the bf16 one, see reference/perf_targets.md).
// "<scheme>_gpu": a GPU kernel against the CPU emulation of the same quantization: the inputs'
// codes are bit-exact and both round at the same points, but the fp32 sums run in another order,
// so an intermediate value within an fp32 rounding of an fp8 rounding boundary may requantize one
// fp8 step (~6%) apart; an int8 step is 1/127 of the row's or tensor's amax. MXFP4 weights with
// bf16 activations dequantize exactly to bf16, and so do NVFP4 weights (e2m1 x ue4m3 x 2^-8, the
// global scale applied in fp32): the GPU is held to the bf16 layer's tolerance. W4A8's int4 codes
// convert exactly to e4m3 and its activations quantize as fp8's do: the GPU is held to fp8's.
// MXFP4 weights with MXFP4 / MXFP6 activations on the GPU: both sides round the same values to
// the same coarse grid, but a value within an fp32 (or, with the fused activation, a bf16)
// rounding of an e2m1 boundary lands one step (up to a third of its size) apart; measured on the
// H200 (2026-12-03): bitwise at M <= 33, at most 1.2e-4 relative L2 at M = 257 .. 65537. MXFP6
// weights with MXFP6 activations on the GPU likewise ("mxfp6_gpu"; the fp6 steps are finer).
// "bf16_ep_gpu": the expert-parallel peer-memory experts against a single-rank GPU layer: each
// rank's partial output is rounded to bf16 before the ranks' partials are summed (one rounding
// more than the single layer makes).
constexpr std::array<Tolerance, 18> kTolerances = {{
    {"f32", 1e-5, 1e-5, 1e-4},
    {"f16", 3e-3, 2e-3, 2e-2},
    {"bf16", 1.6e-2, 1.6e-2, 8e-2},
    {"fp8_w8a8", 8e-2, 5e-2, 2.5e-1},
    {"fp8_w8a8_gpu", 2e-2, 3e-2, 1.5e-1},
    {"int8_w8a8", 4e-2, 3e-2, 2e-1},
    {"int8_w8a8_gpu", 1e-2, 2e-2, 1e-1},
    {"mxfp4", 2.5e-1, 2e-1, 1.0},
    {"mxfp4_w4a16_gpu", 1.6e-2, 1.6e-2, 8e-2},
    {"mxfp4_w4a4_gpu", 1.6e-2, 1.6e-2, 8e-2},
    {"nvfp4", 2.5e-1, 2e-1, 1.0},
    {"nvfp4_w4a16_gpu", 1.6e-2, 1.6e-2, 8e-2},
    {"mxfp6", 1e-1, 8e-2, 5e-1},
    {"mxfp6_gpu", 1.6e-2, 1.6e-2, 8e-2},
    {"w4a8", 2.5e-1, 2e-1, 1.0},
    {"w4a8_gpu", 2e-2, 3e-2, 1.5e-1},
    {"int4_w4a16", 2e-1, 2e-1, 1.0},
    {"bf16_ep_gpu", 8e-3, 1.6e-2, 8e-2},
}};

}  // namespace

const Tolerance& tolerance(std::string_view name) {
  for (const Tolerance& t : kTolerances) {
    if (t.name == name) return t;
  }
  throw Error(fmt::format("moekit: no tolerance named '{}'", name));
}

const Tolerance& tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return tolerance("f16");
    case DType::kBF16:
      return tolerance("bf16");
    default:
      return tolerance("f32");
  }
}

}  // namespace moekit
