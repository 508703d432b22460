// Named QuantConfig factories, one per scheme of the original's FusedMoEQuantConfig constructors,
// plus quant_keys_of(): the (weight key, activation key) pair the oracles select with.
//
// Each factory takes the layer's dimensions (MoEWeightShape) and a small struct of tensors whose
// shapes are commented on every member, validates every tensor (shape, dtype, CPU or CUDA device
// alike) and throws moekit::Error naming the tensor, the value and the requirement.
//
// Notation: E = local experts, H = hidden size (K of GEMM1), I = intermediate size per partition,
// N1 = 2*I for gated activations (w13 = [gate; up]) or I for `_no_mul` ones.
//
// Weight codes are not part of a QuantConfig: they are the w1 / w2 tensors passed to
// FusedMoEKernel::apply (the experts read them with the scales kept here):
//   fp8:          w1 (E, N1, H) kFp8E4M3,          w2 (E, H, I)
//   int8:         w1 (E, N1, H) kInt8 (uint8 with zero points), w2 (E, H, I)
//   int4:         w1 (E, N1, ceil(H/2)) kUInt8, two codes per byte, element 2j in the LOW nibble;
//                 symmetric codes are uint4b8 (q + 8), asymmetric ones uint4 with zero points
//   mxfp4, nvfp4: w1 (E, N1, ceil(H/2)) kFp4E2M1x2 or kUInt8 (low nibble first)
//   mxfp6:        w1 (E, N1, 3*ceil(H/4)) kUInt8 (four codes in three bytes, quant/formats.h)
// (The CPU emulation experts also accept sub-byte codes unpacked, one code per byte: last dim H.)
//
// What the descriptors hold (QuantDesc fields; "static" activation scale = QuantDesc::scale set):
//   weights:  dtype, shape (per_tensor, per_channel, {128,128} blocks, {1,g} groups along K),
//             scale, alpha_or_gscale (NVFP4 g-alphas), zp (weight-only zero points), bias.
//   a1 / a2:  dtype, shape (per_tensor, per_token, {1,g}); scale (1,) f32 for static per-tensor
//             fp8/int8; alpha_or_gscale: NVFP4 activation global scale (1,) or (E,).
// NVFP4 conventions (as the original's): g1_alphas[e] = input_scale * weight_scale_2[e] (the
// GEMM1 epilogue factor), a1_gscale = 1 / input_scale; the weight's own global dequantization
// scale is weight_scale_2 = g1_alphas * a1_gscale. Weight-only NVFP4 (w4a16) stores
// weight_scale_2 itself as g1_alphas.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "moekit/config/moe_config.h"
#include "moekit/config/quant_config.h"
#include "moekit/config/quant_key.h"
#include "moekit/core/tensor.h"

namespace moekit {

// The dimensions every factory validates against.
struct MoEWeightShape {
  int64_t num_experts = 0;   // E (local experts)
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I (per partition)
  bool gated = true;         // N1 = 2*I when gated, else I

