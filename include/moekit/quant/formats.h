// Number formats of quantized MoE tensors: float <-> code conversions, scalar and bulk, and the
// packing of sub-byte codes.
//
// Every encoder rounds to nearest, ties to even (RNE), on the format's own grid (subnormals
// included). Every code of every format decodes to its exact value, and encoding that value gives
// the code back (NaN codes stay NaN). Negative zero keeps its sign bit where the format has one
// (fp8 0x80, fp4 0x8, fp6 0x20); int8 has a single zero.
//
// | format   | fields, bias       | max finite | inf         | NaN codes         | NaN encodes to |
// |----------|--------------------|------------|-------------|-------------------|----------------|
// | e4m3fn   | s eeee mmm, 7      | 448        | none        | 0x7f, 0xff        | sign | 0x7f    |
// | e5m2     | s eeeee mm, 15     | 57344      | 0x7c, 0xfc  | exp 31, mant != 0 | sign | 0x7e    |
// | int8     | two's complement   | 127        | -           | -                 | 0              |
// | fp4 e2m1 | s ee m, 1          | 6          | none        | none              | +6 (0x7)       |
// | fp6 e3m2 | s eee mm, 3        | 28         | none        | none              | +28 (0x1f)     |
// | fp6 e2m3 | s ee mmm, 1        | 7.5        | none        | none              | +7.5 (0x1f)    |
// | e8m0     | eeeeeeee: 2^(c-127)| 2^127      | none        | 0xff              | 0xff           |
// | ue4m3    | 0 eeee mmm, 7      | 448        | none        | 0x7f (>= 0x80 bad)| 0x7f           |
//
// Overflow (finite values whose rounded magnitude exceeds max, and infinities):
//   - fp8 e4m3 / e5m2 follow `Overflow`: kSaturate clamps to ±max (±inf too);
//     kIeee rounds as if the exponent range were unbounded, then gives NaN (e4m3fn, which has no
//     inf) or ±inf (e5m2). So e4m3 kIeee: |x| <= 464 -> 448, |x| > 464 -> NaN; e5m2 kIeee:
//     |x| < 61440 -> 57344, |x| >= 61440 -> inf (ties go to the even code, here inf).
//   - fp4, fp6, ue4m3 and int8 always saturate (they have no inf); `Overflow` does not apply.
//   - ue4m3 is unsigned: zero, negative values and -inf encode to 0. Codes >= 0x80 are not ue4m3
//     and decode to NaN.
//   - e8m0 encodes a positive scale by rounding its exponent down (floor) or up (ceil), clamped to
//     [2^-127, 2^127]; 0 -> code 0 (2^-127), +inf -> 254 (2^127), negative or NaN -> 255 (NaN).
//
// Packing (codes of sub-byte formats, one code per byte unpacked):
//   - 4-bit (fp4 e2m1, int4): element 2i in the LOW nibble of byte i, element 2i+1 in the high
//     nibble; an odd tail leaves the last high nibble 0. Packed size ceil(n / 2).
//   - 6-bit (fp6): four codes in three bytes; code i of a group occupies bits [6i, 6i + 6) of the
//     little-endian 24-bit word b0 | b1 << 8 | b2 << 16. A short tail is padded with zero codes.
//     Packed size 3 * ceil(n / 4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace moekit::quant {

// The code formats this file converts.
enum class Format : uint8_t {
  kFp8E4M3,  // float8_e4m3fn
  kFp8E5M2,  // float8_e5m2
  kInt8,     // int8, stored as its two's complement byte
  kFp4E2M1,  // OCP MX fp4, 4-bit code in the low bits of a byte
  kFp6E3M2,  // OCP MX fp6, 6-bit code in the low bits of a byte
  kFp6E2M3,  // OCP MX fp6, 6-bit code in the low bits of a byte
  kE8M0,     // OCP MX shared scale (UE8M0)
  kUE4M3,    // unsigned e4m3: the NVFP4 block scale
};

// How fp8 encoders treat values beyond the largest finite value (see the table above).
enum class Overflow : uint8_t {
  kSaturate,  // clamp to ±max; ±inf -> ±max; NaN stays NaN
  kIeee,      // round with an unbounded exponent, then NaN (e4m3fn) or ±inf (e5m2)
};

// How e8m0 turns a positive float into a power of two.
enum class E8M0Rounding : uint8_t {
  kFloor,  // 2^floor(log2 x): the largest power of two <= x
  kCeil,   // 2^ceil(log2 x): the smallest power of two >= x
};

// Static description of a format. For int8 the exponent fields are 0.
struct FormatInfo {
  std::string_view name;
  int bits;           // code width
  int exponent_bits;  // 0 for int8
  int mantissa_bits;  // explicit fraction bits (int8: 0)
  int bias;           // exponent bias (e8m0: 127)
  int emax;           // exponent of the largest finite value, e.g. 8 for e4m3 (448 = 1.75 * 2^8)
  float max_finite;   // largest finite value
  bool is_signed;     // has a sign bit (int8: two's complement)
  bool has_inf;
  bool has_nan;
};

const FormatInfo& format_info(Format format);
std::string_view format_name(Format format);

// ---- fp8 e4m3fn ---------------------------------------------------------------------------------
float decode_e4m3(uint8_t code);
uint8_t encode_e4m3(float value, Overflow overflow = Overflow::kSaturate);

