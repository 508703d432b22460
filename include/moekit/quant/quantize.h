// Quantize and dequantize fp32 row-major matrices [rows, cols] (activations [M, K], weights
// [N, K]) under a QuantScheme: fp8 / int8 with fp32 scales per tensor, row, row group or 2-D
// block; OCP MX (e8m0 scales, blocks of 32 along K); NVFP4 (ue4m3 scales, blocks of 16 along K,
// plus an fp32 global scale); int8 / int4 weight-only groups with optional zero points.
// Host-side reference code, bit-exact and deterministic.
//
// Scale conventions, with x an input value, q the decoded code, s the block's effective scale
// (QuantizedTensor::scale_value), amax the block's max |x|, qmax the element format's largest
// value (fp8 e4m3 448, e5m2 57344, fp4 6, fp6 e3m2 28, fp6 e2m3 7.5, int8 127, int4 7; asymmetric
// uint8 255, uint4 15):
//   fp32, symmetric     x ~= q * s            s = max(amax, kAmaxFloor) / qmax; q = enc(x / s)
//   fp32, asymmetric    x ~= (q - zp) * s     lo = min(min x, 0), hi = max(max x, 0),
//                                             s = max(hi - lo, kAmaxFloor) / qmax,
//                                             zp = clamp(rne(-lo / s), 0, qmax),
//                                             q = clamp(rne(x / s) + zp, 0, qmax)
//   e8m0 (MX)           x ~= q * 2^e          kFloor (OCP MX): e = floor(log2 amax) - emax_elem,
//                                             emax_elem = 2 (fp4), 4 (fp6 e3m2), 2 (fp6 e2m3),
//                                             8 (fp8 e4m3), 15 (fp8 e5m2); values above qmax * 2^e
//                                             saturate. kCeil: the smallest e with
//                                             qmax * 2^e >= amax (nothing saturates).
//                                             e is clamped to [-127, 127]; an all-zero block gets
//                                             e = -127 (code 0). q = enc(x * 2^-e), exact scaling.
//   ue4m3 + fp32 global x ~= q * sf / g       NVFP4. g = 448 * qmax / max(amax_tensor, kAmaxFloor)
//                                             (= 2688 / amax_tensor for fp4) unless given;
//                                             sf = ue4m3(amax_block / qmax * g) (RNE, <= 448);
//                                             q = enc(x * (g / sf)), and q = 0 when sf == 0;
//                                             dequantized as (q * sf) / g.
// Element encoders round to nearest even and saturate (formats.h); int8 codes are two's
// complement bytes; symmetric int4 codes are stored as uint4b8 (q + 8, q in [-8, 7]).
//
// NOTE: static vs dynamic is a property of the call, not of the scheme: quantize() derives every
// scale from the data (dynamic activations, or quantizing weights offline); quantize_with_scales()
// takes given fp32 scales (static activation scales; for NVFP4 the global scale).
// NOTE: inputs are expected to be finite. NaN is ignored by amax and encodes as the element's NaN
// (fp8), +max (fp4, fp6) or 0 (int).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "moekit/config/quant_key.h"
#include "moekit/quant/formats.h"

namespace moekit::quant {

// Dynamic fp32 scales and NVFP4 global scales use max(amax, kAmaxFloor), so all-zero or tiny
// blocks get finite, non-zero scales (and their codes are exact zeros).
inline constexpr float kAmaxFloor = 1e-10f;

// The block of elements one scale serves, in terms of the matrix being quantized: (rows, cols)
// of the row-major [rows, cols] data; -1 = the whole extent.
// NOTE: a weight stored [N, K] has its per-output-channel scales as per_row() here, whereas
// QuantKey's GroupShape::per_channel() (-1, 1) names the same thing from the GEMM output's side.
struct BlockShape {
  int64_t rows = -1;
  int64_t cols = -1;

  static constexpr BlockShape per_tensor() { return {-1, -1}; }
  static constexpr BlockShape per_row() { return {1, -1}; }  // per token / per output channel
  static constexpr BlockShape row_groups(int64_t group) { return {1, group}; }  // (1, g) along K
  static constexpr BlockShape blocks(int64_t r, int64_t c) { return {r, c}; }
  bool operator==(const BlockShape&) const = default;
};

// A quantization scheme as data. Build one with the named factories.
struct QuantScheme {
  QuantDType dtype = QuantDType::kFp8E4M3;    // element codes (kNone is not a scheme)
  ScaleDType scale_dtype = ScaleDType::kF32;  // kF32, kUE8M0 or kUE4M3 (kActivation: not here)
  BlockShape block = BlockShape::per_tensor();
  bool symmetric = true;  // false: int8 / int4 codes with a zero point per block
  E8M0Rounding e8m0_rounding = E8M0Rounding::kFloor;  // kUE8M0 scales only

  bool operator==(const QuantScheme&) const = default;
  // e.g. "fp8_e4m3 f32 block(1,128) sym"
  std::string to_string() const;