  int64_t n1() const { return gated ? 2 * intermediate : intermediate; }
  // E = num_local_experts, H = hidden_dim, I = intermediate_size_per_partition, gated from the
  // activation.
  static MoEWeightShape from(const MoEConfig& moe);
};

// Expert biases, optional: bf16/f16/f32, on any device.
struct ExpertBiases {
  Tensor w1_bias;  // (E, N1)
  Tensor w2_bias;  // (E, H)
};

// gemm1 swiglu parameters (gpt-oss: alpha 1.702, beta 1.0, limit 7.0); nullopt = unset.
struct SwigluParams {
  std::optional<float> alpha;
  std::optional<float> beta;
  std::optional<float> limit;
};

// ---- fp8 (e4m3) weights
// ---------------------------------------------------------------------------

struct Fp8W8A8Params {
  // Weight scales, f32. Per tensor: (E,) (or (E, 1), (E, 1, 1)). Per output channel
  // (per_out_ch_quant): w1 (E, N1) (or (E, N1, 1)), w2 (E, H). Blocks (block_shape = {bn, bk}):
  // w1 (E, ceil(N1/bn), ceil(H/bk)), w2 (E, ceil(H/bn), ceil(I/bk)), f32 or kUE8M0.
  Tensor w1_scale;
  Tensor w2_scale;
  // Static per-tensor activation scales, f32: (1,) or (E,) (reduced to their maximum, as the
  // whole input is quantized before dispatch). Undefined = dynamic scales.
  Tensor a1_scale;
  Tensor a2_scale;
  bool per_act_token_quant = false;  // dynamic per-token activation scales
  bool per_out_ch_quant = false;     // per-output-channel weight scales
  // {block_n, block_k} (DeepSeek {128, 128}): block weight scales, dynamic (1, block_k) activation
  // groups. Excludes per_act_token_quant and per_out_ch_quant.
  std::optional<std::pair<int64_t, int64_t>> block_shape;
  ExpertBiases bias;
  SwigluParams swiglu;
};
// fp8 W8A8: keys (kFp8StaticTensorSym | kFp8StaticChannelSym | kFp8Static128BlockSym
// [E8M0], kFp8StaticTensorSym | kFp8DynamicTensorSym | kFp8DynamicTokenSym | kFp8Dynamic128Sym).
QuantConfig fp8_w8a8_moe_quant_config(const MoEWeightShape& shape, const Fp8W8A8Params& p);
// fp8 weights, unquantized (bf16/f16) activations (Marlin / CPU): a1_scale, a2_scale and
// per_act_token_quant must be unset. Keys (fp8 weight key, None).
QuantConfig fp8_w8a16_moe_quant_config(const MoEWeightShape& shape, const Fp8W8A8Params& p);

// ---- int8 W8A8 ---------------------------------------------------------------------------------

struct Int8W8A8Params {
  // f32 weight scales: per output channel (per_out_ch_quant) w1 (E, N1), w2 (E, H); else per tensor
  // (E,).
  Tensor w1_scale;
  Tensor w2_scale;
  // Static per-tensor activation scales (1,) or (E,) f32 (maximum taken); undefined = dynamic.
  Tensor a1_scale;
  Tensor a2_scale;
  bool per_act_token_quant = false;  // dynamic per-token (a1_scale must be unset)
  bool per_out_ch_quant = true;
  ExpertBiases bias;
  SwigluParams swiglu;
};
// int8 W8A8 (no blocks): keys (kInt8StaticChannelSym | kInt8StaticTensorSym,
// kInt8DynamicTokenSym | kInt8DynamicTensorSym | kInt8StaticTensorSym).
QuantConfig int8_w8a8_moe_quant_config(const MoEWeightShape& shape, const Int8W8A8Params& p);

// ---- int4 / int8 weight-only (GPTQ / AWQ style)
// ---------------------------------------------------

struct IntWna16Params {
  int weight_bits = 4;       // 4 or 8
  int64_t group_size = 128;  // along K; -1 = one group per output channel
  // Group scales in the activation dtype (bf16 / f16 / f32): w1 (E, N1, G1), w2 (E, H, G2),
  // G1 = ceil(H / group), G2 = ceil(I / group) (1 when group_size = -1).
  Tensor w1_scale;
  Tensor w2_scale;
  // Optional zero points (asymmetric weights), one per group, uint8 (one value per byte, in
  // [0, 15] for int4): same shapes as the scales. Both or neither.
  Tensor w1_zp;
  Tensor w2_zp;
  ExpertBiases bias;
  SwigluParams swiglu;
};
// Weight-only integer weights: keys (kInt4Static | kInt4StaticAsym | kInt4Static32 |
// kInt4Static32Asym | kInt8Static (+ asymmetric int8), None). Group 32 gives the "32" keys.
QuantConfig int_wna16_moe_quant_config(const MoEWeightShape& shape, const IntWna16Params& p);
// The original's names for the same factory (weight_bits forced to 4 / 8).
QuantConfig int4_w4a16_moe_quant_config(const MoEWeightShape& shape, IntWna16Params p);
QuantConfig int8_w8a16_moe_quant_config(const MoEWeightShape& shape, IntWna16Params p);
// GPTQ-Marlin: weight_bits 4 or 8 and group_size given explicitly.
QuantConfig gptq_marlin_moe_quant_config(const MoEWeightShape& shape, int weight_bits,
                                         int64_t group_size, IntWna16Params p);

// ---- OCP MX (mxfp4 / mxfp6 weights)
// ---------------------------------------------------------------

// Element types of OCP MX configs.
enum class OcpMxDType {
  kNone,       // unquantized activations (weight-only)
  kFp8,        // fp8 e4m3 per tensor: static (a1_scale) or dynamic
  kMxfp4,      // fp4 e2m1, e8m0 scale per 32
  kMxfp6E3M2,  // fp6 e3m2, e8m0 scale per 32
  kMxfp6E2M3,  // fp6 e2m3, e8m0 scale per 32
  kMxfp8,      // fp8 e4m3, e8m0 scale per 32
};
std::string_view ocp_mx_dtype_name(OcpMxDType dtype);  // "none", "fp8", "mxfp4", ...

struct MxParams {
  // e8m0 scales (kUE8M0 or kUInt8 codes), one per 32 weights along K: w1 (E, N1, ceil(H/32)),
  // w2 (E, H, ceil(I/32)).
  Tensor w1_scale;
  Tensor w2_scale;
  // fp8 activations only: static per-tensor scales (1,) or (E,) f32 (maximum taken); undefined =
  // dynamic per-tensor fp8.
  Tensor a1_scale;
  Tensor a2_scale;
  ExpertBiases bias;  // f32 in gpt-oss checkpoints
  SwigluParams swiglu;
};
// mxfp4 weights, bf16 activations (gpt-oss): keys (kMxfp4Static, None).
QuantConfig mxfp4_w4a16_moe_quant_config(const MoEWeightShape& shape, const MxParams& p);
// mxfp4 weights, static fp8 per-tensor activations: a1_scale and a2_scale are required.
// Keys (kMxfp4Static, kFp8StaticTensorSym).
QuantConfig mxfp4_w4a8_moe_quant_config(const MoEWeightShape& shape, const MxParams& p);
// mxfp4 weights, dynamic mxfp8 activations: keys (kMxfp4Static, kMxfp8Dynamic).
QuantConfig mxfp4_mxfp8_moe_quant_config(const MoEWeightShape& shape, const MxParams& p);
// mxfp4 weights, dynamic mxfp4 activations (W4A4): keys (kMxfp4Static, kMxfp4Dynamic).
QuantConfig mxfp4_moe_quant_config(const MoEWeightShape& shape, const MxParams& p);
// Any OCP MX pair: weight_dtype in {kMxfp4, kMxfp6E3M2, kMxfp6E2M3}; activation_dtype in
// {kNone, kFp8, kMxfp4, kMxfp6E3M2, kMxfp6E2M3, kMxfp8}.
QuantConfig ocp_mx_moe_quant_config(const MoEWeightShape& shape, OcpMxDType activation_dtype,
                                    OcpMxDType weight_dtype, const MxParams& p);

// ---- NVFP4 -------------------------------------------------------------------------------------

struct Nvfp4Params {
  // ue4m3 block scales (kUE4M3 or kUInt8 codes), one per 16 weights along K:
  // w1 (E, N1, ceil(H/16)), w2 (E, H, ceil(I/16)).
  Tensor w1_scale;
  Tensor w2_scale;
  // (E,) f32 GEMM epilogue factors: input_scale * weight_scale_2 (w4a4), or weight_scale_2 itself
  // (w4a16).
  Tensor g1_alphas;
  Tensor g2_alphas;
  // Activation global scales 1 / input_scale, f32: (1,) or (E,) per expert. W4A4 only.
  Tensor a1_gscale;
  Tensor a2_gscale;
  ExpertBiases bias;
  SwigluParams swiglu;
};
// NVFP4 W4A4: keys (kNvfp4Static, kNvfp4Dynamic).
QuantConfig nvfp4_moe_quant_config(const MoEWeightShape& shape, const Nvfp4Params& p);
// NVFP4 weights, bf16 activations: a1_gscale / a2_gscale must be unset. Keys (kNvfp4Static, None).
QuantConfig nvfp4_w4a16_moe_quant_config(const MoEWeightShape& shape, const Nvfp4Params& p);

// ---- W4A8: int4 weights, fp8 activations
// ----------------------------------------------------------

struct W4A8Fp8Params {
  // f32 int4 weight scales: per output channel w1 (E, N1), w2 (E, H); or (group_size = 128)
  // w1 (E, N1, ceil(H/128)), w2 (E, H, ceil(I/128)).
  Tensor w1_scale;
  Tensor w2_scale;
  int64_t group_size = -1;  // -1 (per channel) or 128
  // Static per-tensor fp8 activation scales (1,) or (E,) f32 (maximum taken); undefined =
  // dynamic per-token fp8.
  Tensor a1_scale;
  Tensor a2_scale;
  ExpertBiases bias;
  SwigluParams swiglu;
};
// keys (kInt4W4A8StaticChannelSym | kInt4W4A8StaticGroup128Sym,
// kFp8DynamicTokenSym | kFp8StaticTensorSym).
QuantConfig int4_w4afp8_moe_quant_config(const MoEWeightShape& shape, const W4A8Fp8Params& p);

// ---- keys ------------------------------------------------------------------------------------

// (weight key, activation key) of a QuantConfig, as the experts' capability records list them.
// nullopt = an unquantized operand. Derived from w1 and a1 (w2 / a2 follow them in every factory):
//   fp8 weights: per_tensor / per_channel / {128,128} (kUE8M0 scales: the E8M0 key) / {1,32} MXFP8;
//   int8 weights: kInt8StaticTensorSym / kInt8StaticChannelSym with int8 activations, kInt8Static
//     weight-only (asymmetric when zero points are set);
//   int4 weights: kInt4W4A8* with fp8 activations, else kInt4Static(32)(Asym);
//   fp4 weights: {1,32} kMxfp4Static, {1,16} kNvfp4Static; fp6: kMxfp6*Static.
//   activations: fp8 static/dynamic per tensor, dynamic per token, (1,128) / (1,64) groups, (1,32)
//     MXFP8; int8 static/dynamic per tensor, dynamic per token; mxfp4 / nvfp4 / mxfp6 dynamic.
std::pair<std::optional<QuantKey>, std::optional<QuantKey>> quant_keys_of(
    const QuantConfig& config);

// The weight-only asymmetric int8 key (uint8 codes with zero points and activation-dtype group
// scales), which the standard catalog does not name.
const QuantKey& int8_static_asym_key();

}  // namespace moekit