// ---- fp8 e5m2 -----------------------------------------------------------------------------------
float decode_e5m2(uint8_t code);
uint8_t encode_e5m2(float value, Overflow overflow = Overflow::kSaturate);

// ---- int8 ---------------------------------------------------------------------------------------
inline float decode_int8(int8_t code) {
  return static_cast<float>(code);
}
// RNE, saturating to [-128, 127]; NaN -> 0.
int8_t encode_int8(float value);

// ---- fp4 e2m1 (4-bit code, high bits of the byte ignored on decode)
// ------------------------------
float decode_fp4_e2m1(uint8_t code);
uint8_t encode_fp4_e2m1(float value);

// ---- fp6 e3m2 / e2m3 (6-bit code, high bits of the byte ignored on decode)
// -----------------------
float decode_fp6_e3m2(uint8_t code);
uint8_t encode_fp6_e3m2(float value);
float decode_fp6_e2m3(uint8_t code);
uint8_t encode_fp6_e2m3(float value);

// ---- e8m0 (UE8M0) -------------------------------------------------------------------------------
// 2^(code - 127) as a float (code 0 is the fp32 subnormal 2^-127); 255 -> NaN.
float decode_e8m0(uint8_t code);
// The unbiased exponent code - 127 (code 255 -> 128, meaning NaN).
inline int e8m0_exponent(uint8_t code) {
  return static_cast<int>(code) - 127;
}
uint8_t encode_e8m0(float value, E8M0Rounding rounding);
inline uint8_t encode_e8m0_floor(float value) {
  return encode_e8m0(value, E8M0Rounding::kFloor);
}
inline uint8_t encode_e8m0_ceil(float value) {
  return encode_e8m0(value, E8M0Rounding::kCeil);
}

// ---- ue4m3 (NVFP4 block scale)
// -------------------------------------------------------------------
float decode_ue4m3(uint8_t code);
uint8_t encode_ue4m3(float value);

// ---- any format ---------------------------------------------------------------------------------
// Dispatch on `format`. The int8 code is the two's complement byte. e8m0 encodes with kFloor.
// `overflow` only affects the fp8 formats.
float decode(Format format, uint8_t code);
uint8_t encode(Format format, float value, Overflow overflow = Overflow::kSaturate);

// Bulk conversions, one code per byte; sizes must match (throws moekit::Error otherwise).
void encode(Format format, std::span<const float> values, std::span<uint8_t> codes,
            Overflow overflow = Overflow::kSaturate);
void decode(Format format, std::span<const uint8_t> codes, std::span<float> values);

// Named bulk forms of the above.
void encode_e4m3(std::span<const float> values, std::span<uint8_t> codes,
                 Overflow overflow = Overflow::kSaturate);
void decode_e4m3(std::span<const uint8_t> codes, std::span<float> values);
void encode_e5m2(std::span<const float> values, std::span<uint8_t> codes,
                 Overflow overflow = Overflow::kSaturate);
void decode_e5m2(std::span<const uint8_t> codes, std::span<float> values);
void encode_int8(std::span<const float> values, std::span<int8_t> codes);
void decode_int8(std::span<const int8_t> codes, std::span<float> values);
void encode_ue4m3(std::span<const float> values, std::span<uint8_t> codes);
void decode_ue4m3(std::span<const uint8_t> codes, std::span<float> values);
void encode_e8m0(std::span<const float> values, std::span<uint8_t> codes, E8M0Rounding rounding);
void decode_e8m0(std::span<const uint8_t> codes, std::span<float> values);

// ---- packing ------------------------------------------------------------------------------------
constexpr size_t packed_size_4bit(size_t count) {
  return (count + 1) / 2;
}
constexpr size_t packed_size_6bit(size_t count) {
  return (count + 3) / 4 * 3;
}

// codes: [n] 4-bit codes (high bits ignored) -> packed: [ceil(n/2)], low nibble first.
void pack_4bit(std::span<const uint8_t> codes, std::span<uint8_t> packed);
// packed: [ceil(n/2)] -> codes: [n] (n = codes.size()).
void unpack_4bit(std::span<const uint8_t> packed, std::span<uint8_t> codes);
// codes: [n] 6-bit codes (high bits ignored) -> packed: [3 * ceil(n/4)].
void pack_6bit(std::span<const uint8_t> codes, std::span<uint8_t> packed);
// packed: [3 * ceil(n/4)] -> codes: [n] (n = codes.size()).
void unpack_6bit(std::span<const uint8_t> packed, std::span<uint8_t> codes);

// values: [n] -> packed fp4 e2m1: [ceil(n/2)], low nibble first.
void encode_fp4_e2m1_packed(std::span<const float> values, std::span<uint8_t> packed);
// packed: [ceil(n/2)] -> values: [n] (n = values.size()).
void decode_fp4_e2m1_packed(std::span<const uint8_t> packed, std::span<float> values);
// format: kFp6E3M2 or kFp6E2M3. values: [n] -> packed: [3 * ceil(n/4)].
void encode_fp6_packed(Format format, std::span<const float> values, std::span<uint8_t> packed);
// format: kFp6E3M2 or kFp6E2M3. packed: [3 * ceil(n/4)] -> values: [n] (n = values.size()).
void decode_fp6_packed(Format format, std::span<const uint8_t> packed, std::span<float> values);

}  // namespace moekit::quant