  // fp8 e4m3 with fp32 scales.
  static QuantScheme fp8_per_tensor();
  static QuantScheme fp8_per_token();    // [M, K] activations: one scale per row
  static QuantScheme fp8_per_channel();  // [N, K] weights: one scale per output row
  static QuantScheme fp8_per_token_group(int64_t group = 128);  // DeepSeek activations, (1, 128)
  // DeepSeek weights, 128x128 blocks. scale_dtype kUE8M0 rounds scales up to a power of two
  // (kCeil), as DeepGEMM's UE8M0 scales do.
  static QuantScheme fp8_block(int64_t block_rows = 128, int64_t block_cols = 128,
                               ScaleDType scale_dtype = ScaleDType::kF32);
  // OCP MX: groups of 32 along K with e8m0 scales. dtype: kFp4E2M1, kFp6E3M2, kFp6E2M3,
  // kFp8E4M3 or kFp8E5M2.
  static QuantScheme mx(QuantDType dtype, E8M0Rounding rounding = E8M0Rounding::kFloor);
  static QuantScheme mxfp4() { return mx(QuantDType::kFp4E2M1); }
  static QuantScheme mxfp6_e3m2() { return mx(QuantDType::kFp6E3M2); }
  static QuantScheme mxfp6_e2m3() { return mx(QuantDType::kFp6E2M3); }
  static QuantScheme mxfp8() { return mx(QuantDType::kFp8E4M3); }
  // NVFP4: fp4 e2m1, groups of 16 along K, ue4m3 block scales, fp32 global scale.
  static QuantScheme nvfp4();
  // int8 with fp32 scales (W8A8); symmetric = false gives uint8 codes with zero points.
  static QuantScheme int8_per_tensor(bool symmetric = true);
  static QuantScheme int8_per_token(bool symmetric = true);
  static QuantScheme int8_per_channel();
  // Weight-only int8 / int4 (dtype kInt8 or kInt4) in groups of `group` along K; group = -1 is
  // per channel. symmetric = false stores uint codes with one zero point per group.
  static QuantScheme int_weight_groups(QuantDType dtype, int64_t group, bool symmetric = true);
};

// "" when quantize() supports the scheme, else why not.
std::string unsupported_reason(const QuantScheme& scheme);

// Largest code magnitude of the scheme's elements (qmax above): 448, 57344, 6, 28, 7.5, 127, 7,
// 255 / 15 (asymmetric).
float element_qmax(const QuantScheme& scheme);

// Bytes per row of codes: cols (8-bit), ceil(cols / 2) (fp4, int4), 3 * ceil(cols / 4) (fp6).
int64_t code_row_bytes(QuantDType dtype, int64_t cols);

// A quantized matrix. Codes of each row start on a byte boundary.
struct QuantizedTensor {
  QuantScheme scheme;
  int64_t rows = 0;
  int64_t cols = 0;
  // [rows, code_row_bytes(cols)]:
  //   fp8 / int8 / uint8: one code per byte (int8 as two's complement)
  //   fp4 e2m1 / int4:    two per byte, element 2j in the LOW nibble of byte j
  //   fp6:                four per 3 bytes, element 4j+i at bits [6i, 6i+6) of the
  //                       little-endian 24-bit word of bytes 3j..3j+2
  std::vector<uint8_t> codes;
  // Scale grid: scale_rows = ceil(rows / block.rows), scale_cols = ceil(cols / block.cols), with
  // an extent of -1 counting as one block (so per-tensor is [1, 1], per-row [rows, 1],
  // (1, 128) groups [rows, ceil(cols / 128)], 128x128 blocks [ceil(rows/128), ceil(cols/128)]).
  int64_t scale_rows = 0;
  int64_t scale_cols = 0;
  std::vector<float> scales;         // [scale_rows, scale_cols] fp32 (kF32 schemes; else empty)
  std::vector<uint8_t> scale_codes;  // [scale_rows, scale_cols] e8m0 / ue4m3 (else empty)
  std::vector<uint8_t> zero_points;  // [scale_rows, scale_cols] uint8 / uint4 values (asym only)
  float global_scale = 1.0f;         // NVFP4 (kUE4M3) only: x ~= q * sf / global_scale

  // The effective scale of block (i, j): fp32 scale, 2^e, or ue4m3 / global_scale.
  float scale_value(int64_t i, int64_t j) const;
  // The code of element (r, c), unpacked (fp4 / int4: 4 bits, fp6: 6 bits).
  uint8_t code_at(int64_t r, int64_t c) const;
};

// data: [rows, cols] fp32 row-major. Every scale is derived from the data.
QuantizedTensor quantize(std::span<const float> data, int64_t rows, int64_t cols,
                         const QuantScheme& scheme);

// As quantize(), with given scales. kF32 symmetric schemes: `scales` is [scale_rows, scale_cols]
// fp32 (one value per tensor for per-tensor static). NVFP4: `scales` is the one fp32 global scale
// g (block scales are still derived from the data). MX and asymmetric schemes take no scales.
QuantizedTensor quantize_with_scales(std::span<const float> data, int64_t rows, int64_t cols,
                                     const QuantScheme& scheme, std::span<const float> scales);

// out: [rows, cols] fp32.
void dequantize(const QuantizedTensor& q, std::span<float> out);
std::vector<float> dequantize(const QuantizedTensor& q);

}  // namespace moekit::quant
